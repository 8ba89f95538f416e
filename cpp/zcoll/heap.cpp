#include "zcoll/heap.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace zcoll::heap {

namespace {

constexpr std::size_t min_slab_bytes = std::size_t{4} << 20;
constexpr int class_count = 64;
constexpr std::uint64_t max_pid = (std::uint64_t{1} << 22) - 1;  // Linux's pid_max limit
constexpr std::uint64_t max_fd = 0xffff;
constexpr std::uint64_t generation_mask = 0xffffff;
constexpr const char* name_prefix = "zcoll-heap-";

struct segment {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  int fd = -1;  // -1: privatized in a fork child
  std::uint32_t generation = 0;
  int size_class = -1;     // -1: one block (a large request); else log2 of the block size
  std::size_t carved = 0;  // slab: bytes handed out from the start so far
};

struct attachment {
  std::uint32_t generation = 0;
  std::byte* base = nullptr;
  std::size_t bytes = 0;
};

struct heap_state {
  std::mutex mutex;
  limits lim;
  std::map<std::uintptr_t, segment> segments;                     // by base address
  std::map<int, std::uintptr_t> by_fd;                            // segments' bases by descriptor
  std::vector<std::vector<std::byte*>> free_blocks{class_count};  // per size class
  std::vector<std::uintptr_t> carving = std::vector<std::uintptr_t>(class_count, 0);
  std::map<std::uint64_t, attachment> attached;  // peers' segments, by pid << 16 | fd
  std::size_t blocks = 0;
  std::uint32_t generation = 0;
  std::uint64_t pid = static_cast<std::uint64_t>(::getpid());
  bool forked_child = false;
  bool fork_handler = false;
};

// Never destroyed: arrays may be freed while the interpreter shuts down, after static
// destructors would have run.
heap_state& state() {
  static heap_state* s = new heap_state();
  return *s;
}

segment* segment_at(heap_state& s, const void* p) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  auto it = s.segments.upper_bound(at);
  if (it == s.segments.begin()) return nullptr;
  --it;
  segment& seg = it->second;
  return at < it->first + seg.bytes ? &seg : nullptr;
}

segment* create_segment(heap_state& s, std::size_t bytes, int size_class) {
  const std::uint32_t generation = ++s.generation;
  const std::string name = name_prefix + std::to_string(generation);
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return nullptr;
  }
  segment seg{static_cast<std::byte*>(p), bytes, fd, generation, size_class, 0};
  s.by_fd[fd] = reinterpret_cast<std::uintptr_t>(p);
  return &s.segments.emplace(reinterpret_cast<std::uintptr_t>(p), seg).first->second;
}

void destroy_segment(heap_state& s, segment& seg) {
  if (seg.fd >= 0) {
    // Peers may still map it: the pages go now, whoever holds a mapping.
    ::fallocate(seg.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                static_cast<off_t>(seg.bytes));
    ::close(seg.fd);
    s.by_fd.erase(seg.fd);
  }
  ::munmap(seg.base, seg.bytes);
  s.segments.erase(reinterpret_cast<std::uintptr_t>(seg.base));
}

// Replaces `seg`'s shared mapping with a private copy at the same address (fork child).
void privatize(segment& seg) {
  const std::size_t used = seg.size_class < 0 ? seg.bytes : seg.carved;
  void* copy =
      ::mmap(nullptr, seg.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (copy == MAP_FAILED) std::abort();  // the child cannot keep NumPy's semantics
  std::memcpy(copy, seg.base, used);
  if (::mremap(copy, seg.bytes, seg.bytes, MREMAP_MAYMOVE | MREMAP_FIXED, seg.base) == MAP_FAILED)
    std::abort();
  ::close(seg.fd);
  seg.fd = -1;
}

void lock_for_fork() {
  state().mutex.lock();
}

void unlock_in_parent() {
  state().mutex.unlock();
}

void privatize_in_child() {
  heap_state& s = state();
  for (auto& [base, seg] : s.segments) privatize(seg);
  for (auto& [key, a] : s.attached) ::munmap(a.base, a.bytes);
  s.attached.clear();
  for (auto& blocks : s.free_blocks) blocks.clear();
  s.by_fd.clear();
  s.forked_child = true;
  s.pid = static_cast<std::uint64_t>(::getpid());
  s.mutex.unlock();
}

int class_of(std::size_t bytes) {
  return std::bit_width(std::bit_ceil(std::max<std::size_t>(bytes, 64))) - 1;
}

std::byte* slab_block(heap_state& s, int k) {
  auto& reuse = s.free_blocks[static_cast<std::size_t>(k)];
  if (!reuse.empty()) {
    std::byte* p = reuse.back();
    reuse.pop_back();
    return p;
  }
  const std::size_t block = std::size_t{1} << k;
  segment* slab =
      s.carving[static_cast<std::size_t>(k)]
          ? segment_at(s, reinterpret_cast<void*>(s.carving[static_cast<std::size_t>(k)]))
          : nullptr;
  if (!slab || slab->carved + block > slab->bytes) {
    slab = create_segment(s, std::max(min_slab_bytes, 8 * block), k);
    if (!slab) return nullptr;
    s.carving[static_cast<std::size_t>(k)] = reinterpret_cast<std::uintptr_t>(slab->base);
  }
  std::byte* p = slab->base + slab->carved;
  slab->carved += block;
  return p;
}

// Maps peer `pid`'s segment behind its descriptor `fd` if it is generation `generation`.
std::optional<attachment> attach(std::uint64_t pid, std::uint64_t fd, std::uint32_t generation) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int mine = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (mine < 0) return std::nullopt;
  // The name of what was opened (not of what the path named a moment before).
  char target[128] = {};
  const std::string self = "/proc/self/fd/" + std::to_string(mine);
  const ssize_t n = ::readlink(self.c_str(), target, sizeof target - 1);
  const std::string text(target, n > 0 ? static_cast<std::size_t>(n) : 0);
  const std::string expected = std::string("/memfd:") + name_prefix;
  struct stat st{};
  bool ok = text.rfind(expected, 0) == 0 && ::fstat(mine, &st) == 0 && st.st_size > 0;
  if (ok) {
    const unsigned long named = std::strtoul(text.c_str() + expected.size(), nullptr, 10);
    ok = (named & generation_mask) == generation;
  }
  void* p = MAP_FAILED;
  if (ok)
    p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED,
               mine, 0);
  ::close(mine);
  if (p == MAP_FAILED) return std::nullopt;
  return attachment{generation, static_cast<std::byte*>(p), static_cast<std::size_t>(st.st_size)};
}

}  // namespace

void set_limits(const limits& l) noexcept {
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  s.lim = l;
}

limits current_limits() noexcept {
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  return s.lim;
}

void* allocate(std::size_t bytes, bool zeroed) noexcept {
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  if (bytes < s.lim.small_bytes || s.forked_child) return nullptr;
  if (!s.fork_handler) {
    s.fork_handler = ::pthread_atfork(lock_for_fork, unlock_in_parent, privatize_in_child) == 0;
    if (!s.fork_handler) return nullptr;  // without it a fork child would share our arrays
  }
  if (bytes >= s.lim.large_bytes) {
    segment* seg = create_segment(s, round_up(bytes, page_size()), -1);
    if (!seg) return nullptr;
    ++s.blocks;
    return seg->base;  // a fresh memfd reads as zeros
  }
  std::byte* p = slab_block(s, class_of(bytes));
  if (!p) return nullptr;
  ++s.blocks;
  if (zeroed) std::memset(p, 0, std::size_t{1} << class_of(bytes));
  return p;
}

bool owns(const void* p) noexcept {
  if (!p) return false;
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  return segment_at(s, p) != nullptr;
}

void release(void* p) noexcept {
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  segment* seg = segment_at(s, p);
  if (!seg) return;
  --s.blocks;
  if (seg->size_class < 0)
    destroy_segment(s, *seg);
  else if (!s.forked_child)
    s.free_blocks[static_cast<std::size_t>(seg->size_class)].push_back(static_cast<std::byte*>(p));
}

std::size_t usable_bytes(const void* p) noexcept {
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  const segment* seg = segment_at(s, p);
  if (!seg) return 0;
  return seg->size_class < 0 ? seg->bytes : std::size_t{1} << seg->size_class;
}

buffer_ref locate(const void* p, std::size_t bytes) noexcept {
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  const segment* seg = segment_at(s, p);
  if (!seg || seg->fd < 0 || static_cast<std::uint64_t>(seg->fd) > max_fd || s.pid > max_pid)
    return {};
  const auto offset = static_cast<std::size_t>(static_cast<const std::byte*>(p) - seg->base);
  if (bytes > seg->bytes - offset) return {};
  const std::uint64_t word = heap_tag | s.pid << 40 | static_cast<std::uint64_t>(seg->fd) << 24 |
                             (seg->generation & generation_mask);
  return {word, offset};
}

std::byte* resolve(const buffer_ref& ref, std::size_t bytes) noexcept {
  const std::uint64_t pid = (ref.segment >> 40) & max_pid;
  const std::uint64_t fd = (ref.segment >> 24) & max_fd;
  const auto generation = static_cast<std::uint32_t>(ref.segment & generation_mask);
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  if (pid == s.pid) {  // this process's own buffer
    const auto base = s.by_fd.find(static_cast<int>(fd));
    if (base == s.by_fd.end()) return nullptr;
    const segment& seg = s.segments.at(base->second);
    if ((seg.generation & generation_mask) != generation) return nullptr;
    return seg.base + ref.offset;
  }
  const std::uint64_t key = pid << 16 | fd;
  auto it = s.attached.find(key);
  if (it != s.attached.end() && it->second.generation != generation) {
    ::munmap(it->second.base, it->second.bytes);  // that segment was freed: never read it
    s.attached.erase(it);
    it = s.attached.end();
  }
  if (it == s.attached.end()) {
    auto made = attach(pid, fd, generation);
    if (!made) return nullptr;
    it = s.attached.emplace(key, *made).first;
  }
  if (ref.offset > it->second.bytes || bytes > it->second.bytes - ref.offset) return nullptr;
  return it->second.base + ref.offset;
}

stats current_stats() noexcept {
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  stats out;
  out.segments = s.segments.size();
  for (const auto& [base, seg] : s.segments) out.segment_bytes += seg.bytes;
  out.blocks = s.blocks;
  out.attached = s.attached.size();
  out.forked_child = s.forked_child;
  return out;
}

}  // namespace zcoll::heap
