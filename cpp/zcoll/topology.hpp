/*
 * Topology: what hwloc says about this machine and where the calling process runs.
 *
 * Loaded once per process (hwloc discovery costs milliseconds) and cached. Cache sizes feed the
 * copy kernels' thresholds (HINT: T ~ L2 / ranks per node); packages and NUMA nodes feed the
 * NUMA-aware schedules. hwloc honours HWLOC_XMLFILE / HWLOC_SYNTHETIC, so tests can describe
 * machines this one is not.
 */
#pragma once

#include <cstdint>
#include <string>

namespace zcoll {

struct cache_sizes {
  std::uint64_t l1d = 0;  // bytes, data cache of one core (0: unknown)
  std::uint64_t l2 = 0;
  std::uint64_t l3 = 0;
};

struct machine_topology {
  int packages = 0;
  int numa_nodes = 0;
  int cores = 0;
  int pus = 0;  // hardware threads
  cache_sizes caches;
  std::string source;  // "this machine", or the synthetic/XML description used
};

struct process_location {
  int pu = -1;         // OS index of the hardware thread it last ran on
  int core = -1;       // logical index of that core
  int numa_node = -1;  // logical index of its NUMA node
  int package = -1;    // logical index of its package (socket)
  int l3_cache = -1;   // logical index of the L3 cache above it (-1: none or unknown)
  bool bound = false;  // bound to a strict subset of the machine's PUs
};

// The machine as hwloc sees it (cached after the first call).
const machine_topology& read_machine_topology();
// Where the calling process runs now.
process_location locate_this_process();

}  // namespace zcoll
