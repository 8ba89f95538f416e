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

std::size_t table_bytes() noexcept {
  return round_up(max_blocks * sizeof(std::atomic<std::uint32_t>), page_size());
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

std::size_t node_pool::shape::segment_bytes() const noexcept {
  return table_bytes() + static_cast<std::size_t>(blocks()) * block_bytes();
}

node_pool::node_pool(std::shared_ptr<shm_segment> shm, const shape& s)
    : shm_(std::move(shm)), shape_(s) {}

std::shared_ptr<node_pool> node_pool::create(const shape& s) {
  auto shm = shm_segment::create(s.segment_bytes());
  shm->reserve(0, table_bytes() + s.block_bytes());  // the table and block 0, now
  std::shared_ptr<node_pool> pool(new node_pool(std::move(shm), s));
  pool->users_of(0).store(static_cast<std::uint32_t>(s.size), std::memory_order_release);
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
  return users_of(index).load(std::memory_order_acquire);
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
    std::uint32_t free = 0;
    if (!users_of(i).compare_exchange_strong(free, static_cast<std::uint32_t>(users),
                                             std::memory_order_acq_rel))
      continue;
    try {
      shm_->reserve(static_cast<std::size_t>(block(i) - shm_->data()), shape_.block_bytes());
    } catch (...) {
      abandon(i);
      throw;
    }
    // Sequence numbers only grow within a context: a reused block starts again from zero.
    std::memset(block(i), 0, shape_.control_bytes());
    std::atomic_thread_fence(std::memory_order_release);
    return i;
  }
  return -1;
}

void node_pool::abandon(int index) noexcept {
  users_of(index).store(0, std::memory_order_release);
}

void node_pool::release(int index) noexcept {
  users_of(index).fetch_sub(1, std::memory_order_acq_rel);
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
