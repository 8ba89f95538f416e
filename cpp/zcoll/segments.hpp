/*
 * Node segments: the shared memory one node context has met, and how a call reaches it.
 *
 * A context creates data segments collectively (leader creates, announces the name in the
 * control header, every rank maps it and reserves its partition, barrier, leader unlinks), for
 * three uses: the arena that zcoll.empty allocates from (grown by doubling partitions up to
 * 64 MiB), a staging area for buffers that are not in the arena (one extra copy on each side
 * and one extra barrier: the documented cost of passing plain NumPy arrays), and the eager
 * slots of small calls. It also remembers segments created by other contexts of this process
 * (a dup or split of the allocating communicator), so their arrays are used in place: a buffer
 * is published as (segment id, offset), valid only when every rank of this context has mapped
 * that segment. A context of a node pool allocates from the pool's arena first (pool.hpp): no
 * segment of its own until its arrays outgrow that.
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "zcoll/arena.hpp"
#include "zcoll/heap.hpp"
#include "zcoll/protocol.hpp"

namespace zcoll {

class pool_arena;

class node_segments {
 public:
  // `protocol` must outlive this object; it carries the segment announcements.
  node_segments(call_protocol& protocol, int rank, int size, std::vector<std::int32_t> pids);

  // Collective: a new segment of one `partition_bytes` partition per node rank.
  std::shared_ptr<data_segment> create(std::size_t partition_bytes);
  // Collective: every node rank allocates `bytes` (may differ per rank) in the arena.
  std::shared_ptr<arena_block> allocate(std::size_t bytes);
  // Local, before any call: allocate from `arena` (this context's node pool's, every rank of the
  // context having it mapped) first.
  void use_pool_arena(std::shared_ptr<pool_arena> arena);
  // Collective: forgets `seg` (its arrays stay valid) and replaces it with a new segment of
  // `partition_bytes` per rank.
  void renew(std::shared_ptr<data_segment>& seg, std::size_t partition_bytes);
  // Collective: makes the staging area hold at least `bytes` per rank.
  void reserve_staging(std::size_t bytes);
  // Node rank `rank`'s staging partition (after reserve_staging).
  std::byte* staging(int rank) const noexcept { return staging_->partition(rank); }
  // Bytes of each rank's staging partition (0 before the first reserve_staging); the same on
  // every rank of the node.
  std::size_t staging_bytes() const noexcept { return staging_ ? staging_->partition_bytes : 0; }
  // Bytes of each third of a staging partition, whole cache lines: the reductions keep an input
  // copy and two work buffers there.
  std::size_t staging_third() const noexcept { return staging_bytes() / 3 / 64 * 64; }

  // Where [p, p + bytes) is, in terms every rank of this context can resolve: a segment all of
  // them have mapped, or this process's shared heap (heap.hpp) once publish_heap(true); else
  // segment 0 (private memory) with p's address in this process as the offset, for peers'
  // CMA reads (cma.hpp).
  buffer_ref locate(const void* p, std::size_t bytes);
  // Whether heap buffers are published for peers to map (the context's probe said they can).
  void publish_heap(bool yes) noexcept { publish_heap_ = yes; }
  // The address of a buffer a peer published; marks the protocol broken if it is unknown.
  std::byte* resolve(const buffer_ref& ref);
  // A view of `bytes` at `ref` (published by a peer); keeps the mapping alive.
  std::shared_ptr<arena_block> view(const buffer_ref& ref, std::size_t bytes);

  // This rank's bytes allocated in its own segments and, shared with the pool's other contexts,
  // in the pool's arena.
  std::size_t bytes_in_use() const;
  std::size_t count() const noexcept { return known_.size(); }
  // Forgets every segment; arrays built on them stay valid.
  void close() noexcept;

 private:
  struct known_segment {
    std::shared_ptr<data_segment> seg;
    bool shared_by_all;  // every rank of this context has it mapped (so peers can resolve it)
  };
  const known_segment& remember(std::shared_ptr<data_segment> seg);
  // locate() for buffers in shared memory ({0, 0} for the others).
  buffer_ref shared_ref(const void* p, std::size_t bytes);

  call_protocol& protocol_;
  int rank_;
  int size_;
  std::vector<std::int32_t> sorted_pids_;
  std::shared_ptr<detail::partition_allocator> allocator_;
  std::shared_ptr<pool_arena> pool_arena_;
  std::vector<known_segment> known_;                  // every segment this context has met
  std::vector<std::shared_ptr<data_segment>> owned_;  // segments this context created
  std::shared_ptr<data_segment> staging_;
  std::size_t next_partition_bytes_;
  bool publish_heap_ = false;
  heap::lookup_memo heap_memo_;  // this context's heap look-ups (calls on the same arrays)
  struct private_range {         // a buffer the registry had no segment for, after `additions` adds
    std::uintptr_t begin = 0;
    std::size_t bytes = 0;
    std::uint64_t additions = 0;
  };
  std::array<private_range, 4> private_{};
  std::size_t next_private_ = 0;
};

}  // namespace zcoll
