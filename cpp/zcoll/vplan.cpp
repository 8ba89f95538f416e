#include "zcoll/vplan.hpp"

#include <algorithm>
#include <string>

#include "zcoll/copy.hpp"

namespace zcoll {

v_plan::v_plan(std::shared_ptr<node_context> ctx, const v_call& call)
    : plan_base(std::move(ctx), call.op), op_(call.op), in_place_(call.in_place) {
  v_exchange& vx = ctx_->irregular();
  v_exchange::checked_call mine;
  const local_check v = vx.check(call, mine);
  if (!v.ok()) ctx_->fail(v.error, call_prefix(op_, "_init") + v.message);
  order_ = mine.order;
  send_ = call.send ? static_cast<const std::byte*>(call.send->data) : nullptr;
  recv_ = static_cast<std::byte*>(const_cast<void*>(call.recv->data));
  send_extent_ = mine.send_extent;
  auto& line = protocol_->next(op_code::plan);
  const std::size_t parity = protocol_->parity();
  vx.write_metadata(mine, parity, false);
  v_exchange::describe_line(call, mine, line);
  line.call.target = op_;
  if (call.send) line.send = ctx_->segments().locate(call.send->data, call.send->nbytes);
  line.recv = ctx_->segments().locate(call.recv->data, call.recv->nbytes);
  const auto all = protocol_->publish();
  check_calls(all, op_code::plan);
  check_arguments(all);
  vx.check_counts(call, parity);
  plan_pieces(mine, call, parity);  // reads the metadata: before any other barrier
  resolve_buffers(call, mine, all);
  const std::size_t blocks = std::max<std::size_t>(pieces_.size(), 1);
  choose_copy(op_, call.copy, static_cast<std::size_t>(copied_ / blocks), mine.recv_extent,
              copied_);
  numbered();
}

void v_plan::plan_pieces(const v_exchange::checked_call& mine, const v_call& call,
                         std::size_t parity) {
  v_exchange& vx = ctx_->irregular();
  const v_pattern& pat = vx.pattern(call.pattern);
  const auto& tuples = vx.tuples_for(call.pattern, order_, in_place_);
  std::uint64_t total = 0;
  for (const v_tuple& t : tuples) total += vx.received(pat, t, parity).bytes;
  const auto [first, last] = vx.my_piece(pat, tuples, parity, total, order_, in_place_);
  auto bytes = [&](const v_tuple& t) { return vx.received(pat, t, parity).bytes; };
  for_each_piece(tuples, first, last, bytes,
                 [&](const v_tuple& t, std::uint64_t lo, std::uint64_t hi) {
                   if (hi > lo)
                     pieces_.push_back({t.src, t.dst, vx.sent(t, parity).offset + lo,
                                        vx.received(pat, t, parity).offset + lo, hi - lo});
                 });
  written_ = vx.written_blocks(pat, tuples, parity, in_place_);
  copied_ = last - first;
  if (in_place_ != v_in_place::none) {
    const auto data = mine.in_place_data(in_place_);
    stage_blocks_.assign(data.begin(), data.end());
  }
}

void v_plan::resolve_buffers(const v_call& call, const v_exchange::checked_call& mine,
                             call_protocol::published all) {
  const bool in_place = in_place_ != v_in_place::none;
  bool private_buffers = false;
  for (int j = 0; j < size_; ++j)
    private_buffers |=
        (!in_place && all.line(j).send.segment == 0) || all.line(j).recv.segment == 0;
  if (private_buffers) {
    // Every rank saw the same lines, so every rank takes this branch: arena shadows for the
    // private buffers (a collective allocation), then the buffers published again.
    const auto& me = all.line(rank_);
    const bool send_private = !in_place && me.send.segment == 0;
    const bool recv_private = me.recv.segment == 0;
    const std::uint64_t send_part =
        send_private ? round_up(std::max<std::uint64_t>(send_extent_, 1), 64) : 0;
    const std::uint64_t recv_part = recv_private ? std::max<std::uint64_t>(mine.recv_extent, 1) : 0;
    shadow_ = ctx_->segments().allocate(send_part + recv_part);
    if (send_part) send_shadow_ = shadow_->data();
    if (recv_part) recv_shadow_ = shadow_->data() + send_part;
    auto& again = protocol_->next(op_code::plan);
    v_exchange::describe_line(call, mine, again);
    again.call.target = op_;
    if (!in_place)
      again.send = send_shadow_ ? ctx_->segments().locate(send_shadow_, send_part)
                                : ctx_->segments().locate(send_, call.send->nbytes);
    again.recv = recv_shadow_ ? ctx_->segments().locate(recv_shadow_, recv_part)
                              : ctx_->segments().locate(recv_, call.recv->nbytes);
    all = protocol_->publish();
    check_calls(all, op_code::plan);
  }
  ctx_->resolve_all(all, false, &recv_bases_);
  if (in_place)
    send_bases_ = recv_bases_;
  else
    ctx_->resolve_all(all, true, &send_bases_);
}

void v_plan::run_part(detail::rank_line& /*line*/) {
  if (send_shadow_) copy_bytes(send_shadow_, send_, send_extent_);
  if (recv_shadow_) copy_spans(recv_shadow_, recv_, stage_blocks_);
  ordered_part();
}

void v_plan::copy_blocks(const copy_plan& how) noexcept {
  const bool swap = in_place_ == v_in_place::swap;
  for (const piece& p : pieces_) {
    std::byte* dst = recv_bases_[static_cast<std::size_t>(p.dst)] + p.dst_offset;
    if (swap)
      swap_bytes(dst, recv_bases_[static_cast<std::size_t>(p.src)] + p.src_offset, p.bytes);
    else
      copy_bytes(dst, send_bases_[static_cast<std::size_t>(p.src)] + p.src_offset, p.bytes, how);
  }
}

void v_plan::after_barrier() {
  if (recv_shadow_) copy_spans(recv_, recv_shadow_, written_);
}

void v_plan::release() noexcept {
  shadow_.reset();
  send_shadow_ = recv_shadow_ = nullptr;
  pieces_.clear();
  send_bases_.clear();
  recv_bases_.clear();
}

}  // namespace zcoll
