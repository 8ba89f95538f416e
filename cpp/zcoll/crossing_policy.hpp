/*
 * How the calls of one communicator spanning several nodes cross them: the one place that
 * decides it, for the one crossing of the binding and for the Python path alike. Held by the
 * context's auto_policy (made with the node map by the first call across nodes), which so
 * holds every choice a call makes.
 *
 * - Carried or not. A call's blocks (a reduction's inputs, a bcast's buffer) travel in the
 *   round of messages that agrees on every rank's call record when they are at most
 *   pack_limit(op); larger ones go rank to rank after the node's part (a reduction: spread
 *   over the ranks). The limit is the built-in size rule (max_aggregated_block: one message's
 *   payload bounded per rank of the smallest node), or for an alltoall and an allgather the
 *   tuning table's "round" rules for these nodes, measured by `zcoll.tune --internode`.
 * - An allgather's blocks beyond the round: rank to rank ("direct"), or the SC'05 concurrent
 *   exchange between the nodes' leaders with concurrency index C. The table's "direct" and
 *   "concurrent" rules where one covers the block size, else direct: on one machine's virtual
 *   nodes the direct path beat the leaders' exchange at every size from 8 KiB to 64 KiB
 *   (zcoll._internode.builtin_choice has the numbers); on a cluster the table decides.
 * - What tests, benchmarks and the tuner force instead (crossing_overrides), per communicator.
 *
 * Every input is the same on every rank (rank 0's table, shared when the context is made;
 * forcing is collective), so every rank decides alike without communicating. Trade-off: the
 * table's rules are matched to the layout (nodes, largest node) by the caller once per
 * context, so a rule written for another layout is ignored rather than scaled.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "zcoll/registry.hpp"

namespace zcoll {

struct node_map;

// How calls across nodes choose between carrying their blocks in the round and sending them
// rank to rank.
enum class aggregation : std::int8_t {
  never = -1,   // every block rank to rank
  by_size = 0,  // the size rule (default)
  always = 1,   // every block in the round
};

// How allgathers beyond the round cross nodes: as the policy chooses, or forced to rank to
// rank or to the leaders' concurrent exchange.
enum class allgather_crossing : std::int8_t {
  by_policy = 0,   // the table's rules, else direct
  direct = 1,      // every one rank to rank
  concurrent = 2,  // every one by the leaders' exchange (crossing_overrides::concurrency)
};

// What tests, benchmarks and the tuner force for one communicator's calls across nodes, in
// place of the policy's choices (zcoll._aggregated.force, zcoll._internode.force,
// zcoll._aggregated.spread_segment). Part of that communicator's context, never of the
// process, so forcing one communicator leaves every other to the policy. Every rank of the
// communicator sets the same, between collectives.
struct crossing_overrides {
  aggregation carry = aggregation::by_size;
  allgather_crossing allgather = allgather_crossing::by_policy;
  int concurrency = 0;             // the forced concurrent exchange's index C
  std::size_t spread_segment = 0;  // bytes of a spread message's segment; 0: the default
};

// How blocks of a range of sizes cross nodes, as a tuning table's internode rule says.
enum class crossing_method : std::int8_t {
  round = 0,       // in the call's round of messages
  direct = 1,      // rank to rank after it
  concurrent = 2,  // between the nodes' leaders (allgather only)
};

// One internode rule of the tuning table, for this communicator's layout: blocks of
// min_block to max_block bytes (both included) cross by `method`.
struct internode_rule {
  std::uint64_t min_block = 0;
  std::uint64_t max_block = std::numeric_limits<std::uint64_t>::max();  // no upper bound
  crossing_method method = crossing_method::direct;
  int concurrency = 0;  // concurrent: the index C
};

// How an allgather's blocks beyond the round cross: direct, or concurrent with index C.
struct allgather_route {
  crossing_method method = crossing_method::direct;
  int concurrency = 0;
};

// The size rule of a call across nodes: the largest block it carries in the round's messages
// (an alltoall aggregates up to it, an irregular call packs its blocks up to it); larger ones go
// rank to rank after the round. Aggregating saves messages (all but one per node pair: on
// nodes of one rank only the round of records) and costs a copy on each side plus the node's
// coordination, so the limit grows with the smallest node: aggregate_unit_block * q, at most
// aggregate_max_block. Measured with virtual nodes (zcoll.bench alltoall --between-nodes,
// xn:aggregated against xn:direct, blocks rank to rank from C++, 2-vCPU VM): nodes of 1 (P = 2)
// aggregated faster up to 4 KiB, rank to rank 1.1-3.6x faster from 8 KiB; nodes of 2 (P = 4,
// oversubscribed, three runs) aggregated faster up to 4 KiB, either way at 8-16 KiB, rank to
// rank up to 4.6x faster from 32 KiB. The cap: on 16 real cores (nodes of 2 and 4; rank to
// rank from Python then, session 11) aggregated was faster up to 64 KiB.
inline constexpr std::uint64_t aggregate_unit_block = 4 * 1024;
inline constexpr std::uint64_t aggregate_max_block = 64 * 1024;
// An allgather's message carries one block per sender (q_a blocks, an alltoall's q_a * q_b),
// so its limit is this many times an alltoall's (at most aggregate_max_block). Measured
// (zcoll.bench allgather --between-nodes: xn:round against xn:direct and the leaders' xn:C=1,
// 2-vCPU VM, noisy: ranges over two or three launches): on nodes of 1 the round faster up to
// 16 KiB (9.7-12 against 15-24 us rank to rank), even with it at 64 KiB; on nodes of 2 faster
// up to 32 KiB (40-72 against 98-135 rank to rank and 69-108 by the leaders), even at 64 KiB.
inline constexpr std::uint64_t allgather_block_factor = 4;
// A reduction's round (allreduce, reduce, reduce_scatter) carries each node's partial result,
// n bytes, in each of its N - 1 messages; the alternative is the reduction spread over the ranks
// (spread_reduction.hpp: two phases of messages of n / P bytes, two more node barriers). The
// round carries inputs of at most reduction_unit_bytes * q, while the bytes a node sends per rank,
// (N - 1) n / q, are at most reduction_round_bytes, and at most reduction_round_bytes. Measured
// (a script timing zcoll.allreduce of float64 forced each way, interleaved, medians of 7 rounds,
// 2-vCPU VM, us, round / spread): nodes of 1, N = 2: 16 KiB 13.3 / 16.4, 24 KiB 16.7 / 19.2,
// 32 KiB 18.0 / 16.7, 64 KiB 33.1 / 27.2, 256 KiB 87.8 / 68.7; N = 3: 32 KiB 54.5 / 56.9, 48 KiB
// 74.6 / 77.3, 64 KiB 81.5 / 64.1; nodes of 2, N = 2 (P = 4, oversubscribed): the round faster up
// to 512 KiB (190 / 213), spread at 1 MiB (539 / 512); N = 3: 64 KiB 193 / 251, 256 KiB 391 /
// 332; nodes of 3, N = 2: 64 KiB 134 / 208, 256 KiB 383 / 280. The per-rank bound (the rule
// before the spread path, measured against the leaders' path: on four one-rank nodes the round
// faster up to 128 KiB) keeps the round's N - 1 copies of the input in check on many nodes.
inline constexpr std::uint64_t reduction_unit_bytes = 32 * 1024;
inline constexpr std::uint64_t reduction_round_bytes = 256 * 1024;
// The size rule on `nodes` for `op`: aggregate_unit_block times the smallest node's ranks
// (times allgather_block_factor for an allgather or a bcast), at most aggregate_max_block; a
// reduction's, reduction_unit_bytes times q and reduction_round_bytes times q / (N - 1), at most
// reduction_round_bytes. A bcast
// moves no more bytes through the round than a reduction, but the copies into and out of it
// (root to local area to messages to every rank) cost more than the leaders' path, which
// broadcasts the user's buffer itself: measured (a script timing zcoll.bcast forced each way,
// two runs) the round faster up to 8 KiB on one-rank nodes (9.2-9.9 against 12.4-14.7 us),
// even at 16 KiB, slower at 32 KiB (28 against 16-18); on nodes of 2 faster up to 32 KiB;
// slower at 64 KiB in zcoll.bench bcast (62 against 50).
std::uint64_t max_aggregated_block(const node_map& nodes, op_code op = op_code::alltoall) noexcept;
// The same for `nodes` nodes whose smallest has `q` ranks.
std::uint64_t size_rule_limit(std::uint64_t q, int nodes, op_code op) noexcept;

// The largest block the first run of "round" rules carries (sorted by min_block, back to back
// from the first rule): -1 when the first rule is another method, the largest int64 when the
// run has no end; nullopt without rules (the size rule then).
std::optional<std::int64_t> round_limit_of(const std::vector<internode_rule>& rules) noexcept;

class crossing_policy {
 public:
  explicit crossing_policy(const node_map& nodes);

  crossing_overrides& overrides() noexcept { return overrides_; }
  const crossing_overrides& overrides() const noexcept { return overrides_; }
  // The table's internode rules of an alltoall or an allgather for these nodes (sorted by
  // min_block, not overlapping: the table's reader checks); {} restores the built-in rules.
  void set_rules(op_code op, std::vector<internode_rule> rules);
  // The largest block a call of `op` carries in its round; negative: none. Irregular calls
  // take an alltoall's.
  std::int64_t pack_limit(op_code op) const noexcept;
  // Whether a call of `op` carries blocks (a reduction: inputs) of `bytes` in its round.
  bool carries(op_code op, std::uint64_t bytes) const noexcept {
    const std::int64_t limit = pack_limit(op);
    return limit >= 0 && bytes <= static_cast<std::uint64_t>(limit);
  }
  // How an allgather's blocks of `block` bytes, beyond its round, cross nodes.
  allgather_route allgather_route_for(std::uint64_t block) const noexcept;

 private:
  static int rules_index(op_code op) noexcept;  // 0 alltoall, 1 allgather, else -1

  std::uint64_t smallest_node_ = 1;  // ranks of the smallest node (the size rule's q)
  int nodes_ = 2;
  crossing_overrides overrides_;
  std::vector<internode_rule> allgather_rules_;
  std::optional<std::int64_t> round_limits_[2];  // from the rules; nullopt: the size rule
};

}  // namespace zcoll
