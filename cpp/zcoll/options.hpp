/*
 * Options shared by every zcoll collective.
 *
 * One struct, documented defaults. The Python layer fills it from keyword arguments and
 * environment variables (ZCOLL_TIMEOUT, ZCOLL_BARRIER, ...); the core never reads the
 * environment itself, so it stays deterministic and testable in one process.
 */
#pragma once

#include <cstdint>

#include "zcoll/registry.hpp"

namespace zcoll {

// How long and how hard a rank waits for its peers.
struct wait_options {
  double timeout_s = 60.0;  // bound on one wait; then peer_error naming the missing ranks
  std::uint32_t spin_iterations = 4096;  // busy-wait polls before yielding (0 when oversubscribed)
  std::uint32_t yield_iterations = 64;   // sched_yield polls before sleeping on the futex
  double sleep_slice_s = 0.02;  // futex sleep slice; laggards' liveness is checked after each
};

}  // namespace zcoll
