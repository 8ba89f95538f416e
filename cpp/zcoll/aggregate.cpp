#include "zcoll/aggregate.hpp"

#include <algorithm>
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

// The node of this rank's communicator rank in `nodes`, once `nodes` is checked to describe
// `cfg`'s communicator: before the context's crossing policy is made from it.
static int checked_node(const context_config& cfg, const node_map& nodes) {
  const int me = cfg.comm_ranks[static_cast<std::size_t>(cfg.rank)];
  if (nodes.node_of.size() != static_cast<std::size_t>(cfg.comm_size) || nodes.nodes() < 2)
    throw std::invalid_argument("zcoll: the node map does not describe this communicator");
  const int node = nodes.node_of[static_cast<std::size_t>(me)];
  const auto& mine = nodes.members[static_cast<std::size_t>(node)];
  if (mine.size() != static_cast<std::size_t>(cfg.size) ||
      !std::equal(mine.begin(), mine.end(), cfg.comm_ranks.begin()))
    throw std::invalid_argument("zcoll: the node map disagrees with this node's ranks");
  return node;
}

node_messages::node_messages(node_context& ctx, node_map nodes)
    : ctx_(ctx),
      nodes_(std::move(nodes)),
      me_node_(checked_node(ctx.config(), nodes_)),
      policy_(ctx.policy().cross_nodes(nodes_)) {
  const auto& cfg = ctx_.config();
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

std::byte* node_messages::message(int owner, std::size_t offset) const {
  return messages_->partition(owner) + offset;
}

// Offsets of this node's outgoing and incoming messages (of `out_bytes[k]` and `in_bytes[k]`
// bytes, to node + k + 1 and from node - k - 1) in their owners' partitions of the message
// segment; makes the partitions large enough (collective: the same sizes on every node rank).
void node_messages::plan_messages(std::span<const std::size_t> out_bytes,
                                  std::span<const std::size_t> in_bytes, std::size_t local_bytes) {
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
  local_offset_ = used;
  for (std::size_t& u : used) u += rounded(local_bytes);
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
  node_blocks_ = false;
  own_ = false;
  reduction_ = false;
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

void node_messages::begin(const call_record& record, const collective_data* data) {
  auto& line = start_round(record);
  const auto& cfg = ctx_.config();
  call_protocol& protocol = ctx_.protocol();
  node_segments& segments = ctx_.segments();
  collective_args args;
  const bool gather = op_ == op_code::allgather;
  if (data && data->recv && record.call.error == arg_error::none &&
      (op_ == op_code::alltoall || gather)) {
    local_check check = check_local_args(op_, cfg.comm_size, data->send, *data->recv);
    if (check_codes(check, data->order, data->copy, true))
      ctx_.prepare(op_, data->send, *data->recv, data->order, data->copy, check, args);
    if (check.ok()) {
      line.call.target = op_;
      line.call.block_bytes = args.block_bytes;
      line.call.flag = data->send == nullptr ? 1 : 0;
      if (data->send) line.send = segments.locate(args.send, args.send_bytes);
      line.recv = segments.locate(args.recv, args.recv_bytes);
    }
  }
  const auto all = protocol.publish();
  // Blocks in the round only when every node rank brings blocks of the same size, in place or
  // not alike (its local checks passed).
  bool together = line.call.target != op_code::none && line.call.block_bytes > 0;
  for (int j = 0; j < cfg.size; ++j) {
    const call_descriptor& c = all.call(j);
    together &= c.target == line.call.target && c.block_bytes == line.call.block_bytes &&
                c.flag == line.call.flag;
  }
  if (together) {
    in_place_ = data->send == nullptr;
    block_ = args.block_bytes;
    recv_bytes_ = args.recv_bytes;
    bool private_buffers = false;
    for (int j = 0; j < cfg.size; ++j)
      private_buffers |=
          (!in_place_ && all.line(j).send.segment == 0) || all.line(j).recv.segment == 0;
    aggregate_ = carries(op_, block_);
    // An allgather's blocks are packed by their own ranks, whatever the buffers (a rank's one
    // block into every message: nothing to order); its node's blocks are read from the node's
    // first outgoing message.
    own_ = private_buffers || gather;
    // A call rank to rank with a private buffer on the node: the node's blocks in the round
    // anyway (through the local areas), which spares the node's part staging whole buffers.
    node_blocks_ = aggregate_ || private_buffers;
  }
  const int n = nodes_.nodes();
  std::vector<std::size_t> out_bytes(static_cast<std::size_t>(n - 1));
  std::vector<std::size_t> in_bytes(static_cast<std::size_t>(n - 1));
  const std::size_t block = aggregate_ ? block_ : 0;
  for (int step = 1; step < n; ++step) {
    const auto k = static_cast<std::size_t>(step - 1);
    const int to = (me_node_ + step) % n, from = (me_node_ - step + n) % n;
    const auto here = static_cast<std::size_t>(cfg.size);
    const auto there = static_cast<std::size_t>(nodes_.ranks_on(from));
    // A message's blocks: (senders x receivers) for an alltoall, one per sender for an allgather
    const std::size_t to_blocks = gather ? 1 : static_cast<std::size_t>(nodes_.ranks_on(to));
    out_bytes[k] = message_head_bytes(cfg.size) + here * to_blocks * block;
    in_bytes[k] = message_head_bytes(nodes_.ranks_on(from)) + there * (gather ? 1 : here) * block;
  }
  const bool own = node_blocks_ && own_;
  // Local areas: an alltoall's node blocks by receiver, an allgather's one block (when the
  // messages do not carry it).
  std::size_t local_bytes = 0;
  if (own)
    local_bytes = gather ? (aggregate_ ? 0 : block_) : static_cast<std::size_t>(cfg.size) * block_;
  plan_messages(out_bytes, in_bytes, local_bytes);
  write_heads(all, 0);
  // A message is complete once its sender wrote it: records alone, or blocks it packed alone.
  // The local areas need no barrier of their own: the one after the exchange precedes finish().
  if (own) {
    pack_own(args);
    if (aggregate_) protocol.sync();
  } else if (aggregate_) {
    const bool alone = widest_message_blocks_ * block_ <= sender_packs_bytes_;
    pack(args, all, alone);
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
                         bool alone) {
  const auto& cfg = ctx_.config();
  node_segments& segments = ctx_.segments();
  const int size = cfg.size;
  const int me = cfg.rank;
  order_ = args.eager ? block_order::morton : args.order;
  copy_ = args.copy;
  send_.assign(static_cast<std::size_t>(size), nullptr);
  recv_.assign(static_cast<std::size_t>(size), nullptr);
  for (int j = 0; j < size; ++j) {
    const auto k = static_cast<std::size_t>(j);
    if (!in_place_) send_[k] = segments.resolve(all.line(j).send);
    recv_[k] = segments.resolve(all.line(j).recv);
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

void node_messages::pack_own(const collective_args& args) {
  const auto& cfg = ctx_.config();
  const int here = cfg.size, me = cfg.rank;
  const int n = nodes_.nodes();
  copy_ = args.copy;
  user_send_ = static_cast<const std::byte*>(in_place_ ? args.recv : args.send);
  user_recv_ = args.recv;
  const std::size_t head = message_head_bytes(here);
  if (op_ == op_code::allgather) {
    const std::byte* mine =  // in place: this rank's block of the receive buffer
        user_send_ +
        (in_place_ ? static_cast<std::size_t>(cfg.comm_ranks[static_cast<std::size_t>(me)]) : 0) *
            block_;
    if (!aggregate_) {  // rank to rank: the node's ranks read it from this rank's local area
      if (here > 1)
        copy_bytes(message(me, local_offset_[static_cast<std::size_t>(me)]), mine, block_,
                   copy_plan{copy_mode::temporal});
      return;
    }
    ctx_.policy().timed_copies(op_, block_, copy_, recv_bytes_,
                               static_cast<std::size_t>(n - 1) * block_, [&](const copy_plan& how) {
                                 for (int step = 1; step < n; ++step)
                                   copy_bytes(
                                       message(nodes_.sender(me_node_, (me_node_ + step) % n),
                                               out_offset_[static_cast<std::size_t>(step - 1)]) +
                                           head + static_cast<std::size_t>(me) * block_,
                                       mine, block_, how);
                               });
    return;
  }
  const std::size_t bytes = static_cast<std::size_t>(aggregate_ ? cfg.comm_size : here) * block_;
  ctx_.policy().timed_copies(
      op_code::alltoall, block_, copy_, recv_bytes_, bytes, [&](const copy_plan& how) {
        auto block_for = [&](int rank) {
          return user_send_ + static_cast<std::size_t>(rank) * block_;
        };
        for (int step = 1; aggregate_ && step < n; ++step) {  // slot (receiver, me) of each
          const int to = (me_node_ + step) % n;
          std::byte* into = message(nodes_.sender(me_node_, to),
                                    out_offset_[static_cast<std::size_t>(step - 1)]) +
                            head;
          const auto& ranks = nodes_.members[static_cast<std::size_t>(to)];
          for (std::size_t d = 0; d < ranks.size(); ++d)
            copy_bytes(
                into + (d * static_cast<std::size_t>(here) + static_cast<std::size_t>(me)) * block_,
                block_for(ranks[d]), block_, how);
        }
        std::byte* local = message(me, local_offset_[static_cast<std::size_t>(me)]);
        for (int j = 0; j < here; ++j)  // this node's blocks, by receiver
          if (j != me)
            copy_bytes(local + static_cast<std::size_t>(j) * block_,
                       block_for(cfg.comm_ranks[static_cast<std::size_t>(j)]), block_, how);
      });
}

void node_messages::unpack_gathered() {
  const auto& cfg = ctx_.config();
  const int n = nodes_.nodes();
  const int me = cfg.comm_ranks[static_cast<std::size_t>(cfg.rank)];
  auto* recv = static_cast<std::byte*>(user_recv_);
  if (!aggregate_) {  // rank to rank: this node's blocks from the local areas, its own block
    ctx_.policy().timed_copies(
        op_, block_, copy_, recv_bytes_, static_cast<std::size_t>(cfg.size) * block_,
        [&](const copy_plan& how) {
          for (int j = 0; j < cfg.size; ++j) {
            const auto rank = static_cast<std::size_t>(cfg.comm_ranks[static_cast<std::size_t>(j)]);
            if (j != cfg.rank)
              copy_bytes(recv + rank * block_,
                         message(j, local_offset_[static_cast<std::size_t>(j)]), block_, how);
            else if (!in_place_)
              copy_bytes(recv + rank * block_, user_send_, block_, how);
          }
        });
    return;
  }
  // Each message holds its node's blocks in node-rank order; this node's own are in its first
  // outgoing message.
  auto blocks_of = [&](int node, const std::byte* message_start, const copy_plan& how) {
    const std::byte* from = message_start + message_head_bytes(nodes_.ranks_on(node));
    for (const int rank : nodes_.members[static_cast<std::size_t>(node)]) {
      if (rank != me || !in_place_)
        copy_bytes(recv + static_cast<std::size_t>(rank) * block_, from, block_, how);
      from += block_;
    }
  };
  ctx_.policy().timed_copies(
      op_, block_, copy_, recv_bytes_, recv_bytes_, [&](const copy_plan& how) {
        blocks_of(me_node_, message(nodes_.sender(me_node_, (me_node_ + 1) % n), out_offset_[0]),
                  how);
        for (int step = 1; step < n; ++step) {
          const int from = (me_node_ - step + n) % n;
          blocks_of(from,
                    message(nodes_.receiver(from, me_node_),
                            in_offset_[static_cast<std::size_t>(step - 1)]),
                    how);
        }
      });
}

void node_messages::unpack_own() {
  if (op_ == op_code::allgather) return unpack_gathered();
  const auto& cfg = ctx_.config();
  const int me = cfg.rank;
  const int n = nodes_.nodes();
  auto* recv = static_cast<std::byte*>(user_recv_);
  auto block_of = [&](int rank) { return recv + static_cast<std::size_t>(rank) * block_; };
  const std::size_t bytes =
      static_cast<std::size_t>(aggregate_ ? cfg.comm_size : cfg.size) * block_;
  ctx_.policy().timed_copies(
      op_code::alltoall, block_, copy_, recv_bytes_, bytes, [&](const copy_plan& how) {
        for (int step = 1; aggregate_ && step < n; ++step) {  // my row of every message
          const int from = (me_node_ - step + n) % n;
          const auto& ranks = nodes_.members[static_cast<std::size_t>(from)];
          const std::byte* row = message(nodes_.receiver(from, me_node_),
                                         in_offset_[static_cast<std::size_t>(step - 1)]) +
                                 message_head_bytes(nodes_.ranks_on(from)) +
                                 static_cast<std::size_t>(me) * ranks.size() * block_;
          for (std::size_t s = 0; s < ranks.size(); ++s)
            copy_bytes(block_of(ranks[s]), row + s * block_, block_, how);
        }
        for (int j = 0; j < cfg.size; ++j) {
          const int rank = cfg.comm_ranks[static_cast<std::size_t>(j)];
          if (j != me)
            copy_bytes(block_of(rank),
                       message(j, local_offset_[static_cast<std::size_t>(j)]) +
                           static_cast<std::size_t>(me) * block_,
                       block_, how);
          else if (!in_place_)
            copy_bytes(block_of(rank), user_send_ + static_cast<std::size_t>(rank) * block_, block_,
                       how);
        }
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
  else if (reduction_)
    finish_reduction();
  else if (node_blocks_ && own_)
    unpack_own();
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
}

}  // namespace zcoll
