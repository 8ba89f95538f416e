#include "zcoll/transfer_plan.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "zcoll/auto_policy.hpp"
#include "zcoll/error.hpp"

namespace zcoll {

namespace {

constexpr const char* init_prefix = "zcoll.transfer_init: ";
constexpr const char* run_prefix = "zcoll.transfer: ";

// The bytes of a contiguous run of the transfer's blocks, the same on every rank: the first
// non-empty block from a rank to itself (blocks differ only in the extents of the cut axes).
std::size_t run_bytes(const transfer_geometry& g) {
  for (int j = 0; j < g.comm_size; ++j) {
    const transfer_block blk = block_of(g, j, j);
    const box_shape box = make_box(blk.dst_strides.data(), blk.src_strides.data(), blk.count.data(),
                                   g.ndim, g.itemsize);
    if (box.empty()) continue;
    if (box.rank == 0) return g.itemsize;
    const box_axis& inner = box.axes[static_cast<std::size_t>(box.rank - 1)];
    const auto item = static_cast<std::int64_t>(g.itemsize);
    const bool contiguous = inner.dst_stride == item && inner.src_stride == item;
    return contiguous ? inner.count * g.itemsize : g.itemsize;
  }
  return 0;
}

}  // namespace

transfer_plan::transfer_plan(std::shared_ptr<node_context> ctx, const transfer_geometry& g,
                             const array_view& send, const array_view& recv, int order, int copy)
    : plan_base(std::move(ctx), op_code::transfer), g_(g), dtype_(recv.dtype) {
  const auto& cr = comm_ranks_;
  const int me = cr[static_cast<std::size_t>(rank_)];
  local_check check = check_transfer_args(g, me, send, recv);
  if (!check_codes(check, order, copy, false)) ctx_->fail(check.error, init_prefix + check.message);
  order_ = order == auto_order ? ctx_->policy().builtin_order(check.block_bytes)
                               : static_cast<block_order>(order);
  own_send_ = static_cast<const std::byte*>(send.data);
  own_recv_ = static_cast<const std::byte*>(recv.data);
  send_bytes_ = send.nbytes;
  recv_bytes_ = recv.nbytes;

  auto& segments = ctx_->segments();
  auto& line = protocol_->next(op_code::plan);
  line.call.target = op_code::transfer;
  line.call.order = static_cast<std::int8_t>(order_);
  line.call.dtype = recv.dtype;
  line.call.block_bytes = g.signature();
  line.send = segments.locate(send.data, send.nbytes);
  line.recv = segments.locate(recv.data, recv.nbytes);
  const auto all = protocol_->publish();
  check_calls(all, op_code::plan);
  check_arguments(all);
  ctx_->resolve_all(all, true, &send_bases_);  // the same error on every rank: all saw `all`
  ctx_->resolve_all(all, false, &recv_bases_);
  resolve_blocks(copy);
}

transfer_plan::transfer_plan(const transfer_plan& forward, reverse_tag, int copy)
    : plan_base(forward.ctx_, op_code::transfer), g_(forward.g_), dtype_(forward.dtype_) {
  std::swap(g_.axis_a, g_.axis_b);
  order_ = forward.order_;
  own_send_ = forward.own_recv_;
  own_recv_ = forward.own_send_;
  send_bytes_ = forward.recv_bytes_;
  recv_bytes_ = forward.send_bytes_;
  send_bases_ = forward.recv_bases_;
  recv_bases_ = forward.send_bases_;
  resolve_blocks(copy);
}

std::unique_ptr<transfer_plan> transfer_plan::reversed(int copy) const {
  if (freed()) throw usage_error("zcoll.transfer_init: the plan to reverse was freed");
  return std::unique_ptr<transfer_plan>(new transfer_plan(*this, reverse_tag{}, copy));
}

void transfer_plan::resolve_blocks(int copy) {
  const transfer_geometry& g = g_;
  const auto& cr = comm_ranks_;
  const int me = cr[static_cast<std::size_t>(rank_)];
  send_now_ = send_bases_;
  recv_now_ = recv_bases_;

  for (const block_coord& b : ctx_->schedule_for(op_code::transfer, false, order_).segment(rank_)) {
    const transfer_block blk =
        block_of(g, cr[static_cast<std::size_t>(b.src)], cr[static_cast<std::size_t>(b.dst)]);
    const box_shape box = make_box(blk.dst_strides.data(), blk.src_strides.data(), blk.count.data(),
                                   g.ndim, g.itemsize);
    if (box.empty()) continue;
    blocks_.push_back({b.src, b.dst, blk.src_offset, blk.dst_offset, box});
    copied_ += box.bytes();
  }
  // Every rank knows the mean a rank receives (the global bytes over the ranks): the same
  // answer everywhere.
  std::size_t global = g.itemsize;
  for (int k = 0; k < g.ndim; ++k) global *= g.shape[static_cast<std::size_t>(k)];
  pulls_ = ctx_->pulls_private(global / static_cast<std::size_t>(g.comm_size)) &&
           ctx_->policy().pulls_runs(run_bytes(g));
  if (pulls_) {
    for (int k = 0; k < size_; ++k) {  // from the next rank on, as pull_row
      const int j = (rank_ + k) % size_;
      const transfer_block blk = block_of(g, cr[static_cast<std::size_t>(j)], me);
      const box_shape box = make_box(blk.dst_strides.data(), blk.src_strides.data(),
                                     blk.count.data(), g.ndim, g.itemsize);
      if (!box.empty()) into_me_.push_back({j, rank_, blk.src_offset, blk.dst_offset, box});
    }
    remote_.assign(static_cast<std::size_t>(size_), 0);
  }
  // Blocks differ in size: "auto" judges by the mean block, as for a plain transfer.
  // A pulled run copies this rank's destination blocks, not its schedule segment: a rank whose
  // segment is empty must still take its part (plan_base skips ranks that copy nothing).
  std::size_t pulled = 0;
  for (const block& b : into_me_) pulled += b.box.bytes();
  choose_copy(op_code::transfer, copy, recv_bytes_ / static_cast<std::size_t>(g.comm_size),
              recv_bytes_, std::max(copied_, pulled));
  numbered();
}

local_check transfer_plan::check_run(const array_view* send, const array_view* recv,
                                     buffer_ref* send_ref, buffer_ref* recv_ref) {
  *send_ref = {};
  *recv_ref = {};
  if (!send && !recv) return {};
  const int me = comm_ranks_[static_cast<std::size_t>(rank_)];
  auto& segments = ctx_->segments();
  for (const bool source : {true, false}) {
    const array_view* a = source ? send : recv;
    if (!a) continue;
    local_check c = check_transfer_side(g_, me, *a, source, dtype_);
    if (!c.ok()) return c;
    if (a->data == (source ? own_send_ : own_recv_)) continue;  // the plan's own array
    buffer_ref& ref = source ? *send_ref : *recv_ref;
    ref = segments.locate(a->data, a->nbytes);  // private: {0, its address}
    if (ref.segment == 0 && !pulls_)
      return value_error(std::string(source ? "the source" : "the destination") +
                         " array is not in the shared arena (allocate it with zcoll.empty)");
  }
  // A run's destination must not overlap its source, whichever arrays they are.
  const auto* s = static_cast<const std::byte*>(send ? send->data : own_send_);
  const auto* r = static_cast<const std::byte*>(recv ? recv->data : own_recv_);
  if (send_bytes_ && recv_bytes_ && s < r + recv_bytes_ && r < s + send_bytes_)
    return value_error("the source and destination arrays overlap");
  return {};
}

void transfer_plan::start(const array_view* send, const array_view* recv) {
  check_startable();
  buffer_ref send_ref, recv_ref;
  const local_check c = check_run(send, recv, &send_ref, &recv_ref);
  if (!c.ok()) ctx_->fail(c.error, run_prefix + c.message);
  run_send_ = send_ref;
  run_recv_ = recv_ref;
  plan_base::start();
}

call_record transfer_plan::describe_start(const array_view* send, const array_view* recv) {
  if (freed()) return error_record(arg_error::value, "zcoll: this plan was freed");
  buffer_ref send_ref, recv_ref;
  const local_check c = check_run(send, recv, &send_ref, &recv_ref);
  if (!c.ok()) return error_record(c.error, run_prefix + c.message);
  call_record r;
  r.call.op = op_code::start;
  r.call.target = op_code::transfer;
  r.call.block_bytes = id();
  return r;
}

void transfer_plan::run_part(detail::rank_line& line) {
  line.send = run_send_;
  line.recv = run_recv_;
  run_send_ = {};
  run_recv_ = {};
  ordered_part();
}

void transfer_plan::bind(const call_protocol::published& all) {
  // A line names the plan's own array ({0, 0}), a shared one (a segment) or a private one
  // ({0, its address}).
  auto is_private = [](const buffer_ref& r) { return r.segment == 0 && r.offset != 0; };
  bool rebound = false;
  pull_run_ = false;
  for (int j = 0; j < size_; ++j) {
    const auto& l = all.line(j);
    rebound |= (l.send.segment | l.recv.segment | l.send.offset | l.recv.offset) != 0;
    pull_run_ |= is_private(l.send) || is_private(l.recv);
  }
  if (!rebound && !rebound_) return;  // the plan's own arrays, as in the previous run
  auto& segments = ctx_->segments();
  // Where each array is here: resolved, this rank's own private one at its address, a peer's
  // private one nowhere (its source is pulled; its destination only its owner writes).
  auto where = [&](const buffer_ref& r, std::byte* own, int j) -> std::byte* {
    if (r.segment) return segments.resolve(r);
    if (!is_private(r)) return own;
    return j == rank_ ? reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(r.offset))
                      : nullptr;
  };
  for (int j = 0; j < size_; ++j) {
    const auto& l = all.line(j);
    const auto k = static_cast<std::size_t>(j);
    send_now_[k] = where(l.send, send_bases_[k], j);
    recv_now_[k] = where(l.recv, recv_bases_[k], j);
    if (pulls_) remote_[k] = is_private(l.send) ? l.send.offset : 0;
  }
  rebound_ = rebound;
}

void transfer_plan::copy_blocks(const copy_plan& how) noexcept {
  if (pull_run_) {
    pull_blocks(how);
    return;
  }
  for (const block& b : blocks_)
    copy_box(recv_now_[static_cast<std::size_t>(b.dst)] + b.dst_offset,
             send_now_[static_cast<std::size_t>(b.src)] + b.src_offset, b.box, how);
}

void transfer_plan::pull_blocks(const copy_plan& how) noexcept {
  std::byte* into = recv_now_[static_cast<std::size_t>(rank_)];
  for (const block& b : into_me_) {
    const auto j = static_cast<std::size_t>(b.src);
    if (send_now_[j]) {
      copy_box(into + b.dst_offset, send_now_[j] + b.src_offset, b.box, how);
    } else if (const int err = ctx_->cma().read_box(b.src, into + b.dst_offset,
                                                    remote_[j] + b.src_offset, b.box);
               err && !pull_failed_.error) {
      pull_failed_ = {err, b.src};
    }
  }
}

void transfer_plan::release() noexcept {
  blocks_.clear();
  send_bases_.clear();
  recv_bases_.clear();
  send_now_.clear();
  recv_now_.clear();
  into_me_.clear();
  remote_.clear();
}

}  // namespace zcoll
