#include "zcoll/exchange.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "zcoll/copy.hpp"
#include "zcoll/error.hpp"

namespace zcoll {

namespace {

constexpr std::size_t first_partition_bytes = std::size_t{1} << 20;
constexpr std::size_t max_growth_partition_bytes = std::size_t{64} << 20;

std::string op_name(op_code op) { return std::string(registry<op_code>::descriptions[static_cast<std::size_t>(op)]); }

bool valid_copy(int copy) noexcept { return copy == auto_copy || is_code<copy_mode>(copy); }

local_check type_error(std::string m) { return {arg_error::type, std::move(m), 0}; }
local_check value_error(std::string m) { return {arg_error::value, std::move(m), 0}; }

// How messages name an order code: the eager path is what "auto" chose.
std::string order_name(int order) {
  return is_code<block_order>(order) ? std::string(name_of(static_cast<block_order>(order))) : "auto";
}

template <std::size_t N>
void set_text(char (&dst)[N], const std::string& text) noexcept {
  const std::size_t n = std::min(text.size(), N - 1);
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

std::string dtype_text(const dtype_id& d) {
  std::ostringstream out;
  out << "'" << static_cast<char>(d.kind) << "' (" << d.itemsize << " bytes)";
  return out.str();
}

constexpr std::size_t header_bytes = round_up(sizeof(detail::control_header), detail::cache_line);

std::uint64_t next_segment_id() noexcept {
  static std::atomic<std::uint32_t> counter{0};
  return (static_cast<std::uint64_t>(::getpid()) << 32) | (counter.fetch_add(1) + 1);
}

}  // namespace

std::size_t node_context::control_bytes(int size) noexcept {
  const auto n = static_cast<std::size_t>(size);
  return round_up(header_bytes + n * (2 * sizeof(detail::rank_line) +
                                      sizeof(detail::barrier_rank_words) + sizeof(detail::rank_slot)),
                  page_size());
}

node_context::node_context(std::shared_ptr<shm_segment> control, context_config config)
    : control_(std::move(control)),
      config_(std::move(config)),
      allocator_(std::make_shared<detail::partition_allocator>()),
      next_partition_bytes_(first_partition_bytes) {
  const auto n = static_cast<std::size_t>(config_.size);
  if (config_.size < 1 || config_.rank < 0 || config_.rank >= config_.size ||
      config_.comm_ranks.size() != n || config_.pids.size() != n ||
      config_.comm_size < config_.size)
    throw std::invalid_argument("zcoll: inconsistent node context configuration");
  if (!control_ || control_->size() < control_bytes(config_.size))
    throw std::invalid_argument("zcoll: control segment too small for the node size");
  std::byte* base = control_->data();
  header_ = reinterpret_cast<detail::control_header*>(base);
  base += header_bytes;
  lines_ = reinterpret_cast<detail::rank_line*>(base);
  base += 2 * n * sizeof(detail::rank_line);
  barrier_words_ = reinterpret_cast<detail::barrier_rank_words*>(base);
  base += n * sizeof(detail::barrier_rank_words);
  slots_ = reinterpret_cast<detail::rank_slot*>(base);
  sorted_pids_ = config_.pids;
  std::sort(sorted_pids_.begin(), sorted_pids_.end());
  static_assert(sizeof(detail::rank_line) % sizeof(std::atomic<std::uint64_t>) == 0);
  barrier_ = std::make_unique<node_barrier>(
      &header_->barrier, &lines_[0].entered,
      sizeof(detail::rank_line) / sizeof(std::atomic<std::uint64_t>), barrier_words_,
      config_.rank, config_.size, config_.comm_ranks, config_.pids, config_.barrier, config_.wait);
}

node_context::~node_context() { close(); }

void node_context::close() noexcept {
  if (closed_) return;
  closed_ = true;
  for (auto& seg : owned_) seg->owner_alive.store(false, std::memory_order_relaxed);
  owned_.clear();
  segments_.clear();
  staging_.reset();
  allocator_.reset();
  barrier_.reset();
  schedules_.clear();
  header_ = nullptr;
  lines_ = nullptr;
  barrier_words_ = nullptr;
  slots_ = nullptr;
  control_.reset();
}

std::string node_context::rank_name(int node_rank) const {
  return "rank " + std::to_string(config_.comm_ranks[static_cast<std::size_t>(node_rank)]);
}

void node_context::check_usable() const {
  if (closed_)
    throw usage_error("zcoll: this communicator's zcoll context is closed (was it freed?)");
  if (broken())
    throw peer_error("zcoll: this communicator's zcoll context is unusable after an earlier "
                     "failure: " +
                     broken_reason_);
}

void node_context::sync() {
  store_fence();  // streaming stores are weakly ordered: make them visible before arriving
  try {
    barrier_->wait();
  } catch (const peer_error& e) {
    broken_reason_ = e.what();
    throw;
  }
}

detail::rank_line& node_context::next_descriptor(op_code op) {
  check_usable();
  ++calls_;
  auto& line = lines_[2 * static_cast<std::size_t>(config_.rank) + publish_parity()];
  line.op = op;
  line.order = 0;
  line.flag = 0;
  line.error = arg_error::none;
  line.dtype = {};
  line.block_bytes = 0;
  line.send = {};
  line.recv = {};
  return line;
}

node_context::descriptors node_context::publish_and_sync() {
  const descriptors all{lines_, publish_parity()};
  sync();
  return all;
}

void node_context::check_agreement(descriptors all, op_code op) const {
  for (int j = 0; j < config_.size; ++j) {
    if (all[j].op != op_code::error) continue;
    const std::string text = "[" + rank_name(j) + "] " + slots_[j].message;
    if (all[j].error == arg_error::type)
      throw type_mismatch(text);
    throw usage_error(text);
  }
  for (int j = 1; j < config_.size; ++j)
    if (all[j].op != all[0].op)
      throw usage_error(
          "zcoll: ranks called different operations at once: " + rank_name(0) +
          " called " + op_name(all[0].op) + ", " + rank_name(j) + " called " +
          op_name(all[j].op));
  if (all[0].op != op)
    throw usage_error(
        "zcoll: expected " + op_name(op) + ", peers called " + op_name(all[0].op));
}

void node_context::check_arguments(descriptors all) const {
  const auto& ref = all[0];
  for (int j = 1; j < config_.size; ++j) {
    const auto& d = all[j];
    if (d.flag == ref.flag && d.dtype == ref.dtype && d.block_bytes == ref.block_bytes &&
        d.order == ref.order)
      continue;
    const std::string what = "zcoll." + op_name(ref.op) + ": ";
    if (d.flag != ref.flag)
      throw 
          usage_error(what + "IN_PLACE must be used by all ranks or none (" + rank_name(0) +
                      " and " + rank_name(j) + " differ)");
    if (!(d.dtype == ref.dtype))
      throw type_mismatch(
          what + "dtypes differ between ranks: " + rank_name(0) + " has " +
          dtype_text(ref.dtype) + ", " + rank_name(j) + " has " + dtype_text(d.dtype));
    if (d.block_bytes != ref.block_bytes && ref.op == op_code::transfer)
      throw usage_error(what + "global shapes, axes or itemsizes differ between " +
                        rank_name(0) + " and " + rank_name(j));
    if (d.block_bytes != ref.block_bytes)
      throw usage_error(
          what + "block sizes differ between ranks: " + rank_name(0) + " has " +
          std::to_string(ref.block_bytes) + " bytes per block, " + rank_name(j) + " has " +
          std::to_string(d.block_bytes));
    throw usage_error(
        what + "order differs between ranks: " + rank_name(0) + " uses '" +
        order_name(ref.order) + "', " + rank_name(j) + " uses '" + order_name(d.order) + "'");
  }
}

const node_context::known_segment& node_context::remember(std::shared_ptr<data_segment> seg) {
  const bool shared = seg->mapped_by_all(sorted_pids_);
  segments_.push_back({std::move(seg), shared});
  return segments_.back();
}

buffer_ref node_context::locate(const void* p, std::size_t bytes) {
  const auto* q = static_cast<const std::byte*>(p);
  for (const auto& known : segments_) {
    const std::byte* base = known.seg->shm->data();
    const std::size_t size = known.seg->shm->size();
    if (q < base || q > base + size || bytes > static_cast<std::size_t>(base + size - q))
      continue;
    if (!known.shared_by_all || !known.seg->owner_alive.load(std::memory_order_relaxed)) return {};
    return {known.seg->id, static_cast<std::uint64_t>(q - base)};
  }
  std::size_t offset = 0;
  auto seg = detail::segment_registry::instance().find(p, bytes, &offset);
  if (!seg) return {};
  const auto& known = remember(std::move(seg));
  return known.shared_by_all ? buffer_ref{known.seg->id, offset} : buffer_ref{};
}

std::byte* node_context::resolve(const buffer_ref& ref) {
  for (const auto& known : segments_)
    if (known.seg->id == ref.segment) return known.seg->shm->data() + ref.offset;
  auto seg = detail::segment_registry::instance().find(ref.segment);
  if (!seg) {
    broken_reason_ = "a peer published a buffer in a shared segment this rank has not mapped "
                     "(was the communicator that allocated it freed on some ranks only?)";
    throw peer_error("zcoll: " + broken_reason_);
  }
  return remember(std::move(seg)).seg->shm->data() + ref.offset;
}

std::shared_ptr<data_segment> node_context::create_segment(std::size_t partition_bytes) {
  const auto p = static_cast<std::size_t>(config_.size);
  const bool leader = config_.rank == 0;
  std::shared_ptr<shm_segment> shm;
  if (leader) {
    try {
      shm = shm_segment::create(p * partition_bytes);
      set_text(header_->segment_name, shm->name());
      header_->segment_id = next_segment_id();
      header_->segment_partition = partition_bytes;
      header_->segment_status = 0;
    } catch (const std::exception& e) {
      header_->segment_status = 1;
      set_text(header_->segment_message, e.what());
    }
  }
  sync();
  if (header_->segment_status != 0)
    throw std::runtime_error("[" + rank_name(0) + "] " + header_->segment_message);
  const std::uint64_t id = header_->segment_id;
  auto& mine = slots_[config_.rank];
  mine.status = 0;
  try {
    if (!leader) shm = shm_segment::attach(header_->segment_name, p * partition_bytes);
    shm->reserve(static_cast<std::size_t>(config_.rank) * partition_bytes, partition_bytes);
  } catch (const std::exception& e) {
    mine.status = 1;
    set_text(mine.status_message, e.what());
  }
  sync();
  if (leader) shm->unlink();
  for (int j = 0; j < config_.size; ++j)
    if (slots_[j].status != 0)
      throw std::runtime_error("[" + rank_name(j) + "] " + slots_[j].status_message);
  auto seg = std::make_shared<data_segment>();
  seg->shm = std::move(shm);
  seg->id = id;
  seg->partition_bytes = partition_bytes;
  seg->member_pids = sorted_pids_;
  detail::segment_registry::instance().add(seg);
  remember(seg);
  owned_.push_back(seg);
  return seg;
}

std::shared_ptr<arena_block> node_context::allocate(std::size_t bytes) {
  auto& d = next_descriptor(op_code::allocate);
  d.block_bytes = bytes;
  d.flag = allocator_->fits(bytes) ? 1 : 0;
  const auto all = publish_and_sync();
  check_agreement(all, op_code::allocate);
  std::size_t need = 0;
  bool grow = false;
  for (int j = 0; j < config_.size; ++j)
    if (!all[j].flag) grow = true, need = std::max<std::size_t>(need, all[j].block_bytes);
  if (grow) {
    const std::size_t partition = std::max(
        round_up(need + detail::partition_allocator::colour_span, page_size()), next_partition_bytes_);
    next_partition_bytes_ = std::min(2 * next_partition_bytes_, max_growth_partition_bytes);
    allocator_->add_partition(create_segment(partition), config_.rank);
  }
  auto got = allocator_->allocate(bytes);
  if (!got) throw std::runtime_error("zcoll: arena allocation failed after growing the arena");
  return std::make_shared<arena_block>(std::move(got->first), allocator_, got->second, bytes);
}

void node_context::ensure_staging(std::size_t bytes) {
  if (staging_ && staging_->partition_bytes >= bytes) return;
  const std::size_t old = staging_ ? staging_->partition_bytes : 0;
  std::erase_if(segments_, [&](const known_segment& k) { return k.seg == staging_; });
  std::erase(owned_, staging_);
  staging_.reset();
  staging_ = create_segment(
      std::max(round_up(std::max<std::size_t>(bytes, 1), page_size()), 2 * old));
}

void node_context::fail(op_code op, arg_error kind, const std::string& message) {
  auto& d = next_descriptor(op_code::error);
  d.error = kind == arg_error::none ? arg_error::value : kind;
  set_text(slots_[config_.rank].message, message);
  check_agreement(publish_and_sync(), op);
  throw std::logic_error("zcoll: unreachable: an error was published but not raised");
}

void node_context::barrier() {
  next_descriptor(op_code::barrier);
  check_agreement(publish_and_sync(), op_code::barrier);
}

void node_context::setup_eager(std::size_t bytes) {
  check_usable();
  eager_bytes_ = round_up(bytes, detail::partition_allocator::alignment);
  if (eager_bytes_ == 0) return;
  eager_ = create_segment(round_up(2 * eager_bytes_, page_size()));
}

void node_context::execute_eager(const collective_args& args) {
  auto& d = next_descriptor(args.op);
  const bool in_place = args.send == nullptr;
  const std::size_t parity = publish_parity();
  const std::size_t block = args.block_bytes;
  const auto& cr = config_.comm_ranks;
  const auto me = static_cast<std::size_t>(cr[static_cast<std::size_t>(config_.rank)]);
  const auto* data = static_cast<const std::byte*>(in_place ? args.recv : args.send);
  if (args.op == op_code::alltoall)
    copy_bytes(eager_slot(config_.rank, parity), data, args.recv_bytes);
  else
    copy_bytes(eager_slot(config_.rank, parity), in_place ? data + me * block : data, block);
  d.order = static_cast<std::int8_t>(eager_order);
  d.block_bytes = block;
  d.dtype = args.dtype;
  d.flag = in_place ? 1 : 0;
  const auto all = publish_and_sync();
  check_agreement(all, args.op);
  check_arguments(all);
  auto* recv = static_cast<std::byte*>(args.recv);
  for (int s = 0; s < config_.size; ++s) {
    const std::byte* from = eager_slot(s, parity);
    const auto src = static_cast<std::size_t>(cr[static_cast<std::size_t>(s)]);
    copy_bytes(recv + src * block, args.op == op_code::alltoall ? from + me * block : from, block);
  }
}

std::shared_ptr<arena_block> node_context::view(const buffer_ref& ref, std::size_t bytes) {
  check_usable();
  std::byte* p = resolve(ref);
  for (const auto& known : segments_) {
    if (known.seg->id != ref.segment) continue;
    if (ref.offset + bytes > known.seg->shm->size())
      throw usage_error("zcoll: a peer's array extends past its shared segment");
    return std::make_shared<arena_block>(known.seg, std::weak_ptr<detail::partition_allocator>{},
                                         static_cast<std::size_t>(p - known.seg->shm->data()),
                                         bytes);
  }
  throw std::logic_error("zcoll: resolved segment vanished");
}

const schedule& node_context::schedule_for(op_code op, bool in_place, block_order order) {
  const schedule_kind kind = schedule_kind_of(op, in_place);
  const auto key = static_cast<std::uint32_t>(static_cast<int>(kind) * count_of<block_order> +
                                              static_cast<int>(order));
  auto it = schedules_.find(key);
  if (it != schedules_.end()) return it->second;
  return schedules_.emplace(key, make_schedule(kind, config_.size, order)).first->second;
}

schedule_kind schedule_kind_of(op_code op, bool in_place) noexcept {
  if (!in_place) return schedule_kind::full;
  return op == op_code::alltoall ? schedule_kind::swap : schedule_kind::offdiagonal;
}

void node_context::run_schedule(const schedule& sched, op_code op, bool in_place,
                                std::size_t block, const std::vector<std::byte*>& send,
                                const std::vector<std::byte*>& recv, const copy_plan& how) {
  copy_segment(sched.segment(config_.rank), op, in_place, block, send.data(), recv.data(),
               config_.comm_ranks.data(), how);
}

void copy_segment(std::span<const block_coord> segment, op_code op, bool in_place,
                  std::size_t block, std::byte* const* send, std::byte* const* recv,
                  const int* comm_ranks, const copy_plan& how) noexcept {
  const int* cr = comm_ranks;
  for (const block_coord& b : segment) {
    const auto d = static_cast<std::size_t>(b.dst);
    const auto s = static_cast<std::size_t>(b.src);
    std::byte* into = recv[d] + static_cast<std::size_t>(cr[s]) * block;
    if (op == op_code::alltoall) {
      if (in_place)
        swap_bytes(into, recv[s] + static_cast<std::size_t>(cr[d]) * block, block);
      else
        copy_bytes(into, send[s] + static_cast<std::size_t>(cr[d]) * block, block, how);
    } else {
      copy_bytes(into, in_place ? recv[s] + static_cast<std::size_t>(cr[s]) * block : send[s],
                 block, how);
    }
  }
}

void node_context::execute(const collective_args& args) {
  if (args.op != op_code::alltoall && args.op != op_code::allgather)
    throw std::invalid_argument("zcoll: execute() runs alltoall or allgather");
  if (args.eager) {
    execute_eager(args);
    return;
  }
  auto& d = next_descriptor(args.op);
  const bool in_place = args.send == nullptr;
  d.order = static_cast<std::int8_t>(args.order);
  d.block_bytes = args.block_bytes;
  d.dtype = args.dtype;
  d.flag = in_place ? 1 : 0;
  if (!in_place) d.send = locate(args.send, args.send_bytes);
  d.recv = locate(args.recv, args.recv_bytes);
  const auto all = publish_and_sync();
  check_agreement(all, args.op);
  check_arguments(all);
  const std::size_t block = args.block_bytes;
  if (block == 0) return;
  const auto p = static_cast<std::size_t>(config_.size);
  bool staged = false;
  for (std::size_t j = 0; j < p; ++j)
    staged |= (!in_place && all[j].send.segment == 0) || all[j].recv.segment == 0;
  auto& send = send_bases_;
  auto& recv = recv_bases_;
  send.assign(p, nullptr);
  recv.assign(p, nullptr);
  const std::size_t send_part = in_place ? 0 : round_up(args.send_bytes, 64);
  if (staged) stage_in(args, in_place, send_part, d.send, d.recv);
  for (std::size_t j = 0; j < p; ++j) {
    std::byte* stage = staged ? staging_->partition(static_cast<int>(j)) : nullptr;
    if (!in_place) send[j] = all[j].send.segment ? resolve(all[j].send) : stage;
    recv[j] = all[j].recv.segment ? resolve(all[j].recv) : stage + send_part;
  }
  const bool my_recv_staged = d.recv.segment == 0;
  const schedule& sched = schedule_for(args.op, in_place, args.order);
  timed_copies(block, args.copy, args.recv_bytes, sched.segment(config_.rank).size() * block,
               tuned_index(args.op), [&](const copy_plan& how) {
                 run_schedule(sched, args.op, in_place, block, send, recv, how);
               });
  sync();
  if (staged && my_recv_staged)
    copy_bytes(args.recv, staging_->partition(config_.rank) + send_part, args.recv_bytes);
}

void node_context::resolve_all(descriptors all, bool send_side, std::vector<std::byte*>* bases) {
  bases->assign(static_cast<std::size_t>(config_.size), nullptr);
  for (int j = 0; j < config_.size; ++j) {
    const buffer_ref& ref = send_side ? all[j].send : all[j].recv;
    if (ref.segment == 0)
      throw usage_error("zcoll." + op_name(all[j].op) + ": " + rank_name(j) +
                        "'s " + (send_side ? "source" : "destination") +
                        " array is not in the shared arena (allocate it with zcoll.empty)");
    (*bases)[static_cast<std::size_t>(j)] = resolve(ref);
  }
}

void node_context::run_transfer(const transfer_geometry& g, const array_view& send,
                                const array_view& recv, int order, int copy) {
  const int me = config_.comm_ranks[static_cast<std::size_t>(config_.rank)];
  local_check check = check_transfer_args(g, me, send, recv);
  block_order o = default_order(config_.size, check.block_bytes);
  if (is_code<block_order>(order))
    o = static_cast<block_order>(order);
  else if (order != auto_order && check.ok())
    check = value_error("unknown order code " + std::to_string(order));
  if (check.ok() && !valid_copy(copy)) check = value_error("unknown copy code " + std::to_string(copy));
  if (!check.ok()) fail(op_code::transfer, check.error, "zcoll.transfer: " + check.message);
  execute_transfer(g, send, recv, o, copy);
}

void node_context::execute_transfer(const transfer_geometry& g, const array_view& send,
                                    const array_view& recv, block_order order, int copy) {
  auto& d = next_descriptor(op_code::transfer);
  d.order = static_cast<std::int8_t>(order);
  d.block_bytes = g.signature();
  d.dtype = recv.dtype;
  d.send = locate(send.data, send.nbytes);
  d.recv = locate(recv.data, recv.nbytes);
  const auto all = publish_and_sync();
  check_agreement(all, op_code::transfer);
  check_arguments(all);
  resolve_all(all, true, &send_bases_);
  resolve_all(all, false, &recv_bases_);
  const auto& sched = schedule_for(op_code::transfer, false, order);
  const auto& cr = config_.comm_ranks;
  const auto mine = sched.segment(config_.rank);
  // Blocks differ in size: "auto" judges by the mean block this rank copies.
  const std::size_t block = recv.nbytes / static_cast<std::size_t>(g.comm_size);
  timed_copies(block, copy, recv.nbytes, recv.nbytes, no_rules, [&](const copy_plan& how) {
    for (const block_coord& b : mine) {
      const auto dst = static_cast<std::size_t>(b.dst);
      const auto src = static_cast<std::size_t>(b.src);
      const transfer_block blk = block_of(g, cr[src], cr[dst]);
      copy_box(recv_bases_[dst] + blk.dst_offset, blk.dst_strides.data(),
               send_bases_[src] + blk.src_offset, blk.src_strides.data(), blk.count.data(),
               g.ndim, g.itemsize, how);
    }
  });
  sync();
}

void node_context::stage_in(const collective_args& args, bool in_place, std::size_t send_part,
                            const buffer_ref& my_send, const buffer_ref& my_recv) {
  ensure_staging(send_part + args.recv_bytes);
  std::byte* mine = staging_->partition(config_.rank);
  if (!in_place && my_send.segment == 0) copy_bytes(mine, args.send, args.send_bytes);
  if (in_place && my_recv.segment == 0) {
    if (args.op == op_code::alltoall) {
      copy_bytes(mine, args.recv, args.recv_bytes);
    } else {  // in-place allgather: only this rank's own block is input
      const std::size_t own =
          static_cast<std::size_t>(config_.comm_ranks[static_cast<std::size_t>(config_.rank)]) *
          args.block_bytes;
      copy_bytes(mine + own, static_cast<const std::byte*>(args.recv) + own, args.block_bytes);
    }
  }
  sync();  // staged data is visible
}

namespace {

std::string elements_text(std::size_t n) { return std::to_string(n) + (n == 1 ? " element" : " elements"); }

// Elements per block when `a` is cut into `p` blocks along its first axis (or a 1-D split).
std::string split_error(const array_view& a, int p, const char* name) {
  const auto np = static_cast<std::size_t>(p);
  if (a.ndim == 0) return std::string(name) + " must have at least one dimension";
  if (a.ndim == 1 && a.first_dim % np != 0)
    return std::string(name) + " has " + elements_text(a.first_dim) +
           ", which is not divisible by comm.size=" + std::to_string(p);
  if (a.ndim > 1 && a.first_dim != np)
    return std::string(name) + ".shape[0] must equal comm.size=" + std::to_string(p) + ", got " +
           std::to_string(a.first_dim);
  return {};
}

std::string dtype_short(const dtype_id& d) {
  return std::string(1, static_cast<char>(d.kind)) + std::to_string(d.itemsize);
}

bool overlap(const array_view& a, const array_view& b) noexcept {
  const auto* pa = static_cast<const std::byte*>(a.data);
  const auto* pb = static_cast<const std::byte*>(b.data);
  return a.nbytes && b.nbytes && pa < pb + b.nbytes && pb < pa + a.nbytes;
}

}  // namespace

local_check check_local_args(op_code op, int comm_size, const array_view* send,
                             const array_view& recv) {
  const auto p = static_cast<std::size_t>(comm_size);
  if (recv.has_objects || (send && send->has_objects))
    return type_error("arrays of Python objects cannot be exchanged through shared memory");
  if (!recv.c_contiguous) return value_error("recvbuf must be C-contiguous");
  if (!recv.writeable) return value_error("recvbuf is read-only");
  if (auto e = split_error(recv, comm_size, "recvbuf"); !e.empty()) return value_error(e);
  if (!send) return {arg_error::none, {}, recv.nbytes / p};
  if (!(send->dtype == recv.dtype))
    return type_error("recvbuf dtype (" + dtype_short(recv.dtype) +
                      ") differs from sendbuf dtype (" + dtype_short(send->dtype) + ")");
  const std::size_t want = op == op_code::alltoall ? send->size : p * send->size;
  if (recv.size != want)
    return value_error("recvbuf has " + elements_text(recv.size) + ", expected " +
                       elements_text(want));
  if (op == op_code::alltoall)
    if (auto e = split_error(*send, comm_size, "sendbuf"); !e.empty()) return value_error(e);
  if (overlap(*send, recv))
    return value_error("sendbuf and recvbuf overlap; pass zcoll.IN_PLACE as sendbuf instead");
  return {arg_error::none, {}, op == op_code::alltoall ? send->nbytes / p : send->nbytes};
}

namespace {

std::string shape_text(const std::int64_t* shape, int ndim) {
  std::string t = "(";
  for (int k = 0; k < ndim; ++k) t += (k ? ", " : "") + std::to_string(shape[k]);
  return t + (ndim == 1 ? ",)" : ")");
}

std::string extents_text(const extents& e, int ndim) {
  std::int64_t s[max_transfer_dims];
  for (int k = 0; k < ndim; ++k) s[k] = static_cast<std::int64_t>(e[static_cast<std::size_t>(k)]);
  return shape_text(s, ndim);
}

std::string check_transfer_array(const array_view& a, const char* name, const extents& want,
                                 int ndim) {
  if (a.has_objects) return "arrays of Python objects cannot be exchanged through shared memory";
  if (!a.c_contiguous) return std::string(name) + " must be C-contiguous";
  bool same = a.ndim == ndim;
  for (int k = 0; same && k < ndim; ++k)
    same = static_cast<std::uint64_t>(a.shape[k]) == want[static_cast<std::size_t>(k)];
  if (!same)
    return std::string(name) + " has shape " + shape_text(a.shape, a.ndim) +
           ", this rank's part of the distributed array has shape " + extents_text(want, ndim);
  return {};
}

}  // namespace

local_check check_transfer_args(const transfer_geometry& g, int comm_rank, const array_view& send,
                                const array_view& recv) {
  if (auto e = g.invalid(); !e.empty()) return value_error(e);
  if (!(send.dtype == recv.dtype))
    return type_error("the arrays' dtypes differ (" + dtype_short(send.dtype) + " and " +
                      dtype_short(recv.dtype) + ")");
  if (send.dtype.itemsize != g.itemsize)
    return type_error("the arrays' itemsize " + std::to_string(send.dtype.itemsize) +
                      " differs from the transfer's " + std::to_string(g.itemsize));
  if (auto e = check_transfer_array(send, "the source array", g.shape_a(comm_rank), g.ndim);
      !e.empty())
    return value_error(e);
  if (auto e = check_transfer_array(recv, "the destination array", g.shape_b(comm_rank), g.ndim);
      !e.empty())
    return value_error(e);
  if (!recv.writeable) return value_error("the destination array is read-only");
  if (overlap(send, recv)) return value_error("the source and destination arrays overlap");
  return {arg_error::none, {}, send.nbytes / static_cast<std::size_t>(g.comm_size)};
}

bool parse_order(std::string_view name, int p, std::size_t block_bytes, block_order* order) {
  if (name == "auto") {
    *order = default_order(p, block_bytes);
    return true;
  }
  const auto named = parse_name<block_order>(name);
  if (named) *order = *named;
  return named.has_value();
}

void node_context::run(op_code op, const array_view* send, const array_view& recv, int order,
                       int copy) {
  local_check check = check_local_args(op, config_.comm_size, send, recv);
  collective_args args;
  if (order == auto_order) {
    const auto_choice c = resolve_auto(op, check.block_bytes, recv.nbytes);
    args.order = c.order;
    args.eager = check.ok() && c.eager;
  } else if (order == eager_order) {
    args.eager = true;
    if (check.ok() && (!eager_ || recv.nbytes > eager_bytes_))
      check = value_error("the eager path takes at most " + std::to_string(eager_bytes()) +
                          " bytes per rank, this call receives " + std::to_string(recv.nbytes));
  } else if (is_code<block_order>(order))
    args.order = static_cast<block_order>(order);
  else if (check.ok())
    check = value_error("unknown order code " + std::to_string(order));
  if (check.ok() && !valid_copy(copy)) check = value_error("unknown copy code " + std::to_string(copy));
  if (!check.ok()) fail(op, check.error, "zcoll." + op_name(op) + ": " + check.message);
  args.copy = copy;
  args.op = op;
  args.send = send ? send->data : nullptr;
  args.send_bytes = send ? send->nbytes : 0;
  args.recv = const_cast<void*>(recv.data);
  args.recv_bytes = recv.nbytes;
  args.block_bytes = check.block_bytes;
  args.dtype = recv.dtype;
  execute(args);
}

void node_context::set_tuning_rules(op_code op, std::vector<order_rule> orders,
                                    std::vector<copy_rule> copies) {
  const int table = tuned_index(op);
  if (table == no_rules) throw std::invalid_argument("zcoll: only alltoall and allgather are tuned");
  for (const order_rule& r : orders)
    if (r.order != auto_order && r.order != eager_order &&
        !is_code<block_order>(r.order))
      throw std::invalid_argument("zcoll: unknown order code in a tuning rule");
  for (const copy_rule& r : copies)
    if (r.mode != auto_copy && !is_code<copy_mode>(r.mode))
      throw std::invalid_argument("zcoll: unknown copy code in a tuning rule");
  sort_rules(orders);
  copy_.set_rules(table, std::move(copies));
  order_rules_[static_cast<std::size_t>(table)] = std::move(orders);
}

auto_choice node_context::resolve_auto(op_code op, std::size_t block_bytes,
                                       std::size_t recv_bytes) const {
  // Eager is judged by what a rank receives (P blocks), the bulk of the pull for both.
  const bool eager_fits = eager_ && recv_bytes <= eager_bytes_;
  auto_choice c{default_order(config_.size, block_bytes), eager_fits, false};
  const int table = tuned_index(op);
  if (table == no_rules || order_rules_[static_cast<std::size_t>(table)].empty()) return c;
  const order_rule* r = find_rule(order_rules_[static_cast<std::size_t>(table)], block_bytes);
  if (!r || r->order == auto_order) return c;
  c.from_rule = true;
  if (r->order == eager_order) return c;  // eager where the call fits it, else the default
  c.order = static_cast<block_order>(r->order);
  c.eager = false;
  return c;
}

block_order default_order(int p, std::size_t block_bytes) noexcept {
  (void)block_bytes;
  return p <= 2 ? block_order::row : block_order::morton;
}

}  // namespace zcoll
