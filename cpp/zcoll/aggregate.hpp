/*
 * Aggregated alltoall across nodes (TPDS'18 §2.5, "MN-CO").
 *
 * A communicator spanning N nodes sends, with the direct path, one MPI message per pair of
 * ranks on different nodes: P * (P - P/N) per alltoall. Here each ordered pair of nodes
 * exchanges one aggregated message, N * (N - 1) per alltoall, in three phases:
 *   1. pack (this file, collective over the node): every node rank publishes its call record
 *      (in its control slot) and buffers; barrier; each message's sender writes the node's
 *      records into its head; when the node's calls allow, the ranks copy, in equal shares and
 *      Morton order, every block bound for another node into that node's message; barrier
 *      (only then: a message of records alone is complete once its sender wrote it).
 *   2. exchange (MPI point-to-point: mpi_messages.hpp, or the Python side's mpi4py loop): the
 *      message from node a to node b is sent by one rank of a and received by one rank of b,
 *      the pairs spread over the ranks of each node (node rank (k - 1) mod q for the node k
 *      steps away), so every rank posts about (N - 1) / q sends and receives; then a node
 *      barrier.
 *   3. unpack (collective over the node): every rank reads every rank's record from the
 *      messages' heads and the ranks agree (protocol.hpp's agree: the same verdict on every
 *      rank of every node) -- the argument check across nodes travels with the data, so it
 *      costs no extra round of messages; then the node-local blocks (the node's own schedule)
 *      and the received blocks are copied into the receive buffers, in equal shares; barrier.
 * Nothing is written into a receive buffer before every rank's arguments are known good.
 *
 * Without aggregation (`aggregate` false: large blocks, where packing costs a copy and saves
 * nothing) the messages carry the records only; phase 3 then copies the node-local blocks and
 * the caller sends the rest directly, rank to rank.
 *
 * Message from node a (q_a ranks) to node b (q_b ranks): q_a call records, padded to 64 bytes,
 * then q_a * q_b blocks, receiver-major (the blocks for b's node rank 0 from a's ranks 0..q_a-1
 * first), so each receiver's blocks are contiguous. Messages live in a shared segment of their
 * own, in the partitions of the ranks that send or receive them.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "zcoll/checks.hpp"
#include "zcoll/protocol.hpp"
#include "zcoll/registry.hpp"
#include "zcoll/schedule.hpp"

namespace zcoll {

class node_context;
struct collective_args;
struct data_segment;

// The nodes of a communicator, as every rank sees them.
struct node_map {
  std::vector<int> node_of;               // communicator rank -> node index (node order)
  std::vector<std::vector<int>> members;  // node -> its communicator ranks (= node rank order)
  std::vector<int> node_rank;             // communicator rank -> its rank within its node

  // From the lowest communicator rank of each rank's node (nodes ordered by that rank).
  static node_map from_leaders(std::span<const int> leader_of);
  int nodes() const noexcept { return static_cast<int>(members.size()); }
  int ranks_on(int node) const noexcept {
    return static_cast<int>(members[static_cast<std::size_t>(node)].size());
  }
  // Node rank that sends the message from node `from` to node `to` (on `from`), and node rank
  // that receives it (on `to`).
  int sender(int from, int to) const noexcept;
  int receiver(int from, int to) const noexcept;
};

// Bytes of the head of a message from a node of `senders` ranks (its call records, padded).
std::size_t message_head_bytes(int senders) noexcept;

// One block copy of phase 1 or 3: node ranks' buffers and message offsets, in the order run.
struct aggregate_copy {
  std::int32_t rank = 0;     // node rank whose send (pack) or receive (unpack) buffer it touches
  std::int32_t message = 0;  // index into the node's outgoing (pack) or incoming (unpack) list
  std::int32_t peer = 0;     // communicator rank at the other end
  std::uint32_t slot = 0;    // block index within the message's payload
};

// The blocks between node `node` and every other node, in Morton order within each message
// (messages in staggered order: the node 1 step away first). pack: this node's senders into
// its outgoing messages; unpack: incoming messages into this node's receivers.
std::vector<aggregate_copy> aggregate_copies(const node_map& nodes, int node, bool pack);

// Largest payload of a node's outgoing message that its sender packs alone, with no barrier
// after packing (phase 1); larger ones are packed by all node ranks in equal shares, then a
// barrier. Measured both ways (zcoll.bench alltoall --between-nodes: xn:alone, xn:shares) for
// payloads of 4 to 64 KiB: on 16 real cores (virtual nodes of 2 and 4) alone was as fast or
// up to 1.2x faster (64 KiB payloads of 4 KiB blocks at P = 16); on the oversubscribed 2-vCPU
// VM (P = 4) 1.1x faster from 32 KiB. Beyond 64 KiB, shares spread a copy that outgrows the
// barrier it costs.
inline constexpr std::size_t sender_packs_bytes = 64 * 1024;

// A message this rank sends or receives in phase 2.
struct node_message {
  int node = 0;  // the other node
  int peer = 0;  // the communicator rank at the other end
  std::byte* data = nullptr;
  std::size_t bytes = 0;
};

// What an aggregated alltoall adds to its round: this rank's buffers and options (send
// nullptr: in place).
struct alltoall_data {
  const array_view* send = nullptr;
  const array_view* recv = nullptr;
  int order = 0;  // block_order value or auto_order
  int copy = 0;   // copy_mode value or auto_copy
};

// One round of messages between the nodes of a communicator: the agreement every call on
// several nodes starts with (each rank's call record reaches every rank), carrying the blocks
// of an aggregated alltoall when the call is one.
class node_messages {
 public:
  node_messages(node_context& ctx, node_map nodes);

  const node_map& nodes() const noexcept { return nodes_; }
  // Collective (node): phase 1. Every rank's `record` goes into the head of every message its
  // node sends; with `data` on every node rank and records that match on the node (an alltoall
  // whose local checks passed), the blocks bound for other nodes are packed too. Never throws
  // for bad arguments: they are in the records, which finish() compares.
  void begin(const call_record& record, const alltoall_data* data);
  // Local, after begin: the messages this rank sends and the ones it receives (full expected
  // size; the caller overwrites the head when a message arrives with another size).
  std::span<const node_message> outgoing() const noexcept { return out_; }
  std::span<const node_message> incoming() const noexcept { return in_; }
  // Whether begin() packed blocks (the node's records allowed it).
  bool packed() const noexcept { return aggregate_; }
  // The largest payload the sender packs alone (default sender_packs_bytes): 0 has every
  // message packed in shares, SIZE_MAX each by its sender. Every rank of the node must set the
  // same value before the same call (it decides who joins the barrier); for measuring both
  // sides of the threshold. Returns the previous value.
  std::size_t set_sender_packs_bytes(std::size_t bytes) noexcept {
    return std::exchange(sender_packs_bytes_, bytes);
  }
  // Collective (node), after the node barrier that ends the exchange: the verdict over every
  // rank's record (protocol.hpp's agree: the same error on every rank of every node, or
  // none), then, when begin() packed, phase 3.
  void finish();

 private:
  std::byte* message(int owner, std::size_t offset) const;
  void plan_messages(std::size_t block);
  // Resolves the node's buffers (staging private ones) and packs phase 1's blocks: those of the
  // messages this rank sends (`alone`), or an equal share of all.
  void pack(const collective_args& args, const call_protocol::published& all,
            const detail::rank_line& line, bool alone);
  void unpack();

  node_context& ctx_;
  node_map nodes_;
  int me_node_ = 0;
  std::vector<aggregate_copy> pack_copies_, unpack_copies_;
  std::vector<aggregate_copy> sent_copies_;  // the pack copies of the messages this rank sends
  std::size_t widest_message_blocks_ = 0;    // blocks in this node's largest outgoing message
  std::size_t sender_packs_bytes_ = sender_packs_bytes;
  // The messages, each in the partition of the rank that sends or receives it: a segment of
  // their own, as a fast rank's next call may write its staging partition while a slow one
  // still reads the heads of this round.
  std::shared_ptr<data_segment> messages_;
  // Per round (between begin and finish):
  op_code op_ = op_code::none;
  std::vector<std::size_t> out_offset_, in_offset_;  // per message: offset in its owner's partition
  std::vector<node_message> out_, in_;
  std::vector<std::byte*> send_, recv_;  // every node rank's buffers (staged ones resolved)
  std::size_t block_ = 0, recv_bytes_ = 0, send_part_ = 0;
  bool in_place_ = false, staged_ = false, my_recv_staged_ = false, aggregate_ = false;
  bool begun_ = false;
  block_order order_ = block_order::morton;
  int copy_ = 0;
  void* user_recv_ = nullptr;
};

}  // namespace zcoll
