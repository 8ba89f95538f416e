/*
 * Reductions across nodes beyond their round's size rule, spread over every rank: the node's
 * shared heap for the ranks of a node (HPDC'13 §2), a reduce-scatter and an allgather between
 * nodes (Rabenseifner's split of allreduce), every rank sending its share.
 *
 * The result is cut into P pieces, piece r owned by communicator rank r (reduce_scatter: r's
 * block; else equal cache-line-aligned ranges, the last ones possibly short or empty):
 *   1. on every node, each piece's node partial -- the node's inputs folded in node-rank order
 *      -- is computed by one rank of the node: the piece's owner for the node's own pieces, else
 *      the node's server of that piece (spread_server: the other nodes' ranks dealt round robin
 *      to the node's ranks). Inputs are read in place when in the arena, else from a copy in the
 *      reader's staging partition.
 *   2. each server sends its partials to their owners, one message per piece and other node;
 *      each owner folds the N partials in node order (the same bits whoever reads them).
 *   3. allreduce: each owner sends its piece to its server on every other node, which receives
 *      it into its node's shared result area (the owner has written it into its own node's);
 *      reduce: every owner on another node sends its piece to the root; reduce_scatter: none,
 *      the owner folded its block straight into its receive buffer. A node barrier ends the
 *      call (no input is read after it), then each rank copies the result it wants.
 * An allreduce's (or a bcast's) rank whose receive buffer is in the arena receives its pieces
 * there and folds its own there: its peers copy them from it, and a second node barrier keeps
 * it from returning while they do (one copy of its pieces less per node rank).
 * A reduce on two nodes gives the pieces to the root's node's ranks only
 * (reduce_to_root_node_nodes): the other node sends them its partials, and phase 3 is empty.
 * A bcast beyond its round's rule is spread alike, with pieces of the root's buffer: the root's
 * node sends each other node's rank its piece (its servers reading the root's buffer, in place
 * when it is in the arena, else a copy in the root's staging partition) and each of its own
 * ranks' pieces to that rank's server on every other node (phase 2); the other nodes pass
 * their own pieces on between them (phase 3); every rank copies the pieces from its node's
 * result area (the root's node: from the root's buffer). Each node receives the buffer once.
 * As a flow, every receive is posted at the start and an owner forwards each segment of its
 * piece to the other nodes as soon as it arrived (phases 2 and 3 overlap; with two nodes phase
 * 3 is empty).
 *
 * Bytes between nodes, per node of q ranks: (P - q) m / P out in phase 2 and as many in in phase
 * 3, each rank sending about 1/q of them -- against the leaders' path this replaced (the node's
 * reduction into its leader, a gather of N partials to the first leader, its fold, a broadcast
 * back: (N - 1) m into and out of one rank, all from Python). Messages: each rank about
 * 2 (P - q) / q, each of m / P bytes. Determinism as the node's reductions: each element of the
 * result is computed by exactly one rank, in an order fixed by (nodes, size).
 *
 * Every message of phases 2 and 3 is cut into segments of at most spread_segment() bytes, the
 * same for every sender, so that a receiver can act on each as it comes. The messages go by
 * MPI in one of two ways, the same segments either way:
 *   - phases: the caller (the Python path by mpi4py) sends sends() and receives recvs() after
 *     begin() and again after combine(): phase 2 whole, the fold whole, phase 3 whole.
 *   - a flow (message_flow.hpp; the binding's sender in C++): phase 3's receives are posted at
 *     the start, phase 2's into a ring of spread_ring_segments segments per other node; as soon
 *     as every node's partial of a segment arrived the owner folds it and sends it on, and the
 *     ring slot takes a later segment. The transfer, the fold and phase 3 overlap, and each
 *     segment is folded while in cache (MPI's own reductions pipeline segments alike). On a
 *     node of several ranks phase 1 flows too: while nothing arrives, each rank folds the next
 *     segment of a piece it serves (the pieces round robin) and sends it at once, then its own
 *     piece's partial ahead of its fold -- so the first segments leave before the node's whole
 *     phase 1 is done (an in-place reduce_scatter, whose result may overlay a piece it serves,
 *     folds phase 1 first).
 */
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "zcoll/message_buffer.hpp"
#include "zcoll/message_flow.hpp"
#include "zcoll/protocol.hpp"
#include "zcoll/reduce_kernels.hpp"
#include "zcoll/reduction.hpp"
#include "zcoll/registry.hpp"

namespace zcoll {

class node_context;
struct node_map;

// The tags of phase 2 (partials to owners) and phase 3 (pieces to other nodes) on the
// communicator's private dup (other rounds use other tags).
inline constexpr int spread_partial_tag = 0x7A10;
inline constexpr int spread_result_tag = 0x7A11;

// Piece of the result: [from, from + bytes) of the full result (bytes of an input).
struct result_piece {
  std::size_t from = 0;
  std::size_t bytes = 0;
};

// Bytes of a segment of the messages of phases 2 and 3 (a multiple of 64, so of every element
// size) unless the communicator's crossing_overrides (aggregate.hpp) set another. Measured on 2 and
// 3 one-rank virtual nodes (docs/performance.md, session 15; zcoll.bench allreduce|reduce
// --spread-segment): 64 KiB costs more in messages than it gains, 256-512 KiB are best at 16 MiB
// and within 10 % of one message per piece at 1-4 MiB.
inline constexpr std::size_t spread_segment_bytes = 512 * 1024;
// Segments of each other node's partial that a flow's owner receives ahead of its fold.
inline constexpr std::size_t spread_ring_segments = 4;

// Checks a forced segment (crossing_overrides::spread_segment): a multiple of 64 bytes, or 0
// for spread_segment_bytes. Throws std::invalid_argument otherwise.
void check_spread_segment(std::size_t bytes);

// A reduce on at most this many nodes gives the pieces to the root's node's ranks only: each
// other node sends its partials there (m bytes per node, in one phase: the bound when N = 2),
// instead of P owners and a second phase to the root. Measured on two one-rank virtual nodes
// (zcoll.bench reduce, 2-vCPU VM): P owners 0.4-0.6x comm.Reduce from 64 KiB, mostly the
// second phase's extra copy of half the input.
inline constexpr int reduce_to_root_node_nodes = 2;

// The communicator ranks that own the pieces of a call of `op` rooted at `root`: every rank, or
// for a reduce on at most reduce_to_root_node_nodes nodes the root's node's ranks.
std::vector<int> spread_owners(const node_map& nodes, op_code op, int root);

// The P pieces (index: owner's communicator rank) of a result of `count` elements of `esize`
// bytes: reduce_scatter's blocks, else equal ranges of whole 64-byte lines, one per rank of
// `owners` in that order (an empty tail when the result is short; empty for other ranks).
std::vector<result_piece> spread_pieces(op_code op, std::size_t count, std::size_t esize,
                                        int comm_size, std::span<const int> owners);

// The node rank of `node` that folds and sends `node`'s partial of the piece of communicator
// rank `owner` (on another node), and receives its result in phase 3: the ranks of the other
// nodes, in communicator order, dealt round robin to the node's ranks.
int spread_server(const node_map& nodes, int node, int owner);

class spread_reduction final : public message_flow {
 public:
  // `ctx` and `nodes` must outlive this object.
  spread_reduction(node_context& ctx, const node_map& nodes) : ctx_(ctx), nodes_(nodes) {}

  // Collective (node), after a round of records agreed on `call` (allreduce, reduce or
  // reduce_scatter with a non-empty input, or bcast) across nodes: this rank's input
  // published, staged when private, and phase 1. Then either sends() and recvs() are phase 2's
  // messages, or, with `as_flow` and when flowing(), the call is a message_flow to run.
  void begin(const reduction_call& call, bool as_flow = false);
  // Whether begin() made the call a flow (asked to; a reduce_scatter in place on a node of one
  // rank runs its phases).
  bool flowing() const noexcept { return flow_; }
  // Local, after phase 2's messages: the owner's fold. Then sends() and recvs() are phase 3's.
  void combine();
  // Collective (node), after phase 3's messages or the flow: the node barrier, then this
  // rank's result.
  void finish();

  // message_flow, after begin(call, true): phases 2 and 3 as they can go.
  void take(std::vector<peer_buffer>& recvs, std::vector<peer_buffer>& sends) override;
  void completed(std::size_t id) override;
  // Phase 1 as the messages travel (a node of several ranks): the next segment of a served
  // piece's partial folded and handed out, else of this rank's own piece's.
  bool step() override;

  std::span<const peer_block> sends() const noexcept { return sends_; }
  std::span<const peer_block> recvs() const noexcept { return recvs_; }

 private:
  // Collective (node): this rank's line (filled) published and checked, every rank's work
  // areas made to hold `bytes`.
  call_protocol::published publish(std::size_t bytes);
  std::byte* work(int node_rank, int which) const;  // 0: result area, 1: partials
  // Node rank `j` of this node, by the communicator rank behind it.
  int comm_rank(int j) const;
  // This node's partial of [off, off + bytes) of `piece`, into this rank's partials area.
  void fold_partial(const result_piece& piece, std::size_t off, std::size_t bytes);
  // The owner's fold of [off, off + bytes) of its piece: this node's partial and `others` (the
  // other nodes' partials of the same range, in node order) into the result.
  void fold_segment(std::size_t off, std::size_t bytes, const std::byte* const* others);
  // The segments of `bytes` bytes: each(offset, length).
  template <class Each>
  void for_segments(std::size_t bytes, Each&& each) const;
  // Segments of `bytes` bytes, and the length of segment k.
  std::size_t segment_count(std::size_t bytes) const;
  std::size_t segment_length(std::size_t k, std::size_t bytes) const;
  // Phase 2's sends (this rank's partials of the pieces it serves) and phase 3's: [off, off +
  // bytes) of this rank's result (to every other node, or the root), and its receives of
  // `owner`'s piece: each(peer, data, bytes).
  template <class Each>
  void partial_sends(Each&& each) const;
  template <class Each>
  void result_sends(std::size_t off, std::size_t bytes, Each&& each) const;
  template <class Each>
  void result_recvs(int owner, Each&& each) const;
  // Where this rank's piece of the result goes: its block (reduce_scatter), the root's buffer
  // (reduce), where an allreduce's pieces land, else the node's result area (sent from there).
  std::byte* result_place();
  // The flow's messages: hands them out, numbered.
  // other: nothing follows its completion; ring: a partial into a ring slot (index: its
  // segment); partial: a partial sent (index: its owner); own: a segment of a bcast's own piece
  // arrived (index: the segment), to forward.
  enum class handed_kind : std::uint8_t { other, ring, partial, own };
  void hand(const peer_block& b, int tag, bool receive, handed_kind kind, std::size_t index);
  // After phase 1: phase 2's messages as lists (sends(), recvs()). Or the flow started (a node
  // of one rank in place defers the receives of a piece until its partial went).
  void list_partials();
  // `folded`: phase 1 is done (or the partials are the input), else step() does it.
  void start_flow(bool in_place_alone, bool folded);
  // Phase 2's receives of the next segments whose ring slots are free, and of segment k.
  void post_rings();
  void post_ring(std::size_t k);
  // The owner's fold of segment k from its ring slot (after its own partial of it), and its
  // phase 3 sends.
  void fold_ring(std::size_t k);
  void fold_own_partial(std::size_t k);
  std::byte* ring(std::size_t slot, std::size_t other) const;
  void post_result_recvs(int owner);
  // Whether this rank is its node's server of `owner`'s piece (on another node).
  bool serves(int owner) const;
  // The node rank that folds this node's partial of `owner`'s piece (and holds its result in
  // phase 3): the owner on its own node, else the node's server.
  int folder(int owner) const;
  // This node's partial of `piece` (on a node of one rank: the input itself).
  std::byte* partial(const result_piece& piece) const;
  // A bcast's three steps.
  void begin_bcast(const reduction_call& call, bool as_flow);
  void combine_bcast();
  void finish_bcast();
  // A bcast's phase 2: the root's node's sends, another node's receives
  // (each(peer, data, bytes, own): `own` for this rank's own piece); phase 3: [off, off + bytes)
  // of this rank's piece to the other nodes but the root's, and the receives of the pieces
  // this rank serves from them. The flow forwards segment k once it arrived, in order.
  template <class Each>
  void bcast_sends(Each&& each) const;
  template <class Each>
  void bcast_recvs(Each&& each) const;
  template <class Each>
  void bcast_forwards(std::size_t off, std::size_t bytes, Each&& each) const;
  template <class Each>
  void bcast_forwarded_recvs(Each&& each) const;
  void forward_arrived(std::size_t k);
  // The communicator rank of `node` that serves `owner`'s piece there.
  int member(int node, int owner) const;
  // Where a piece of an allreduce's result or of a bcast's buffer arrives (and an owner's own
  // piece is put): this rank's receive buffer when it is in the arena (its peers copy from it)
  // or on a node of one rank, else its part of the node's result area.
  std::byte* landing(const result_piece& piece) const;
  // After publish(): each node rank's receive buffer where it is in the arena (an allreduce or
  // a bcast on another node than the root's, on a node of several ranks).
  void find_holders(const call_protocol::published& all);
  // Where node rank `node_rank`'s pieces land.
  std::byte* holder(int node_rank) const;
  // Local, after the node barrier: `owner`'s piece into this rank's receive buffer from where it
  // landed (nothing when it landed there).
  void copy_piece(int owner);

  node_context& ctx_;
  const node_map& nodes_;
  // Per call:
  op_code op_ = op_code::allreduce;
  reduce_op rop_ = reduce_op::sum;
  element_type type_ = element_type::uint8;
  int self_ = 0, node_ = 0, root_ = 0;  // this rank, its node, the root (communicator ranks)
  std::size_t third_ = 0;               // bytes of each third of a staging partition
  bool alone_ = false;                  // a node of one rank: no staging, results in place
  std::size_t bytes_ = 0;               // bcast: bytes of the buffer
  int root_node_ = 0;                   // bcast: the root's node
  const std::byte* source_ = nullptr;   // bcast, on the root's node: the root's buffer (or copy)
  bool root_in_place_ = false;          // bcast: the node's ranks read the root's own buffer
  std::byte* out_ = nullptr;            // this rank's receive buffer (nullptr: none wanted)
  std::vector<result_piece> pieces_;
  std::vector<const std::byte*> inputs_;  // every node rank's input
  std::vector<const void*> sources_;
  std::vector<std::byte*> holders_;  // per node rank: its receive buffer in the arena, or null
  bool holders_read_ = false;        // some rank's receive buffer is read by its peers
  message_buffer scratch_;           // the other nodes' partials of this rank's piece (or a ring)
  std::vector<peer_block> sends_, recvs_;
  std::size_t segment_ = spread_segment_bytes;
  std::byte* result_ = nullptr;  // this rank's piece of the result
  bool stream_ = false;          // its fold writes with streaming stores
  // The flow's:
  bool flow_ = false;
  // A node of one rank in place receives results where its partials are sent from: phase 3's
  // receives of a piece wait until its partial went (MPI forbids overlapping buffers in flight).
  bool defer_results_ = false;
  std::size_t slots_ = 0;              // ring slots in use
  std::size_t ring_slot_ = 0;          // bytes of each other node's segment in a slot
  std::vector<int> ring_count_;        // per slot: partials arrived
  std::size_t segments_ = 0;           // of this rank's piece
  std::size_t next_ring_ = 0;          // the next segment whose receives to post
  std::size_t next_fold_ = 0;          // the next segment to fold (bcast: to forward)
  std::vector<std::uint8_t> arrived_;  // bcast: per segment of this rank's piece
  struct handed {
    handed_kind kind;
    std::size_t index;  // ring: the segment; partial: the owner
  };
  struct pending {
    peer_buffer message;
    handed what;
  };
  std::vector<pending> to_recv_, to_send_;  // not yet handed out
  std::vector<handed> handed_;              // per message handed out, by number
  std::vector<int> partials_left_;          // per owner: its partial's segments not yet sent
  struct partial_segment {
    int owner;
    std::size_t segment;
  };
  std::vector<partial_segment> folds_;    // phase 1's served segments, in the order step() folds
  std::size_t next_partial_ = 0;          // the next of folds_
  std::size_t own_partials_ = 0;          // segments of this rank's own partial folded
  std::vector<const std::byte*> others_;  // the other nodes' partials of a fold
};

}  // namespace zcoll
