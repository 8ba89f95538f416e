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
 * Phases 1 and 3 as above read and write every node rank's buffers, so they need all of them in
 * the arena. When one is private (an mpi4py program's NumPy arrays), each rank instead packs its
 * own blocks into every message and its blocks for its own node into its local area (its
 * partition of the message segment), then a barrier; in phase 3 it fills its own receive
 * buffer from the messages and the node's local areas, and no barrier follows (nothing of the
 * round is written again before the next call's first barrier). This replaced staging whole
 * buffers (send in, receive out: two extra copies of every byte): at P = 4 on nodes of 2 with
 * private buffers, 8 B 20.6 -> 11.4 us, 64 KiB 96 -> 75, 256 KiB 350 -> 161 (rank to rank).
 *
 * Without aggregation (large blocks, where packing costs a copy and saves nothing) the messages
 * carry the records only and the caller sends the blocks between nodes rank to rank; the
 * node-local blocks go through the local areas in the round when a node buffer is private
 * (node_blocks_delivered), else the caller runs the node's part (its Morton schedule, one copy).
 *
 * Message from node a (q_a ranks) to node b (q_b ranks): q_a call records, padded to 64 bytes,
 * then q_a * q_b blocks, receiver-major (the blocks for b's node rank 0 from a's ranks 0..q_a-1
 * first), so each receiver's blocks are contiguous. Messages live in a shared segment of their
 * own, in the partitions of the ranks that send or receive them.
 *
 * An allgather within its size rule uses the round the same way: the message from node a
 * carries a's q_a blocks in node-rank order; each rank copies its block into every message its
 * node sends (then a barrier), and after the verdict reads its own node's blocks from the node's
 * first outgoing message and the other nodes' from the incoming ones.
 *
 * A reduction (allreduce, reduce, reduce_scatter) within its size rule travels whole in the
 * round (aggregate_reduction.cpp): each rank copies its input into its local area, a barrier,
 * each message's sender folds the node's inputs in node-rank order into its payload (the
 * node's partial result), and after the verdict every rank folds the nodes' partials in node
 * order -- this node's read from its first outgoing message -- into its part of the result:
 * the same bits on every rank, no barrier after.
 *
 * Irregular calls (alltoallv, allgatherv, neighbour collectives: vexchange.hpp) use the same
 * round. The head also carries the counts of a's ranks (bytes of every entry of each rank's send
 * list, then of its receive list), so after the round every rank holds every rank's counts and
 * checks every pair -- the same verdict everywhere, with no extra round. The payload is the
 * blocks from a's ranks to b's ranks within the size rule (pack_limit), receiver-major (then
 * sender, then list order); larger ones go rank to rank after the round (the caller's part). Each
 * rank packs its own blocks (its own buffer: no staging) and unpacks its own, after the verdict;
 * one node barrier after packing, none when nothing is packed. A message's size follows from the
 * counts, so the receiver expects what its own ranks' counts say; counts that differ between
 * nodes make a message of another size, received whole, and the check then raises.
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "zcoll/checks.hpp"
#include "zcoll/crossing_policy.hpp"
#include "zcoll/error.hpp"
#include "zcoll/protocol.hpp"
#include "zcoll/reduction.hpp"
#include "zcoll/registry.hpp"
#include "zcoll/schedule.hpp"
#include "zcoll/spread_reduction.hpp"
#include "zcoll/vexchange.hpp"

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

// One irregular pattern's messages as node `node` sees them: where each rank's counts sit in its
// node's head (words of 8 bytes after the records: send list's, then receive list's), and the
// tuples (communicator ranks) of each message this node sends or receives, in payload order
// (receiver, then sender, then the pattern's order).
struct irregular_layout {
  std::vector<std::size_t> counts_at;         // per communicator rank: its first word
  std::vector<std::size_t> counts_words;      // per node: words of its ranks' counts
  std::vector<std::vector<v_tuple>> out, in;  // per step - 1: to node + step, from node - step
};
// `pattern` must hold the communicator's lists and tuples (all_send_blocks and kin).
irregular_layout make_irregular_layout(const node_map& nodes, const v_pattern& pattern, int node);

// A message this rank sends or receives in phase 2.
struct node_message {
  int node = 0;  // the other node
  int peer = 0;  // the communicator rank at the other end
  std::byte* data = nullptr;
  std::size_t bytes = 0;
};

// What an alltoall or allgather adds to its round: this rank's buffers and options (send
// nullptr: in place).
struct collective_data {
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
  // How this communicator's calls cross nodes (crossing_policy.hpp, held by the context's
  // auto_policy): what they carry in the round, an allgather's route beyond it, what tests
  // force.
  crossing_policy& policy() noexcept { return policy_; }
  const crossing_policy& policy() const noexcept { return policy_; }
  crossing_overrides& overrides() noexcept { return policy_.overrides(); }
  const crossing_overrides& overrides() const noexcept { return policy_.overrides(); }
  // The largest block a call of `op` across these nodes carries in its round (the policy's);
  // negative: none. Irregular calls take an alltoall's.
  std::int64_t pack_limit(op_code op = op_code::alltoall) const noexcept {
    return policy_.pack_limit(op);
  }
  // Whether a call of `op` carries blocks (a reduction: inputs) of `bytes` in its round.
  bool carries(op_code op, std::uint64_t bytes) const noexcept {
    return policy_.carries(op, bytes);
  }
  // Collective (node): phase 1. Every rank's `record` goes into the head of every message its
  // node sends; with `data` on every node rank, blocks within pack_limit() and records that
  // match on the node (an alltoall whose local checks passed), the blocks bound for other nodes
  // are packed too. Never throws for bad arguments: they are in the records, which finish()
  // compares.
  void begin(const call_record& record, const collective_data* data);
  // Local, after begin: the messages this rank sends and the ones it receives (full expected
  // size; the caller overwrites the head when a message arrives with another size).
  std::span<const node_message> outgoing() const noexcept { return out_; }
  std::span<const node_message> incoming() const noexcept { return in_; }
  // Whether begin() packed blocks (the node's records allowed it): finish() delivers all of
  // the call's blocks.
  bool packed() const noexcept { return aggregate_; }
  // Whether finish() delivers the blocks between this node's ranks (packed(), or rank to rank
  // with a private buffer on the node); if not, the caller runs the node's part.
  bool node_blocks_delivered() const noexcept { return node_blocks_; }
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

  // Collective (node): phase 1 of an irregular call's round. `call` nullptr: this rank's
  // arguments could not be converted (its `record` says why). Every rank's counts go into the
  // heads when every node rank's local checks passed on the same pattern; with `carry`, the
  // blocks within pack_limit() are packed too. finish() then checks every pair's counts and
  // unpacks this rank's blocks. The call's receive buffer must stay alive until finish().
  void begin_irregular(const call_record& record, const v_call* call, bool carry);
  // Collective (node): phase 1 of a reduction's round (allreduce, reduce, reduce_scatter,
  // bcast). `call` nullptr: this rank's arguments could not be converted (its
  // `record` says why). When every node rank's local checks passed on inputs of the same size
  // within pack_limit(op), each copies its input into its local area, a barrier, and each
  // message's sender folds the node's inputs (node-rank order) into the payload: the node's
  // partial result. finish() then folds the nodes' partials in node order -- the same bits on
  // every rank -- into this rank's result (reduce: the root's; reduce_scatter: its block). A
  // bcast: the root's buffer into its local area, and the root's node's messages carry it.
  // The call's buffers must stay alive until finish().
  void begin_reduction(const call_record& record, const reduction_call* call);

  // The reductions beyond their round's size rule (spread_reduction.hpp), run after a round of
  // records agreed on them; made on first use.
  spread_reduction& spread();

  // After finish() of an irregular round: this rank's blocks to or from other nodes that the
  // round did not carry (non-empty, beyond pack_limit(), or all without carry) -- the caller
  // sends and receives them rank to rank. Both lists follow the pattern's tuple order, so the
  // k-th block between two ranks is the k-th on both sides (one tag serves them all). The sends
  // point into the send buffer (in place: the receive buffer, which a receive overwrites).
  using direct_block = peer_block;
  std::span<const direct_block> direct_sends() const noexcept { return direct_sends_; }
  std::span<const direct_block> direct_recvs() const noexcept { return direct_recvs_; }
  std::size_t direct_blocks() const noexcept { return direct_sends_.size() + direct_recvs_.size(); }

  // A round failed (a peer died or never came, peer_error): every later round throws at once,
  // naming `why` (the first failure's, if several are marked).
  void mark_failed(std::string why) {
    if (failure_.empty()) failure_ = std::move(why);
  }
  const std::string& failure() const noexcept { return failure_; }
  // Throws peer_error ("unusable after an earlier failure") once a round failed.
  void check_unbroken() const;

 private:
  // The start of every round's phase 1: the state reset, this rank's record in its slot (the
  // senders copy it into the heads) and its descriptor line, without data (target none).
  detail::rank_line& start_round(const call_record& record);
  const irregular_layout& layout_for(int pattern);
  // Bytes of the head of a message from `node` in an irregular round of `layout`.
  std::size_t irregular_head_bytes(const irregular_layout& layout, int node) const noexcept;
  // Sizes the messages of a round: per step - 1, the outgoing and incoming bytes; and
  // `local_bytes` in every node rank's partition for its blocks to its own node (own_ rounds).
  void plan_messages(std::span<const std::size_t> out_bytes, std::span<const std::size_t> in_bytes,
                     std::size_t local_bytes = 0);
  // The heads of the messages this rank sends: the node's records, in an irregular round whose
  // ranks all counted also their counts (the published metadata of `parity`).
  void write_heads(const call_protocol::published& all, std::size_t parity);
  // Every node rank's counts (bytes of its send list's entries, then its receive list's), as
  // published at `parity`, into a head's counts.
  void write_counts(std::byte* into, const call_protocol::published& all, std::size_t parity) const;
  // Whether this irregular round carries a block of `bytes` (within carry_limit_).
  bool carried(std::uint64_t bytes) const noexcept;
  // Irregular finish: every rank's counts from the heads, every pair checked, then this rank's
  // blocks unpacked.
  void finish_irregular(const std::vector<call_record>& records);
  std::byte* message(int owner, std::size_t offset) const;
  // Resolves the node's (arena) buffers and packs phase 1's blocks: those of the messages this
  // rank sends (`alone`), or an equal share of all.
  void pack(const collective_args& args, const call_protocol::published& all, bool alone);
  void unpack();
  // An own_ round: this rank's blocks for other nodes into every outgoing message and its
  // blocks for its own node into its local area; after the verdict, its receive buffer from the
  // incoming messages and its node's local areas.
  void pack_own(const collective_args& args);
  void unpack_own();
  void unpack_gathered();  // an allgather's unpack_own
  // A reduction round's finish: the nodes' partials folded into this rank's result.
  void finish_reduction();

  node_context& ctx_;
  node_map nodes_;
  int me_node_ = 0;
  crossing_policy& policy_;  // ctx_.policy()'s, made after the node map's checks
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
  std::vector<std::byte*> send_, recv_;    // every node rank's buffers (staged ones resolved)
  std::vector<std::size_t> local_offset_;  // per node rank: its local area in its partition
  std::size_t block_ = 0, recv_bytes_ = 0;
  // own_: a node rank's buffer is private (not in the arena): each rank packs and unpacks its
  // own blocks (its peers never touch its buffers), its blocks to its own node through its
  // local area -- no staging of whole buffers, no barrier after unpacking.
  bool in_place_ = false, own_ = false, aggregate_ = false, node_blocks_ = false;
  bool begun_ = false;
  block_order order_ = block_order::morton;
  int copy_ = 0;
  const std::byte* user_send_ = nullptr;  // own_: this rank's blocks (in place: its receive buffer)
  void* user_recv_ = nullptr;
  // Reduction rounds (block_: input bytes; aggregate_: carried):
  bool reduction_ = false;
  reduce_op rop_ = reduce_op::sum;
  element_type type_ = element_type::uint8;
  std::byte* result_ = nullptr;   // where this rank's part of the result goes (nullptr: none)
  int root_ = 0, root_node_ = 0;  // reduce, bcast: the root (communicator rank) and its node
  std::size_t result_from_ = 0, result_bytes_ = 0;  // that part, in bytes of the full result
  // Irregular rounds:
  std::map<int, irregular_layout> layouts_;
  const irregular_layout* layout_ = nullptr;  // this round's, when every node rank counted
  const v_pattern* pattern_ = nullptr;
  std::int64_t carry_limit_ = -1;          // the largest block this round carries (negative: none)
  std::vector<v_span> my_send_, my_recv_;  // this rank's blocks
  const std::byte* my_send_base_ = nullptr;  // where my_send_ lies (in place: the receive buffer)
  std::vector<direct_block> direct_sends_, direct_recvs_;
  std::string failure_;
  std::unique_ptr<spread_reduction> spread_;
};

// Runs `steps` (a round between nodes and what follows it); a peer_error other than an
// interrupt marks the rounds failed first, so every later call raises at once.
template <class Steps>
void marking_failure(node_messages& round, Steps&& steps) {
  try {
    steps();
  } catch (const wait_interrupted&) {
    throw;
  } catch (const peer_error& e) {
    round.mark_failed(e.what());
    throw;
  }
}

}  // namespace zcoll
