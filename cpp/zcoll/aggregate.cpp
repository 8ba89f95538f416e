#include "zcoll/aggregate.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>

#include "zcoll/copy.hpp"
#include "zcoll/error.hpp"
#include "zcoll/exchange.hpp"

namespace zcoll {

namespace {

constexpr std::size_t line_bytes = 64;

std::size_t rounded(std::size_t bytes) noexcept {
  return (bytes + line_bytes - 1) / line_bytes * line_bytes;
}

// The cells (dst < rows, src < cols) of a rows x cols grid, in Morton order.
std::vector<block_coord> morton_cells(int rows, int cols) {
  std::vector<block_coord> cells;
  if (rows <= 0 || cols <= 0) return cells;
  cells.reserve(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
  for (const block_coord& b : block_curve(std::max(rows, cols), block_order::morton))
    if (b.dst < rows && b.src < cols) cells.push_back(b);
  return cells;
}

}  // namespace

node_map node_map::from_leaders(std::span<const int> leader_of) {
  node_map m;
  std::map<int, int> index;  // leader -> node index, nodes ordered by their leader
  for (int leader : leader_of) index.emplace(leader, 0);
  int n = 0;
  for (auto& [leader, i] : index) i = n++;
  m.members.resize(index.size());
  m.node_of.resize(leader_of.size());
  m.node_rank.resize(leader_of.size());
  for (std::size_t r = 0; r < leader_of.size(); ++r) {
    const int node = index.at(leader_of[r]);
    auto& members = m.members[static_cast<std::size_t>(node)];
    m.node_of[r] = node;
    m.node_rank[r] = static_cast<int>(members.size());
    members.push_back(static_cast<int>(r));
  }
  return m;
}

int node_map::sender(int from, int to) const noexcept {
  const int n = nodes();
  const int steps = ((to - from) % n + n) % n;
  return (steps - 1) % ranks_on(from);
}

int node_map::receiver(int from, int to) const noexcept {
  const int n = nodes();
  const int steps = ((from - to) % n + n) % n;
  return (steps - 1) % ranks_on(to);
}

std::size_t message_head_bytes(int senders) noexcept {
  return rounded(static_cast<std::size_t>(senders) * sizeof(call_record));
}

std::vector<aggregate_copy> aggregate_copies(const node_map& nodes, int node, bool pack) {
  std::vector<aggregate_copy> copies;
  const int n = nodes.nodes();
  const int here = nodes.ranks_on(node);
  for (int step = 1; step < n; ++step) {
    const int other = pack ? (node + step) % n : (node - step + n) % n;
    const int there = nodes.ranks_on(other);
    const int senders = pack ? here : there;  // columns of the message's block matrix
    const int receivers = pack ? there : here;
    const auto& other_ranks = nodes.members[static_cast<std::size_t>(other)];
    for (const block_coord& b : morton_cells(receivers, senders)) {
      aggregate_copy c;
      c.message = step - 1;
      c.slot = static_cast<std::uint32_t>(b.dst * senders + b.src);
      c.rank = pack ? b.src : b.dst;
      c.peer = other_ranks[static_cast<std::size_t>(pack ? b.dst : b.src)];
      copies.push_back(c);
    }
  }
  return copies;
}

node_messages::node_messages(node_context& ctx, node_map nodes)
    : ctx_(ctx), nodes_(std::move(nodes)) {
  const auto& cfg = ctx_.config();
  const int me = cfg.comm_ranks[static_cast<std::size_t>(cfg.rank)];
  if (nodes_.node_of.size() != static_cast<std::size_t>(cfg.comm_size) || nodes_.nodes() < 2)
    throw std::invalid_argument("zcoll: the node map does not describe this communicator");
  me_node_ = nodes_.node_of[static_cast<std::size_t>(me)];
  const auto& mine = nodes_.members[static_cast<std::size_t>(me_node_)];
  if (mine.size() != static_cast<std::size_t>(cfg.size) ||
      !std::equal(mine.begin(), mine.end(), cfg.comm_ranks.begin()))
    throw std::invalid_argument("zcoll: the node map disagrees with this node's ranks");
  pack_copies_ = aggregate_copies(nodes_, me_node_, true);
  unpack_copies_ = aggregate_copies(nodes_, me_node_, false);
  const int n = nodes_.nodes();
  for (const aggregate_copy& c : pack_copies_)
    if (nodes_.sender(me_node_, (me_node_ + c.message + 1) % n) == cfg.rank)
      sent_copies_.push_back(c);
  for (int node = 0; node < n; ++node)
    if (node != me_node_)
      widest_message_blocks_ =
          std::max(widest_message_blocks_, static_cast<std::size_t>(nodes_.ranks_on(node)));
  widest_message_blocks_ *= static_cast<std::size_t>(cfg.size);
}

std::uint64_t max_aggregated_block(const node_map& nodes) noexcept {
  std::uint64_t q = nodes.node_of.size();
  for (const auto& members : nodes.members) q = std::min<std::uint64_t>(q, members.size());
  return std::min(aggregate_max_block, aggregate_unit_block * q);
}

namespace {
std::atomic<aggregation> aggregation_mode{aggregation::by_size};
}  // namespace

aggregation set_aggregation(aggregation mode) noexcept {
  return aggregation_mode.exchange(mode);
}

std::int64_t node_messages::pack_limit() const noexcept {
  switch (aggregation_mode.load()) {
    case aggregation::never:
      return -1;
    case aggregation::always:
      return std::numeric_limits<std::int64_t>::max();
    case aggregation::by_size:
      break;
  }
  return static_cast<std::int64_t>(max_aggregated_block(nodes_));
}

std::byte* node_messages::message(int owner, std::size_t offset) const {
  return messages_->partition(owner) + offset;
}

// Offsets of this node's outgoing and incoming messages (of `out_bytes[k]` and `in_bytes[k]`
// bytes, to node + k + 1 and from node - k - 1) in their owners' partitions of the message
// segment; makes the partitions large enough (collective: the same sizes on every node rank).
void node_messages::plan_messages(std::span<const std::size_t> out_bytes,
                                  std::span<const std::size_t> in_bytes) {
  const int n = nodes_.nodes();
  const int here = nodes_.ranks_on(me_node_);
  const int me = ctx_.config().rank;
  std::vector<std::size_t> used(static_cast<std::size_t>(here), 0);
  out_offset_.assign(static_cast<std::size_t>(n - 1), 0);
  in_offset_.assign(static_cast<std::size_t>(n - 1), 0);
  out_.clear();
  in_.clear();
  for (int step = 1; step < n; ++step) {
    const auto k = static_cast<std::size_t>(step - 1);
    const int to = (me_node_ + step) % n;
    const int from = (me_node_ - step + n) % n;
    const int out_owner = nodes_.sender(me_node_, to);
    const int in_owner = nodes_.receiver(from, me_node_);
    out_offset_[k] = used[static_cast<std::size_t>(out_owner)];
    used[static_cast<std::size_t>(out_owner)] += rounded(out_bytes[k]);
    in_offset_[k] = used[static_cast<std::size_t>(in_owner)];
    used[static_cast<std::size_t>(in_owner)] += rounded(in_bytes[k]);
    const auto& to_ranks = nodes_.members[static_cast<std::size_t>(to)];
    const auto& from_ranks = nodes_.members[static_cast<std::size_t>(from)];
    if (out_owner == me)
      out_.push_back({to, to_ranks[static_cast<std::size_t>(nodes_.receiver(me_node_, to))],
                      nullptr, out_bytes[k]});
    if (in_owner == me)
      in_.push_back({from, from_ranks[static_cast<std::size_t>(nodes_.sender(from, me_node_))],
                     nullptr, in_bytes[k]});
  }
  const std::size_t need = *std::max_element(used.begin(), used.end());
  if (!messages_ || messages_->partition_bytes < need) {
    const std::size_t old = messages_ ? messages_->partition_bytes : 0;
    ctx_.segments().renew(messages_, std::max(round_up(need, page_size()), 2 * old));
  }
  // Addresses only now: the partitions may have moved.
  for (node_message& m : out_) {
    const int step = ((m.node - me_node_) % n + n) % n;
    m.data = message(me, out_offset_[static_cast<std::size_t>(step - 1)]);
  }
  for (node_message& m : in_) {
    const int step = ((me_node_ - m.node) % n + n) % n;
    m.data = message(me, in_offset_[static_cast<std::size_t>(step - 1)]);
  }
}

void node_messages::check_unbroken() const {
  if (!failure_.empty())
    throw peer_error(
        "zcoll: this communicator's zcoll context is unusable after an earlier failure: " +
        failure_);
}

detail::rank_line& node_messages::start_round(const call_record& record) {
  check_unbroken();
  begun_ = false;
  aggregate_ = false;
  pattern_ = nullptr;
  layout_ = nullptr;
  direct_sends_.clear();
  direct_recvs_.clear();
  op_ = record.call.op;
  call_protocol& protocol = ctx_.protocol();
  auto& line = protocol.next(op_code::none);
  protocol.slot(ctx_.config().rank).record = record;  // the senders copy it into the heads
  line.call = record.call;
  line.call.target = op_code::none;  // the call's op: this rank brings data to pack
  line.send = {};
  line.recv = {};
  return line;
}

void node_messages::begin(const call_record& record, const alltoall_data* data) {
  auto& line = start_round(record);
  const auto& cfg = ctx_.config();
  call_protocol& protocol = ctx_.protocol();
  node_segments& segments = ctx_.segments();
  collective_args args;
  const std::int64_t limit = pack_limit();
  const bool within = data && data->recv && limit >= 0 &&
                      data->recv->nbytes / static_cast<std::size_t>(cfg.comm_size) <=
                          static_cast<std::uint64_t>(limit);
  if (within && record.call.error == arg_error::none && record.call.op == op_code::alltoall) {
    local_check check = check_local_args(op_code::alltoall, cfg.comm_size, data->send, *data->recv);
    if (check_codes(check, data->order, data->copy, true))
      ctx_.prepare(op_code::alltoall, data->send, *data->recv, data->order, data->copy, check,
                   args);
    if (check.ok()) {
      line.call.target = op_code::alltoall;
      line.call.block_bytes = args.block_bytes;
      line.call.flag = data->send == nullptr ? 1 : 0;
      if (data->send) line.send = segments.locate(args.send, args.send_bytes);
      line.recv = segments.locate(args.recv, args.recv_bytes);
    }
  }
  const auto all = protocol.publish();
  // Pack only when every node rank brings blocks of the same size, in place or not alike.
  bool together = true;
  for (int j = 0; j < cfg.size; ++j) {
    const call_descriptor& c = all.call(j);
    together &= c.target == op_code::alltoall && c.block_bytes == line.call.block_bytes &&
                c.flag == line.call.flag;
  }
  aggregate_ = together && line.call.block_bytes > 0;
  if (aggregate_) {
    in_place_ = data->send == nullptr;
    block_ = args.block_bytes;
    recv_bytes_ = args.recv_bytes;
    send_part_ = in_place_ ? 0 : rounded(args.send_bytes);
    staged_ = false;
    for (int j = 0; j < cfg.size; ++j)
      staged_ |= (!in_place_ && all.line(j).send.segment == 0) || all.line(j).recv.segment == 0;
  }
  const int n = nodes_.nodes();
  std::vector<std::size_t> out_bytes(static_cast<std::size_t>(n - 1));
  std::vector<std::size_t> in_bytes(static_cast<std::size_t>(n - 1));
  const std::size_t block = aggregate_ ? block_ : 0;
  for (int step = 1; step < n; ++step) {
    const auto k = static_cast<std::size_t>(step - 1);
    const int to = (me_node_ + step) % n, from = (me_node_ - step + n) % n;
    const auto here = static_cast<std::size_t>(cfg.size);
    out_bytes[k] =
        message_head_bytes(cfg.size) + here * static_cast<std::size_t>(nodes_.ranks_on(to)) * block;
    in_bytes[k] = message_head_bytes(nodes_.ranks_on(from)) +
                  here * static_cast<std::size_t>(nodes_.ranks_on(from)) * block;
  }
  plan_messages(out_bytes, in_bytes);
  write_heads(all, 0);
  // A message is complete once its sender wrote it: records alone, or blocks it packed alone.
  if (aggregate_) {
    const bool alone = widest_message_blocks_ * block_ <= sender_packs_bytes_;
    pack(args, all, line, alone);
    if (!alone) protocol.sync();
  }
  begun_ = true;
}

void node_messages::write_heads(const call_protocol::published& all, std::size_t parity) {
  call_protocol& protocol = ctx_.protocol();
  const int size = ctx_.config().size;
  for (const node_message& m : out_) {
    for (int j = 0; j < size; ++j)
      std::memcpy(m.data + static_cast<std::size_t>(j) * sizeof(call_record),
                  &protocol.slot(j).record, sizeof(call_record));
    if (layout_) write_counts(m.data + message_head_bytes(size), all, parity);
  }
}

void node_messages::pack(const collective_args& args, const call_protocol::published& all,
                         const detail::rank_line& line, bool alone) {
  const auto& cfg = ctx_.config();
  node_segments& segments = ctx_.segments();
  const int size = cfg.size;
  const int me = cfg.rank;
  order_ = args.eager ? block_order::morton : args.order;
  copy_ = args.copy;
  user_recv_ = args.recv;
  my_recv_staged_ = line.recv.segment == 0;
  // The published buffers, read before staging's barrier: past it, a rank that packs nothing
  // may reach the round's next barrier, whose line has the parity of the published ones.
  std::vector<std::pair<buffer_ref, buffer_ref>> lines;  // (send, recv) of each node rank
  for (int j = 0; j < size; ++j) lines.emplace_back(all.line(j).send, all.line(j).recv);
  if (staged_) ctx_.stage_in(args, send_part_, line.send, line.recv);
  send_.assign(static_cast<std::size_t>(size), nullptr);
  recv_.assign(static_cast<std::size_t>(size), nullptr);
  for (int j = 0; j < size; ++j) {
    const auto& [send, recv] = lines[static_cast<std::size_t>(j)];
    std::byte* stage = staged_ ? segments.staging(j) : nullptr;
    const auto k = static_cast<std::size_t>(j);
    if (!in_place_) send_[k] = send.segment ? segments.resolve(send) : stage;
    recv_[k] = recv.segment ? segments.resolve(recv) : stage + send_part_;
  }
  const int n = nodes_.nodes();
  const std::size_t head = message_head_bytes(nodes_.ranks_on(me_node_));
  std::vector<std::byte*> into(static_cast<std::size_t>(n - 1));
  for (int step = 1; step < n; ++step) {
    const auto k = static_cast<std::size_t>(step - 1);
    into[k] = message(nodes_.sender(me_node_, (me_node_ + step) % n), out_offset_[k]) + head;
  }
  std::byte* const* from = in_place_ ? recv_.data() : send_.data();
  // This rank's copies: the blocks of the messages it sends, or an equal share of all.
  const auto [first, last] = segment_of(pack_copies_.size(), size, me);
  const std::span<const aggregate_copy> mine =
      alone ? std::span<const aggregate_copy>(sent_copies_)
            : std::span<const aggregate_copy>(pack_copies_).subspan(first, last - first);
  ctx_.policy().timed_copies(
      op_code::alltoall, block_, copy_, recv_bytes_, mine.size() * block_,
      [&](const copy_plan& how) {
        for (const aggregate_copy& c : mine)
          copy_bytes(into[static_cast<std::size_t>(c.message)] + c.slot * block_,
                     from[c.rank] + static_cast<std::size_t>(c.peer) * block_, block_, how);
      });
}

void node_messages::finish() {
  if (!begun_) throw std::logic_error("zcoll: a round between nodes finished before it began");
  begun_ = false;
  const auto& cfg = ctx_.config();
  const int n = nodes_.nodes();
  // Every rank's record: this node's from the head of its first outgoing message, the other
  // nodes' from the heads of the messages they sent.
  std::vector<call_record> records(static_cast<std::size_t>(cfg.comm_size));
  auto read_head = [&](int node, const std::byte* head) {
    const auto& ranks = nodes_.members[static_cast<std::size_t>(node)];
    for (std::size_t j = 0; j < ranks.size(); ++j)
      std::memcpy(&records[static_cast<std::size_t>(ranks[j])], head + j * sizeof(call_record),
                  sizeof(call_record));
  };
  read_head(me_node_, message(nodes_.sender(me_node_, (me_node_ + 1) % n), out_offset_[0]));
  for (int step = 1; step < n; ++step) {
    const int from = (me_node_ - step + n) % n;
    read_head(from, message(nodes_.receiver(from, me_node_),
                            in_offset_[static_cast<std::size_t>(step - 1)]));
  }
  agree(records, op_);
  if (pattern_)
    finish_irregular(records);
  else if (aggregate_)
    unpack();
}

void node_messages::unpack() {
  const auto& cfg = ctx_.config();
  const int n = nodes_.nodes();
  const int me = cfg.rank;
  const schedule& sched = ctx_.schedule_for(op_code::alltoall, in_place_, order_);
  const auto local = sched.segment(me);
  const auto [first, last] = segment_of(unpack_copies_.size(), cfg.size, me);
  std::vector<const std::byte*> from(static_cast<std::size_t>(n - 1));
  for (int step = 1; step < n; ++step) {
    const auto k = static_cast<std::size_t>(step - 1);
    const int node = (me_node_ - step + n) % n;
    from[k] = message(nodes_.receiver(node, me_node_), in_offset_[k]) +
              message_head_bytes(nodes_.ranks_on(node));
  }
  ctx_.policy().timed_copies(
      op_code::alltoall, block_, copy_, recv_bytes_, (local.size() + last - first) * block_,
      [&](const copy_plan& how) {
        copy_segment(local, op_code::alltoall, in_place_, block_, send_.data(), recv_.data(),
                     cfg.comm_ranks.data(), how);
        for (std::size_t i = first; i < last; ++i) {
          const aggregate_copy& c = unpack_copies_[i];
          copy_bytes(
              recv_[static_cast<std::size_t>(c.rank)] + static_cast<std::size_t>(c.peer) * block_,
              from[static_cast<std::size_t>(c.message)] + c.slot * block_, block_, how);
        }
      });
  ctx_.protocol().sync();
  if (staged_ && my_recv_staged_)
    copy_bytes(static_cast<std::byte*>(user_recv_), ctx_.segments().staging(me) + send_part_,
               recv_bytes_);
}

}  // namespace zcoll
