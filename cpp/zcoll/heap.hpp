/*
 * Shared heap: this process's private arrays allocated in memory its node peers can map, so
 * that an unmodified NumPy program's buffers move with one copy, as arena arrays do (TPDS'18
 * §2 overrides malloc for this; zcoll installs a NumPy memory handler, NEP 49: bind_heap.cpp).
 *
 * Memory. Each segment is a memfd (memfd_create): no name in /dev/shm, so nothing can leak
 * there, not even on kill -9, and no tmpfs size limit to hit later as a SIGBUS -- its pages
 * are allocated on first touch, by the owner (NUMA first touch) and charged like anonymous
 * memory; a mapping the kernel refuses (address space, RLIMIT_AS) is a null pointer, which
 * NumPy raises as MemoryError. Requests below small_bytes are not taken (the caller keeps them
 * with its default allocator: calls that small go through the eager slots anyway). Requests of
 * at least large_bytes get a segment of their own. Freed, a segment of at most
 * keep_segment_bytes goes to a cache for reuse while the cache holds at most keep_total_bytes
 * (NumPy's temporaries come and go at one size: a fresh segment's pages fault in again, and
 * shared-memory faults cost several times anonymous ones); any other is given back to the
 * system at once, its pages punched out first, so a peer's cached mapping keeps none alive.
 * That is glibc's malloc's rule too (memory from mmap above a threshold that grows to 32 MiB).
 * Requests of huge_bytes or more are not taken either: where the kernel gives shared memory
 * no transparent huge pages (shmem_enabled "never" or "deny"), first touching a 64 MiB heap
 * array cost 4.7x NumPy's default allocator (which asks for huge pages), 256 MiB 5.9x
 * (python -m zcoll.bench alloc --touch), while collectives on arrays that large gain little
 * from the heap over CMA; where it does give them (advise: large segments are advised), there
 * is no such limit.
 * Requests in between come from slabs of one power-of-two size class each (64 B aligned at
 * least; LIFO free lists), kept for reuse like malloc's arenas: a loop of allocations and frees
 * stays flat.
 *
 * Peers. A buffer in the heap is published as (owner pid, fd, generation, offset) packed into a
 * buffer_ref whose segment word has heap_tag set (arena segment ids never do). A peer maps the
 * segment by opening /proc/<pid>/fd/<fd> (a weaker permission than process_vm_readv's, which
 * the context's probe checked) and checks that the memfd's name carries the generation. Peers
 * cache one mapping per (pid, fd): a published generation that differs means the owner freed
 * that segment and its fd number was reused, so the old mapping is dropped and never read.
 * The cache is thus bounded by the peers' open descriptors, and never drops a live segment's
 * mapping (plans keep resolved addresses). A freed segment's pages are punched out by its
 * owner, so a peer's stale mapping holds address space, not memory.
 *
 * fork(). A child must not share its parent's arrays: the child's handler copies every heap
 * segment into private memory at the same address (mremap), drops its peers' mappings, and
 * allocates from its default allocator from then on; the parent's handler waits until that
 * copy is done, so the child sees the heap as it was at the fork. This costs a copy of the
 * heap per fork, which the parent waits for.
 *
 * Thread safety: one mutex guards the tables; allocation is a map lookup and a list pop.
 *
 * Calls. A loop of collectives on the same heap arrays would take that mutex for every buffer
 * it locates and every peer buffer it resolves (2P + 2 times per alltoall, a third of an 8 KiB
 * alltoall's time at P = 2). A lookup_memo keeps a context's last answers instead, valid while
 * the heap's epoch is unchanged: it advances whenever a mapping an answer may point into goes
 * away (a segment of this process destroyed or kept for reuse, a peer's mapping dropped, a
 * fork), so a memo never hands out an address that is no longer mapped, nor a name a peer
 * could no longer resolve.
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "zcoll/arena.hpp"

namespace zcoll::heap {

// The segment word of a heap buffer_ref has this bit set.
inline constexpr std::uint64_t heap_tag = std::uint64_t{1} << 63;

// Sizes the heap takes: [small_bytes, ...); own segments from large_bytes.
struct limits {
  std::size_t small_bytes = 1024;
  std::size_t large_bytes = std::size_t{1} << 20;
  std::size_t keep_segment_bytes = std::size_t{32} << 20;
  std::size_t keep_total_bytes = std::size_t{64} << 20;
  std::size_t huge_bytes = SIZE_MAX;  // default: 32 MiB unless shared memory gets huge pages
};
void set_limits(const limits& l) noexcept;
limits current_limits() noexcept;

// A block of at least `bytes` in the heap (zero-filled if `zeroed`), or nullptr: below
// small_bytes, in a fork child, or when the kernel refuses a segment (no memory, no
// descriptor): the caller then uses its default allocator, which raises MemoryError if it
// cannot allocate either.
void* allocate(std::size_t bytes, bool zeroed) noexcept;
// Whether `p` lies in a live block's segment (a slab's, or a one-block segment not freed).
bool owns(const void* p) noexcept;
// Gives back `p` if it is a block allocate() returned; false (nothing done) otherwise.
bool release(void* p) noexcept;
// Bytes usable at `p`, a block allocate() returned; 0 when owns(p) is false.
std::size_t usable_bytes(const void* p) noexcept;

// How peers name [p, p + bytes) ({0, 0} when it is not in the heap or cannot be published).
buffer_ref locate(const void* p, std::size_t bytes) noexcept;
// The address in this process of a heap buffer_ref published by a peer (mapping its segment
// if needed), or nullptr when it cannot be mapped (the segment is gone or not the one named).
std::byte* resolve(const buffer_ref& ref, std::size_t bytes) noexcept;

// One of this process's segments as peers name it (word 0: none, or not publishable).
struct segment_name {
  std::uint64_t word = 0;
  const std::byte* base = nullptr;
  std::size_t bytes = 0;
};

// Advances whenever a mapping that a locate() or resolve() answer may name goes away.
std::uint64_t epoch() noexcept;

// The last answers of locate() and resolve() for one caller (a node context: one thread at a
// time), so that repeated calls on the same buffers take no lock; a few entries each, replaced
// in turn, all dropped when the epoch moves.
class lookup_memo {
 public:
  buffer_ref locate(const void* p, std::size_t bytes) noexcept;
  std::byte* resolve(const buffer_ref& ref, std::size_t bytes) noexcept;

 private:
  struct resolved {  // a published name and where its segment is mapped here
    std::uint64_t word = 0;
    std::byte* base = nullptr;
    std::size_t bytes = 0;
  };
  static constexpr std::size_t entries = 8;
  void refresh() noexcept;

  std::uint64_t epoch_ = 0;
  std::array<segment_name, entries> located_{};  // this process's segments
  std::array<resolved, entries> resolved_{};
  std::size_t next_located_ = 0;
  std::size_t next_resolved_ = 0;
};

// The kernel's transparent-huge-page mode for shared memory (the bracketed word of
// /sys/kernel/mm/transparent_hugepage/shmem_enabled; "" if unknown).
std::string shmem_huge_pages();

struct stats {
  std::size_t segments = 0;       // memfd segments this process owns
  std::size_t segment_bytes = 0;  // their bytes
  std::size_t blocks = 0;         // blocks handed out and not freed
  std::size_t kept_bytes = 0;     // freed segments kept for reuse (part of segment_bytes)
  std::size_t attached = 0;       // peers' segments mapped
  bool forked_child = false;      // this process is a fork child (heap disabled)
};
stats current_stats() noexcept;

}  // namespace zcoll::heap
