#include "zcoll/heap.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zcoll::heap {

namespace {

constexpr std::size_t min_slab_bytes = std::size_t{4} << 20;
constexpr int class_count = 64;
constexpr std::uint64_t max_pid = (std::uint64_t{1} << 22) - 1;  // Linux's pid_max limit
constexpr std::uint64_t max_fd = 0xffff;
constexpr std::uint64_t generation_mask = 0xffffff;
constexpr const char* name_prefix = "zcoll-heap-";
constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

struct segment {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  int fd = -1;  // -1: privatized in a fork child
  std::uint32_t generation = 0;
  int size_class = -1;     // -1: one block (a large request); else log2 of the block size
  std::size_t carved = 0;  // slab: bytes handed out from the start so far
  bool kept = false;       // one block, freed and kept for reuse
};

struct attachment {
  std::uint32_t generation = 0;
  std::byte* base = nullptr;
  std::size_t bytes = 0;
};

limits default_limits() {
  limits l;
  const std::string mode = shmem_huge_pages();
  if (mode == "never" || mode == "deny" || mode.empty()) l.huge_bytes = std::size_t{32} << 20;
  return l;
}

struct heap_state {
  std::mutex mutex;
  limits lim = default_limits();
  std::map<std::uintptr_t, segment> segments;                     // by base address
  std::map<int, std::uintptr_t> by_fd;                            // segments' bases by descriptor
  std::vector<std::vector<std::byte*>> free_blocks{class_count};  // per size class
  std::vector<segment*> carving = std::vector<segment*>(class_count, nullptr);  // slabs in use
  std::map<std::uint64_t, attachment> attached;     // peers' segments, by pid << 16 | fd
  std::multimap<std::size_t, std::uintptr_t> kept;  // freed one-block segments: bytes -> base
  std::size_t kept_bytes = 0;
  std::atomic<std::size_t> small_bytes{limits{}.small_bytes};  // read before locking
  // Every segment lies in [low, high): a pointer outside is not the heap's, known without
  // locking (NumPy frees every array through the handler, the smallest too).
  std::atomic<std::uintptr_t> low{UINTPTR_MAX}, high{0};
  std::size_t blocks = 0;
  std::atomic<std::uint64_t> epoch{1};  // lookup_memo's: see heap.hpp
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

// A mapping a memo may name is going away (under the lock).
void mappings_changed(heap_state& s) noexcept {
  s.epoch.fetch_add(1, std::memory_order_release);
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
  if (bytes >= huge_page_bytes) ::madvise(p, bytes, MADV_HUGEPAGE);  // where shmem_enabled=advise
  segment seg{static_cast<std::byte*>(p), bytes, fd, generation, size_class, 0};
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  s.by_fd[fd] = base;
  if (base < s.low.load(std::memory_order_relaxed)) s.low.store(base, std::memory_order_relaxed);
  if (base + bytes > s.high.load(std::memory_order_relaxed))
    s.high.store(base + bytes, std::memory_order_relaxed);
  return &s.segments.emplace(reinterpret_cast<std::uintptr_t>(p), seg).first->second;
}

void destroy_segment(heap_state& s, segment& seg) {
  mappings_changed(s);
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

// fork(): the child must copy the heap as it was when fork() returned, so the parent waits
// (in its handler, before it can write any array) until the child says its copy is done --
// or has died: the parent's end of the pipe then reads end-of-file.
int fork_pipe[2] = {-1, -1};

void lock_for_fork() {
  state().mutex.lock();
  if (::pipe2(fork_pipe, O_CLOEXEC) != 0) fork_pipe[0] = fork_pipe[1] = -1;
}

void unlock_in_parent() {
  if (fork_pipe[0] >= 0) {
    ::close(fork_pipe[1]);
    char done = 0;
    while (::read(fork_pipe[0], &done, 1) < 0 && errno == EINTR) {
    }
    ::close(fork_pipe[0]);
  }
  state().mutex.unlock();
}

void privatize_in_child() {
  heap_state& s = state();
  mappings_changed(s);
  for (auto& [base, seg] : s.segments) privatize(seg);
  for (auto& [key, a] : s.attached) ::munmap(a.base, a.bytes);
  s.attached.clear();
  for (auto& blocks : s.free_blocks) blocks.clear();
  s.by_fd.clear();
  s.kept.clear();  // their segments stay mapped (private now), unused
  s.kept_bytes = 0;
  s.forked_child = true;
  s.pid = static_cast<std::uint64_t>(::getpid());
  if (fork_pipe[0] >= 0) {
    ::close(fork_pipe[0]);
    while (::write(fork_pipe[1], "x", 1) < 0 && errno == EINTR) {
    }
    ::close(fork_pipe[1]);
  }
  s.mutex.unlock();
}

int class_of(std::size_t bytes) {
  return static_cast<int>(std::bit_width(std::bit_ceil(std::max<std::size_t>(bytes, 64)))) - 1;
}

std::byte* slab_block(heap_state& s, int k) {
  auto& reuse = s.free_blocks[static_cast<std::size_t>(k)];
  if (!reuse.empty()) {
    std::byte* p = reuse.back();
    reuse.pop_back();
    return p;
  }
  const std::size_t block = std::size_t{1} << k;
  segment*& slab = s.carving[static_cast<std::size_t>(k)];  // slabs are never unmapped
  if (!slab || slab->carved + block > slab->bytes) {
    segment* fresh = create_segment(s, std::max(min_slab_bytes, 8 * block), k);
    if (!fresh) return nullptr;
    slab = fresh;
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

// A kept segment of at least `bytes` and at most twice that, or nullptr.
segment* reuse_kept(heap_state& s, std::size_t bytes) {
  const auto it = s.kept.lower_bound(bytes);
  if (it == s.kept.end() || it->first > 2 * bytes) return nullptr;
  segment& seg = s.segments.at(it->second);
  s.kept.erase(it);
  s.kept_bytes -= seg.bytes;
  seg.kept = false;
  return &seg;
}

// Frees a one-block segment: kept for reuse when it and the cache are small enough.
void release_segment(heap_state& s, segment& seg) {
  if (!s.forked_child && seg.bytes <= s.lim.keep_segment_bytes &&
      s.kept_bytes + seg.bytes <= s.lim.keep_total_bytes) {
    seg.kept = true;
    mappings_changed(s);  // no longer published
    s.kept.emplace(seg.bytes, reinterpret_cast<std::uintptr_t>(seg.base));
    s.kept_bytes += seg.bytes;
    return;
  }
  destroy_segment(s, seg);
}

void drop_kept(heap_state& s) {
  while (!s.kept.empty()) {
    segment& seg = s.segments.at(s.kept.begin()->second);
    s.kept.erase(s.kept.begin());
    destroy_segment(s, seg);
  }
  s.kept_bytes = 0;
}

}  // namespace

std::string shmem_huge_pages() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string word;
  while (in >> word)
    if (word.size() > 2 && word.front() == '[' && word.back() == ']')
      return word.substr(1, word.size() - 2);
  return "";
}

void set_limits(const limits& l) noexcept {
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  s.lim = l;
  s.small_bytes.store(l.small_bytes, std::memory_order_relaxed);
  drop_kept(s);
}

limits current_limits() noexcept {
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  return s.lim;
}

void* allocate(std::size_t bytes, bool zeroed) noexcept {
  heap_state& s = state();
  if (bytes < s.small_bytes.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard lock(s.mutex);
  if (bytes < s.lim.small_bytes || bytes >= s.lim.huge_bytes || s.forked_child) return nullptr;
  if (!s.fork_handler) {
    s.fork_handler = ::pthread_atfork(lock_for_fork, unlock_in_parent, privatize_in_child) == 0;
    if (!s.fork_handler) return nullptr;  // without it a fork child would share our arrays
  }
  if (bytes >= s.lim.large_bytes) {
    const std::size_t size = round_up(bytes, page_size());
    if (segment* seg = reuse_kept(s, size)) {
      ++s.blocks;
      if (zeroed) std::memset(seg->base, 0, seg->bytes);
      return seg->base;
    }
    segment* seg = create_segment(s, size, -1);
    if (!seg) return nullptr;
    ++s.blocks;
    return seg->base;  // a fresh memfd reads as zeros
  }
  const int k = class_of(bytes);
  std::byte* p = slab_block(s, k);
  if (!p) return nullptr;
  ++s.blocks;
  if (zeroed) std::memset(p, 0, std::size_t{1} << k);
  return p;
}

namespace {

// Whether `p` may lie in a segment (false: certainly not), without locking.
bool in_range(const heap_state& s, const void* p) noexcept {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  return at >= s.low.load(std::memory_order_relaxed) && at < s.high.load(std::memory_order_relaxed);
}

}  // namespace

bool owns(const void* p) noexcept {
  heap_state& s = state();
  if (!p || !in_range(s, p)) return false;
  std::lock_guard lock(s.mutex);
  const segment* seg = segment_at(s, p);
  return seg && !seg->kept;
}

bool release(void* p) noexcept {
  heap_state& s = state();
  if (!p || !in_range(s, p)) return false;
  std::lock_guard lock(s.mutex);
  segment* seg = segment_at(s, p);
  if (!seg || seg->kept) return false;
  --s.blocks;
  if (seg->size_class < 0)
    release_segment(s, *seg);
  else if (!s.forked_child)
    s.free_blocks[static_cast<std::size_t>(seg->size_class)].push_back(static_cast<std::byte*>(p));
  return true;
}

std::size_t usable_bytes(const void* p) noexcept {
  heap_state& s = state();
  if (!p || !in_range(s, p)) return 0;
  std::lock_guard lock(s.mutex);
  const segment* seg = segment_at(s, p);
  if (!seg || seg->kept) return 0;
  return seg->size_class < 0 ? seg->bytes : std::size_t{1} << seg->size_class;
}

namespace {

segment_name name_of(heap_state& s, const void* p) {  // under the lock
  const segment* seg = segment_at(s, p);
  if (!seg || seg->kept || seg->fd < 0 || static_cast<std::uint64_t>(seg->fd) > max_fd ||
      s.pid > max_pid)
    return {};
  const std::uint64_t word = heap_tag | s.pid << 40 | static_cast<std::uint64_t>(seg->fd) << 24 |
                             (seg->generation & generation_mask);
  return {word, seg->base, seg->bytes};
}

// [p, p + bytes) in `named` as peers name it ({0, 0} when it does not lie inside).
buffer_ref ref_in(const segment_name& named, const void* p, std::size_t bytes) noexcept {
  if (!named.word) return {};
  const auto offset = static_cast<std::size_t>(static_cast<const std::byte*>(p) - named.base);
  if (bytes > named.bytes - offset) return {};
  return {named.word, offset};
}

// Where the segment named `word` is mapped here (mapping a peer's if needed): {nullptr, 0} when
// it cannot be (gone, or not the one named). Under the lock.
std::pair<std::byte*, std::size_t> mapping_of(heap_state& s, std::uint64_t word) {
  const std::uint64_t pid = (word >> 40) & max_pid;
  const std::uint64_t fd = (word >> 24) & max_fd;
  const auto generation = static_cast<std::uint32_t>(word & generation_mask);
  if (pid == s.pid) {  // this process's own buffer
    const auto base = s.by_fd.find(static_cast<int>(fd));
    if (base == s.by_fd.end()) return {nullptr, 0};
    const segment& seg = s.segments.at(base->second);
    if ((seg.generation & generation_mask) != generation) return {nullptr, 0};
    return {seg.base, seg.bytes};
  }
  const std::uint64_t key = pid << 16 | fd;
  auto it = s.attached.find(key);
  if (it != s.attached.end() && it->second.generation != generation) {
    mappings_changed(s);
    ::munmap(it->second.base, it->second.bytes);  // that segment was freed: never read it
    s.attached.erase(it);
    it = s.attached.end();
  }
  if (it == s.attached.end()) {
    auto made = attach(pid, fd, generation);
    if (!made) return {nullptr, 0};
    it = s.attached.emplace(key, *made).first;
  }
  return {it->second.base, it->second.bytes};
}

// The address of [offset, offset + bytes) in a mapping of `size` bytes at `base`, or nullptr.
std::byte* address_in(std::byte* base, std::size_t size, std::uint64_t offset,
                      std::size_t bytes) noexcept {
  if (!base || offset > size || bytes > size - offset) return nullptr;
  return base + offset;
}

}  // namespace

buffer_ref locate(const void* p, std::size_t bytes) noexcept {
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  return ref_in(name_of(s, p), p, bytes);
}

std::byte* resolve(const buffer_ref& ref, std::size_t bytes) noexcept {
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  const auto [base, size] = mapping_of(s, ref.segment);
  return address_in(base, size, ref.offset, bytes);
}

std::uint64_t epoch() noexcept {
  return state().epoch.load(std::memory_order_acquire);
}

void lookup_memo::refresh() noexcept {
  const std::uint64_t now = epoch();
  if (now == epoch_) return;
  epoch_ = now;
  located_ = {};
  resolved_ = {};
}

buffer_ref lookup_memo::locate(const void* p, std::size_t bytes) noexcept {
  heap_state& s = state();
  if (!p || !in_range(s, p)) return {};
  refresh();  // before the look-up: a mapping gone after it moves the epoch again
  const auto* q = static_cast<const std::byte*>(p);
  for (const segment_name& e : located_)
    if (e.word && q >= e.base && q < e.base + e.bytes) return ref_in(e, p, bytes);
  segment_name named;
  {
    std::lock_guard lock(s.mutex);
    named = name_of(s, p);
  }
  if (!named.word) return {};
  located_[next_located_++ % entries] = named;
  return ref_in(named, p, bytes);
}

std::byte* lookup_memo::resolve(const buffer_ref& ref, std::size_t bytes) noexcept {
  refresh();
  for (const resolved& e : resolved_)
    if (e.base && e.word == ref.segment) return address_in(e.base, e.bytes, ref.offset, bytes);
  heap_state& s = state();
  std::pair<std::byte*, std::size_t> mapping;
  {
    std::lock_guard lock(s.mutex);
    mapping = mapping_of(s, ref.segment);
  }
  if (!mapping.first) return nullptr;
  resolved_[next_resolved_++ % entries] = {ref.segment, mapping.first, mapping.second};
  return address_in(mapping.first, mapping.second, ref.offset, bytes);
}

stats current_stats() noexcept {
  heap_state& s = state();
  std::lock_guard lock(s.mutex);
  stats out;
  out.segments = s.segments.size();
  for (const auto& [base, seg] : s.segments) out.segment_bytes += seg.bytes;
  out.blocks = s.blocks;
  out.kept_bytes = s.kept_bytes;
  out.attached = s.attached.size();
  out.forked_child = s.forked_child;
  return out;
}

}  // namespace zcoll::heap
