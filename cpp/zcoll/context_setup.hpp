/*
 * Context set-up: everything a node context needs besides its control block, gathered once per
 * layout and applied in one call.
 *
 * A context is a block of a node pool (pool.hpp: its call protocol, barrier and eager slots)
 * plus what the node setup learned -- the node's ranks, their processes and places, the nodes
 * of the communicator, the node's CMA verdict -- and what the settings give: waits, the eager
 * size, copy="auto"'s threshold and cache bound, the CMA size. A full creation learns these
 * collectively. A communicator derived from its pool with the same ranks (every Dup of one
 * communicator, every Sub of one Cartesian communicator) learns nothing new, so the caller keeps
 * one set-up per layout and settings, and each new context is one call: open the claimed block,
 * construct the context, configure it.
 *
 * Trade-off: a few vectors of node size kept per layout, against the ten or so separate
 * configuration calls and their argument conversions that a derived context paid each time
 * (about a third of its creation).
 */
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zcoll/cma.hpp"
#include "zcoll/protocol.hpp"

namespace zcoll {

class node_context;
class node_pool;
class pool_arena;

struct context_setup {
  context_config config;
  std::size_t eager_bytes = 0;  // largest per-rank receive of the eager path (0: none)
  // copy="auto"'s initial hybrid threshold, the most a call may move and stay temporal, and
  // the fewest bytes per rank a call receives to pull private buffers by CMA (none: the
  // engine's defaults).
  std::optional<std::size_t> copy_threshold, copy_cache, cma_bytes;
  std::vector<int> node_of;  // lowest communicator rank of each rank's node (empty: one)
  // The node's CMA verdict when a probe among these ranks was already made (the pool's); none:
  // the caller probes (collective) before the first call.
  std::optional<std::pair<cross_memory::state, std::string>> cma;
};

// Local: this rank's context on block `index` of `pool` (claimed for the node's ranks),
// configured by `setup`, allocating arrays from `arena` first (null: none).
std::shared_ptr<node_context> open_context(node_pool& pool, int index, const context_setup& setup,
                                           std::shared_ptr<pool_arena> arena);

}  // namespace zcoll
