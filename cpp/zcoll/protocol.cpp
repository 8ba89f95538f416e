#include "zcoll/protocol.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "zcoll/copy.hpp"
#include "zcoll/error.hpp"

namespace zcoll {

namespace {

constexpr std::size_t header_bytes =
    round_up(sizeof(detail::control_header), static_cast<std::size_t>(detail::cache_line));

std::string op_text(op_code op) {
  return std::string(registry<op_code>::descriptions[static_cast<std::size_t>(op)]);
}

std::string rank_text(int rank) {
  return "rank " + std::to_string(rank);
}

// Whether the ranks' calls of `op` must agree on sizes, dtype and order.
bool moves_data(op_code op) noexcept {
  return op == op_code::alltoall || op == op_code::allgather || op == op_code::transfer ||
         op == op_code::plan || is_reduction(op) || is_irregular(op);
}

// Records gathered from every communicator rank, as check_calls reads them.
struct gathered_records {
  std::span<const call_record> records;
  int size() const noexcept { return static_cast<int>(records.size()); }
  const call_descriptor& call(int j) const noexcept {
    return records[static_cast<std::size_t>(j)].call;
  }
  const char* message(int j) const noexcept { return records[static_cast<std::size_t>(j)].message; }
  int rank(int j) const noexcept { return j; }
};

}  // namespace

void set_text(char* dst, std::size_t capacity, std::string_view text) noexcept {
  const std::size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

call_record error_record(arg_error kind, std::string_view message) noexcept {
  call_record r;
  r.call.op = op_code::error;
  r.call.error = kind == arg_error::none ? arg_error::value : kind;
  set_text(r.message, message_bytes, message);
  return r;
}

namespace detail {

void raise_rank_error(int rank, arg_error kind, const char* message) {
  const std::string text = "[" + rank_text(rank) + "] " + message;
  if (kind == arg_error::type) throw type_mismatch(text);
  throw usage_error(text);
}

void raise_different_ops(int rank0, op_code op0, int rank, op_code op) {
  throw usage_error("zcoll: ranks called different operations at once: " + rank_text(rank0) +
                    " called " + op_text(op0) + ", " + rank_text(rank) + " called " + op_text(op));
}

void raise_unexpected_op(op_code expected, op_code got) {
  throw usage_error("zcoll: expected " + op_text(expected) + ", peers called " + op_text(got));
}

namespace {

std::string algorithm_text(int code) {
  return std::string(is_code<reduce_algorithm>(code) ? name_of(static_cast<reduce_algorithm>(code))
                                                     : auto_name);
}

// check_same_call for the reduction family: sizes, dtype, op, root and algorithm agree.
void check_same_reduction(const call_descriptor& ref, int ref_rank, const call_descriptor& d,
                          int rank) {
  const std::string what = "zcoll." + op_text(ref.op) + ": ", first = rank_text(ref_rank),
                    other = rank_text(rank);
  if (d.block_bytes != ref.block_bytes)
    throw usage_error(what + "buffer sizes differ between ranks: " + first + " has " +
                      std::to_string(ref.block_bytes) + " bytes, " + other + " has " +
                      std::to_string(d.block_bytes));
  if (!(d.dtype == ref.dtype))
    throw type_mismatch(what + "dtypes differ between ranks: " + first + " has " +
                        dtype_text(ref.dtype) + ", " + other + " has " + dtype_text(d.dtype));
  if (d.root != ref.root)
    throw usage_error(what + "roots differ between ranks: " + first + " uses root " +
                      std::to_string(ref.root) + ", " + other + " uses root " +
                      std::to_string(d.root));
  if (d.reduce != ref.reduce)
    throw usage_error(what + "ops differ between ranks: " + first + " uses '" +
                      std::string(name_of(static_cast<reduce_op>(ref.reduce))) + "', " + other +
                      " uses '" + std::string(name_of(static_cast<reduce_op>(d.reduce))) + "'");
  if (d.order != ref.order)
    throw usage_error(what + "algorithms differ between ranks: " + first + " uses '" +
                      algorithm_text(ref.order) + "', " + other + " uses '" +
                      algorithm_text(d.order) + "'");
}

}  // namespace

void check_same_call(const call_descriptor& ref, int ref_rank, const call_descriptor& d, int rank) {
  if (is_reduction(ref.op)) return check_same_reduction(ref, ref_rank, d, rank);
  const bool same_flag = (d.flag & ~eager_slot_flag) == (ref.flag & ~eager_slot_flag);
  if (same_flag && d.dtype == ref.dtype && d.block_bytes == ref.block_bytes &&
      d.order == ref.order && d.target == ref.target)
    return;
  const bool planned = ref.op == op_code::plan;
  const std::string what =
      "zcoll." + op_text(planned ? ref.target : ref.op) + (planned ? "_init: " : ": ");
  const std::string first = rank_text(ref_rank), other = rank_text(rank);
  if (d.target != ref.target)
    throw usage_error("zcoll: ranks planned different collectives at once: " + first + " planned " +
                      op_text(ref.target) + ", " + other + " planned " + op_text(d.target));
  if (!same_flag)
    throw usage_error(what + "IN_PLACE must be used by all ranks or none (" + first + " and " +
                      other + " differ)");
  if (!(d.dtype == ref.dtype))
    throw type_mismatch(what + "dtypes differ between ranks: " + first + " has " +
                        dtype_text(ref.dtype) + ", " + other + " has " + dtype_text(d.dtype));
  if (d.block_bytes != ref.block_bytes && is_irregular(ref.op))
    throw usage_error(what + "ranks use different communication patterns (" + first + " and " +
                      other +
                      "): a neighbourhood call on a communicator without a topology, or "
                      "topologies that differ");
  if (d.block_bytes != ref.block_bytes &&
      (ref.op == op_code::transfer || ref.target == op_code::transfer))
    throw usage_error(what + "global shapes, axes or itemsizes differ between " + first + " and " +
                      other);
  if (d.block_bytes != ref.block_bytes)
    throw usage_error(what + "block sizes differ between ranks: " + first + " has " +
                      std::to_string(ref.block_bytes) + " bytes per block, " + other + " has " +
                      std::to_string(d.block_bytes));
  throw usage_error(what + "order differs between ranks: " + first + " uses '" +
                    order_text(ref.order) + "', " + other + " uses '" + order_text(d.order) + "'");
}

void raise_different_plans(int rank0, const call_descriptor& d0, int rank,
                           const call_descriptor& d) {
  auto plan_text = [](const call_descriptor& c) {
    return "plan #" + std::to_string(c.block_bytes) + " (" + op_text(c.target) + ")";
  };
  throw usage_error("zcoll: ranks ran different persistent plans at once: " + rank_text(rank0) +
                    " ran " + plan_text(d0) + ", " + rank_text(rank) + " ran " + plan_text(d));
}

}  // namespace detail

void agree(std::span<const call_record> records, op_code expected) {
  const gathered_records calls{records};
  check_calls(calls, expected);
  if (moves_data(expected)) check_arguments(calls);
  if (expected == op_code::start) check_same_plan(calls);
}

std::size_t call_protocol::control_bytes(int size) noexcept {
  const auto n = static_cast<std::size_t>(size);
  return round_up(
      header_bytes + n * (2 * sizeof(detail::rank_line) + sizeof(detail::barrier_rank_words) +
                          sizeof(detail::rank_slot)),
      page_size());
}

call_protocol::call_protocol(std::shared_ptr<shm_segment> control, const context_config& config)
    : control_(std::move(control)),
      rank_(config.rank),
      size_(config.size),
      comm_ranks_(config.comm_ranks) {
  if (!control_ || control_->size() < control_bytes(size_))
    throw std::invalid_argument("zcoll: control segment too small for the node size");
  const auto n = static_cast<std::size_t>(size_);
  std::byte* base = control_->data();
  header_ = reinterpret_cast<detail::control_header*>(base);
  base += header_bytes;
  lines_ = reinterpret_cast<detail::rank_line*>(base);
  base += 2 * n * sizeof(detail::rank_line);
  barrier_words_ = reinterpret_cast<detail::barrier_rank_words*>(base);
  base += n * sizeof(detail::barrier_rank_words);
  slots_ = reinterpret_cast<detail::rank_slot*>(base);
  static_assert(sizeof(detail::rank_line) % sizeof(std::atomic<std::uint64_t>) == 0);
  barrier_ = std::make_unique<node_barrier>(
      &header_->barrier, &lines_[0].entered,
      sizeof(detail::rank_line) / sizeof(std::atomic<std::uint64_t>), barrier_words_, rank_, size_,
      config.comm_ranks, config.pids, config.barrier, config.wait);
}

void call_protocol::close() noexcept {
  if (closed_) return;
  closed_ = true;
  pending_ = nullptr;
  barrier_.reset();
  header_ = nullptr;
  lines_ = nullptr;
  barrier_words_ = nullptr;
  slots_ = nullptr;
  control_.reset();
}

std::string call_protocol::rank_name(int node_rank) const {
  return rank_text(comm_ranks_[static_cast<std::size_t>(node_rank)]);
}

void call_protocol::check_usable() const {
  if (closed_)
    throw usage_error("zcoll: this communicator's zcoll context is closed (was it freed?)");
  if (broken())
    throw peer_error(
        "zcoll: this communicator's zcoll context is unusable after an earlier failure: " +
        broken_reason_);
}

void call_protocol::sync() {
  arrive(true);
  complete();
}

template <class Step>
auto call_protocol::marking_broken(Step step) {
  try {
    return step();
  } catch (const peer_error& e) {
    broken_reason_ = e.what();
    throw;
  }
}

void call_protocol::arrive(bool fence) {
  check_usable();
  if (fence) store_fence();  // streaming stores are weakly ordered: visible before arriving
  marking_broken([&] { barrier_->arrive(); });
}

void call_protocol::complete() {
  check_usable();
  marking_broken([&] { barrier_->complete(); });
}

bool call_protocol::poll() {
  check_usable();
  return marking_broken([&] { return barrier_->poll(); });
}

detail::rank_line& call_protocol::next(op_code op) {
  finish_pending();
  check_usable();
  ++calls_;
  auto& line = lines_[2 * static_cast<std::size_t>(rank_) + parity()];
  line.call = call_descriptor{};
  line.call.op = op;
  line.send = {};
  line.recv = {};
  return line;
}

call_protocol::published call_protocol::publish() {
  const published all{lines_, slots_, comm_ranks_.data(), parity(), size_};
  sync();
  return all;
}

void call_protocol::fail(arg_error kind, std::string_view message) {
  auto& line = next(op_code::error);
  line.call.error = kind == arg_error::none ? arg_error::value : kind;
  set_text(slots_[rank_].message, message_bytes, message);
  check_calls(publish(), op_code::error);
  throw std::logic_error("zcoll: unreachable: an error was published but not raised");
}

}  // namespace zcoll
