/*
 * Call protocol: how the ranks of a node agree on one call before any byte moves.
 *
 *   1. each rank writes a descriptor of its call (operation, sizes, dtype, order, where its
 *      buffers are as (segment id, offset), or an argument error it found locally) into its
 *      line of the control segment; lines alternate by barrier parity, so a fast rank's next
 *      call never overwrites what a slow rank is still reading;
 *   2. barrier;
 *   3. every rank reads every descriptor and checks they agree (check_calls). All ranks see
 *      the same data, so they all reach the same verdict: either every rank raises the same
 *      error (nothing was copied, nothing corrupted) or every rank goes on.
 *
 * The verdict is computed by one function over "the ranks' calls", however they were gathered:
 * a node's descriptor lines here, or the call records a communicator spanning several nodes
 * allgathers through MPI (the binding's agree()). So both paths raise the same errors.
 *
 * A rank whose barrier fails (dead or missing peer) marks the protocol broken for good: every
 * later call says why.
 */
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zcoll/arena.hpp"
#include "zcoll/barrier.hpp"
#include "zcoll/checks.hpp"
#include "zcoll/options.hpp"
#include "zcoll/registry.hpp"

namespace zcoll {

// How the context was set up: which node ranks, which communicator ranks, how to wait.
struct context_config {
  int rank = 0;                    // this process among the node's ranks
  int size = 1;                    // ranks of the communicator on this node
  int comm_size = 1;               // ranks of the whole communicator (blocks per buffer)
  std::vector<int> comm_ranks;     // communicator rank of each node rank
  std::vector<std::int32_t> pids;  // pid of each node rank
  barrier_kind barrier = barrier_kind::central;
  wait_options wait;
  std::vector<int> numa_nodes;  // NUMA node of each node rank (empty: unknown), for reductions
  std::vector<int> packages;    // package of each node rank (empty: unknown)
  std::vector<int> l3_caches;   // L3 cache of each node rank (empty: unknown)
};

// What one rank says about one call: everything the ranks must agree on.
struct call_descriptor {
  op_code op = op_code::none;
  std::int8_t order = 0;  // block_order value, auto_order (multi-node records) or eager_order
  std::uint8_t flag = 0;  // collectives: in_place_flag, eager_slot_flag; allocate: it fits
  arg_error error = arg_error::none;
  dtype_id dtype;
  op_code target = op_code::none;  // plan and start: the collective planned
  std::uint8_t reduce = 0;         // reductions: the reduce_op code (order: the algorithm asked)
  std::uint16_t root = 0;          // reduce and bcast: the root (communicator rank mod 2^16)
  std::uint64_t block_bytes = 0;   // bytes per block; allocate: bytes asked; transfer: signature;
                                   // start: the plan's id; reductions: bytes of the input
};
static_assert(sizeof(call_descriptor) == 24, "the descriptor must fit the rank's hot line");

// A collective's flag bits: in place (the same on every rank); this rank's data is in its eager
// slot (a rank's own: its buffers are private, exchange.hpp's slots_if_private).
inline constexpr std::uint8_t in_place_flag = 1;
inline constexpr std::uint8_t eager_slot_flag = 2;

inline constexpr std::size_t message_bytes = 240;

// A call with its error message, as one rank publishes it to ranks on other nodes.
struct call_record {
  call_descriptor call;
  char message[message_bytes] = {};  // why the arguments are invalid, when call.error is set
};

// Copies `text` into `dst`, cut to fit, NUL-terminated.
void set_text(char* dst, std::size_t capacity, std::string_view text) noexcept;

// A record of a call that failed the local checks with `kind` and `message`.
call_record error_record(arg_error kind, std::string_view message) noexcept;

namespace detail {
[[noreturn]] void raise_rank_error(int rank, arg_error kind, const char* message);
[[noreturn]] void raise_different_ops(int rank0, op_code op0, int rank, op_code op);
[[noreturn]] void raise_unexpected_op(op_code expected, op_code got);
// Throws when `d` (rank `rank`) differs from `ref` (rank `ref_rank`) in what must agree.
void check_same_call(const call_descriptor& ref, int ref_rank, const call_descriptor& d, int rank);
[[noreturn]] void raise_different_plans(int rank0, const call_descriptor& d0, int rank,
                                        const call_descriptor& d);
}  // namespace detail

// The verdict over every rank's call. `Calls` has size(), call(j) -> const call_descriptor&,
// message(j) -> const char* and rank(j) -> communicator rank. Throws, in this order: the first
// rank's own argument error (type_mismatch or usage_error); different operations; a call that
// is not `expected`.
template <class Calls>
void check_calls(const Calls& calls, op_code expected) {
  const int n = calls.size();
  for (int j = 0; j < n; ++j)
    if (calls.call(j).op == op_code::error)
      detail::raise_rank_error(calls.rank(j), calls.call(j).error, calls.message(j));
  for (int j = 1; j < n; ++j)
    if (calls.call(j).op != calls.call(0).op)
      detail::raise_different_ops(calls.rank(0), calls.call(0).op, calls.rank(j), calls.call(j).op);
  if (n && calls.call(0).op != expected) detail::raise_unexpected_op(expected, calls.call(0).op);
}

// Throws when the ranks' calls differ in in-place use, dtype, block size or order.
template <class Calls>
void check_arguments(const Calls& calls) {
  for (int j = 1; j < calls.size(); ++j)
    detail::check_same_call(calls.call(0), calls.rank(0), calls.call(j), calls.rank(j));
}

// Throws when the ranks' starts (check_calls passed for op_code::start) run different plans.
template <class Calls>
void check_same_plan(const Calls& calls) {
  for (int j = 1; j < calls.size(); ++j)
    if (calls.call(j).block_bytes != calls.call(0).block_bytes)
      detail::raise_different_plans(calls.rank(0), calls.call(0), calls.rank(j), calls.call(j));
}

// Collective across nodes: the verdict over records gathered from every communicator rank
// (index = rank): check_calls, then check_arguments for calls that move data, check_same_plan
// for the runs of persistent plans.
void agree(std::span<const call_record> records, op_code expected);

namespace detail {

// The one cache line a rank publishes per step: its barrier arrival count and the descriptor
// of the call it is making. Fields are written before `entered` is released and read by peers
// after they acquire it; a rank rewrites them only after a barrier that follows every read.
struct alignas(cache_line) rank_line {
  std::atomic<std::uint64_t> entered;  // barrier arrivals (see barrier.hpp)
  call_descriptor call;
  buffer_ref send, recv;
};
static_assert(sizeof(rank_line) == cache_line, "the descriptor must fit one cache line");

// Cold per-rank data: error text, segment-creation status, the CMA probe (cma.hpp).
struct alignas(cache_line) rank_slot {
  char message[message_bytes];  // why this rank's arguments are invalid
  std::int32_t status;          // segment creation: 0 or failed
  char status_message[message_bytes];
  call_record record;            // this rank's call in a round between nodes (aggregate.hpp)
  std::uint64_t cma_address;     // the probe word's address in this process
  std::int32_t cma_error;        // 0, or the errno of this rank's failed probe read
  std::int32_t cma_failed_from;  // the node rank that read failed from
  // A call's first failed pull or push (node_context::publish_pull_failure): apart from the
  // probe's fields, which a probe in the same call still reads after its last barrier.
  std::int32_t pull_error;        // 0, or its errno
  std::int32_t pull_failed_from;  // the node rank read from, or written to
  std::int32_t pull_pushed;       // 1: a write (a push)
};

struct alignas(cache_line) control_header {
  barrier_shared barrier;
  // Announcement of a new segment, written by the leader between two barriers.
  char segment_name[128];
  std::uint64_t segment_id;
  std::uint64_t segment_partition;
  std::int32_t segment_status;
  char segment_message[message_bytes];
};

}  // namespace detail

// A call this rank has started but not finished: a started persistent plan, arrived at its
// completion barrier. The protocol finishes it before this rank's next call of any kind, so
// calls complete in the order they were started (MPI's rule for collectives).
class pending_call {
 public:
  virtual void finish() = 0;

 protected:
  ~pending_call() = default;
};

class call_protocol {
 public:
  // Every rank's descriptor published at one barrier.
  struct published {
    const detail::rank_line* lines;
    const detail::rank_slot* slots;
    const int* comm_ranks;
    std::size_t parity;
    int count;
    int size() const noexcept { return count; }
    const detail::rank_line& line(int r) const noexcept {
      return lines[2 * static_cast<std::size_t>(r) + parity];
    }
    const call_descriptor& call(int r) const noexcept { return line(r).call; }
    const char* message(int r) const noexcept { return slots[static_cast<std::size_t>(r)].message; }
    int rank(int r) const noexcept { return comm_ranks[r]; }
  };

  // Bytes of the control segment for `size` node ranks (created and shared by the caller).
  static std::size_t control_bytes(int size) noexcept;

  call_protocol(std::shared_ptr<shm_segment> control, const context_config& config);

  // This rank's descriptor line of its next call, cleared, with `op` set. Throws when the
  // protocol is closed or broken.
  detail::rank_line& next(op_code op);
  // Barrier; then every rank's descriptor of this call.
  published publish();
  // Every rank's descriptor published at a completed barrier of parity `parity`.
  published view(std::size_t parity) const noexcept {
    return {lines_, slots_, comm_ranks_.data(), parity, size_};
  }
  // Barrier (store fence first) that marks the protocol broken when it throws.
  void sync();
  // The same in two phases (see node_barrier::arrive); complete() and poll() mark the protocol
  // broken when they throw.
  void arrive(bool fence);
  void complete();
  bool poll();
  // The started call to finish before the next one (nullptr: none); see pending_call.
  void set_pending(pending_call* call) noexcept { pending_ = call; }
  pending_call* pending() const noexcept { return pending_; }
  // Finishes the pending call, if any.
  void finish_pending() {
    if (pending_call* call = pending_) {
      pending_ = nullptr;
      call->finish();
    }
  }
  // Collective: this rank found its arguments invalid; every rank throws (type from `kind`).
  [[noreturn]] void fail(arg_error kind, std::string_view message);

  void check_usable() const;
  void mark_broken(std::string reason) { broken_reason_ = std::move(reason); }
  bool broken() const noexcept { return !broken_reason_.empty(); }
  void close() noexcept;
  bool closed() const noexcept { return closed_; }

  detail::control_header& header() noexcept { return *header_; }
  detail::rank_slot& slot(int node_rank) noexcept { return slots_[node_rank]; }
  node_barrier& barrier() noexcept { return *barrier_; }
  std::uint64_t calls() const noexcept { return calls_; }
  // Node barriers this rank has completed on the context; 0 once it is closed.
  std::uint64_t barriers() const noexcept { return barrier_ ? barrier_->completed() : 0; }
  int comm_rank(int node_rank) const noexcept {
    return comm_ranks_[static_cast<std::size_t>(node_rank)];
  }
  // "rank N": how messages name node rank `node_rank` (by its communicator rank).
  std::string rank_name(int node_rank) const;

  // Parity of the barrier the next publication goes with (what alternates lines and slots).
  std::size_t parity() const noexcept { return (barrier_->completed() + 1) & 1; }

 private:
  template <class Step>
  auto marking_broken(Step step);

  std::shared_ptr<shm_segment> control_;
  detail::control_header* header_ = nullptr;
  detail::rank_line* lines_ = nullptr;                   // two per node rank (by parity)
  detail::barrier_rank_words* barrier_words_ = nullptr;  // one per node rank
  detail::rank_slot* slots_ = nullptr;                   // one per node rank
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> comm_ranks_;
  std::unique_ptr<node_barrier> barrier_;
  std::uint64_t calls_ = 0;
  pending_call* pending_ = nullptr;
  bool closed_ = false;
  std::string broken_reason_;
};

}  // namespace zcoll
