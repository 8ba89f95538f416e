/*
 * Shared arena: POSIX shared-memory segments that every rank of a node maps.
 *
 * A segment is created by the node leader under a unique name (uid, pid, counter, random
 * part), every rank maps it and reserves (posix_fallocate) its own partition -- so a full
 * /dev/shm is an error now rather than a SIGBUS later, and pages land on the owner's NUMA node
 * -- and the leader unlinks the name as soon as everybody has it mapped. From then on nothing
 * can leak, not even on kill -9: the memory goes away with the last mapping.
 *
 * A data segment is cut into one page-aligned partition per rank. Each rank allocates only from
 * its own partitions (first fit, coalescing free list), so allocation needs no communication
 * unless a partition is full and the node must add a segment (a collective step done by
 * node_context). Peers refer to buffers by (segment id, offset); the process-wide registry turns
 * that back into an address, and tells whether a pointer lies in the arena at all.
 */
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace zcoll {

// A POSIX shared-memory object mapped read-write into this process.
class shm_segment {
 public:
  // Creates a new object of `bytes` (zero-filled) under a fresh unique name. Leader only.
  static std::shared_ptr<shm_segment> create(std::size_t bytes);
  // Maps an existing object created by `create` on another rank.
  static std::shared_ptr<shm_segment> attach(const std::string& name, std::size_t bytes);
  // A part [data, data + bytes) of a mapping that `keep` holds alive (a node pool's block,
  // pool.hpp): it unmaps and unlinks nothing itself, and cannot reserve.
  static std::shared_ptr<shm_segment> part(std::shared_ptr<void> keep, std::byte* data,
                                           std::size_t bytes);

  ~shm_segment();
  shm_segment(const shm_segment&) = delete;
  shm_segment& operator=(const shm_segment&) = delete;

  // Backs [offset, offset + bytes) with memory now; throws std::system_error (ENOSPC) if full,
  // std::out_of_range if the range passes the end of the segment.
  void reserve(std::size_t offset, std::size_t bytes);
  // Removes the name; the mapping stays valid. Idempotent.
  void unlink() noexcept;

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  const std::string& name() const noexcept { return name_; }

 private:
  shm_segment(std::string name, int fd, std::size_t bytes, bool owner);
  std::string name_;
  int fd_ = -1;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  bool linked_ = false;
  std::shared_ptr<void> keep_;  // a part's owner (null for a whole mapping)
};

// A node-unique segment id: this process's pid << 32 | a counter.
std::uint64_t next_segment_id() noexcept;

// Prefix of every segment name zcoll creates (so leak checks can grep /dev/shm for it).
inline constexpr const char* segment_prefix = "zcoll";
std::size_t page_size() noexcept;
constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept {
  return (n + to - 1) / to * to;
}

// A segment holding one partition per node rank, plus who mapped it.
struct data_segment {
  std::shared_ptr<shm_segment> shm;
  std::uint64_t id = 0;                   // node-unique: creator pid << 32 | counter
  std::size_t partition_bytes = 0;        // page-aligned
  std::vector<std::int32_t> member_pids;  // sorted pids of every rank that mapped it
  std::atomic<bool> owner_alive{true};    // false once the allocating context is closed
  // A node pool's arena (pool.hpp): mapped while the pool lives, which only the pool's own
  // contexts can count on, so no other context shares buffers in it.
  bool pool_only = false;

  std::byte* partition(int rank) const noexcept {
    return shm->data() + static_cast<std::size_t>(rank) * partition_bytes;
  }
  // True when every process in `pids` (sorted) has this segment mapped.
  bool mapped_by_all(const std::vector<std::int32_t>& sorted_pids) const;
};

// Where an arena buffer is, in terms every rank of the node can resolve.
struct buffer_ref {
  std::uint64_t segment = 0;  // 0: not in the arena (private memory)
  std::uint64_t offset = 0;
};

namespace detail {

// Process-wide table of mapped data segments.
class segment_registry {
 public:
  static segment_registry& instance();
  void add(const std::shared_ptr<data_segment>& seg);
  // The live segment containing [p, p + bytes), with the offset of p in it.
  std::shared_ptr<data_segment> find(const void* p, std::size_t bytes, std::size_t* offset) const;
  std::shared_ptr<data_segment> find(std::uint64_t id) const;
  // How many segments were ever added: a find() that found nothing stays true while it holds.
  std::uint64_t additions() const noexcept { return additions_.load(std::memory_order_acquire); }

 private:
  // A segment's range and id are kept beside it, so a look-up compares them without taking a
  // reference to every segment (a private buffer, looked up at every call, matches none).
  struct entry {
    std::weak_ptr<data_segment> seg;
    const std::byte* base;
    std::size_t size;
    std::uint64_t id;
  };
  mutable std::mutex mutex_;
  mutable std::vector<entry> segments_;
  std::atomic<std::uint64_t> additions_{0};
};

// First-fit free list over this rank's partitions. Thread-safe (arrays may die in any thread).
//
// Colouring: rank r's free space starts colour_of(r) bytes into its page-aligned partition (the
// first pages still belong to r, so first touch stays local). Without it every rank's first
// array starts on a page boundary, all ranks' buffers map to the same L1 sets, and a schedule
// segment that reads 8+ ranks' blocks at one offset thrashes an 8-way L1 (seen in the
// cachegrind replay: allgather, P=64, 512 B blocks, Morton 0.63x row's misses; 0.57x coloured).
// A stride of 9 lines walks all 64 line offsets of a 4 KiB page before repeating.
class partition_allocator {
 public:
  static constexpr std::size_t alignment = 64;
  static constexpr std::size_t colour_stride = 9 * alignment;
  static constexpr std::size_t colour_span = 4096;  // a partition spends at most this on colour
  static constexpr std::size_t colour_of(int rank) noexcept {
    return static_cast<std::size_t>(rank) * colour_stride % colour_span;
  }

  void add_partition(std::shared_ptr<data_segment> seg, int rank);
  // Adds [begin, end) of `seg`, part of node rank `rank`'s partition, as free space.
  void add_range(std::shared_ptr<data_segment> seg, std::size_t begin, std::size_t end, int rank);
  // Returns the segment and offset of a free range of `bytes` (rounded to `alignment`).
  std::optional<std::pair<std::shared_ptr<data_segment>, std::size_t>> allocate(std::size_t bytes);
  void release(std::uint64_t segment, std::size_t offset, std::size_t bytes) noexcept;
  bool fits(std::size_t bytes) const;
  std::size_t bytes_in_use() const;

 private:
  struct partition {
    std::shared_ptr<data_segment> seg;
    std::size_t begin = 0, end = 0;           // byte range of this rank's partition in seg
    std::map<std::size_t, std::size_t> free;  // offset -> length, coalesced
  };
  mutable std::mutex mutex_;
  std::vector<partition> partitions_;
  std::size_t in_use_ = 0;
};

}  // namespace detail

// Owns one allocation; returns it to the allocator when destroyed (unless `alloc` is empty: a
// view of a peer's allocation). Keeps the mapping alive, so a NumPy array built on it stays
// valid even after its communicator is freed.
class arena_block {
 public:
  arena_block(std::shared_ptr<data_segment> seg, std::weak_ptr<detail::partition_allocator> alloc,
              std::size_t offset, std::size_t bytes) noexcept;
  ~arena_block();
  arena_block(const arena_block&) = delete;
  arena_block& operator=(const arena_block&) = delete;

  std::byte* data() const noexcept { return seg_->shm->data() + offset_; }
  std::size_t size() const noexcept { return bytes_; }

 private:
  std::shared_ptr<data_segment> seg_;
  std::weak_ptr<detail::partition_allocator> alloc_;
  std::size_t offset_;
  std::size_t bytes_;
};

// Is [p, p + bytes) inside a mapped arena segment?
bool in_arena(const void* p, std::size_t bytes);

}  // namespace zcoll
