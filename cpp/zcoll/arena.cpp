#include "zcoll/arena.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <system_error>

namespace zcoll {

namespace {

[[noreturn]] void throw_errno(int err, const std::string& what) {
  throw std::system_error(err, std::generic_category(), "zcoll: " + what);
}

std::string unique_segment_name() {
  static std::atomic<std::uint64_t> counter{0};
  static const std::uint64_t salt = std::random_device{}();
  return "/" + std::string(segment_prefix) + "-" + std::to_string(::getuid()) + "-" +
         std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)) + "-" +
         std::to_string(salt % 1000000007ULL);
}

}  // namespace

std::size_t page_size() noexcept {
  static const std::size_t size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

shm_segment::shm_segment(std::string name, int fd, std::size_t bytes, bool owner)
    : name_(std::move(name)), fd_(fd), size_(bytes), linked_(owner) {
  if (bytes == 0) return;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    if (owner) ::shm_unlink(name_.c_str());
    ::close(fd);
    throw_errno(err, "mmap of shared segment " + name_ + " failed");
  }
  data_ = static_cast<std::byte*>(p);
}

std::shared_ptr<shm_segment> shm_segment::create(std::size_t bytes) {
  for (int attempt = 0;; ++attempt) {
    std::string name = unique_segment_name();
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      if (errno == EEXIST && attempt < 8) continue;
      throw_errno(errno, "shm_open(" + name + ") failed");
    }
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int err = errno;
      ::shm_unlink(name.c_str());
      ::close(fd);
      throw_errno(err, "ftruncate of shared segment failed");
    }
    return std::shared_ptr<shm_segment>(new shm_segment(std::move(name), fd, bytes, true));
  }
}

std::shared_ptr<shm_segment> shm_segment::attach(const std::string& name, std::size_t bytes) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw_errno(errno, "shm_open(" + name + ") for attach failed");
  struct stat st{};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < bytes) {
    ::close(fd);
    throw_errno(EINVAL, "shared segment " + name + " is smaller than announced");
  }
  return std::shared_ptr<shm_segment>(new shm_segment(name, fd, bytes, false));
}

std::shared_ptr<shm_segment> shm_segment::part(std::shared_ptr<void> keep, std::byte* data,
                                               std::size_t bytes) {
  std::shared_ptr<shm_segment> seg(new shm_segment(std::string(), -1, 0, false));
  seg->data_ = data;
  seg->size_ = bytes;
  seg->keep_ = std::move(keep);
  return seg;
}

shm_segment::~shm_segment() {
  unlink();
  if (data_ && !keep_) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

void shm_segment::reserve(std::size_t offset, std::size_t bytes) {
  if (bytes == 0) return;
  if (offset > size_ || bytes > size_ - offset)  // posix_fallocate would grow the object
    throw std::out_of_range("zcoll: cannot reserve bytes past the end of a shared segment");
  const int err = ::posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes));
  if (err != 0)
    throw_errno(err, "cannot reserve " + std::to_string(bytes) +
                         " bytes of shared memory (is /dev/shm full?)");
}

void shm_segment::unlink() noexcept {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

bool data_segment::mapped_by_all(const std::vector<std::int32_t>& sorted_pids) const {
  return owner_alive.load(std::memory_order_relaxed) &&
         std::includes(member_pids.begin(), member_pids.end(), sorted_pids.begin(),
                       sorted_pids.end());
}

namespace detail {

segment_registry& segment_registry::instance() {
  static segment_registry* registry = new segment_registry;  // never destroyed: used at exit
  return *registry;
}

void segment_registry::add(const std::shared_ptr<data_segment>& seg) {
  std::lock_guard lock(mutex_);
  std::erase_if(segments_, [](const entry& e) { return e.seg.expired(); });
  segments_.push_back({seg, seg->shm->data(), seg->shm->size(), seg->id});
  additions_.fetch_add(1, std::memory_order_release);
}

std::shared_ptr<data_segment> segment_registry::find(const void* p, std::size_t bytes,
                                                     std::size_t* offset) const {
  const auto* q = static_cast<const std::byte*>(p);
  std::lock_guard lock(mutex_);
  for (const entry& e : segments_) {
    if (q < e.base || q > e.base + e.size || bytes > static_cast<std::size_t>(e.base + e.size - q))
      continue;
    auto seg = e.seg.lock();
    if (!seg) continue;  // gone: its range may since hold another mapping
    if (offset) *offset = static_cast<std::size_t>(q - e.base);
    return seg;
  }
  return nullptr;
}

std::shared_ptr<data_segment> segment_registry::find(std::uint64_t id) const {
  std::lock_guard lock(mutex_);
  for (const entry& e : segments_)
    if (e.id == id)
      if (auto seg = e.seg.lock()) return seg;
  return nullptr;
}

void partition_allocator::add_partition(std::shared_ptr<data_segment> seg, int rank) {
  const std::size_t begin = static_cast<std::size_t>(rank) * seg->partition_bytes;
  const std::size_t end = begin + seg->partition_bytes;
  add_range(std::move(seg), begin, end, rank);
}

void partition_allocator::add_range(std::shared_ptr<data_segment> seg, std::size_t begin,
                                    std::size_t end, int rank) {
  std::lock_guard lock(mutex_);
  partition part;
  part.begin = begin;
  part.end = end;
  const std::size_t colour = std::min(colour_of(rank), end - begin);
  if (colour < end - begin) part.free.emplace(begin + colour, end - begin - colour);
  part.seg = std::move(seg);
  partitions_.push_back(std::move(part));
}

namespace {
std::size_t allocation_size(std::size_t bytes) {
  return round_up(std::max<std::size_t>(bytes, 1), partition_allocator::alignment);
}
}  // namespace

std::optional<std::pair<std::shared_ptr<data_segment>, std::size_t>> partition_allocator::allocate(
    std::size_t bytes) {
  const std::size_t need = allocation_size(bytes);
  std::lock_guard lock(mutex_);
  for (auto& part : partitions_) {
    for (auto it = part.free.begin(); it != part.free.end(); ++it) {
      if (it->second < need) continue;
      const std::size_t offset = it->first;
      const std::size_t rest = it->second - need;
      part.free.erase(it);
      if (rest) part.free.emplace(offset + need, rest);
      in_use_ += need;
      return std::make_pair(part.seg, offset);
    }
  }
  return std::nullopt;
}

bool partition_allocator::fits(std::size_t bytes) const {
  const std::size_t need = allocation_size(bytes);
  std::lock_guard lock(mutex_);
  for (const auto& part : partitions_)
    for (const auto& [offset, length] : part.free)
      if (length >= need) return true;
  return false;
}

void partition_allocator::release(std::uint64_t segment, std::size_t offset,
                                  std::size_t bytes) noexcept {
  const std::size_t length = allocation_size(bytes);
  std::lock_guard lock(mutex_);
  for (auto& part : partitions_) {
    if (part.seg->id != segment || offset < part.begin || offset >= part.end) continue;
    // A range that overlaps free space is a double free (perhaps of a block that has since
    // been merged with its neighbours): ignore it rather than corrupt the free list.
    const auto after = part.free.lower_bound(offset);
    if (after != part.free.end() && after->first < offset + length) return;
    if (after != part.free.begin()) {
      const auto before = std::prev(after);
      if (before->first + before->second > offset) return;
    }
    const auto it = part.free.emplace_hint(after, offset, length);
    in_use_ -= length;
    if (auto next = std::next(it);
        next != part.free.end() && it->first + it->second == next->first) {
      it->second += next->second;
      part.free.erase(next);
    }
    if (it != part.free.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        part.free.erase(it);
      }
    }
    return;
  }
}

std::size_t partition_allocator::bytes_in_use() const {
  std::lock_guard lock(mutex_);
  return in_use_;
}

}  // namespace detail

arena_block::arena_block(std::shared_ptr<data_segment> seg,
                         std::weak_ptr<detail::partition_allocator> alloc, std::size_t offset,
                         std::size_t bytes) noexcept
    : seg_(std::move(seg)), alloc_(std::move(alloc)), offset_(offset), bytes_(bytes) {}

arena_block::~arena_block() {
  if (auto alloc = alloc_.lock()) alloc->release(seg_->id, offset_, bytes_);
}

bool in_arena(const void* p, std::size_t bytes) {
  return detail::segment_registry::instance().find(p, bytes, nullptr) != nullptr;
}

}  // namespace zcoll
