// Irregular calls in a round between nodes (aggregate.hpp: counts in the heads, small blocks
// in the payloads, each rank packing and unpacking its own blocks).
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>

#include "zcoll/aggregate.hpp"
#include "zcoll/copy.hpp"
#include "zcoll/error.hpp"
#include "zcoll/exchange.hpp"

namespace zcoll {

namespace {

constexpr std::size_t word_bytes = sizeof(std::uint64_t);

std::size_t padded_words(std::size_t words) noexcept {
  return (words * word_bytes + 63) / 64 * 64;
}

// Payload order: receiver, then sender, then the pattern's order (match_edges: list order).
void sort_by_receiver(std::vector<v_tuple>& tuples) {
  std::stable_sort(tuples.begin(), tuples.end(), [](const v_tuple& a, const v_tuple& b) {
    return std::tie(a.dst, a.src) < std::tie(b.dst, b.src);
  });
}

}  // namespace

irregular_layout make_irregular_layout(const node_map& nodes, const v_pattern& p, int node) {
  const auto comm_size = nodes.node_of.size();
  if (p.all_send_blocks.size() != comm_size || p.all_recv_blocks.size() != comm_size)
    throw std::invalid_argument(
        "zcoll: the pattern was registered without the communicator's lists (several nodes)");
  const int n = nodes.nodes();
  irregular_layout l;
  l.counts_at.resize(comm_size);
  l.counts_words.assign(static_cast<std::size_t>(n), 0);
  for (int k = 0; k < n; ++k)
    for (int r : nodes.members[static_cast<std::size_t>(k)]) {
      const auto i = static_cast<std::size_t>(r);
      std::size_t& words = l.counts_words[static_cast<std::size_t>(k)];
      l.counts_at[i] = words;
      words += p.all_send_blocks[i] + p.all_recv_blocks[i];
    }
  l.out.resize(static_cast<std::size_t>(n - 1));
  l.in.resize(static_cast<std::size_t>(n - 1));
  for (const v_tuple& t : p.all_tuples) {
    const int a = nodes.node_of[static_cast<std::size_t>(t.src)];
    const int b = nodes.node_of[static_cast<std::size_t>(t.dst)];
    const auto k = static_cast<std::size_t>((b - a + n) % n - 1);
    if (a != b && a == node) l.out[k].push_back(t);
    if (a != b && b == node) l.in[k].push_back(t);
  }
  for (auto& tuples : l.out) sort_by_receiver(tuples);
  for (auto& tuples : l.in) sort_by_receiver(tuples);
  return l;
}

const irregular_layout& node_messages::layout_for(int pattern) {
  if (const auto it = layouts_.find(pattern); it != layouts_.end()) return it->second;
  irregular_layout l = make_irregular_layout(nodes_, ctx_.irregular().pattern(pattern), me_node_);
  return layouts_.emplace(pattern, std::move(l)).first->second;
}

std::size_t node_messages::irregular_head_bytes(const irregular_layout& layout,
                                                int node) const noexcept {
  return message_head_bytes(nodes_.ranks_on(node)) +
         padded_words(layout.counts_words[static_cast<std::size_t>(node)]);
}

void node_messages::write_counts(std::byte* into, const call_protocol::published& all,
                                 std::size_t parity) const {
  const v_exchange& vx = ctx_.irregular();
  auto* words = reinterpret_cast<std::uint64_t*>(into);
  for (int j = 0; j < ctx_.config().size; ++j) {
    const int r = ctx_.config().comm_ranks[static_cast<std::size_t>(j)];
    const auto k = static_cast<std::size_t>(r);
    const std::size_t blocks = pattern_->all_send_blocks[k] + pattern_->all_recv_blocks[k];
    std::uint64_t* mine = words + layout_->counts_at[k];
    if (all.call(j).target == op_) {  // published its blocks (its local checks passed)
      const auto spans = vx.slot(j, parity);
      for (std::size_t b = 0; b < blocks; ++b) mine[b] = spans[b].bytes;
    } else {
      std::fill(mine, mine + blocks, std::uint64_t{0});
    }
  }
}

bool node_messages::carried(std::uint64_t bytes) const noexcept {
  return carry_limit_ >= 0 && bytes <= static_cast<std::uint64_t>(carry_limit_);
}

void node_messages::begin_irregular(const call_record& record, const v_call* call, bool carry) {
  auto& line = start_round(record);
  carry_limit_ = carry ? pack_limit() : -1;
  const auto& cfg = ctx_.config();
  v_exchange& vx = ctx_.irregular();
  call_protocol& protocol = ctx_.protocol();
  const std::size_t parity = protocol.parity();
  v_exchange::checked_call mine;
  if (call && record.call.error == arg_error::none && record.call.op == call->op &&
      vx.check(*call, mine).ok()) {
    vx.write_metadata(mine, parity, false);
    line.call.target = call->op;
    line.call.block_bytes = static_cast<std::uint64_t>(call->pattern) + 1;
    line.call.flag = static_cast<std::uint8_t>(call->in_place);
  }
  const auto all = protocol.publish();
  // Counts (and blocks) only when every node rank published the same call's blocks; otherwise
  // the records alone, which finish() rejects on every rank.
  bool counted = line.call.target != op_code::none;
  for (int j = 0; j < cfg.size; ++j)
    counted &= all.call(j).target == line.call.target &&
               all.call(j).block_bytes == line.call.block_bytes &&
               all.call(j).flag == line.call.flag;
  pattern_ = counted ? &vx.pattern(call->pattern) : nullptr;
  const int n = nodes_.nodes();
  std::vector<std::size_t> out_bytes(static_cast<std::size_t>(n - 1));
  std::vector<std::size_t> in_bytes(static_cast<std::size_t>(n - 1));
  std::size_t packed = 0;  // bytes the node packs
  if (counted) {
    layout_ = &layout_for(call->pattern);
    const auto& node_rank = nodes_.node_rank;
    auto sent = [&](const v_tuple& t) {
      return vx.slot(node_rank[static_cast<std::size_t>(t.src)], parity)[t.send_block].bytes;
    };
    auto received = [&](const v_tuple& t) {
      const int j = node_rank[static_cast<std::size_t>(t.dst)];
      return vx.slot(j, parity)[pattern_->send_blocks[static_cast<std::size_t>(j)] + t.recv_block]
          .bytes;
    };
    for (int step = 1; step < n; ++step) {
      const auto k = static_cast<std::size_t>(step - 1);
      out_bytes[k] = irregular_head_bytes(*layout_, me_node_);
      in_bytes[k] = irregular_head_bytes(*layout_, (me_node_ - step + n) % n);
      for (const v_tuple& t : layout_->out[k])
        if (const std::uint64_t b = sent(t); carried(b)) out_bytes[k] += b;
      for (const v_tuple& t : layout_->in[k])
        if (const std::uint64_t b = received(t); carried(b)) in_bytes[k] += b;
      packed += out_bytes[k] - irregular_head_bytes(*layout_, me_node_);
    }
    my_send_ = mine.send;
    my_recv_ = mine.recv;
    user_recv_ = const_cast<void*>(call->recv->data);  // checked writeable
    my_send_base_ = static_cast<const std::byte*>(call->send ? call->send->data : user_recv_);
  } else {
    for (int step = 1; step < n; ++step) {
      const auto k = static_cast<std::size_t>(step - 1);
      out_bytes[k] = message_head_bytes(cfg.size);
      in_bytes[k] = message_head_bytes(nodes_.ranks_on((me_node_ - step + n) % n));
    }
  }
  plan_messages(out_bytes, in_bytes);
  write_heads(all, parity);
  if (packed) {  // this rank's blocks into every outgoing message, then the node's barrier
    const int me = cfg.comm_ranks[static_cast<std::size_t>(cfg.rank)];
    const auto* from =
        static_cast<const std::byte*>(call->send ? call->send->data : call->recv->data);
    const auto spans = vx.slot(cfg.rank, parity);  // this rank's send blocks, as published
    for (int step = 1; step < n; ++step) {
      const auto k = static_cast<std::size_t>(step - 1);
      std::byte* into = message(nodes_.sender(me_node_, (me_node_ + step) % n), out_offset_[k]);
      std::size_t at = irregular_head_bytes(*layout_, me_node_);
      for (const v_tuple& t : layout_->out[k]) {
        const int j = nodes_.node_rank[static_cast<std::size_t>(t.src)];
        const std::uint64_t b = vx.slot(j, parity)[t.send_block].bytes;
        if (!carried(b)) continue;
        if (t.src == me) copy_bytes(into + at, from + spans[t.send_block].offset, b);
        at += b;
      }
    }
    protocol.sync();
  }
  begun_ = true;
}

void node_messages::finish_irregular(const std::vector<call_record>& records) {
  if (!layout_) return;  // unreachable: such a round's records fail agree()
  const auto& cfg = ctx_.config();
  const int n = nodes_.nodes();
  // Every rank's counts, from the heads: this node's in its first outgoing message.
  std::vector<const std::uint64_t*> counts(static_cast<std::size_t>(cfg.comm_size));
  auto read_counts = [&](int node, const std::byte* head) {
    const auto* words =
        reinterpret_cast<const std::uint64_t*>(head + message_head_bytes(nodes_.ranks_on(node)));
    for (int r : nodes_.members[static_cast<std::size_t>(node)])
      counts[static_cast<std::size_t>(r)] = words + layout_->counts_at[static_cast<std::size_t>(r)];
  };
  read_counts(me_node_, message(nodes_.sender(me_node_, (me_node_ + 1) % n), out_offset_[0]));
  for (int step = 1; step < n; ++step) {
    const int from = (me_node_ - step + n) % n;
    read_counts(from, message(nodes_.receiver(from, me_node_),
                              in_offset_[static_cast<std::size_t>(step - 1)]));
  }
  const auto& sends = pattern_->all_send_blocks;
  auto sent = [&](const v_tuple& t) {
    return counts[static_cast<std::size_t>(t.src)][t.send_block];
  };
  auto received = [&](const v_tuple& t) {
    const auto d = static_cast<std::size_t>(t.dst);
    return counts[d][sends[d] + t.recv_block];
  };
  const std::size_t itemsize = std::max<std::size_t>(records[0].call.dtype.itemsize, 1);
  for (const v_tuple& t : pattern_->all_tuples) {
    const std::uint64_t out = sent(t), in = received(t);
    if (out == in) continue;
    throw usage_error(call_prefix(op_) + "counts differ between ranks: rank " +
                      std::to_string(t.src) + " sends " + std::to_string(out / itemsize) +
                      " elements (its block " + std::to_string(t.send_block) + ") to rank " +
                      std::to_string(t.dst) + ", which expects " + std::to_string(in / itemsize) +
                      " (its block " + std::to_string(t.recv_block) + ")");
  }
  // This rank's blocks from the payloads.
  const int me = cfg.comm_ranks[static_cast<std::size_t>(cfg.rank)];
  auto* recv = static_cast<std::byte*>(user_recv_);
  for (int step = 1; step < n; ++step) {
    const auto k = static_cast<std::size_t>(step - 1);
    const int from_node = (me_node_ - step + n) % n;
    const std::byte* from = message(nodes_.receiver(from_node, me_node_), in_offset_[k]);
    std::size_t at = irregular_head_bytes(*layout_, from_node);
    for (const v_tuple& t : layout_->in[k]) {
      const std::uint64_t b = received(t);
      if (!carried(b)) continue;
      if (t.dst == me) copy_bytes(recv + my_recv_[t.recv_block].offset, from + at, b);
      at += b;
    }
  }
  // The others, rank to rank (the caller's part), in the pattern's tuple order.
  const auto& node_of = nodes_.node_of;
  for (const v_tuple& t : pattern_->all_tuples) {
    if ((t.src != me && t.dst != me) ||
        node_of[static_cast<std::size_t>(t.src)] == node_of[static_cast<std::size_t>(t.dst)])
      continue;
    const std::uint64_t b = sent(t);
    if (b == 0 || carried(b)) continue;
    if (t.src == me)
      direct_sends_.push_back(
          {t.dst, const_cast<std::byte*>(my_send_base_) + my_send_[t.send_block].offset, b});
    else
      direct_recvs_.push_back({t.src, recv + my_recv_[t.recv_block].offset, b});
  }
}

}  // namespace zcoll
