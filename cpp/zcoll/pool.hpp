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
 * block's memory is reserved (posix_fallocate) only when claimed, so an idle pool costs one
 * mapping of address space. The node leader of a derived communicator claims a block for its
 * node ranks (a CAS on a free count, then the control part cleared) and tells them its index in
 * the one agreement the derivation makes; each user releases it when its context's last
 * reference dies (a part of the mapping, arena.hpp, holds the lease), and the last one frees it
 * for reuse. A rank killed holding a block never releases it: the block stays claimed while the
 * pool lives, and the pool's memory goes away with its last mapping like every segment's.
 * Contexts hold the pool through their blocks, so parents and children may be freed in any
 * order.
 */
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "zcoll/arena.hpp"

namespace zcoll {

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
    std::size_t segment_bytes() const noexcept;
  };

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

 private:
  struct lease;  // one user's hold on a block: releases it when destroyed
  node_pool(std::shared_ptr<shm_segment> shm, const shape& s);
  std::atomic<std::uint32_t>& users_of(int index) const noexcept;
  std::byte* block(int index) const noexcept;
  void release(int index) noexcept;

  std::shared_ptr<shm_segment> shm_;
  shape shape_;
};

}  // namespace zcoll
