/*
 * Node pool: one shared segment of control blocks for every context of a node that one full
 * creation made, and the communicators derived from it (a Dup, Split, Create_cart, Sub).
 *
 * A full creation (the node split, a segment created, mapped and unlinked by every rank, the CMA
 * probe) costs some hundred microseconds; a derived communicator's context instead claims a
 * block of its parent's pool: its own call protocol and barrier (protocol.hpp; the block's
 * control part, laid out for its own node ranks) and its own eager slots, in memory every rank
 * already has mapped. Contexts never share sequence numbers or lines, so calls on a parent and
 * its children interleave freely, and a barrier that fails (a dead or departed peer) fails in
 * every block that peer belongs to: each block's barrier is registered for departures
 * (departure.hpp) like any context's.
 *
 * The segment is sparse: the header is a table of user counts, one per block (0: free), and a
 * block's memory is reserved (posix_fallocate) when it is first claimed, so an idle pool costs
 * one mapping of address space; a block claimed again keeps its reservation (a bit of its count
 * says so), so its claim makes no system call. The node leader of a derived communicator claims
 * a block for its node ranks (a CAS on a free count, then the control part cleared) and tells
 * them its index in the one agreement the derivation makes; each user releases it when its
 * context's last reference dies (a part of the mapping, arena.hpp, holds the lease), and the last
 * one frees it for reuse. A rank killed holding a block never releases it: the block stays claimed
 * while the pool lives, and the pool's memory goes away with its last mapping like every segment's.
 * Contexts hold the pool through their blocks, so parents and children may be freed in any
 * order.
 *
 * The segment also holds the pool's arena: one region per node rank, after the blocks, from
 * which every context of the pool allocates zcoll.empty arrays and work arrays up to the region's
 * size. A rank reserves its own region chunk by chunk (1 MiB, then doubling) as its arrays need
 * it, with no communication: every rank of the pool has the segment mapped already, so a new
 * context's first arrays cost no segment created, mapped, reserved and unmapped collectively
 * (some hundred microseconds each way). Larger arrays, or more of them than the region holds, go
 * to the context's own segments (segments.hpp). Reserved chunks stay with the pool until its
 * last mapping goes; buffers in the region are shared only by the pool's own contexts, the only
 * ones sure that every peer still maps it.
 */
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "zcoll/arena.hpp"

namespace zcoll {

// One rank's view of a pool's arena: the whole arena as a data segment (one region per pool node
// rank) and this rank's allocator over the chunks of its region reserved so far.
class pool_arena {
 public:
  // `segment`: the arena regions, a part of `whole` (the pool's mapping, which can reserve).
  pool_arena(std::shared_ptr<data_segment> segment, std::shared_ptr<shm_segment> whole, int rank);
  // Local: `bytes` in this rank's region, reserving its next chunk if needed; null when the
  // region cannot hold them or memory is short.
  std::shared_ptr<arena_block> allocate(std::size_t bytes);
  const std::shared_ptr<data_segment>& segment() const noexcept { return segment_; }
  const std::shared_ptr<detail::partition_allocator>& allocator() const noexcept {
    return allocator_;
  }

 private:
  bool make_room(std::size_t bytes);  // with mutex_ held

  std::shared_ptr<data_segment> segment_;
  std::shared_ptr<shm_segment> whole_;
  int rank_;
  std::shared_ptr<detail::partition_allocator> allocator_;
  std::mutex mutex_;
  std::size_t reserved_ = 0;  // bytes of this rank's region reserved so far
};

class node_pool : public std::enable_shared_from_this<node_pool> {
 public:
  // A pool's segment, its `size` node ranks and the eager bytes per rank its blocks hold.
  struct shape {
    int size = 1;
    std::size_t eager_bytes = 0;
    std::size_t control_bytes() const noexcept;    // a block's control part
    std::size_t eager_partition() const noexcept;  // one rank's eager slots (two by parity)
    std::size_t block_bytes() const noexcept;
    int blocks() const noexcept;  // blocks in the segment: at most 1024, about 1 GiB in all
    std::size_t arena_offset() const noexcept;  // the arena regions, after the blocks
    std::size_t segment_bytes() const noexcept;
  };
  // Bytes of each node rank's arena region.
  static constexpr std::size_t arena_region_bytes = std::size_t{8} << 20;

  // Leader: a new pool segment, its block 0 claimed for the `shape.size` node ranks (the full
  // creation's context). The caller shares its name and unlinks it once every rank mapped it.
  static std::shared_ptr<node_pool> create(const shape& s);
  // Another node rank: maps the pool the leader created under `name`.
  static std::shared_ptr<node_pool> attach(const std::string& name, const shape& s);

  // Local (the derived communicator's node leader): claims a free block for `users` node ranks,
  // reserves its memory and clears its control part; -1 when every block is taken.
  int claim(int users);
  // Local: frees a block claimed by claim() that no rank opened (the derivation fell back).
  void abandon(int index) noexcept;
  // Local: block `index` as (control part, eager part), each a part of the mapping that keeps
  // the pool alive; the block loses this user when both are gone.
  std::pair<std::shared_ptr<shm_segment>, std::shared_ptr<shm_segment>> open(int index);

  const std::shared_ptr<shm_segment>& segment() const noexcept { return shm_; }
  const shape& layout() const noexcept { return shape_; }
  // Users of block `index` (0: free).
  std::uint32_t users(int index) const noexcept;
  // Blocks in use.
  int blocks_in_use() const noexcept;
  // Local: the pool's arena as node rank `rank` of the pool uses it, every rank of the pool
  // having process id `sorted_pids`; made at the first call, the same object after while
  // someone holds it, and null once it was dropped (its allocator, gone, no longer knows which
  // ranges arrays that outlived it still hold). The pool holds it only weakly: the arena's
  // segment holds the pool's mapping.
  std::shared_ptr<pool_arena> arena(int rank, std::vector<std::int32_t> sorted_pids);

 private:
  struct lease;  // one user's hold on a block: releases it when destroyed
  node_pool(std::shared_ptr<shm_segment> shm, const shape& s);
  std::atomic<std::uint32_t>& users_of(int index) const noexcept;
  std::byte* block(int index) const noexcept;
  void release(int index) noexcept;

  std::shared_ptr<shm_segment> shm_;
  shape shape_;
  std::mutex arena_mutex_;
  std::weak_ptr<pool_arena> arena_;
  bool arena_made_ = false;
};

}  // namespace zcoll
