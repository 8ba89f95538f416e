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
 * A reduce on two nodes gives the pieces to the root's node's ranks only
 * (reduce_to_root_node_nodes): the other node sends them its partials, and phase 3 is empty.
 * A bcast beyond its round's rule is spread alike, with pieces of the root's buffer: the root's
 * node sends each other node's rank its piece (its servers reading the root's buffer, in place
 * when it is in the arena, else a copy in the root's staging partition) and each of its own
 * ranks' pieces to that rank's server on every other node (phase 2); the other nodes pass
 * their own pieces on between them (phase 3); every rank copies the pieces from its node's
 * result area (the root's node: from the root's buffer). Each node receives the buffer once.
 *
 * Bytes between nodes, per node of q ranks: (P - q) m / P out in phase 2 and as many in in phase
 * 3, each rank sending about 1/q of them -- against the leaders' path this replaced (the node's
 * reduction into its leader, a gather of N partials to the first leader, its fold, a broadcast
 * back: (N - 1) m into and out of one rank, all from Python). Messages: each rank about
 * 2 (P - q) / q, each of m / P bytes. Determinism as the node's reductions: each element of the
 * result is computed by exactly one rank, in an order fixed by (nodes, size).
 *
 * The messages go by MPI between the phases: the caller (the binding from C++, or the Python
 * path by mpi4py) sends sends() and receives recvs() after begin() and again after combine().
 */
#pragma once

#include <cstddef>
#include <span>
#include <vector>

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

// A block sent to or received from communicator rank `peer` by MPI point-to-point after a round
// between nodes: a spread call's messages of phase 2 or 3, an irregular call's blocks rank to
// rank (node_messages::direct_sends).
struct peer_block {
  int peer = 0;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
};

class spread_reduction {
 public:
  // `ctx` and `nodes` must outlive this object.
  spread_reduction(node_context& ctx, const node_map& nodes) : ctx_(ctx), nodes_(nodes) {}

  // Collective (node), after a round of records agreed on `call` (allreduce, reduce or
  // reduce_scatter with a non-empty input) across nodes: this rank's input published, staged
  // when private, and phase 1. Then sends() and recvs() are phase 2's messages.
  void begin(const reduction_call& call);
  // Local, after phase 2's messages: the owner's fold. Then sends() and recvs() are phase 3's.
  void combine();
  // Collective (node), after phase 3's messages: the node barrier, then this rank's result.
  void finish();

  std::span<const peer_block> sends() const noexcept { return sends_; }
  std::span<const peer_block> recvs() const noexcept { return recvs_; }

 private:
  // Collective (node): this rank's line (filled) published and checked, every rank's work
  // areas made to hold `bytes`.
  call_protocol::published publish(std::size_t bytes);
  std::byte* work(int node_rank, int which) const;  // 0: result area, 1: partials
  // Node rank `j` of this node, by the communicator rank behind it.
  int comm_rank(int j) const;
  void fold_partial(std::byte* dst, const result_piece& piece);
  // The node rank that folds this node's partial of `owner`'s piece (and holds its result in
  // phase 3): the owner on its own node, else the node's server.
  int folder(int owner) const;
  // This node's partial of `piece` (on a node of one rank: the input itself).
  std::byte* partial(const result_piece& piece) const;
  // A bcast's three steps.
  void begin_bcast(const reduction_call& call);
  void combine_bcast();
  void finish_bcast();
  // The communicator rank of `node` that serves `owner`'s piece there.
  int member(int node, int owner) const;
  // Where a piece of an allreduce's result or of a bcast's buffer arrives (and an owner's own
  // piece is put): the node's result area, or on a node of one rank the buffer itself.
  std::byte* landing(const result_piece& piece) const;

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
  std::vector<std::byte> scratch_;  // the other nodes' partials of this rank's piece
  std::vector<peer_block> sends_, recvs_;
};

}  // namespace zcoll
