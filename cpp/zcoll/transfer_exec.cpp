// Execution of a global transpose (transfer.hpp) on a node context: one strided box copy per
// block, in a schedule's order, between two barriers. Both arrays must be in the arena.
#include <string>

#include "zcoll/copy.hpp"
#include "zcoll/error.hpp"
#include "zcoll/exchange.hpp"

namespace zcoll {

namespace {

static_assert(max_transfer_dims <= max_box_dims, "a transfer block must fit copy_box");

constexpr const char* transfer_prefix = "zcoll.transfer: ";

}  // namespace

call_record node_context::describe_transfer(const transfer_geometry& g, const array_view& send,
                                            const array_view& recv, int order, int copy) const {
  const int me = config_.comm_ranks[static_cast<std::size_t>(config_.rank)];
  local_check check = check_transfer_args(g, me, send, recv);
  if (!check_codes(check, order, copy, false))
    return error_record(check.error, transfer_prefix + check.message);
  call_record r;
  r.call.op = op_code::transfer;
  r.call.order = static_cast<std::int8_t>(order);
  r.call.dtype = recv.dtype;
  r.call.block_bytes = g.signature();
  return r;
}

void node_context::run_transfer(const transfer_geometry& g, const array_view& send,
                                const array_view& recv, int order, int copy) {
  const int me = config_.comm_ranks[static_cast<std::size_t>(config_.rank)];
  local_check check = check_transfer_args(g, me, send, recv);
  if (!check_codes(check, order, copy, false)) fail(check.error, transfer_prefix + check.message);
  const block_order o = order == auto_order ? policy_.builtin_order(check.block_bytes)
                                            : static_cast<block_order>(order);
  execute_transfer(g, send, recv, o, copy);
}

void node_context::resolve_all(const call_protocol::published& all, bool send_side,
                               std::vector<std::byte*>* bases) {
  bases->assign(static_cast<std::size_t>(config_.size), nullptr);
  for (int j = 0; j < config_.size; ++j) {
    const buffer_ref& ref = send_side ? all.line(j).send : all.line(j).recv;
    const call_descriptor& call = all.call(j);
    const std::string what = call.op == op_code::plan ? std::string(name_of(call.target)) + "_init"
                                                      : std::string(name_of(call.op));
    if (ref.segment == 0)
      throw usage_error("zcoll." + what + ": " + protocol_.rank_name(j) + "'s " +
                        (send_side ? "source" : "destination") +
                        " array is not in the shared arena (allocate it with zcoll.empty)");
    (*bases)[static_cast<std::size_t>(j)] = segments_.resolve(ref);
  }
}

void node_context::execute_transfer(const transfer_geometry& g, const array_view& send,
                                    const array_view& recv, block_order order, int copy) {
  auto& line = protocol_.next(op_code::transfer);
  line.call.order = static_cast<std::int8_t>(order);
  line.call.block_bytes = g.signature();
  line.call.dtype = recv.dtype;
  line.send = segments_.locate(send.data, send.nbytes);
  line.recv = segments_.locate(recv.data, recv.nbytes);
  const auto all = protocol_.publish();
  check_calls(all, op_code::transfer);
  check_arguments(all);
  resolve_all(all, true, &send_bases_);
  resolve_all(all, false, &recv_bases_);
  const auto& sched = schedule_for(op_code::transfer, false, order);
  const auto& cr = config_.comm_ranks;
  const auto mine = sched.segment(config_.rank);
  // Blocks differ in size: "auto" judges by the mean block this rank copies.
  const std::size_t block = recv.nbytes / static_cast<std::size_t>(g.comm_size);
  policy_.timed_copies(op_code::transfer, block, copy, recv.nbytes, recv.nbytes,
                       [&](const copy_plan& how) {
                         for (const block_coord& b : mine) {
                           const auto dst = static_cast<std::size_t>(b.dst);
                           const auto src = static_cast<std::size_t>(b.src);
                           const transfer_block blk = block_of(g, cr[src], cr[dst]);
                           copy_box(recv_bases_[dst] + blk.dst_offset, blk.dst_strides.data(),
                                    send_bases_[src] + blk.src_offset, blk.src_strides.data(),
                                    blk.count.data(), g.ndim, g.itemsize, how);
                         }
                       });
  protocol_.sync();
}

}  // namespace zcoll
