#include "zcoll/segments.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>

#include "zcoll/error.hpp"
#include "zcoll/heap.hpp"
#include "zcoll/pool.hpp"

namespace zcoll {

namespace {

constexpr std::size_t first_partition_bytes = std::size_t{1} << 20;
constexpr std::size_t max_growth_partition_bytes = std::size_t{64} << 20;

}  // namespace

std::uint64_t next_segment_id() noexcept {
  static std::atomic<std::uint32_t> counter{0};
  return (static_cast<std::uint64_t>(::getpid()) << 32) | (counter.fetch_add(1) + 1);
}

node_segments::node_segments(call_protocol& protocol, int rank, int size,
                             std::vector<std::int32_t> pids)
    : protocol_(protocol),
      rank_(rank),
      size_(size),
      sorted_pids_(std::move(pids)),
      allocator_(std::make_shared<detail::partition_allocator>()),
      next_partition_bytes_(first_partition_bytes) {
  std::sort(sorted_pids_.begin(), sorted_pids_.end());
}

void node_segments::close() noexcept {
  for (auto& seg : owned_) seg->owner_alive.store(false, std::memory_order_relaxed);
  owned_.clear();
  known_.clear();
  staging_.reset();
  allocator_.reset();
  pool_arena_.reset();
}

void node_segments::use_pool_arena(std::shared_ptr<pool_arena> arena) {
  if (!arena || !arena->segment()->mapped_by_all(sorted_pids_)) return;
  known_.push_back({arena->segment(), true});
  pool_arena_ = std::move(arena);
}

std::size_t node_segments::bytes_in_use() const {
  if (!allocator_) return 0;
  return allocator_->bytes_in_use() + (pool_arena_ ? pool_arena_->allocator()->bytes_in_use() : 0);
}

const node_segments::known_segment& node_segments::remember(std::shared_ptr<data_segment> seg) {
  const bool shared = !seg->pool_only && seg->mapped_by_all(sorted_pids_);
  known_.push_back({std::move(seg), shared});
  return known_.back();
}

buffer_ref node_segments::shared_ref(const void* p, std::size_t bytes) {
  const auto* q = static_cast<const std::byte*>(p);
  for (const auto& known : known_) {
    const std::byte* base = known.seg->shm->data();
    const std::size_t size = known.seg->shm->size();
    if (q < base || q > base + size || bytes > static_cast<std::size_t>(base + size - q)) continue;
    if (!known.shared_by_all || !known.seg->owner_alive.load(std::memory_order_relaxed)) return {};
    return {known.seg->id, static_cast<std::uint64_t>(q - base)};
  }
  if (publish_heap_)  // before the registry: a heap segment is no other segment
    if (const buffer_ref ref = heap_memo_.locate(p, bytes); ref.segment) return ref;
  // A private buffer is looked up at every call: the registry's answer is kept while no
  // segment is added (its lock and walk cost a small irregular call 15 % at P = 2).
  auto& registry = detail::segment_registry::instance();
  const std::uint64_t additions = registry.additions();
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  for (const private_range& r : private_)
    if (r.begin == at && r.bytes == bytes && r.additions == additions) return {};
  std::size_t offset = 0;
  auto seg = registry.find(p, bytes, &offset);
  if (!seg) {
    private_[next_private_++ % private_.size()] = {at, bytes, additions};
    return buffer_ref{};
  }
  const auto& known = remember(std::move(seg));
  return known.shared_by_all ? buffer_ref{known.seg->id, offset} : buffer_ref{};
}

buffer_ref node_segments::locate(const void* p, std::size_t bytes) {
  buffer_ref ref = shared_ref(p, bytes);
  if (ref.segment == 0) ref.offset = reinterpret_cast<std::uintptr_t>(p);
  return ref;
}

std::byte* node_segments::resolve(const buffer_ref& ref) {
  if (ref.segment & heap::heap_tag) {
    if (std::byte* p = heap_memo_.resolve(ref, 0)) return p;
    const std::string why =
        "a peer published a heap buffer this rank cannot map (freed during "
        "the call, or its process is gone)";
    protocol_.mark_broken(why);
    throw peer_error("zcoll: " + why);
  }
  for (const auto& known : known_)
    if (known.seg->id == ref.segment) return known.seg->shm->data() + ref.offset;
  auto seg = detail::segment_registry::instance().find(ref.segment);
  if (!seg) {
    const std::string why =
        "a peer published a buffer in a shared segment this rank has not mapped (was the "
        "communicator that allocated it freed on some ranks only?)";
    protocol_.mark_broken(why);
    throw peer_error("zcoll: " + why);
  }
  return remember(std::move(seg)).seg->shm->data() + ref.offset;
}

std::shared_ptr<arena_block> node_segments::view(const buffer_ref& ref, std::size_t bytes) {
  protocol_.check_usable();
  if (ref.segment & heap::heap_tag)
    throw usage_error("zcoll: a peer's heap buffer cannot be viewed as an arena array");
  std::byte* p = resolve(ref);
  for (const auto& known : known_) {
    if (known.seg->id != ref.segment) continue;
    if (ref.offset + bytes > known.seg->shm->size())
      throw usage_error("zcoll: a peer's array extends past its shared segment");
    return std::make_shared<arena_block>(known.seg, std::weak_ptr<detail::partition_allocator>{},
                                         static_cast<std::size_t>(p - known.seg->shm->data()),
                                         bytes);
  }
  throw std::logic_error("zcoll: resolved segment vanished");
}

std::shared_ptr<data_segment> node_segments::create(std::size_t partition_bytes) {
  const auto p = static_cast<std::size_t>(size_);
  const bool leader = rank_ == 0;
  auto& header = protocol_.header();
  std::shared_ptr<shm_segment> shm;
  if (leader) {
    try {
      shm = shm_segment::create(p * partition_bytes);
      set_text(header.segment_name, sizeof header.segment_name, shm->name());
      header.segment_id = next_segment_id();
      header.segment_partition = partition_bytes;
      header.segment_status = 0;
    } catch (const std::exception& e) {
      header.segment_status = 1;
      set_text(header.segment_message, message_bytes, e.what());
    }
  }
  protocol_.sync();
  if (header.segment_status != 0)
    throw std::runtime_error("[" + protocol_.rank_name(0) + "] " + header.segment_message);
  const std::uint64_t id = header.segment_id;
  auto& mine = protocol_.slot(rank_);
  mine.status = 0;
  try {
    if (!leader) shm = shm_segment::attach(header.segment_name, p * partition_bytes);
    shm->reserve(static_cast<std::size_t>(rank_) * partition_bytes, partition_bytes);
  } catch (const std::exception& e) {
    mine.status = 1;
    set_text(mine.status_message, message_bytes, e.what());
  }
  protocol_.sync();
  if (leader) shm->unlink();
  for (int j = 0; j < size_; ++j)
    if (protocol_.slot(j).status != 0)
      throw std::runtime_error("[" + protocol_.rank_name(j) + "] " +
                               protocol_.slot(j).status_message);
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

std::shared_ptr<arena_block> node_segments::allocate(std::size_t bytes) {
  auto& line = protocol_.next(op_code::allocate);
  line.call.block_bytes = bytes;
  // Taken from the pool's arena now, locally (given back if the call fails); else from this
  // context's segments, grown collectively below when some rank's do not fit.
  auto pooled = pool_arena_ ? pool_arena_->allocate(bytes) : nullptr;
  line.call.flag = pooled || allocator_->fits(bytes) ? 1 : 0;
  const auto all = protocol_.publish();
  check_calls(all, op_code::allocate);
  std::size_t need = 0;
  bool grow = false;
  for (int j = 0; j < size_; ++j)
    if (!all.call(j).flag) grow = true, need = std::max<std::size_t>(need, all.call(j).block_bytes);
  if (grow) {
    const std::size_t partition =
        std::max(round_up(need + detail::partition_allocator::colour_span, page_size()),
                 next_partition_bytes_);
    next_partition_bytes_ = std::min(2 * next_partition_bytes_, max_growth_partition_bytes);
    allocator_->add_partition(create(partition), rank_);
  }
  if (pooled) return pooled;
  auto got = allocator_->allocate(bytes);
  if (!got) throw std::runtime_error("zcoll: arena allocation failed after growing the arena");
  return std::make_shared<arena_block>(std::move(got->first), allocator_, got->second, bytes);
}

void node_segments::reserve_staging(std::size_t bytes) {
  if (staging_ && staging_->partition_bytes >= bytes) return;
  const std::size_t old = staging_ ? staging_->partition_bytes : 0;
  renew(staging_, std::max(round_up(std::max<std::size_t>(bytes, 1), page_size()), 2 * old));
}

void node_segments::renew(std::shared_ptr<data_segment>& seg, std::size_t partition_bytes) {
  if (seg) {
    std::erase_if(known_, [&](const known_segment& k) { return k.seg == seg; });
    std::erase(owned_, seg);
    seg.reset();
  }
  seg = create(partition_bytes);
}

}  // namespace zcoll
