#include "zcoll/across_nodes.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "zcoll/crossing_policy.hpp"
#include "zcoll/error.hpp"
#include "zcoll/leaders_exchange.hpp"
#include "zcoll/mpi_messages.hpp"
#include "zcoll/spread_reduction.hpp"

namespace zcoll {

namespace {

constexpr int remote_tag = 0x7A0C;    // alltoall and allgather blocks rank to rank
constexpr int direct_tag = 0x7AFF;    // an irregular call's blocks rank to rank (one tag)
constexpr int transfer_tag = 0x7A0E;  // a transfer's blocks (plans: their own)

// Blocks rank to rank between nodes, all posted at once on `route`'s communicator and bounded
// by `timeout`; with `copy_sends` (in place: receives overwrite the blocks sent) the sends go
// from copies.
void exchange_rank_to_rank(const nodes_route& route, std::span<const peer_buffer> recvs,
                           std::vector<peer_buffer> sends, bool copy_sends, double timeout,
                           const std::string& what) {
  std::vector<std::vector<std::byte>> copies;
  if (copy_sends)
    for (peer_buffer& b : sends) b.data = copies.emplace_back(b.data, b.data + b.bytes).data();
  exchange_buffers(comm_from_handle(route.comm), recvs, sends, route.rank,
                   round_options(timeout, what + " (blocks between nodes)"));
}

std::vector<peer_buffer> with_tag(std::span<const peer_block> blocks, int tag) {
  std::vector<peer_buffer> out;
  out.reserve(blocks.size());
  for (const peer_block& b : blocks) out.push_back({b.peer, tag, b.data, b.bytes});
  return out;
}

// The blocks of an alltoall or allgather between this rank and the ranks on other nodes, one
// per pair with `tag` (an allgather sends its one block to each): (receives, sends).
std::pair<std::vector<peer_buffer>, std::vector<peer_buffer>> remote_blocks(
    const node_context& ctx, op_code op, const node_map& nodes, const array_view* send,
    const array_view& recv, int tag) {
  const auto& cfg = ctx.config();
  const std::size_t block = recv.nbytes / static_cast<std::size_t>(cfg.comm_size);
  std::vector<peer_buffer> in, out;
  if (block == 0) return {in, out};
  const int me = cfg.comm_ranks[static_cast<std::size_t>(cfg.rank)];
  const bool gather = op == op_code::allgather;
  auto* into = static_cast<std::byte*>(const_cast<void*>(recv.data));
  auto* from = static_cast<std::byte*>(const_cast<void*>(send ? send->data : recv.data));
  if (gather && !send) from += static_cast<std::size_t>(me) * block;
  const int mine = nodes.node_of[static_cast<std::size_t>(me)];
  for (int r = 0; r < cfg.comm_size; ++r) {
    if (nodes.node_of[static_cast<std::size_t>(r)] == mine) continue;
    const std::size_t at = static_cast<std::size_t>(r) * block;
    in.push_back({r, tag, into + at, block});
    out.push_back({r, tag, gather ? from : from + at, block});
  }
  return {in, out};
}

// Whether an alltoall or allgather's receives overwrite the blocks it sends: an in-place
// alltoall's.
bool sends_overwritten(op_code op, const array_view* send) noexcept {
  return !send && op != op_code::allgather;
}

// An alltoall or allgather's blocks between nodes, rank to rank.
void exchange_remote(node_context& ctx, op_code op, const node_map& nodes, const array_view* send,
                     const array_view& recv, const nodes_route& route) {
  auto [in, out] = remote_blocks(ctx, op, nodes, send, recv, remote_tag);
  if (in.empty()) return;
  exchange_rank_to_rank(route, in, std::move(out), sends_overwritten(op, send), wait_timeout(ctx),
                        "zcoll." + std::string(name_of(op)));
}

// Whether `ctx` failed (a peer died or never came): a plan's messages in flight may never finish.
bool plan_messages_failed(node_context& ctx) {
  const node_messages* rounds = ctx.rounds();
  return ctx.broken() || (rounds && !rounds->failure().empty());
}

// Waits for a plan's messages between nodes within `ctx`'s bound; a peer_error marks the rounds
// failed.
template <class Messages>
void wait_plan_messages(node_context& ctx, Messages& messages, int rank, const std::string& what) {
  const message_round_options options = round_options(wait_timeout(ctx), what);
  node_messages* rounds = ctx.rounds();
  if (!rounds) return messages.wait(rank, options);
  marking_failure(*rounds, [&] { messages.wait(rank, options); });
}

// "zcoll.<op> plan (blocks between nodes)": what a plan's waits name.
std::string plan_what(op_code op) {
  return "zcoll." + std::string(name_of(op)) + " plan (blocks between nodes)";
}

// An allgather's blocks of the other nodes by the leaders' concurrent exchange with index
// `concurrency` (leaders_exchange.hpp), after the node's part: the leaders' rounds into their
// receive buffers, then a node bcast of each leader's buffer.
void leaders_exchange(node_context& ctx, const node_map& nodes, const array_view& recv,
                      int concurrency, const nodes_route& route) {
  const auto& cfg = ctx.config();
  const std::uint64_t block = recv.nbytes / static_cast<std::size_t>(cfg.comm_size);
  if (block == 0) return;
  auto* base = static_cast<std::byte*>(const_cast<void*>(recv.data));
  const int me = cfg.comm_ranks[static_cast<std::size_t>(cfg.rank)];
  const int node = nodes.node_of[static_cast<std::size_t>(me)];
  auto leader = [&](int n) { return nodes.members[static_cast<std::size_t>(n)].front(); };
  if (me == leader(node)) {
    const std::string what =
        "zcoll.allgather (concurrent exchange between nodes, C=" + std::to_string(concurrency) +
        ")";
    auto buffers = [&](const std::vector<leader_transfer>& list) {
      std::vector<peer_buffer> out;
      for (const leader_transfer& t : list)
        out.push_back({leader(t.node), t.tag, base + t.start, t.stop - t.start});
      return out;
    };
    for (const leader_round& r : leader_rounds(nodes, node, concurrency, block))
      exchange_rank_to_rank(route, buffers(r.receives), buffers(r.sends), false, wait_timeout(ctx),
                            what);
  }
  if (cfg.size > 1)
    ctx.run_reduction({op_code::bcast, nullptr, &recv, 0, auto_algorithm, leader(node)});
}

// The blocks between this rank's node and the others, after the node's part: rank to rank, or
// an allgather's by the leaders' exchange where the crossing policy routes its block size so.
void send_between_nodes(node_context& ctx, op_code op, const node_messages& round,
                        const array_view* send, const array_view& recv, const nodes_route& route) {
  if (op == op_code::allgather) {
    const std::uint64_t block = recv.nbytes / static_cast<std::size_t>(ctx.config().comm_size);
    const allgather_route how = round.policy().allgather_route_for(block);
    if (how.method == crossing_method::concurrent)
      return leaders_exchange(ctx, round.nodes(), recv, how.concurrency, route);
  }
  exchange_remote(ctx, op, round.nodes(), send, recv, route);
}

// The messages of a phase of a spread reduction.
void exchange_spread(const spread_reduction& spread, const nodes_route& route, int tag,
                     double timeout, const std::string& what) {
  exchange_rank_to_rank(route, with_tag(spread.recvs(), tag), with_tag(spread.sends(), tag), false,
                        timeout, what);
}

// The subarray messages of a transpose's blocks between this rank and the other nodes' ranks.
slab_messages transfer_slabs(const node_context& ctx, const node_map& nodes,
                             const transfer_geometry& g, int tag) {
  const int me = ctx.config().comm_ranks[static_cast<std::size_t>(ctx.config().rank)];
  const int mine = nodes.node_of[static_cast<std::size_t>(me)];
  const extents before = g.shape_a(me), after = g.shape_b(me);
  auto slab = [&](const extents& shape, int axis, int r) {
    const axis_share share = block_share(g.shape[static_cast<std::size_t>(axis)], g.comm_size, r);
    return peer_slab{
        r,         tag,         std::vector<std::uint64_t>(shape.begin(), shape.begin() + g.ndim),
        axis,      share.start, share.count,
        g.itemsize};
  };
  auto empty = [&](const extents& shape) {
    return std::any_of(shape.begin(), shape.begin() + g.ndim, [](auto n) { return n == 0; });
  };
  std::vector<peer_slab> recvs, sends;
  for (int r = 0; r < g.comm_size; ++r) {
    if (nodes.node_of[static_cast<std::size_t>(r)] == mine) continue;
    if (peer_slab in = slab(after, g.axis_b, r); in.count && !empty(after)) recvs.push_back(in);
    if (peer_slab out = slab(before, g.axis_a, r); out.count && !empty(before))
      sends.push_back(out);
  }
  return slab_messages(recvs, sends);
}

// Posts `slabs` on the arrays (receives into `recv`, sends from `send`) and waits for them.
void exchange_slabs(node_context& ctx, slab_messages& slabs, void* recv, const void* send,
                    const nodes_route& route, const std::string& what) {
  node_messages& round = ctx.between_nodes(node_map{});
  marking_failure(round, [&] {
    slabs.post(comm_from_handle(route.comm), recv, send);
    slabs.wait(route.rank, round_options(wait_timeout(ctx), what));
  });
}

// The blocks between nodes of a persistent plan, run after run: persistent requests on the
// route's communicator, started before the node part and waited for after it within the
// context's bound (a peer_error marks the rounds failed; a failed context's plan raises at
// start). With `copy_sends` (in place: receives overwrite the blocks sent) the sends go from
// copies refreshed from their live places at each start.
class plan_blocks final : public plan_between_nodes {
 public:
  plan_blocks(std::shared_ptr<node_context> ctx, const nodes_route& route,
              std::span<const peer_buffer> recvs, std::vector<peer_buffer> sends, bool copy_sends,
              std::string what);
  void start() override;
  void wait() override;
  bool test() override { return messages_->test(); }
  bool failed() const override;

 private:
  std::shared_ptr<node_context> ctx_;
  std::vector<peer_buffer> live_;                  // copy_sends: the blocks the copies refresh from
  std::vector<std::vector<std::byte>> copies_;     // and the copies sent
  std::unique_ptr<persistent_messages> messages_;  // made after the copies it sends from
  int rank_;
  std::string what_;
};

plan_blocks::plan_blocks(std::shared_ptr<node_context> ctx, const nodes_route& route,
                         std::span<const peer_buffer> recvs, std::vector<peer_buffer> sends,
                         bool copy_sends, std::string what)
    : ctx_(std::move(ctx)), rank_(route.rank), what_(std::move(what)) {
  if (copy_sends)
    for (peer_buffer& b : sends) {
      live_.push_back(b);
      b.data = copies_.emplace_back(b.bytes).data();
    }
  messages_ = std::make_unique<persistent_messages>(comm_from_handle(route.comm), recvs, sends);
}

void plan_blocks::start() {
  if (const node_messages* rounds = ctx_->rounds()) rounds->check_unbroken();
  for (std::size_t i = 0; i < live_.size(); ++i)
    std::copy_n(live_[i].data, live_[i].bytes, copies_[i].data());
  messages_->start();
}

void plan_blocks::wait() {
  wait_plan_messages(*ctx_, *messages_, rank_, what_);
}

bool plan_blocks::failed() const {
  return plan_messages_failed(*ctx_);
}

class transfer_plan_slabs final : public transfer_between_nodes {
 public:
  transfer_plan_slabs(std::shared_ptr<node_context> ctx, const transfer_geometry& g,
                      const nodes_route& route, int tag);
  void agree(const call_record& record) override {
    agree_across_nodes(*ctx_, record, route_, what_);
  }
  void set_arrays(void* recv, const void* send) override { recv_ = recv, send_ = send; }
  void start() override;
  void wait() override;
  bool test() override { return slabs_.test(); }
  bool failed() const override;

 private:
  std::shared_ptr<node_context> ctx_;
  slab_messages slabs_;
  nodes_route route_;
  std::string what_;  // what its agreement names
  void* recv_ = nullptr;
  const void* send_ = nullptr;
};

transfer_plan_slabs::transfer_plan_slabs(std::shared_ptr<node_context> ctx,
                                         const transfer_geometry& g, const nodes_route& route,
                                         int tag)
    : ctx_(std::move(ctx)),
      slabs_(transfer_slabs(*ctx_, ctx_->between_nodes(node_map{}).nodes(), g, tag)),
      route_(route),
      what_("zcoll." + std::string(name_of(op_code::transfer)) + " plan") {}

void transfer_plan_slabs::start() {
  slabs_.post(comm_from_handle(route_.comm), recv_, send_);
}

void transfer_plan_slabs::wait() {
  wait_plan_messages(*ctx_, slabs_, route_.rank, plan_what(op_code::transfer));
}

bool transfer_plan_slabs::failed() const {
  return plan_messages_failed(*ctx_);
}

}  // namespace

void finish_round(node_context& ctx, node_messages& round, const nodes_route& route,
                  const std::string& what) {
  message_round_options options = round_options(wait_timeout(ctx), what);
  options.tag = route.tag;
  options.window = route.window;
  exchange_messages(comm_from_handle(route.comm), round.outgoing(), round.incoming(), route.rank,
                    options);
  ctx.barrier();  // every message of the node received
  round.finish();
}

void agree_across_nodes(node_context& ctx, const call_record& record, const nodes_route& route,
                        const std::string& what) {
  node_messages& round = ctx.between_nodes(node_map{});
  marking_failure(round, [&] {
    round.begin(record, nullptr);
    finish_round(ctx, round, route, what);
  });
}

void collective_across_nodes(node_context& ctx, op_code op, const array_view* send,
                             const array_view& recv, int order, int copy, const call_record& record,
                             const nodes_route& route) {
  node_messages& round = ctx.between_nodes(node_map{});
  marking_failure(round, [&] {
    const collective_data data{send, &recv, order, copy};
    round.begin(record, &data);  // the blocks carried when the policy's limit allows
    finish_round(ctx, round, route,
                 "zcoll." + std::string(name_of(op)) + " (messages between nodes)");
    if (round.packed()) return;
    if (!round.node_blocks_delivered()) ctx.run(op, send, recv, order, copy);  // the node's part
    send_between_nodes(ctx, op, round, send, recv, route);
  });
}

void blocks_between_nodes(node_context& ctx, op_code op, const array_view* send,
                          const array_view& recv, const nodes_route& route) {
  node_messages& round = ctx.between_nodes(node_map{});
  marking_failure(round, [&] { send_between_nodes(ctx, op, round, send, recv, route); });
}

void irregular_across_nodes(node_context& ctx, op_code op, const v_call* call,
                            const call_record& record, const nodes_route& route) {
  node_messages& round = ctx.between_nodes(node_map{});
  const std::string what = "zcoll." + std::string(name_of(op));
  marking_failure(round, [&] {
    round.begin_irregular(record, call, true);
    finish_round(ctx, round, route, what + " (messages between nodes)");
    if (!call) return;  // unreachable: the round raised this rank's error
    ctx.irregular().run(*call);
    if (round.direct_blocks())
      exchange_rank_to_rank(route, with_tag(round.direct_recvs(), direct_tag),
                            with_tag(round.direct_sends(), direct_tag),
                            call->in_place == v_in_place::swap, wait_timeout(ctx), what);
  });
}

void reduction_across_nodes(node_context& ctx, op_code op, const reduction_call* call,
                            const call_record& record, const nodes_route& route) {
  node_messages& round = ctx.between_nodes(node_map{});
  std::string what = public_call_prefix(op);  // "zcoll.allreduce: "
  what.replace(what.size() - 2, 2, " (messages between nodes)");
  marking_failure(round, [&] {
    round.begin_reduction(record, call);
    finish_round(ctx, round, route, what);
  });
  if (round.packed() || record.call.block_bytes == 0 || !call) return;
  const double timeout = wait_timeout(ctx);
  marking_failure(round, [&] {
    spread_reduction& spread = round.spread();
    spread.begin(*call, true);  // as a flow where the spread allows
    if (spread.flowing()) {
      message_round_options options = round_options(timeout, what + " (blocks between nodes)");
      exchange_flow(comm_from_handle(route.comm), spread, route.rank, options);
    } else {
      exchange_spread(spread, route, spread_partial_tag, timeout, what);
      spread.combine();
      exchange_spread(spread, route, spread_result_tag, timeout, what);
    }
    spread.finish();
  });
}

void transfer_across_nodes(node_context& ctx, const transfer_geometry& g, const array_view& send,
                           const array_view& recv, int order, int copy, const nodes_route& route) {
  ctx.run_transfer(g, send, recv, order, copy);
  slab_messages slabs = transfer_slabs(ctx, ctx.between_nodes(node_map{}).nodes(), g, transfer_tag);
  exchange_slabs(ctx, slabs, const_cast<void*>(recv.data), send.data, route,
                 "zcoll.transfer (blocks between nodes)");
}

std::unique_ptr<plan_between_nodes> collective_plan_blocks(std::shared_ptr<node_context> ctx,
                                                           op_code op, const array_view* send,
                                                           const array_view& recv,
                                                           const nodes_route& route, int tag) {
  const node_map& nodes = ctx->between_nodes(node_map{}).nodes();
  auto [in, out] = remote_blocks(*ctx, op, nodes, send, recv, tag);
  return std::make_unique<plan_blocks>(std::move(ctx), route, in, std::move(out),
                                       sends_overwritten(op, send), plan_what(op));
}

std::unique_ptr<plan_between_nodes> irregular_plan_blocks(std::shared_ptr<node_context> ctx,
                                                          op_code op, bool swap,
                                                          const nodes_route& route, int tag_base) {
  const node_messages& round = ctx->between_nodes(node_map{});
  // The k-th block to or from a peer gets tag_base + k, alike on both sides: sender and receiver
  // list the pattern's blocks in the same order.
  auto tagged = [tag_base](std::span<const peer_block> blocks) {
    std::map<int, int> seen;
    std::vector<peer_buffer> out;
    for (const peer_block& b : blocks)
      out.push_back({b.peer, tag_base + seen[b.peer]++, b.data, b.bytes});
    return out;
  };
  return std::make_unique<plan_blocks>(std::move(ctx), route, tagged(round.direct_recvs()),
                                       tagged(round.direct_sends()), swap, plan_what(op));
}

std::unique_ptr<transfer_between_nodes> transfer_plan_blocks(std::shared_ptr<node_context> ctx,
                                                             const transfer_geometry& g,
                                                             const nodes_route& route, int tag) {
  return std::make_unique<transfer_plan_slabs>(std::move(ctx), g, route, tag);
}

}  // namespace zcoll
