// Reductions in a round between nodes (aggregate.hpp): each node's partial result in the
// payload of every message the node sends, folded on every rank in node order.
#include <cstring>
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
  const std::byte* input = nullptr;
  if (call && record.call.error == arg_error::none && record.call.op == call->op &&
      (op_ == op_code::allreduce || op_ == op_code::reduce || op_ == op_code::reduce_scatter)) {
    const local_check check = check_reduction_args(op_, cfg.comm_size, me, call->send, call->recv,
                                                   call->reduce, call->algorithm, call->root);
    const std::int64_t limit = pack_limit(op_);
    if (check.ok() && check.block_bytes > 0 && limit >= 0 &&
        check.block_bytes <= static_cast<std::uint64_t>(limit)) {
      const array_view& in = call->send ? *call->send : *call->recv;
      input = static_cast<const std::byte*>(in.data);
      rop_ = static_cast<reduce_op>(call->reduce);
      type_ = *element_type_of(in.dtype);
      block_ = check.block_bytes;
      const bool wants = op_ != op_code::reduce || call->root == me;
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
  // The node's partial only when every node rank brings an input of the same size (their
  // dtypes and ops are compared by finish(): nothing is written before its verdict).
  bool together = line.call.target != op_code::none;
  for (int j = 0; j < cfg.size; ++j)
    together &=
        all.call(j).target == line.call.target && all.call(j).block_bytes == line.call.block_bytes;
  reduction_ = aggregate_ = together;
  const int n = nodes_.nodes();
  const std::size_t payload = together ? block_ : 0;
  std::vector<std::size_t> out_bytes(static_cast<std::size_t>(n - 1));
  std::vector<std::size_t> in_bytes(static_cast<std::size_t>(n - 1));
  for (int step = 1; step < n; ++step) {
    const auto k = static_cast<std::size_t>(step - 1);
    out_bytes[k] = message_head_bytes(cfg.size) + payload;
    in_bytes[k] = message_head_bytes(nodes_.ranks_on((me_node_ - step + n) % n)) + payload;
  }
  plan_messages(out_bytes, in_bytes, payload);
  write_heads(all, 0);
  if (together) {
    copy_bytes(message(cfg.rank, local_offset_[static_cast<std::size_t>(cfg.rank)]), input, block_);
    protocol.sync();  // every input in its local area
    std::vector<const void*> inputs(static_cast<std::size_t>(cfg.size));
    for (int j = 0; j < cfg.size; ++j)
      inputs[static_cast<std::size_t>(j)] = message(j, local_offset_[static_cast<std::size_t>(j)]);
    const std::size_t count = block_ / element_bytes(type_);
    for (const node_message& m : out_)  // the messages this rank sends: the node's partial
      reduce_fold(rop_, type_, m.data + message_head_bytes(cfg.size), inputs.data(), cfg.size,
                  count);
  }
  begun_ = true;
}

void node_messages::finish_reduction() {
  if (!aggregate_) return;  // unreachable: such a round's records fail agree()
  if (!result_) return;     // reduce off the root: nothing to write
  const int n = nodes_.nodes();
  // Every node's partial, in node order: this node's in its first outgoing message (its
  // sender folded it before sending), the others' in the incoming ones.
  std::vector<const void*> partials(static_cast<std::size_t>(n));
  const int first_to = (me_node_ + 1) % n;
  partials[static_cast<std::size_t>(me_node_)] =
      message(nodes_.sender(me_node_, first_to), out_offset_[0]) +
      message_head_bytes(nodes_.ranks_on(me_node_)) + result_from_;
  for (int step = 1; step < n; ++step) {
    const int from = (me_node_ - step + n) % n;
    partials[static_cast<std::size_t>(from)] =
        message(nodes_.receiver(from, me_node_), in_offset_[static_cast<std::size_t>(step - 1)]) +
        message_head_bytes(nodes_.ranks_on(from)) + result_from_;
  }
  reduce_fold(rop_, type_, result_, partials.data(), n, result_bytes_ / element_bytes(type_));
}

}  // namespace zcoll
