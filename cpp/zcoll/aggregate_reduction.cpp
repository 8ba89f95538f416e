// Reductions in a round between nodes (aggregate.hpp): each node's partial result in the
// payload of every message the node sends, folded on every rank in node order; a bcast's
// buffer in the root's node's messages.
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "zcoll/aggregate.hpp"
#include "zcoll/copy.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/reduce_kernels.hpp"

namespace zcoll {

void node_messages::begin_reduction(const call_record& record, const reduction_call* call) {
  auto& line = start_round(record);
  const auto& cfg = ctx_.config();
  call_protocol& protocol = ctx_.protocol();
  const int me = cfg.comm_ranks[static_cast<std::size_t>(cfg.rank)];
  const bool bcast = op_ == op_code::bcast;
  const std::byte* input = nullptr;  // what this rank contributes (bcast: the root's buffer)
  if (call && record.call.error == arg_error::none && record.call.op == call->op &&
      is_reduction(op_)) {
    const local_check check = check_reduction_args(op_, cfg.comm_size, me, call->send, call->recv,
                                                   call->reduce, call->algorithm, call->root);
    if (check.ok() && check.block_bytes > 0 && carries(op_, check.block_bytes)) {
      const array_view& in = call->send ? *call->send : *call->recv;
      block_ = check.block_bytes;
      root_node_ = nodes_.node_of[static_cast<std::size_t>(call->root)];
      root_ = call->root;
      if (!bcast) {
        rop_ = static_cast<reduce_op>(call->reduce);
        type_ = *element_type_of(in.dtype);
      }
      if (!bcast || me == root_) input = static_cast<const std::byte*>(in.data);
      const bool wants = bcast ? me != root_ : op_ != op_code::reduce || me == root_;
      result_ = wants ? static_cast<std::byte*>(const_cast<void*>(call->recv->data)) : nullptr;
      result_bytes_ = op_ == op_code::reduce_scatter
                          ? block_ / static_cast<std::size_t>(cfg.comm_size)
                          : block_;
      result_from_ =
          op_ == op_code::reduce_scatter ? static_cast<std::size_t>(me) * result_bytes_ : 0;
      line.call.target = op_;
      line.call.block_bytes = block_;
    }
  }
  const auto all = protocol.publish();
  // The node's partial (bcast: the root's buffer) only when every node rank brings an input of
  // the same size (their dtypes, ops and roots are compared by finish(): nothing is written
  // before its verdict).
  bool together = line.call.target != op_code::none;
  for (int j = 0; j < cfg.size; ++j)
    together &=
        all.call(j).target == line.call.target && all.call(j).block_bytes == line.call.block_bytes;
  reduction_ = aggregate_ = together;
  // A bcast's payload comes from the root's node only.
  auto payload = [&](int from) {
    return together && (!bcast || from == root_node_) ? block_ : std::size_t{0};
  };
  const int n = nodes_.nodes();
  std::vector<std::size_t> out_bytes(static_cast<std::size_t>(n - 1));
  std::vector<std::size_t> in_bytes(static_cast<std::size_t>(n - 1));
  for (int step = 1; step < n; ++step) {
    const auto k = static_cast<std::size_t>(step - 1);
    const int from = (me_node_ - step + n) % n;
    out_bytes[k] = message_head_bytes(cfg.size) + payload(me_node_);
    in_bytes[k] = message_head_bytes(nodes_.ranks_on(from)) + payload(from);
  }
  plan_messages(out_bytes, in_bytes, payload(me_node_));
  write_heads(all, 0);
  if (payload(me_node_) > 0) {
    if (input)
      copy_bytes(message(cfg.rank, local_offset_[static_cast<std::size_t>(cfg.rank)]), input,
                 block_);
    protocol.sync();  // every input (bcast: the root's) in its local area
    std::vector<const void*> inputs;
    for (int j = 0; j < cfg.size; ++j)
      if (!bcast || cfg.comm_ranks[static_cast<std::size_t>(j)] == root_)
        inputs.push_back(message(j, local_offset_[static_cast<std::size_t>(j)]));
    const std::size_t head = message_head_bytes(cfg.size);
    for (const node_message& m : out_)  // the messages this rank sends: the node's partial
      if (bcast)
        copy_bytes(m.data + head, inputs[0], block_);
      else
        reduce_fold(rop_, type_, m.data + head, inputs.data(), cfg.size,
                    block_ / element_bytes(type_));
  }
  begun_ = true;
}

void node_messages::finish_reduction() {
  if (!aggregate_) return;  // unreachable: such a round's records fail agree()
  if (!result_) return;     // reduce off the root, bcast's root: nothing to write
  const int n = nodes_.nodes();
  // What node `node` contributed: this node's in its first outgoing message (its sender wrote
  // it before sending), the others' in the incoming ones.
  auto from_node = [&](int node) -> const std::byte* {
    if (node == me_node_)
      return message(nodes_.sender(me_node_, (me_node_ + 1) % n), out_offset_[0]) +
             message_head_bytes(nodes_.ranks_on(me_node_)) + result_from_;
    const int step = (me_node_ - node + n) % n;
    return message(nodes_.receiver(node, me_node_),
                   in_offset_[static_cast<std::size_t>(step - 1)]) +
           message_head_bytes(nodes_.ranks_on(node)) + result_from_;
  };
  if (op_ == op_code::bcast) {
    copy_bytes(result_, from_node(root_node_), result_bytes_);
    return;
  }
  std::vector<const void*> partials(static_cast<std::size_t>(n));  // in node order
  for (int node = 0; node < n; ++node) partials[static_cast<std::size_t>(node)] = from_node(node);
  reduce_fold(rop_, type_, result_, partials.data(), n, result_bytes_ / element_bytes(type_));
}

spread_reduction& node_messages::spread() {
  if (!spread_) spread_ = std::make_unique<spread_reduction>(ctx_, nodes_);
  return *spread_;
}

}  // namespace zcoll
