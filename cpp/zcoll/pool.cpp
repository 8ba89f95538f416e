#include "zcoll/pool.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "zcoll/protocol.hpp"

namespace zcoll {

namespace {

constexpr int max_blocks = 1024;  // the departure registry's bound on live contexts too
constexpr int min_blocks = 4;
constexpr std::size_t address_budget = std::size_t{1} << 30;  // one pool's mapping, sparse
constexpr std::size_t first_chunk_bytes = std::size_t{1} << 20;
// A block's word in the table: its user count, and this bit once its memory was reserved. The
// memory of a shared object stays reserved until the object goes, so a block claimed again
// skips posix_fallocate (a system call, about a tenth of a derived context's creation).
constexpr std::uint32_t reserved_bit = std::uint32_t{1} << 31;
// The arena's segment id follows the block table (the leader writes it at creation).
constexpr std::size_t arena_id_offset = max_blocks * sizeof(std::atomic<std::uint32_t>);

std::size_t table_bytes() noexcept {
  return round_up(arena_id_offset + sizeof(std::uint64_t), page_size());
}

}  // namespace

struct node_pool::lease {
  std::shared_ptr<node_pool> pool;
  int index;
  ~lease() { pool->release(index); }
};

std::size_t node_pool::shape::control_bytes() const noexcept {
  return call_protocol::control_bytes(size);
}

std::size_t node_pool::shape::eager_partition() const noexcept {
  if (eager_bytes == 0) return 0;
  return round_up(2 * round_up(eager_bytes, detail::partition_allocator::alignment), page_size());
}

std::size_t node_pool::shape::block_bytes() const noexcept {
  return control_bytes() + static_cast<std::size_t>(size) * eager_partition();
}

int node_pool::shape::blocks() const noexcept {
  const std::size_t fit = address_budget / block_bytes();
  return static_cast<int>(std::clamp<std::size_t>(fit, min_blocks, max_blocks));
}

std::size_t node_pool::shape::arena_offset() const noexcept {
  return table_bytes() + static_cast<std::size_t>(blocks()) * block_bytes();
}

std::size_t node_pool::shape::segment_bytes() const noexcept {
  return arena_offset() + static_cast<std::size_t>(size) * arena_region_bytes;
}

pool_arena::pool_arena(std::shared_ptr<data_segment> segment, std::shared_ptr<shm_segment> whole,
                       int rank)
    : segment_(std::move(segment)),
      whole_(std::move(whole)),
      rank_(rank),
      allocator_(std::make_shared<detail::partition_allocator>()) {}

std::shared_ptr<arena_block> pool_arena::allocate(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (!make_room(bytes)) return nullptr;
  auto got = allocator_->allocate(bytes);
  if (!got) return nullptr;
  return std::make_shared<arena_block>(std::move(got->first), allocator_, got->second, bytes);
}

bool pool_arena::make_room(std::size_t bytes) {
  while (!allocator_->fits(bytes)) {
    const std::size_t region = segment_->partition_bytes;
    const std::size_t need =
        round_up(bytes + detail::partition_allocator::colour_span, page_size());
    const std::size_t chunk = std::max({need, reserved_, first_chunk_bytes});
    if (chunk > region - reserved_) return false;
    const std::size_t begin = static_cast<std::size_t>(rank_) * region + reserved_;
    const auto in_whole = static_cast<std::size_t>(segment_->shm->data() - whole_->data());
    try {
      whole_->reserve(in_whole + begin, chunk);
    } catch (const std::exception&) {
      return false;  // memory is short: the context's own segments raise the error
    }
    allocator_->add_range(segment_, begin, begin + chunk, rank_);
    reserved_ += chunk;
  }
  return true;
}

node_pool::node_pool(std::shared_ptr<shm_segment> shm, const shape& s)
    : shm_(std::move(shm)), shape_(s) {}

std::shared_ptr<node_pool> node_pool::create(const shape& s) {
  auto shm = shm_segment::create(s.segment_bytes());
  shm->reserve(0, table_bytes() + s.block_bytes());  // the table and block 0, now
  const std::uint64_t arena_id = next_segment_id();
  std::memcpy(shm->data() + arena_id_offset, &arena_id, sizeof arena_id);
  std::shared_ptr<node_pool> pool(new node_pool(std::move(shm), s));
  pool->users_of(0).store(static_cast<std::uint32_t>(s.size) | reserved_bit,
                          std::memory_order_release);
  return pool;
}

std::shared_ptr<node_pool> node_pool::attach(const std::string& name, const shape& s) {
  return std::shared_ptr<node_pool>(new node_pool(shm_segment::attach(name, s.segment_bytes()), s));
}

std::atomic<std::uint32_t>& node_pool::users_of(int index) const noexcept {
  return reinterpret_cast<std::atomic<std::uint32_t>*>(shm_->data())[index];
}

std::byte* node_pool::block(int index) const noexcept {
  return shm_->data() + table_bytes() + static_cast<std::size_t>(index) * shape_.block_bytes();
}

std::uint32_t node_pool::users(int index) const noexcept {
  return users_of(index).load(std::memory_order_acquire) & ~reserved_bit;
}

int node_pool::blocks_in_use() const noexcept {
  int n = 0;
  for (int i = 0; i < shape_.blocks(); ++i) n += users(i) != 0 ? 1 : 0;
  return n;
}

int node_pool::claim(int users) {
  if (users < 1 || users > shape_.size)
    throw std::invalid_argument("zcoll: a pool block's users must be 1 to the pool's node size");
  for (int i = 0; i < shape_.blocks(); ++i) {
    std::atomic<std::uint32_t>& word = users_of(i);
    std::uint32_t free = word.load(std::memory_order_relaxed) & reserved_bit;
    const auto claimed = static_cast<std::uint32_t>(users) | free;
    if (!word.compare_exchange_strong(free, claimed, std::memory_order_acq_rel)) continue;
    if (!(free & reserved_bit)) {
      try {
        shm_->reserve(static_cast<std::size_t>(block(i) - shm_->data()), shape_.block_bytes());
      } catch (...) {
        abandon(i);
        throw;
      }
      word.fetch_or(reserved_bit, std::memory_order_release);
    }
    // Sequence numbers only grow within a context: a reused block starts again from zero.
    std::memset(block(i), 0, shape_.control_bytes());
    std::atomic_thread_fence(std::memory_order_release);
    return i;
  }
  return -1;
}

void node_pool::abandon(int index) noexcept {
  users_of(index).fetch_and(reserved_bit, std::memory_order_release);
}

void node_pool::release(int index) noexcept {
  users_of(index).fetch_sub(1, std::memory_order_acq_rel);
}

std::shared_ptr<pool_arena> node_pool::arena(int rank, std::vector<std::int32_t> sorted_pids) {
  if (rank < 0 || rank >= shape_.size)
    throw std::invalid_argument("zcoll: no such rank of the pool: " + std::to_string(rank));
  std::lock_guard lock(arena_mutex_);
  if (arena_made_) return arena_.lock();
  const std::size_t offset = shape_.arena_offset();
  auto seg = std::make_shared<data_segment>();
  seg->shm = shm_segment::part(shared_from_this(), shm_->data() + offset,
                               static_cast<std::size_t>(shape_.size) * arena_region_bytes);
  std::memcpy(&seg->id, shm_->data() + arena_id_offset, sizeof seg->id);
  seg->partition_bytes = arena_region_bytes;
  seg->member_pids = std::move(sorted_pids);
  seg->pool_only = true;
  detail::segment_registry::instance().add(seg);
  auto made = std::make_shared<pool_arena>(std::move(seg), shm_, rank);
  arena_ = made;
  arena_made_ = true;
  return made;
}

std::pair<std::shared_ptr<shm_segment>, std::shared_ptr<shm_segment>> node_pool::open(int index) {
  if (index < 0 || index >= shape_.blocks() || users(index) == 0)
    throw std::invalid_argument("zcoll: no such claimed pool block: " + std::to_string(index));
  std::shared_ptr<lease> hold(new lease{shared_from_this(), index});
  std::byte* base = block(index);
  const std::size_t control = shape_.control_bytes();
  return {shm_segment::part(hold, base, control),
          shm_segment::part(hold, base + control,
                            static_cast<std::size_t>(shape_.size) * shape_.eager_partition())};
}

}  // namespace zcoll
