/*
 * Messages between nodes as a flow: a sender posts what the flow hands it, tells it each
 * receive that arrived, and posts what it hands over next, until nothing is in flight. The flow
 * is the engine's (MPI-free); the sender is MPI's (mpi_messages.hpp: exchange_flow).
 *
 * A flow is how a call overlaps its work with its messages (a pipeline): a spread reduction's
 * owner folds each segment of its piece as soon as every node's partial of it arrived and sends
 * the segment on, while the next segments travel (spread_reduction.hpp). Against two fixed
 * phases (all of phase 2 received, all folded, all of phase 3 sent) the transfer and the fold
 * overlap and the segments are folded while in cache, at the price of more, smaller messages.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zcoll {

// Where a communicator's messages between nodes go: its private duplicate (mpi4py's C handle,
// MPI._handleof), this rank in it, the rounds' tag, and the sends of a round in flight at most.
struct nodes_route {
  std::uintptr_t comm = 0;
  int rank = 0;
  int tag = 0;
  int window = 1;
};

// A block sent to or received from communicator rank `peer` by MPI point-to-point after a round
// between nodes: a spread call's messages, an irregular call's blocks rank to rank
// (node_messages::direct_sends).
struct peer_block {
  int peer = 0;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
};

// A block of the rank-to-rank paths: `bytes` at `data`, to or from `peer` with `tag`.
struct peer_buffer {
  int peer = 0;
  int tag = 0;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
};

class message_flow {
 public:
  virtual ~message_flow() = default;
  // Appends the receives and the sends to post now (posted in that order).
  virtual void take(std::vector<peer_buffer>& recvs, std::vector<peer_buffer>& sends) = 0;
  // The message numbered `id` completed (arrived, or went: its buffer is free again). Messages
  // are numbered 0, 1, ... in the order take() handed them out, each call's receives first.
  virtual void completed(std::size_t id) = 0;
  // Local work the flow can do while its messages travel (a segment's fold): does one unit and
  // returns true (then take() may hand out more), or returns false when none is left. The
  // sender calls it whenever nothing completed, and goes on until nothing is in flight and no
  // work is left.
  virtual bool step() { return false; }
};

}  // namespace zcoll
