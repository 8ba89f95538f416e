/*
 * An allgather's blocks between nodes by the SC'05 concurrent exchange among the nodes'
 * leaders (the all-gather paper on network concurrency, its concurrency index C, §3).
 *
 * After the node's part of an allgather (every rank holds its own node's blocks), the other
 * nodes' blocks are missing. The direct path sends every rank's block to every rank on another
 * node: P - q messages per rank. This exchange runs between the node leaders only (the lowest
 * communicator rank of each node; nodes in node_map order), moving whole nodes' worth of blocks
 * at once; then each leader hands what it received to its node's ranks through shared memory
 * (a node bcast).
 *
 * With concurrency index C (§3.1) the N leaders form C groups of consecutive nodes (sizes
 * differing by at most one). Within a group of m members the leaders run a dissemination
 * (Bruck) allgather: in step s (distance d = 2^s, ceil(log2 m) steps) member j sends the
 * group's blocks it holds, those of members j .. j + min(d, m - d) - 1 (mod m), to member
 * j - d; the same message goes to the peers of the pair in every other group -- the members k
 * with k mod m == j - d -- and before the first step each member sends its own node's blocks
 * to its peers (k mod m == j). A member k of another group so receives, from its anchor
 * a = k mod m and the members a + 1, a + 2, a + 4, ..., every block of the group exactly once.
 * A round waits for all its messages: round 0 has the C - 1 preamble messages and the first
 * step's C (the paper overlaps them), every later round C. C = 1 is the ordinary dissemination
 * allgather over the leaders (ceil(log2 N) rounds of one exchange), the baseline. Group sizes
 * need not be powers of two, nor equal (k mod m maps a larger group's extra members onto the
 * smaller group's chains).
 *
 * Message splitting (§3.2): for blocks of leaders_split_bytes and more, with C >= 2, every block
 * is cut in two halves; the first halves travel as above, the second halves by the mirror
 * scheme (members numbered from the other end: the co-pair at the same distance in the
 * opposite direction), with C / 2 groups, so each step still has C exchanges in flight.
 *
 * No packing: a message is the receive buffer's byte ranges that hold its nodes' blocks, one
 * run per stretch of consecutive ranks (each run travels as a message of its own, in order).
 * Trade-off: on one machine the direct path beat this exchange at every size measured
 * (crossing_policy.hpp), so it runs only where a tuning table, measured on a cluster, says so.
 */
#pragma once

#include <cstdint>
#include <vector>

namespace zcoll {

struct node_map;

// Blocks of this many bytes and more are split in halves between pair and co-pair (C >= 2).
inline constexpr std::uint64_t leaders_split_bytes = 64 * 1024;
// Tags of the leaders' messages on the communicator's private duplicate.
inline constexpr int leaders_tag_base = 0x7D00;

// One message of the exchange: from node `source` to node `dest` (node indices) in `round`,
// carrying the blocks of the nodes `content`; `part` 0 is the whole block (or its first half
// when split), 1 the second half; `preamble` marks the own-node messages sent before step 0.
struct leader_message {
  int source = 0;
  int dest = 0;
  int round = 0;
  std::vector<int> content;
  int part = 0;
  bool preamble = false;
  int tag() const noexcept { return leaders_tag_base + ((round * 2 + part) * 2 + int(preamble)); }
};

// Every message of the exchange on `nodes` nodes with concurrency index `concurrency` (capped
// at `nodes`), halves by pair and co-pair when `split`.
std::vector<leader_message> leaders_schedule(int nodes, int concurrency, bool split);

// One message of a leader's round: the byte range [start, stop) of the receive buffer, to or
// from the leader of node `node`.
struct leader_transfer {
  int node = 0;
  int tag = 0;
  std::uint64_t start = 0;
  std::uint64_t stop = 0;
};
struct leader_round {
  std::vector<leader_transfer> receives;
  std::vector<leader_transfer> sends;
};

// The rounds of node `me`'s leader for blocks of `block` bytes (rounds it has no part in left
// out); sender and receiver compute the same byte ranges.
std::vector<leader_round> leader_rounds(const node_map& nodes, int me, int concurrency,
                                        std::uint64_t block);

}  // namespace zcoll
