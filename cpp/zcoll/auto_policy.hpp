/*
 * Auto policy: what order="auto" and copy="auto" resolve to for one call.
 *
 * Order: calls in which each rank receives at most the eager size take the eager path (two
 * copies, one barrier: what dominates small calls, far more so when ranks outnumber cores);
 * larger ones the built-in default_order: numa (TPDS'18 §2.4) whenever the node's ranks span
 * more than one NUMA node (each domain then writes only its own receive buffers, and cross-domain
 * reads are staggered; one rank per domain is row order with staggered sources), else row for
 * P <= 2 and Morton otherwise. A tuning-table
 * rule (python -m zcoll.tune, set_rules) for the call's block size overrides this: its order,
 * or the eager path where the call fits it. Every rank of a node holds the same rules
 * (broadcast at context creation) and the same eager size, so they all resolve "auto" alike --
 * they must, since the order is part of what the ranks agree on.
 *
 * Reductions (HPDC'13 §3.4): algorithm="auto" picks the algorithm with the least predicted
 * time a + b*m for a call of m bytes, from a cost model per algorithm: pieces (up to max_bytes:
 * a seconds + b seconds per byte) measured by python -m zcoll.tune and set from the tuning
 * table (set_reduction_model), or built-in estimates from the algorithms' barriers and memory
 * traffic where no table covers this node size. The model and m are the same on every rank, so
 * the choice is too.
 *
 * Buffers outside shared memory (cma.hpp): an exchange in which each rank receives at least
 * cma_bytes() pulls its blocks from the senders' private memory by CMA (one copy, two barriers,
 * a system call per block); less than that, where every rank's buffers are private, goes through
 * the eager slots (two copies, one barrier; eager_takes); anything else smaller is staged (three
 * copies and one more barrier, no system call). The threshold is the slots' capacity (16 KiB).
 * Measured at P = 2 and 4 on every exchange (EPYC VM, 2 vCPUs, 32 MiB L3;
 * tools/measure/irregular_paths.py, the bench's counts, each path forced in turn within one
 * launch; docs/performance.md, "Plain arrays: the slots up to their capacity"): the slots beat CMA
 * by 1.6-3x up to 16 KiB at P = 2, where a pull's floor is 4-6 us against the slots' 1-3, in each
 * of the VM's two states. Beyond them staging beat CMA by 7-25 % up to 20-37 KiB (and further with
 * send buffers rewritten before each call) in the VM's fast state, but lost by 1.8-1.9x in its slow
 * one (cross-vCPU copies of freshly written lines twice as slow), down to 0.72x MPI, where CMA
 * stayed ahead of MPI in both: so beyond the slots, CMA.
 *
 * Irregular calls (vexchange.hpp) decide the eager path after the ranks publish, each rank by
 * eager_takes(): within the eager size, and -- a rank whose buffers are outside shared memory --
 * up to the CMA size where the slots hold it; beyond it, Morton order.
 *
 * Online tuning (ZCOLL_TUNING=online): order="auto" calls of a size no rule covers try every
 * order first and keep the fastest, agreed on by the node's ranks (online_tuner.hpp); the
 * context runs the trials, the policy keeps their state.
 *
 * Copy: delegated to copy_chooser (copy_choice.hpp), which may differ between ranks (copy modes
 * change no result). timed_copies() runs a call's copies and feeds the chooser's run-time
 * threshold refinement when it asks for timings.
 *
 * Across nodes: delegated to crossing_policy (crossing_policy.hpp), made with the node map by
 * the context's first call across nodes: what a call carries in the round of messages, an
 * allgather's route beyond it, what tests force. So one object per context holds every choice
 * a call makes, on one node or several.
 */
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "zcoll/copy_choice.hpp"
#include "zcoll/crossing_policy.hpp"
#include "zcoll/online_tuner.hpp"
#include "zcoll/registry.hpp"

namespace zcoll {

// A tuning-table rule for order="auto" on blocks in `range`.
struct order_rule {
  block_range range;
  int order = auto_order;  // block_order value, eager_order, or auto_order (built-in)
};

// One piece of a reduction algorithm's cost model: calls of at most `max_bytes` (and more than
// the previous piece's) take a + b * bytes seconds.
struct reduction_cost {
  std::uint64_t max_bytes = 0;
  double a = 0;  // seconds
  double b = 0;  // seconds per byte
};

// What order="auto" resolves to for one call.
struct auto_choice {
  block_order order = block_order::row;  // the ordered schedule, also when `eager` is set
  bool eager = false;                    // take the eager path
  bool from_rule = false;                // a tuning rule decided (not the built-in rule)
};

// This thread's CPU time in seconds. The refinement times copies with it rather than the wall
// clock: a rank descheduled mid-copy (other processes on the node's cores) would otherwise
// decide the choice more than the copies do.
double thread_cpu_seconds() noexcept;

// Order used for order="auto" when no tuning table says otherwise, for p ranks spanning
// `numa_domains` NUMA nodes.
block_order default_order(int p, std::size_t block_bytes, int numa_domains = 1) noexcept;

// Bytes per rank an exchange receives from which it pulls private buffers by CMA under the
// built-in rule (above).
inline constexpr std::size_t default_cma_bytes = std::size_t{16} << 10;
// Reductions pull private inputs from 4 MiB per rank. Measured, P = 2 and 4, plain float64
// inputs (docs/performance.md, "Reductions on plain arrays"): staged flat beat pulled tiled for
// allreduce up to 1 MiB (by 16-60 %), tied at 4 MiB and lost by 1.5x at 16 MiB. A reduce, where
// only the root needs the result, alike (tools/measure/reduce_private.py reduce, staged flat
// against pulled tiled, in the OSU loop and with inputs rewritten before each call as a
// program's are; "reduce of plain arrays: the pull threshold"): on the EPYC VM, P = 2, pulled
// tiled won with rewritten inputs at 4 MiB in four launches of six (by 4-34 %) and lost the OSU
// loop in five (by 10-34 %), and won both from 8 MiB in every launch, by 7-40 % (P = 2 and 4); on
// the Xeon VM it won both at 4 MiB by 16-31 %. A pull reads a peer's piece with a system call and
// a page pin, which staging's in-cache copies undercut until the inputs outgrow the cache.
inline constexpr std::size_t default_reduction_pull_bytes = std::size_t{4} << 20;
// A bcast pulls a private root buffer from 1 MiB. Measured, plain float64 buffers, staged
// against pulled (ZCOLL_CMA_BYTES never and 0), two rounds each: staging (the root's one copy
// into shared memory, then each rank's copy out, in cache) was 3-6x faster from 8 to 256 KiB and
// 1.8x at 1 MiB at P = 2, 2-3x from 32 KiB to 2 MiB at P = 4; pulling won from 4 MiB (P = 4),
// where the buffers leave the cache. Both are the defaults: a tuning table measured on the
// machine (zcoll.tune's pulls sweep) replaces them; the EPYC VM's bcast pulls from 5.66 MiB
// (docs/performance.md). A forced exchange threshold (ZCOLL_CMA_BYTES, tests) scales both by
// its ratio to default_cma_bytes: 0 pulls every size, "never" never pulls.
inline constexpr std::size_t default_bcast_pull_bytes = std::size_t{1} << 20;
// The calls that pull private buffers from a threshold of their own: bcast, allreduce, reduce,
// reduce_scatter (pulled_index); the tuning table may set each (auto_policy::set_pull_bytes).
inline constexpr std::size_t pulled_calls = 4;
// Where `op`'s pull threshold is kept, or pulled_calls for a call without one.
std::size_t pulled_index(op_code op) noexcept;
// The built-in pull threshold of `op` (bcast, allreduce, reduce, reduce_scatter) when the
// exchanges pull from `cma_bytes`: its default scaled by cma_bytes / default_cma_bytes ("never"
// stays never). Throws std::invalid_argument for another op.
std::size_t builtin_pull_bytes(op_code op, std::size_t cma_bytes = default_cma_bytes);
// Fewest bytes per contiguous run for a strided pull (a transfer's boxes): the kernel pins
// the pages of every run, so short runs cost more than staging's two local copies. Measured
// (transfers, P = 2): runs of 512 B pull 1.6x slower than staging, of 1 KiB 1.5x faster.
inline constexpr std::size_t default_cma_run_bytes = 1024;
// Fewest bytes a sender pushes into a receiver that holds more than its share of a pulled
// irregular exchange (vexchange.hpp: split_pulls). A push is one more system call on a rank
// that would otherwise wait at the completion barrier, and where ranks outnumber cores that
// rank is not idle. Measured (tools/measure/uneven_pulls.py busy, every rank sending X to rank
// 0 only, Xeon VM with 2 vCPUs, docs/performance.md): pushing X won from 8 KiB at P = 2 (by
// 8-13 % at 8-16 KiB, 19 % at 32 KiB) and tied below; at P = 3 it was -12 to +4 % at 8-16 KiB,
// +1 to +5 % from 32 KiB; at P = 4, +2-7 % from 8 KiB.
inline constexpr std::size_t default_cma_push_bytes = std::size_t{32} << 10;
// Senders push only into a receiver of at least this many times the mean load: the bench's
// alltoallv counts at P = 2 (same tool, `bench`) gained 2.4-2.7x at 1 MiB, where one rank
// receives every byte (twice the mean), and lost 4-7 % at 64 KiB, where the busiest receiver
// held 1.47 times the mean, most of it its own block (a local copy, cheaper than a pull).
inline constexpr std::uint64_t cma_push_load_factor = 2;

// Runs through MPI of a global transpose (zcoll.fft's Transfer) on a communicator without a
// context, before zcoll makes the context, work arrays and plans; `bytes_per_rank`: what a run
// moves on each rank. Ski rental: a run through MPI (one small agreement, then an Alltoallw of
// subarray datatypes, as mpi4py-fft runs it) costs no set-up, so runs stay with MPI while
// together they cost less than the set-up would. A Transfer run a few times (a test suite, a
// Pencil per stage) then never pays the set-up; one run many times pays it once, after MPI
// runs that cost about as much, so never more than about twice the better of the two. Linear
// models fitted at P = 2 (tools/measure/cold_transfers.py, docs/performance.md, "Cold
// transfers"): the set-up (a first zcoll run less a later one) 110 us plus 0.16 us per KiB per
// rank (the work arrays' first touch); a run through MPI 6 us plus 0.13 us per KiB. zcoll's
// later runs were as fast as MPI's on plain arrays, up to 2x faster on shared-heap ones. Every
// input is the same on every rank, so every rank counts alike.
inline double cold_setup_us(std::size_t bytes_per_rank) noexcept {
  return 110.0 + 0.16 * static_cast<double>(bytes_per_rank) / 1024.0;
}
inline double cold_mpi_run_us(std::size_t bytes_per_rank) noexcept {
  return 6.0 + 0.13 * static_cast<double>(bytes_per_rank) / 1024.0;
}
inline std::size_t cold_transfer_runs(std::size_t bytes_per_rank) noexcept {
  return static_cast<std::size_t>(cold_setup_us(bytes_per_rank) / cold_mpi_run_us(bytes_per_rank));
}
// A PFFT whose arrays take at most this many bytes per rank (a bound from its global shape) is
// made without a context while a node pool holds its ranks: its arrays come from the pool's arena
// with no communication, and its first calls run through MPI as above, so a plan made and run a
// few times never pays a context. Larger plans make their context and arrays collectively at
// construction: there the set-up is a small part of one call (a transform of 1 MiB per rank takes
// milliseconds), and the pool's region (8 MiB per rank) keeps room for the small ones.
inline constexpr std::size_t cold_array_bytes = std::size_t{1} << 20;
// The same rule for a plan of several transposes run together (a PFFT's forward or backward
// call), each moving `bytes_per_rank[i]`: calls stay with MPI while their transposes together
// cost less than the set-up of all of them (its arrays exist already, so the work arrays' first
// touch is counted as part of a context's set-up: the models are the Transfer's).
inline std::size_t cold_plan_runs(const std::vector<std::size_t>& bytes_per_rank) noexcept {
  double setup = 0.0, run = 0.0;
  for (const std::size_t bytes : bytes_per_rank) {
    setup += cold_setup_us(bytes);
    run += cold_mpi_run_us(bytes);
  }
  return run > 0.0 ? static_cast<std::size_t>(setup / run) : 0;
}

class auto_policy {
 public:
  // `numa_domains`: how many NUMA nodes the node's ranks span (numa_domain_count).
  explicit auto_policy(int node_size, int numa_domains = 1) noexcept
      : node_size_(node_size), numa_domains_(numa_domains) {}

  // The built-in order for blocks of `block_bytes` (default_order for this node).
  block_order builtin_order(std::size_t block_bytes) const noexcept {
    return default_order(node_size_, block_bytes, numa_domains_);
  }
  int numa_domains() const noexcept { return numa_domains_; }

  // Calls receiving at most `bytes` per rank may take the eager path (0: never); its slots
  // hold `capacity` bytes (at least `bytes`: a node pool's slots are sized for the largest
  // eager size any of its contexts may have).
  void set_eager_bytes(std::size_t bytes, std::size_t capacity) noexcept {
    eager_bytes_ = bytes;
    eager_capacity_ = bytes ? std::max(bytes, capacity) : 0;
    chosen_bytes_ = SIZE_MAX;  // the built-in estimates depend on it
  }
  std::size_t eager_bytes() const noexcept { return eager_bytes_; }
  std::size_t eager_capacity() const noexcept { return eager_capacity_; }
  bool eager_fits(std::size_t recv_bytes) const noexcept {
    return eager_bytes_ && recv_bytes <= eager_bytes_;
  }
  // What order="auto" runs for an irregular call beyond the eager path: Morton at every P.
  // With uneven blocks its byte-balanced pieces beat row order's "each receiver its own
  // blocks" (measured at P = 2, 1 MiB blocks: 26 against 45 us).
  static constexpr block_order irregular_order() noexcept { return block_order::morton; }
  // Whether a call that puts and takes at most `bytes` on this rank goes through the eager
  // slots when this rank's buffers are `private_buffers` (outside shared memory): within the
  // eager size always; beyond it, private buffers as long as the slots hold them (and the CMA
  // size, when one is forced lower). The eager path makes two copies and one barrier where
  // staging makes three and three, and a CMA pull one copy, two barriers and a system call per
  // block. Measured at P = 2 on plain arrays (EPYC VM, tools/measure/irregular_paths.py; the
  // header comment): through the slots 1.5-2.8 us from 8 to 16 KiB received, against CMA's 4.0-
  // 6.0 and staging's 2.0-3.4, in every exchange. alltoall and allgather decide so after the
  // ranks publish (exchange.hpp's slots_if_private), the irregular calls too (vexchange.hpp).
  bool eager_takes(std::size_t bytes, bool private_buffers) const noexcept {
    if (eager_fits(bytes)) return true;
    return private_buffers && private_slots_ && bytes <= eager_capacity_ && bytes <= cma_bytes_;
  }
  // Whether private buffers may take the slots beyond the eager size (on by default; off, they
  // are staged or pulled as the CMA threshold says: tests force the staged path so).
  void set_private_slots(bool yes) noexcept { private_slots_ = yes; }
  bool private_slots() const noexcept { return private_slots_; }

  // Exchanges receiving at least `bytes` per rank pull private buffers by CMA (SIZE_MAX:
  // never). A threshold set here is forced (ZCOLL_CMA_BYTES, tests, benchmarks): bcast and the
  // reductions then pull from their defaults scaled alike, whatever the tuning table says.
  void set_cma_bytes(std::size_t bytes) noexcept {
    cma_bytes_ = bytes;
    cma_forced_ = true;
  }
  // The built-in threshold again, and the tuning table's pull thresholds in force.
  void reset_cma_bytes() noexcept {
    cma_bytes_ = default_cma_bytes;
    cma_forced_ = false;
  }
  std::size_t cma_bytes() const noexcept { return cma_bytes_; }
  bool cma_forced() const noexcept { return cma_forced_; }
  // The tuning table's pull threshold of `op` (bcast, allreduce, reduce, reduce_scatter):
  // calls of at least `bytes` per rank pull private buffers, smaller ones stage them
  // (nullopt: the built-in rule, builtin_pull_bytes). Measured per
  // machine by python -m zcoll.tune (pulls): where staging in cache stops paying depends on
  // the cache and the cost of a page pin. Throws std::invalid_argument for another op.
  void set_pull_bytes(op_code op, std::optional<std::size_t> bytes);
  // Fewest bytes per rank from which an `op` call pulls private buffers: the table's, unless
  // the exchanges' threshold is forced or the table has none; else builtin_pull_bytes of that
  // threshold (so a forced 0 pulls every size, as tests force it, and "never" never does).
  std::size_t pull_threshold(op_code op) const;
  // Fewest bytes a pulled irregular exchange's sender pushes to even out the ranks' copies
  // (SIZE_MAX: never; 0: whenever it evens them out).
  void set_cma_push_bytes(std::size_t bytes) noexcept { cma_push_bytes_ = bytes; }
  std::size_t cma_push_bytes() const noexcept { return cma_push_bytes_; }
  // Whether an exchange receiving `recv_bytes` per rank, with a private buffer, pulls rather
  // than stages.
  bool pulls(std::size_t recv_bytes) const noexcept { return recv_bytes >= cma_bytes_; }
  // Whether an `op` reduction of `bytes` per rank pulls private inputs rather than staging
  // them (pull_threshold; built in: from default_reduction_pull_bytes).
  bool pulls_reduction(std::size_t bytes, op_code op) const { return bytes >= pull_threshold(op); }
  // Whether a bcast of `bytes` from a private root buffer pulls it rather than staging it
  // (pull_threshold; built in: from default_bcast_pull_bytes).
  bool pulls_bcast(std::size_t bytes) const { return bytes >= pull_threshold(op_code::bcast); }
  // Whether a strided pull whose contiguous runs hold `run_bytes` is worth it (always with a
  // threshold of 0: every private buffer pulled, as tests force it).
  bool pulls_runs(std::size_t run_bytes) const noexcept {
    return cma_bytes_ == 0 || run_bytes >= default_cma_run_bytes;
  }

  // The tuning rules of `op` (a tuned collective); throws std::invalid_argument for unknown
  // codes or overlapping ranges.
  void set_rules(op_code op, std::vector<order_rule> orders, std::vector<copy_rule> copies);
  // What order="auto" does for an `op` call with blocks of `block_bytes`, each rank receiving
  // `recv_bytes`.
  auto_choice resolve(op_code op, std::size_t block_bytes, std::size_t recv_bytes) const;

  // The measured cost model of `algorithm` (pieces in any order; empty: the built-in one).
  // Throws std::invalid_argument for an unknown algorithm or a non-finite/negative cost.
  void set_reduction_model(reduce_algorithm algorithm, std::vector<reduction_cost> pieces);
  const std::vector<reduction_cost>& reduction_model(reduce_algorithm algorithm) const noexcept {
    return reduction_models_[static_cast<std::size_t>(algorithm)];
  }
  // Predicted seconds of `algorithm` for `bytes` per rank (the measured piece covering it, the
  // last piece beyond them, or the built-in estimate).
  double predicted(reduce_algorithm algorithm, std::size_t bytes) const noexcept;
  // What algorithm="auto" runs for `bytes` per rank: the least predicted time (ties: the
  // lowest code). The last answer is remembered: a loop of calls of one size asks once.
  // `pulled`: some input is private and the call pulls it by CMA, which the tiled and the flat
  // algorithm do (the others stage each private input whole first); tiled measured faster than
  // any staged algorithm at every size that pulls (docs/performance.md).
  // A reduce (`to_root`) runs flat, where only the root folds, unless its peers can write their
  // tiles into the root's result (`shared_result`: in shared memory) or it pulls: measured, P =
  // 2 and 4, flat beat tiled at every size from 16 KiB to 16 MiB (by up to 3.5x) when the root
  // copied every tile out, and tiled beat flat from 16 KiB (P = 2) and 256 KiB (P = 4) up when
  // the peers wrote into a shared result.
  reduce_algorithm choose_reduction(std::size_t bytes, bool pulled = false, bool to_root = false,
                                    bool shared_result = false) const noexcept {
    if (pulled) return reduce_algorithm::tiled;
    if (to_root)
      return shared_result && !eager_fits(bytes) ? reduce_algorithm::tiled : reduce_algorithm::flat;
    if (bytes != chosen_bytes_) {
      chosen_ = least_predicted(bytes);
      chosen_bytes_ = bytes;
    }
    return chosen_;
  }

  // How the communicator's calls cross nodes, made for `nodes` by the first call across them
  // (node_messages); later calls get the same policy, with its rules and overrides.
  crossing_policy& cross_nodes(const node_map& nodes) {
    if (!crossing_) crossing_.emplace(nodes);
    return *crossing_;
  }

  // How this rank picks copy modes (threshold, what "auto" learned).
  copy_chooser& copy() noexcept { return copy_; }
  // The online trials of order="auto" (off unless ZCOLL_TUNING=online on one node).
  online_tuner& online() noexcept { return online_; }
  const online_tuner& online() const noexcept { return online_; }
  // What a call where each rank receives `received` bytes reads and writes on the node: the
  // receive buffers and as much source.
  std::size_t touched_bytes(std::size_t received) const noexcept {
    return 2 * received * static_cast<std::size_t>(node_size_);
  }

  // Runs `copies(plan)` with the plan the chooser picks for blocks of `block` bytes under mode
  // code `copy` in an `op` call where each rank receives `received` bytes, timed when "auto" is
  // still refining (`bytes`: what this rank copies; CPU time). `op`'s rules apply when it
  // is a tuned collective.
  template <class Copies>
  void timed_copies(op_code op, std::size_t block, int copy, std::size_t received,
                    std::size_t bytes, Copies&& copies) {
    bool tuning = false;
    const copy_plan how =
        copy_.choose(copy, block, touched_bytes(received), &tuning, tuned_index(op));
    if (!tuning) {
      copies(how);
      return;
    }
    const double start = thread_cpu_seconds();
    copies(how);
    store_fence();
    copy_.record(block, how, bytes, thread_cpu_seconds() - start);
  }

 private:
  int node_size_;
  int numa_domains_;
  std::size_t eager_bytes_ = 0;
  std::size_t eager_capacity_ = 0;
  std::size_t cma_bytes_ = default_cma_bytes;
  std::size_t cma_push_bytes_ = default_cma_push_bytes;
  bool cma_forced_ = false;
  std::array<std::optional<std::size_t>, pulled_calls> tuned_pulls_;  // by pulled_index
  bool private_slots_ = true;
  std::array<std::vector<order_rule>, rule_tables> order_rules_;  // by tuned_index
  std::array<std::vector<reduction_cost>, count_of<reduce_algorithm>> reduction_models_;
  reduce_algorithm least_predicted(std::size_t bytes) const noexcept;
  mutable std::size_t chosen_bytes_ = SIZE_MAX;  // choose_reduction's last question, answer
  mutable reduce_algorithm chosen_ = reduce_algorithm::flat;
  copy_chooser copy_;
  online_tuner online_;
  std::optional<crossing_policy> crossing_;  // several nodes only (cross_nodes)
};

}  // namespace zcoll
