/*
 * Options shared by every zcoll collective.
 *
 * One struct, documented defaults. The Python layer fills it from keyword arguments and
 * environment variables (ZCOLL_TIMEOUT, ZCOLL_BARRIER, ...); the core never reads the
 * environment itself, so it stays deterministic and testable in one process.
 */
#pragma once

#include <cstdint>

namespace zcoll {

// Order in which the P x P block matrix of a collective is traversed (and then cut into P
// contiguous segments, one per rank). Coordinates are (dst, src): row d of the matrix is rank
// d's receive buffer.
enum class block_order : std::uint32_t {
  row = 0,      // row-major: each rank fills its own receive row (the papers' SH-Naive baseline)
  column = 1,   // column-major: each rank pushes its own send row to every peer
  morton = 2,   // Z-order; bit de-interleave for power-of-two P, balanced recursion otherwise
  hilbert = 3,  // generalised Hilbert curve, defined for any P; consecutive blocks are neighbours
};
inline constexpr int block_order_count = 4;
// Names of the block orders, by block_order value.
inline constexpr const char* block_order_names[block_order_count] = {"row", "column", "morton",
                                                                     "hilbert"};

// Node barrier algorithm (HPDC'13 §3). All wait with spin -> yield -> futex and bounded time.
enum class barrier_kind : std::uint32_t {
  flat = 0,           // each rank bumps its own line and polls everyone's: no shared hot line,
                      // and the line also carries the call's descriptor (one transfer per peer)
  central = 1,        // one shared arrival counter + generation word: O(1) reads per rank
  dissemination = 2,  // ceil(log2 P) rounds of pairwise flags: O(log P) depth, no shared line
};

// How long and how hard a rank waits for its peers.
struct wait_options {
  double timeout_s = 60.0;         // bound on one wait; then peer_error naming the missing ranks
  std::uint32_t spin_iterations = 4096;  // busy-wait polls before yielding (0 when oversubscribed)
  std::uint32_t yield_iterations = 64;   // sched_yield polls before sleeping on the futex
  double sleep_slice_s = 0.02;     // futex sleep slice; laggards' liveness is checked after each
};

}  // namespace zcoll
