#include "zcoll/plan.hpp"

#include <utility>

#include "zcoll/copy.hpp"
#include "zcoll/error.hpp"

namespace zcoll {

namespace {

bool any_private(const call_protocol::published& all, bool in_place) {
  for (int j = 0; j < all.size(); ++j)
    if ((!in_place && all.line(j).send.segment == 0) || all.line(j).recv.segment == 0) return true;
  return false;
}

}  // namespace

// -- plan_base: the run machinery -------------------------------------------------------------

plan_base::plan_base(std::shared_ptr<node_context> ctx, op_code target)
    : ctx_(std::move(ctx)),
      protocol_(&ctx_->protocol()),
      rank_(ctx_->config().rank),
      size_(ctx_->config().size),
      comm_ranks_(ctx_->config().comm_ranks),
      target_(target) {}

void plan_base::finish_quietly() noexcept {
  try {
    finish();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a peer's failure has no one to go to here
  }
}

void plan_base::choose_copy(op_code op, int copy, std::size_t block, std::size_t received,
                            std::size_t copied) {
  copy_op_ = op;
  copy_block_ = block;
  copy_received_ = received;
  copy_bytes_ = copied;
  auto& policy = ctx_->policy();
  bool tuning = false;
  how_ =
      policy.copy().choose(copy, block, policy.touched_bytes(received), &tuning, tuned_index(op));
  refine_copy_ = tuning;
}

void plan_base::check_not_freed() const {
  if (state_ == state::freed) throw usage_error("zcoll: this plan was freed");
}

void plan_base::check_startable() const {
  check_not_freed();
  if (state_ == state::started)
    throw usage_error(
        "zcoll: this plan is already active (wait() for it before starting it again)");
}

void plan_base::start() {
  check_startable();
  auto& line = protocol_->next(op_code::start);  // finishes another started plan first
  line.call.target = target_;
  line.call.block_bytes = id_;
  parity_ = protocol_->parity();
  run_part(line);
  state_ = state::started;
  protocol_->set_pending(this);
}

void plan_base::ordered_part() {
  const auto all = protocol_->publish();
  check_calls(all, op_code::start);
  check_same_plan(all);
  bind(all);
  if (copy_bytes_ != 0) copy_part();  // nothing to copy: nothing to time either
  if (pulls_this_run()) ctx_->publish_pull_failure(std::exchange(pull_failed_, {}));
  protocol_->arrive(true);
}

void plan_base::copy_part() {
  if (!refine_copy_) {
    copy_blocks(how_);
    return;
  }
  auto& policy = ctx_->policy();
  policy.timed_copies(copy_op_, copy_block_, auto_copy, copy_received_, copy_bytes_,
                      [&](const copy_plan& how) { copy_blocks(how); });
  bool tuning = false;
  how_ = policy.copy().choose(auto_copy, copy_block_, policy.touched_bytes(copy_received_), &tuning,
                              tuned_index(copy_op_));
  refine_copy_ = tuning;
}

void plan_base::end_run() noexcept {
  state_ = state::idle;
  if (protocol_->pending() == this) protocol_->set_pending(nullptr);
}

void plan_base::finish() {
  if (state_ != state::started) return;
  end_run();
  protocol_->complete();
  after_completion();
}

void plan_base::after_completion() {
  if (pulls_this_run()) ctx_->raise_failed_pulls();
  after_barrier();
}

void plan_base::wait() {
  check_not_freed();
  finish();
}

bool plan_base::test() {
  check_not_freed();
  if (state_ != state::started) return true;
  bool done = false;
  try {
    done = protocol_->poll();
  } catch (...) {  // a dead peer: this run is over, and the context is broken
    end_run();
    throw;
  }
  if (!done) return false;
  end_run();
  after_completion();
  return true;
}

void plan_base::free() {
  if (state_ == state::freed) return;
  struct release_at_exit {
    plan_base& plan;
    ~release_at_exit() {
      plan.state_ = state::freed;
      plan.release();
      plan.ctx_.reset();
    }
  } release{*this};
  finish();
}

// -- persistent_plan: alltoall and allgather ---------------------------------------------------

persistent_plan::persistent_plan(std::shared_ptr<node_context> ctx, op_code op,
                                 const array_view* send, const array_view& recv, int order,
                                 int copy)
    : plan_base(std::move(ctx), op) {
  args_ = ctx_->checked_args(op, send, recv, order, copy);
  agree_on_call();
  if (pulls_) {  // every rank fills its own receive row; copy modes do not apply
    choose_copy(op, static_cast<int>(copy_mode::temporal), args_.block_bytes, args_.recv_bytes,
                args_.recv_bytes);
  } else if (!args_.eager && args_.block_bytes != 0) {
    const bool in_place = args_.send == nullptr;
    const auto seg = ctx_->schedule_for(op, in_place, args_.order).segment(rank_);
    mine_.assign(seg.begin(), seg.end());
    choose_copy(op, args_.copy, args_.block_bytes, args_.recv_bytes,
                mine_.size() * args_.block_bytes);
  }
  numbered();
}

void persistent_plan::agree_on_call() {
  auto& segments = ctx_->segments();
  const bool in_place = args_.send == nullptr;
  auto describe = [&](detail::rank_line& line) {
    line.call.target = args_.op;
    line.call.order =
        static_cast<std::int8_t>(args_.eager ? eager_order : static_cast<int>(args_.order));
    line.call.flag = in_place ? 1 : 0;
    line.call.dtype = args_.dtype;
    line.call.block_bytes = args_.block_bytes;
  };
  auto& line = protocol_->next(op_code::plan);
  describe(line);
  const bool ordered = !args_.eager && args_.block_bytes != 0;
  if (ordered) {
    if (!in_place) line.send = segments.locate(args_.send, args_.send_bytes);
    line.recv = segments.locate(args_.recv, args_.recv_bytes);
  }
  auto all = protocol_->publish();
  check_calls(all, op_code::plan);
  check_arguments(all);
  if (!ordered) return;
  const bool private_buffers = any_private(all, in_place);
  if (private_buffers && !in_place && ctx_->pulls_private(args_.recv_bytes)) {
    pulls_ = true;  // every rank saw the same lines and the node's probe verdict
    send_bases_.assign(static_cast<std::size_t>(size_), nullptr);
    remote_.assign(static_cast<std::size_t>(size_), 0);
    for (int j = 0; j < size_; ++j) {
      const buffer_ref& ref = all.line(j).send;
      const auto k = static_cast<std::size_t>(j);
      if (ref.segment)
        send_bases_[k] = segments.resolve(ref);
      else
        remote_[k] = ref.offset;
    }
    return;
  }
  if (private_buffers) {
    // Every rank saw the same lines, so every rank takes this branch: shadows for private
    // buffers (a collective allocation), then the buffers published again.
    const std::size_t send_part =
        !in_place && line.send.segment == 0 ? round_up(args_.send_bytes, 64) : 0;
    const std::size_t recv_part = line.recv.segment == 0 ? args_.recv_bytes : 0;
    shadow_ = segments.allocate(send_part + recv_part);
    if (send_part) send_shadow_ = shadow_->data();
    if (recv_part) recv_shadow_ = shadow_->data() + send_part;
    auto& again = protocol_->next(op_code::plan);
    describe(again);
    if (!in_place)
      again.send = segments.locate(send_shadow_ ? send_shadow_ : args_.send, args_.send_bytes);
    again.recv = segments.locate(recv_shadow_ ? recv_shadow_ : args_.recv, args_.recv_bytes);
    all = protocol_->publish();
    check_calls(all, op_code::plan);
  }
  if (!in_place) ctx_->resolve_all(all, true, &send_bases_);
  ctx_->resolve_all(all, false, &recv_bases_);
}

void persistent_plan::run_part(detail::rank_line& /*line*/) {
  if (args_.eager) {
    const bool in_place = args_.send == nullptr;
    const auto* data = static_cast<const std::byte*>(in_place ? args_.recv : args_.send);
    std::byte* slot = ctx_->eager_slot(rank_, parity());
    if (args_.op == op_code::alltoall) {
      copy_bytes(slot, data, args_.recv_bytes);
    } else {
      const auto own = static_cast<std::size_t>(comm_ranks_[static_cast<std::size_t>(rank_)]);
      copy_bytes(slot, in_place ? data + own * args_.block_bytes : data, args_.block_bytes);
    }
    protocol_->arrive(false);
  } else {
    stage_in();
    ordered_part();
  }
}

void persistent_plan::stage_in() noexcept {
  if (send_shadow_) copy_bytes(send_shadow_, args_.send, args_.send_bytes);
  if (args_.send != nullptr || !recv_shadow_) return;
  if (args_.op == op_code::alltoall) {
    copy_bytes(recv_shadow_, args_.recv, args_.recv_bytes);
    return;
  }
  const std::size_t own =
      static_cast<std::size_t>(comm_ranks_[static_cast<std::size_t>(rank_)]) * args_.block_bytes;
  copy_bytes(recv_shadow_ + own, static_cast<const std::byte*>(args_.recv) + own,
             args_.block_bytes);
}

void persistent_plan::copy_blocks(const copy_plan& how) noexcept {
  if (pulls_) return pull_blocks();
  if (mine_.empty()) return;
  copy_segment(mine_, args_.op, args_.send == nullptr, args_.block_bytes, send_bases_.data(),
               recv_bases_.data(), comm_ranks_.data(), how);
}

void persistent_plan::pull_blocks() noexcept {
  const row_source from{send_bases_.data(), remote_.data(),
                        static_cast<const std::byte*>(args_.send)};
  const pull_failure failed = pull_row(ctx_->cma(), ctx_->config(), args_.op, args_.block_bytes,
                                       from, static_cast<std::byte*>(args_.recv));
  if (!pull_failed_.error) pull_failed_ = failed;
}

void persistent_plan::after_barrier() {
  if (!args_.eager) {
    if (recv_shadow_) copy_out();
    return;
  }
  const auto all = protocol_->view(parity());
  check_calls(all, op_code::start);
  check_same_plan(all);
  pull_eager();
}

void persistent_plan::copy_out() noexcept {
  const auto comm_size = static_cast<std::size_t>(ctx_->config().comm_size);
  if (comm_size == static_cast<std::size_t>(size_)) {
    copy_bytes(args_.recv, recv_shadow_, args_.recv_bytes);
    return;
  }
  // Across nodes only the node's blocks came through the shadow; MPI wrote the others.
  const std::size_t block = args_.block_bytes;
  for (const int r : comm_ranks_) {
    const std::size_t at = static_cast<std::size_t>(r) * block;
    copy_bytes(static_cast<std::byte*>(args_.recv) + at, recv_shadow_ + at, block);
  }
}

void persistent_plan::pull_eager() {
  const std::size_t block = args_.block_bytes;
  if (block == 0) return;
  auto* recv = static_cast<std::byte*>(args_.recv);
  const auto me = static_cast<std::size_t>(comm_ranks_[static_cast<std::size_t>(rank_)]);
  const bool alltoall = args_.op == op_code::alltoall;
  for (int s = 0; s < size_; ++s) {
    const std::byte* from = ctx_->eager_slot(s, parity());
    const auto src = static_cast<std::size_t>(comm_ranks_[static_cast<std::size_t>(s)]);
    copy_bytes(recv + src * block, alltoall ? from + me * block : from, block);
  }
}

void persistent_plan::release() noexcept {
  remote_.clear();
  shadow_.reset();
  send_bases_.clear();
  recv_bases_.clear();
}

}  // namespace zcoll
