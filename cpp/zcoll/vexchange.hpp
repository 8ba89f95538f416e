/*
 * Irregular exchanges: alltoallv, allgatherv and the neighbourhood collectives (TPDS'18 §3).
 *
 * All of them are one operation: a list of block copies between the node ranks' buffers, each
 * a 4-tuple (Rs, Rr, Bs, Br) -- block Bs of sender Rs's send list goes into block Br of
 * receiver Rr's receive list. What differs is only where the lists come from:
 *   alltoallv    every rank sends block c to communicator rank c and receives block c from it;
 *   allgatherv   the same, every send block being the whole send buffer;
 *   neighbor_*   a process topology's destinations and sources (Cartesian: per dimension the
 *                negative then the positive direction; graphs: the lists as given, an edge
 *                repeated k times matching k times in order).
 * A pattern (the tuples of the pairs with both ends on this node) is built once per
 * communicator and cached in its context; per call only the byte counts and offsets of the
 * blocks change.
 *
 * Order: the tuples are sorted along the chosen curve over the (receiver, sender) grid (the
 * compact curve of TPDS'18 §3.1: Morton order restricted to the pairs that communicate), so
 * the copies of consecutive tuples touch nearby send and receive buffers; the user's block
 * order within a buffer (the ordered buffers of §3.2) is followed through Bs and Br, never by
 * asking the user to reorder. Work: the ordered tuples form one stream of bytes cut into one
 * piece per node rank of equal bytes (cache-line aligned cuts; a block may be shared by two
 * ranks), so one large block does not leave the other ranks idle. Pulled by CMA, a rank can
 * copy only into or out of itself: the receivers copy, and senders with less to do push part
 * of the busiest receivers' blocks (split_pulls). order=row is the naive
 * baseline the papers compare against: each receiver copies its own blocks, in its list's order.
 * order=numa runs as Morton here: TPDS'18 §2.4's rule (each NUMA domain copies only into its
 * own receivers) would cut the stream per domain, and with uneven blocks one domain's receivers
 * can hold most of the bytes, idling the other domains -- the byte balance above is what the
 * irregular engine is for, so it keeps it.
 *
 * One call (no MPI):
 *   1. local checks (counts and displacements in bounds, receive blocks disjoint, dtypes);
 *   2. each rank writes the bytes and offsets of its blocks into its metadata slot of the
 *      barrier's parity, and its buffers into its descriptor line; barrier;
 *   3. every rank checks every tuple (the sender's count equals the receiver's): all read the
 *      same data, so they all raise the same error or all go on;
 *   4. buffers outside the arena are pulled by CMA when some rank receives at least the CMA
 *      threshold (cma.hpp, auto_policy.hpp; not in place): each rank copies the blocks into its
 *      own receive buffer straight from the senders' buffers (senders below the mean push
 *      the tails of the busiest receivers' blocks; a source listed twice is read once, its
 *      bytes copied from where they landed); barrier. Otherwise they are
 *      staged (one copy each way, one barrier), then every rank copies its piece of the stream;
 *      barrier.
 * Metadata written for a barrier is read only before the next barrier, which every rank
 * passes only after all reads of this call: a rank that races into its next call writes the
 * other parity's slot (a call that moves nothing ends without the second barrier), and the one
 * after that only once every rank has left this call.
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "zcoll/checks.hpp"
#include "zcoll/copy.hpp"
#include "zcoll/protocol.hpp"
#include "zcoll/registry.hpp"

namespace zcoll {

class node_context;
class node_messages;
struct data_segment;

// One block copy of an irregular collective: block `send_block` of node rank `src`'s send
// list into block `recv_block` of node rank `dst`'s receive list.
struct v_tuple {
  std::int32_t src = 0;
  std::int32_t dst = 0;
  std::uint32_t send_block = 0;
  std::uint32_t recv_block = 0;
  friend bool operator==(const v_tuple&, const v_tuple&) = default;
};

// One entry of a rank's send or receive list.
struct v_edge {
  std::int32_t peer = -1;  // communicator rank; -1 (MPI_PROC_NULL): a slot that moves nothing
  std::int32_t tag = 0;    // matching class: a send matches a receive of the same tag only
                           // (Cartesian: the direction of travel; graphs: 0)
};

// What in place means for an irregular call.
enum class v_in_place : std::uint8_t {
  none = 0,    // separate send and receive buffers
  gather = 1,  // allgatherv: this rank's send block already sits in its receive buffer
  swap = 2,    // alltoallv: the receive blocks are also the send blocks (pairs exchange)
};

// The blocks of one communicator's irregular collectives that stay on this node.
struct v_pattern {
  std::vector<std::uint32_t> send_blocks;  // per node rank: entries of its send list
  std::vector<std::uint32_t> recv_blocks;  // per node rank: entries of its receive list
  std::vector<v_tuple> tuples;             // node-local pairs (node ranks), unordered
  // On a communicator spanning several nodes, for the rounds between nodes (aggregate.hpp):
  // every communicator rank's list lengths and every pair's tuple (src, dst: communicator
  // ranks), in match_edges' order. Empty on one node.
  std::vector<std::uint32_t> all_send_blocks, all_recv_blocks;
  std::vector<v_tuple> all_tuples;
};

// Matches, for every pair with both ends on this node, the k-th send edge from s to d of tag t
// with the k-th receive edge of d from s of tag t. `sends[j]`, `recvs[j]`: node rank j's lists
// (peers as communicator ranks); `comm_ranks[j]`: node rank j's communicator rank. Edges to
// ranks off the node and PROC_NULL slots make no tuple. Throws usage_error when a node-local
// edge has no partner (lists that do not describe one topology).
v_pattern match_edges(std::span<const std::vector<v_edge>> sends,
                      std::span<const std::vector<v_edge>> recvs, std::span<const int> comm_ranks);

// The tuples of `p` that an `in_place` call copies, along `order`'s curve over the (dst, src)
// grid of `node_size` ranks (ties: send block, then receive block); row order sorts by
// receiver, then its receive block (the naive baseline: each receiver in its own list's
// order). gather drops self copies; swap keeps one tuple per exchanged pair (src < dst).
std::vector<v_tuple> ordered_tuples(const v_pattern& p, int node_size, block_order order,
                                    v_in_place in_place);

// The CMA path's split of the copies (v_exchange::execute_pulls): each receiver pulls its
// incoming tuples, except that into a busy receiver (one that receives at least
// cma_push_load_factor times the mean, auto_policy.hpp) a sender whose own load is below the
// mean takes the tail of a tuple, pushing it, as long as both stay on their side of the mean
// and the part is at least `min_push` bytes. `starts`: each tuple's first byte in the stream
// of `tuples` and the total last (v_exchange::execute's); `load`: per node rank, the bytes it
// receives, then its bytes after the split. Every rank passes the same and gets the same
// answer. Fills `pushed` (per tuple, its sender's bytes, taken from the block's end); `busy`
// is scratch.
void split_pulls(std::span<const v_tuple> tuples, std::span<const std::uint64_t> starts,
                 std::uint64_t min_push, std::vector<std::uint64_t>& pushed,
                 std::vector<std::uint64_t>& load, std::vector<bool>& busy);

// Bytes and offset of one block in its buffer.
struct v_span {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

// The piece of a stream of `total` bytes that rank `rank` of `parts` copies: [first, last),
// cuts rounded to cache lines.
std::pair<std::uint64_t, std::uint64_t> v_piece(std::uint64_t total, int parts, int rank) noexcept;

// Calls piece(t, lo, hi) for each tuple that bytes [first, last) of the stream of `tuples`
// overlap, where tuple t stands for bytes(t) bytes and [lo, hi) is the overlap within them.
template <class Bytes, class Piece>
void for_each_piece(std::span<const v_tuple> tuples, std::uint64_t first, std::uint64_t last,
                    Bytes&& bytes, Piece&& piece) {
  std::uint64_t at = 0;
  for (const v_tuple& t : tuples) {
    if (at >= last) break;
    const std::uint64_t end = at + bytes(t);
    if (end > first) piece(t, std::max(first, at) - at, std::min(last, end) - at);
    at = end;
  }
}

// Copies each of `blocks` from `src` + its offset to `dst` + its offset.
inline void copy_spans(std::byte* dst, const std::byte* src, std::span<const v_span> blocks) {
  for (const v_span& b : blocks) copy_bytes(dst + b.offset, src + b.offset, b.bytes);
}

// The engine's copy loop: copies (swap: exchanges) bytes [first, last) of the stream of
// `tuples`, in which tuple t stands for the bytes of its receive block. Per node rank j:
// `sent[j]`, `received[j]` its send and receive blocks (indexed by send_block and recv_block),
// `send[j]`, `recv[j]` the base addresses of its buffers (swap: both blocks in `recv`). A block
// may be copied in part, where [first, last) cuts it. v_exchange copies its piece with it;
// tools/replay.cpp replays it in one process.
void copy_tuples(std::span<const v_tuple> tuples, const v_span* const* sent,
                 const v_span* const* received, std::byte* const* send, std::byte* const* recv,
                 std::uint64_t first, std::uint64_t last, bool swap, const copy_plan& how) noexcept;

// One rank's arguments to an irregular call, as the binding converts them.
struct v_call {
  op_code op = op_code::alltoallv;
  int pattern = 0;                   // id from v_exchange::add_pattern
  const array_view* send = nullptr;  // nullptr: in place
  const array_view* recv = nullptr;
  v_in_place in_place = v_in_place::none;
  // Elements per block and their displacements (in elements of the dtype), one per list
  // entry. In place the send side is ignored: gather sends recv's own block, swap recv's
  // blocks.
  std::span<const std::int64_t> send_counts, send_displs, recv_counts, recv_displs;
  int order = auto_order;  // block_order value or auto_order
  int copy = auto_copy;    // copy_mode value or auto_copy
};

class v_plan;

// The irregular collectives of one node context.
class v_exchange {
 public:
  explicit v_exchange(node_context& ctx) : ctx_(ctx) {}

  // Collective (every node rank, same lists, same order of calls): registers a pattern whose
  // lists every node rank knows; returns its id. Grows the metadata slots if needed. `role`
  // (dense_role, topology_role or no_role) names it for role_pattern().
  int add_pattern(v_pattern pattern, int role);
  const v_pattern& pattern(int id) const { return patterns_.at(static_cast<std::size_t>(id)); }
  int pattern_count() const noexcept { return static_cast<int>(patterns_.size()); }
  // The pattern registered in `role`, or -1.
  static constexpr int no_role = -1, dense_role = 0, topology_role = 1;
  int role_pattern(int role) const noexcept { return roles_[static_cast<std::size_t>(role)]; }

  // Collective: checks one rank's arguments (raising on every rank if any rank's are wrong or
  // the ranks' counts disagree), then runs the node's part of the call.
  void run(const v_call& call);
  // Local: the record ranks on other nodes compare (protocol.hpp's agree).
  call_record describe(const v_call& call) const;

 private:
  friend class v_plan;         // a persistent call runs the same steps once (vplan.hpp)
  friend class node_messages;  // a round between nodes checks and publishes calls alike
  struct checked_call {
    std::vector<v_span> send, recv;  // this rank's blocks, in bytes
    std::uint64_t send_extent = 0, recv_extent = 0;
    block_order order = block_order::row;
    // In place, the receive buffer's blocks that hold what this rank sends: its own block
    // (gather: every send block is that one block) or every block (swap).
    std::span<const v_span> in_place_data(v_in_place in_place) const {
      if (in_place == v_in_place::swap) return recv;
      return std::span<const v_span>(send).first(std::min<std::size_t>(send.size(), 1));
    }
  };
  local_check check(const v_call& call, checked_call& out) const;
  // Writes this rank's blocks and extents into its metadata slot of `parity`.
  void write_metadata(const checked_call& mine, std::size_t parity, bool eager);
  // Fills `line` with what the ranks must agree on.
  static void describe_line(const v_call& call, const checked_call& mine, detail::rank_line& line);
  std::span<v_span> slot(int node_rank, std::size_t parity) const noexcept;
  std::uint64_t* extents(int node_rank, std::size_t parity) const noexcept;
  const std::vector<v_tuple>& tuples_for(int pattern, block_order order, v_in_place in_place);
  // What tuple `t`'s sender sends and its receiver expects, as published at `parity`.
  const v_span& sent(const v_tuple& t, std::size_t parity) const noexcept;
  const v_span& received(const v_pattern& p, const v_tuple& t, std::size_t parity) const noexcept;
  void check_counts(const v_call& call, std::size_t parity) const;
  // This rank's receive-buffer blocks that the node's copies of `tuples` write (swap: the
  // blocks it sends are overwritten too), as published at `parity`.
  std::vector<v_span> written_blocks(const v_pattern& p, const std::vector<v_tuple>& tuples,
                                     std::size_t parity, v_in_place in_place) const;
  // [first, last) of the stream of `tuples` (`total` bytes) that this rank copies: an equal
  // share of the bytes, or under row order (not in place swaps) its own receive blocks.
  std::pair<std::uint64_t, std::uint64_t> my_piece(const v_pattern& p,
                                                   const std::vector<v_tuple>& tuples,
                                                   std::size_t parity, std::uint64_t total,
                                                   block_order order, v_in_place in_place) const;
  void execute(const v_call& call, const checked_call& mine, const call_protocol::published& all,
               std::size_t parity);
  // Each rank copies the tuples into itself from the senders' buffers (by CMA where private),
  // but for the tails split_pulls gives their senders to push.
  // `tuples`: execute's, with starts_ and loads_ filled for them.
  void execute_pulls(const v_call& call, const call_protocol::published& all, std::size_t parity,
                     const std::vector<v_tuple>& tuples);
  // Small calls: every rank's data went into its eager slot before the barrier; each rank
  // pulls its own receive blocks from the senders' slots. One barrier, no staging.
  void execute_eager(const v_call& call, std::size_t parity);
  // Copies this rank's data into its eager slot when the policy takes it there (its buffers
  // `private_buffers`: outside shared memory); whether it did.
  bool fill_eager_slot(const v_call& call, const checked_call& mine, std::size_t parity,
                       bool private_buffers);
  void stage_in(const v_call& call, const checked_call& mine, const detail::rank_line& line,
                std::uint64_t send_part);
  void stage_out(const v_call& call, const v_pattern& p, const std::vector<v_tuple>& tuples,
                 std::size_t parity, std::uint64_t send_part) const;

  node_context& ctx_;
  std::vector<v_pattern> patterns_;
  std::array<int, 2> roles_{-1, -1};
  std::vector<std::vector<v_tuple>> incoming_;             // per pattern: the tuples into this rank
  std::map<std::uint64_t, std::vector<v_tuple>> ordered_;  // by (pattern, order, in place)
  std::shared_ptr<data_segment> meta_;  // per node rank: two slots (by parity) of capacity_
  std::size_t capacity_ = 0;            // blocks per slot
  std::vector<std::byte*> send_bases_, recv_bases_;
  std::vector<std::uint64_t> starts_;  // per call: each ordered tuple's first byte in the stream
  std::vector<const v_span*> sent_, received_;  // per node rank: its published blocks (execute)
  std::vector<std::uint64_t> loads_;   // per call: each node rank's received bytes (execute)
  std::vector<std::uint64_t> pushed_;  // per call: split_pulls' answer (execute_pulls)
  std::vector<bool> busy_;
  // Per node rank: the last bytes pulled from it by CMA in this call (execute_pulls), which a
  // repeated source's next block of the same bytes copies from.
  struct pull_landing {
    std::uint64_t from = 0, bytes = 0, offset = 0;  // its send buffer's offset, my receive's
  };
  std::vector<pull_landing> landed_;
  checked_call mine_;  // run()'s checked call, kept so that its lists allocate only once
};

}  // namespace zcoll
