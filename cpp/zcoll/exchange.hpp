/*
 * Exchange: one node's part of a collective, executed as an ordered list of block copies
 * between two barriers, on a per-communicator node context.
 *
 * One call (no MPI anywhere):
 *   1. the arguments are checked locally (checks.hpp) and "auto" is resolved (auto_policy.hpp);
 *   2. the ranks publish their calls and agree on them (protocol.hpp): on an argument error
 *      anywhere, every rank raises the same error and nothing is copied;
 *   3. private (non-arena) buffers are either pulled by CMA (cma.hpp: calls receiving at
 *      least the policy's cma_bytes per rank, not in place: each rank copies its incoming blocks
 * straight from the senders' buffers into its own, one copy) or staged through a per-rank staging
 *      partition (segments.hpp: one extra copy on each side and one extra barrier);
 *   4. otherwise rank i copies segment i of the schedule (schedule.hpp) with the copy kernels
 *      (copy.hpp);
 *   5. barrier; receive buffers that were staged are copied out.
 * Blocks are addressed by communicator rank, so the same code runs the node-local part of a
 * communicator that spans several nodes (Python moves the rest with MPI point-to-point, after
 * the ranks of all nodes agreed on call records this context describes).
 *
 * Small messages under order="auto" take an eager path instead: each rank copies its data into
 * its own slot of an eager segment, one barrier, then each rank pulls its receive row from the
 * peers' slots. Two copies instead of one, but one barrier instead of two. Slots and
 * descriptor lines alternate by barrier parity, so a rank that races ahead into its next call
 * never overwrites what a slow peer is still reading: no completion barrier is needed.
 *
 * Global transposes (transfer.hpp) run on the same context; their execution is in
 * transfer_exec.cpp. After a peer failure the context is broken for good and every later call
 * says so.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "zcoll/arena.hpp"
#include "zcoll/auto_policy.hpp"
#include "zcoll/checks.hpp"
#include "zcoll/cma.hpp"
#include "zcoll/protocol.hpp"
#include "zcoll/reduction.hpp"
#include "zcoll/schedule.hpp"
#include "zcoll/segments.hpp"
#include "zcoll/transfer.hpp"

namespace zcoll {

class v_exchange;
class node_messages;
struct node_map;

// One rank's arguments to one collective, checked and resolved.
struct collective_args {
  op_code op = op_code::alltoall;
  const void* send = nullptr;  // nullptr: in place (the receive buffer holds the data)
  std::size_t send_bytes = 0;
  void* recv = nullptr;
  std::size_t recv_bytes = 0;
  std::size_t block_bytes = 0;  // bytes per rank-to-rank block
  dtype_id dtype;
  block_order order = block_order::morton;
  bool eager = false;  // small message: one barrier through the eager slots
  // order "auto" beyond the eager size: through the eager slots all the same when every rank's
  // buffers are private (auto_policy::eager_takes), decided once they have published
  bool slots_if_private = false;
  int copy = auto_copy;  // copy_mode of the block copies, or auto_copy (see copy_choice.hpp)
};

struct pull_failure;

class node_context {
  friend class node_messages;  // stages private buffers as execute() does

 public:
  // Bytes of the control segment for `size` node ranks (created and shared by the caller).
  static std::size_t control_bytes(int size) noexcept { return call_protocol::control_bytes(size); }

  node_context(std::shared_ptr<shm_segment> control, context_config config);
  ~node_context();
  node_context(const node_context&) = delete;
  node_context& operator=(const node_context&) = delete;

  // Collective: every node rank allocates `bytes` (may differ per rank) in the arena.
  std::shared_ptr<arena_block> allocate(std::size_t bytes) { return segments_.allocate(bytes); }
  // Collective: checks one rank's arguments of an alltoall or allgather, raises on every rank
  // if any rank's are wrong, else runs it. `order` is a block_order value, auto_order or
  // eager_order; `copy` a copy_mode value or auto_copy.
  // order="auto" runs an online trial's candidate where online tuning is on (online_tuner.hpp).
  void run(op_code op, const array_view* send, const array_view& recv, int order, int copy) {
    if (order == auto_order && policy_.online().enabled()) return run_online(op, send, recv, copy);
    run_resolved(op, send, recv, order, copy);
  }
  // The local checks of such a call and what "auto" resolves to; when they fail, this rank
  // publishes the error and every rank raises it (collective only then).
  collective_args checked_args(op_code op, const array_view* send, const array_view& recv,
                               int order, int copy);
  // Local: the record of such a call that ranks on other nodes compare (agree() in
  // protocol.hpp): the local verdict, or the call as asked ("auto" unresolved).
  call_record describe(op_code op, const array_view* send, const array_view& recv, int order,
                       int copy) const;
  // Collective: the node's part of a global transpose (blocks between ranks of this node);
  // checks the arguments like run(). `order` is a block_order value or auto_order.
  void run_transfer(const transfer_geometry& g, const array_view& send, const array_view& recv,
                    int order, int copy);
  // Local: the record of a transfer call, as describe() for collectives.
  call_record describe_transfer(const transfer_geometry& g, const array_view& send,
                                const array_view& recv, int order, int copy) const;
  // Collective: a call of the reduction family among the ranks of this node (reduction.hpp,
  // its execution in reduction.cpp); checks the arguments like run().
  void run_reduction(const reduction_call& call);
  // Local: the record of such a call, as describe() for collectives.
  call_record describe_reduction(const reduction_call& call) const;
  // The irregular collectives of this context (vexchange.hpp): patterns and their calls.
  v_exchange& irregular();
  // The rounds of messages between nodes (aggregate.hpp): every multi-node call's agreement
  // and the aggregated alltoall. Made on first use from `nodes` (ignored afterwards).
  node_messages& between_nodes(const node_map& nodes);
  // The rounds between nodes if made (nullptr: one node, or closed), without the usability
  // check: for what is asked about a broken or closed context (its rounds' failure).
  node_messages* rounds() noexcept { return between_nodes_.get(); }
  // Collective: this rank found its arguments invalid; every rank throws (type from `kind`).
  [[noreturn]] void fail(arg_error kind, std::string_view message);
  // Collective: a node barrier.
  void barrier();
  // Collective: enables the eager path for calls receiving at most `bytes` per rank (0: never).
  void setup_eager(std::size_t bytes);
  // Local: the same in `area`, memory every node rank has mapped (a node pool's block,
  // pool.hpp), one partition of node_pool::shape::eager_partition() bytes per rank; throws
  // when `bytes` does not fit it.
  void use_eager(std::shared_ptr<shm_segment> area, std::size_t partition, std::size_t bytes);
  // Local, before any call: arrays come from `arena` (this context's node pool's) first.
  void use_pool_arena(std::shared_ptr<pool_arena> arena) {
    protocol_.check_usable();
    segments_.use_pool_arena(std::move(arena));
  }
  // Largest per-rank receive size the eager path takes (0: no eager path).
  std::size_t eager_bytes() const noexcept { return policy_.eager_bytes(); }
  // Local (same on every node rank): the tuning rules of a tuned collective.
  void set_tuning_rules(op_code op, std::vector<order_rule> orders, std::vector<copy_rule> copies) {
    policy_.set_rules(op, std::move(orders), std::move(copies));
  }
  const auto_policy& policy() const noexcept { return policy_; }
  auto_policy& policy() noexcept { return policy_; }
  // Local: where [p, p + bytes) is (segment 0 when no rank of this context can map it; the
  // offset is then its address here).
  buffer_ref where(const void* p, std::size_t bytes) { return segments_.locate(p, bytes); }
  // Local: a view of `bytes` at `ref` (published by a peer); keeps the mapping alive.
  std::shared_ptr<arena_block> view(const buffer_ref& ref, std::size_t bytes) {
    return segments_.view(ref, bytes);
  }
  // Local: unmaps everything this context owns; later calls raise. Arrays stay valid.
  void close() noexcept;

  bool closed() const noexcept { return protocol_.closed(); }
  bool broken() const noexcept { return protocol_.broken(); }
  const context_config& config() const noexcept { return config_; }
  void set_wait_options(const wait_options& w) noexcept {
    if (!protocol_.closed()) protocol_.barrier().set_options(w);
  }
  // Called before any wait of this context starts yielding or sleeping (see block_hook).
  void set_block_hook(block_hook hook) noexcept {
    if (!protocol_.closed()) protocol_.barrier().set_block_hook(hook);
  }
  std::size_t arena_bytes_in_use() const { return segments_.bytes_in_use(); }
  std::size_t segment_count() const noexcept { return segments_.count(); }
  std::uint64_t calls() const noexcept { return protocol_.calls(); }

  // For persistent plans (plan.hpp), which run fixed calls on this context's protocol.
  call_protocol& protocol() noexcept { return protocol_; }
  node_segments& segments() noexcept { return segments_; }
  // Node rank `rank`'s eager slot of barrier parity `parity`.
  std::byte* eager_slot(int rank, std::size_t parity) const noexcept {
    return eager_->partition(rank) + parity * policy_.eager_capacity();
  }
  // The schedule this context uses for `op` (in place or not) and `order` (numa: over the node
  // ranks' NUMA nodes, config().numa_nodes).
  const schedule& schedule_for(op_code op, bool in_place, block_order order);
  // Base address of every node rank's buffer (`recv` or `send` side) published for a call that
  // cannot stage; throws the same error on every rank when one is not in the arena.
  void resolve_all(const call_protocol::published& all, bool send_side,
                   std::vector<std::byte*>* bases);
  // Collective the first time: whether the node ranks can read each other's private memory
  // (cma.hpp); the same answer on every rank.
  bool cma_usable() {
    using state = cross_memory::state;
    return cma_.current() == state::untested ? probe_cma(false) : cma_.current() == state::works;
  }
  // Collective: probes again (cma.hpp; `publish_unmapped`: as a refusing kernel, for tests).
  bool probe_cma(bool publish_unmapped) {
    const bool usable = cma_.probe(protocol_, publish_unmapped);
    segments_.publish_heap(usable);  // peers may map this rank's heap (heap.hpp)
    return usable;
  }
  const cross_memory& cma() const noexcept { return cma_; }
  // Publishes this rank's first failed CMA read or write of a call in its slot (none: no
  // failure), for raise_failed_pulls after the call's next barrier.
  void publish_pull_failure(const pull_failure& failed) noexcept;
  // After the barrier that follows publish_pull_failure: raises the first rank's failure, the
  // same error on every rank (a failed push spoils its receiver's result, a failed tile read
  // every rank's).
  void raise_failed_pulls();
  // Local: the CMA verdict of a probe among ranks that include this node's (its node pool's).
  void adopt_cma(cross_memory::state verdict, std::string refusal) {
    cma_.adopt(verdict, std::move(refusal));
    segments_.publish_heap(verdict == cross_memory::state::works);
  }
  // Collective when it probes: whether a call (not in place) whose ranks receive `recv_bytes`
  // each, published with a buffer outside shared memory, pulls it by CMA rather than staging
  // it. Callers pass what every rank agreed on, so every rank gets the same answer.
  bool pulls_private(std::size_t recv_bytes) {
    return config_.size > 1 && policy_.pulls(recv_bytes) && cma_usable();
  }
  // Whether a reduction of `bytes` per rank leaves private inputs where they are, for the tiled
  // algorithm to pull (the same answer on every rank: the size is agreed, the CMA verdict is
  // the node's; eager calls copy their inputs into the eager slots instead).
  bool pulls_reduction_inputs(std::size_t bytes, op_code op) const {
    return config_.size > 1 && !policy_.eager_fits(bytes) && policy_.pulls_reduction(bytes, op) &&
           cma_.current() == cross_memory::state::works;
  }
  // What algorithm="auto" runs for an allreduce of `bytes` per rank (`private_inputs`: some
  // rank's input is outside shared memory).
  reduce_algorithm reduction_choice(std::size_t bytes, bool private_inputs) const {
    return policy_.choose_reduction(
        bytes, private_inputs && pulls_reduction_inputs(bytes, op_code::allreduce));
  }
  // A new plan id: plans are created collectively, so every rank numbers them alike.
  std::uint64_t next_plan_id() noexcept { return ++plans_; }

 private:
  // Fills `args` for a call whose local checks passed (`check`), resolving "auto"; sets
  // `check` to the error when the call cannot run as asked (the eager path too small).
  void prepare(op_code op, const array_view* send, const array_view& recv, int order, int copy,
               local_check& check, collective_args& args) const;
  // run() with `order` taken as it is (an online trial's candidate, or what the caller asked).
  void run_resolved(op_code op, const array_view* send, const array_view& recv, int order,
                    int copy) {
    const collective_args args = checked_args(op, send, recv, order, copy);
    if (args.eager)
      execute_eager(args);
    else
      execute(args);
  }
  // run() of an order="auto" call under online tuning: the trial's candidate, timed, and the
  // node's agreement once the trial is complete; or its settled choice.
  void run_online(op_code op, const array_view* send, const array_view& recv, int copy);
  void execute(const collective_args& args);
  void execute_eager(const collective_args& args);
  // The eager path's halves: this rank's data into its slot; its blocks out of every slot.
  void fill_eager_slot(const collective_args& args, std::size_t parity);
  void read_eager_slots(const collective_args& args, std::size_t parity);
  // Whether a published call with a private buffer pulls it by CMA (same on every rank).
  bool pulls(const collective_args& args) {
    return args.send != nullptr && pulls_private(args.recv_bytes);
  }
  // Each rank copies its incoming blocks from the senders' buffers, by CMA where private.
  void execute_pulls(const collective_args& args, const call_protocol::published& all);
  void stage_in(const collective_args& args, std::size_t send_part, const buffer_ref& my_send,
                const buffer_ref& my_recv);
  void execute_transfer(const transfer_geometry& g, const array_view& send, const array_view& recv,
                        block_order order, int copy);
  struct reduction_args;
  reduction_args checked_reduction(const reduction_call& call);
  void execute_reduction(const reduction_args& a);
  void execute_bcast(const reduction_args& a);
  // This rank's line of a reduction: the call, and where peers read its input (copied into its
  // eager slot or staging partition when they could not read it where it is).
  void publish_reduction_input(const reduction_args& a, detail::rank_line& line, std::size_t parity,
                               bool eager, bool may_pull, std::size_t third);
  // The algorithms of reduction.hpp, each once every rank's input is known (resolved_reduction):
  // the small flat call from the eager slots, then flat, tiled, tree and dissemination.
  struct resolved_reduction;
  void reduce_eager_flat(const resolved_reduction& r, std::size_t parity);
  void reduce_flat(const resolved_reduction& r);
  void reduce_tiled(const resolved_reduction& r);
  void reduce_tree(const resolved_reduction& r);
  void reduce_dissemination(const resolved_reduction& r);
  // Where each node rank's input is, from the published lines (staging what must be; with
  // `pull`, private peers' inputs are left null for fold_pulled_tile).
  void resolve_inputs(const reduction_args& a, const std::vector<buffer_ref>& refs,
                      std::size_t third, bool pull);
  // Folds bytes [off, off + len) of every input into `work`, pulling private peers' parts by
  // CMA a piece at a time; publishes this rank's first failed read (publish_pull_failure).
  void fold_pulled_tile(const reduction_args& a, std::size_t off, std::size_t len, std::byte* work);

  context_config config_;
  call_protocol protocol_;
  node_segments segments_;
  auto_policy policy_;
  cross_memory cma_;
  std::shared_ptr<data_segment> eager_;  // two slots of the eager capacity per rank, by parity
  std::map<schedule_spec, schedule> schedules_;      // by (kind, order, numa domains)
  std::vector<std::byte*> send_bases_, recv_bases_;  // per call, kept to avoid reallocating
  std::vector<std::uint64_t> pull_from_;             // per pulled call: private send buffers
  std::uint64_t plans_ = 0;                          // plans created
  std::unique_ptr<v_exchange> irregular_;            // made on first use
  std::unique_ptr<node_messages> between_nodes_;     // made on first use (several nodes)
  std::vector<std::vector<tree_group>> tree_;        // reductions' tree (made on first use)
  std::vector<const std::byte*> inputs_;             // per reduction: each node rank's input
  std::vector<buffer_ref> refs_;                     // per reduction: the published inputs
  std::vector<const void*> srcs_;                    // per reduction: a fold's sources
  std::vector<std::byte> pull_scratch_;              // per pulled reduction: peers' pieces
};

// Where an alltoall's or allgather's blocks come from when a rank pulls its receive row (CMA
// path): per node rank, its send buffer mapped here, or (mapped null) its address in that
// process; `own` is this rank's send buffer.
struct row_source {
  const std::byte* const* mapped;
  const std::uint64_t* remote;
  const std::byte* own;
};
// The first read of a pull that failed: its errno (0: none) and the node rank read from.
struct pull_failure {
  int error = 0;
  int from = 0;         // or, when `pushed`, the node rank written to
  bool pushed = false;  // a process_vm_writev (split_pulls), not a read
};
// This rank's receive row (the node ranks' blocks of `block` bytes) copied into `recv` from
// `from`: mapped buffers by memcpy, private ones by CMA. Every read is tried.
pull_failure pull_row(const cross_memory& cma, const context_config& config, op_code op,
                      std::size_t block, const row_source& from, std::byte* recv) noexcept;
// Throws the failure as std::system_error naming the rank (after the completion barrier).
[[noreturn]] void raise_pull_failure(const pull_failure& failed, const call_protocol& protocol);

// The kind of schedule `op` (alltoall or allgather), in place or not, runs.
schedule_kind schedule_kind_of(op_code op, bool in_place) noexcept;

// One rank's part of an alltoall or allgather: copies the blocks of `segment` between the node
// ranks' buffers (`send`, `recv`: base address of each node rank's buffer; `send` unused in
// place). Node rank j's blocks sit at index comm_ranks[j] of a buffer. The engine's one mapping
// from a schedule to copies; tools/replay.cpp replays it in one process.
void copy_segment(std::span<const block_coord> segment, op_code op, bool in_place,
                  std::size_t block, std::byte* const* send, std::byte* const* recv,
                  const int* comm_ranks, const copy_plan& how) noexcept;

// The bound on every wait of `ctx` (ZCOLL_TIMEOUT, zcoll.set_timeout), between nodes too.
inline double wait_timeout(node_context& ctx) {
  return ctx.protocol().barrier().options().timeout_s;
}

}  // namespace zcoll
