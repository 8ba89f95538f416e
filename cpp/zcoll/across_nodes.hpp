/*
 * Calls on a communicator spanning several nodes, each written once, whole: the round of
 * messages that agrees on every rank's call record (aggregate.hpp), the node's part (the
 * engine), and the blocks between nodes (mpi_messages.hpp), in that order.
 *
 * - alltoall, allgather: blocks within the crossing policy's limit travel in the round; larger
 *   ones go rank to rank after the node's part, or an allgather's by the leaders' concurrent
 *   exchange (leaders_exchange.hpp) where the policy routes it so.
 * - the irregular calls: the round checks every pair's counts and carries the blocks up to the
 *   limit; the rest go rank to rank (one tag: the k-th block between two ranks matches).
 * - the reductions and bcast: whole in the round within the size rule, else spread over the
 *   ranks after a round of records (spread_reduction.hpp), as a flow where it can.
 * - a global transpose: the round of records, the node's part, then each remote rank's block
 *   as an MPI subarray message.
 *
 * A persistent plan on several nodes runs the same blocks between nodes on every run: persistent
 * requests made once at its creation, from the same lists of blocks as the one-shot calls
 * (collective_plan_blocks, irregular_plan_blocks), or a transfer plan's subarray messages
 * (transfer_plan_blocks).
 *
 * Part of zcoll_mpi, the only library that calls MPI; the binding converts the arguments and
 * calls one of these with the GIL released. A call that fails on a peer (peer_error) marks the
 * communicator's rounds failed, so every later call raises at once. Trade-off: one call holds
 * the whole protocol, so a Python program cannot overlap it with other work (the persistent
 * plans' start/wait can).
 *
 * No MPI type appears here: a build without MPI links across_nodes_without_mpi.cpp in its place,
 * whose every entry throws, so the binding is one text in both builds (and such a build never
 * registers a communicator spanning nodes).
 */
#pragma once

#include <memory>
#include <string>

#include "zcoll/aggregate.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/message_flow.hpp"
#include "zcoll/plan.hpp"
#include "zcoll/transfer.hpp"

namespace zcoll {

// The rest of a begun round: this rank's messages (at most route.window sends in flight), the
// node barrier that ends the exchange, then node_messages::finish (the verdict).
void finish_round(node_context& ctx, node_messages& round, const nodes_route& route,
                  const std::string& what);

// A round that only carries every rank's `record`: every rank raises the error any rank's
// record calls for, or goes on.
void agree_across_nodes(node_context& ctx, const call_record& record, const nodes_route& route,
                        const std::string& what);

// An alltoall or allgather on several nodes (`send` nullptr: in place), `record` its call
// record (describe()).
void collective_across_nodes(node_context& ctx, op_code op, const array_view* send,
                             const array_view& recv, int order, int copy, const call_record& record,
                             const nodes_route& route);
// Only the blocks between this rank's node and the others, after the node's part (as
// collective_across_nodes sends them; benchmarks time it alone).
void blocks_between_nodes(node_context& ctx, op_code op, const array_view* send,
                          const array_view& recv, const nodes_route& route);

// An irregular call on several nodes; `call` nullptr: this rank's arguments could not be
// converted (`record` says why: the round raises it on every rank).
void irregular_across_nodes(node_context& ctx, op_code op, const v_call* call,
                            const call_record& record, const nodes_route& route);

// A reduction or bcast on several nodes; `call` nullptr as for irregular_across_nodes.
void reduction_across_nodes(node_context& ctx, op_code op, const reduction_call* call,
                            const call_record& record, const nodes_route& route);

// A global transpose on several nodes, after its record agreed (agree_across_nodes): the node's
// part, then each remote rank's block as an MPI subarray message.
void transfer_across_nodes(node_context& ctx, const transfer_geometry& g, const array_view& send,
                           const array_view& recv, int order, int copy, const nodes_route& route);

// The blocks between nodes of an alltoall or allgather plan on its arrays (`send` nullptr: in
// place), one message per pair of ranks with the plan's own `tag`.
std::unique_ptr<plan_between_nodes> collective_plan_blocks(std::shared_ptr<node_context> ctx,
                                                           op_code op, const array_view* send,
                                                           const array_view& recv,
                                                           const nodes_route& route, int tag);

// The blocks between nodes of an irregular plan, from the round that agreed on its creation
// (begin_irregular without carrying: every block between nodes goes rank to rank); the k-th
// block between two ranks has tag `tag_base` + k (persistent requests start in any order).
std::unique_ptr<plan_between_nodes> irregular_plan_blocks(std::shared_ptr<node_context> ctx,
                                                          op_code op, bool swap,
                                                          const nodes_route& route, int tag_base);

// A transfer plan's blocks between nodes: every run agrees across nodes on its record, then
// posts the plan's subarray messages on the run's arrays before the node part and waits for
// them after it.
class transfer_between_nodes : public plan_between_nodes {
 public:
  virtual void agree(const call_record& record) = 0;
  virtual void set_arrays(void* recv, const void* send) = 0;
};
std::unique_ptr<transfer_between_nodes> transfer_plan_blocks(std::shared_ptr<node_context> ctx,
                                                             const transfer_geometry& g,
                                                             const nodes_route& route, int tag);

}  // namespace zcoll
