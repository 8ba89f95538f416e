/*
 * Topology: what hwloc says about this machine and where the calling process runs.
 *
 * Loaded once per process (hwloc discovery costs milliseconds) and cached. Cache sizes feed the
 * copy kernels' thresholds (HINT: T ~ L2 / ranks per node); packages and NUMA nodes feed the
 * NUMA-aware schedules. hwloc honours HWLOC_XMLFILE / HWLOC_SYNTHETIC, so tests can describe
 * machines this one is not.
 *
 * A described machine (ZCOLL_TOPOLOGY): an hwloc synthetic description ("package:2 numa:2
 * core:4 pu:1") or the path of an hwloc XML file, loaded on its own (not this process's
 * topology) and cached per description. Node rank i is placed on its i-th PU in hwloc's logical
 * order (wrapping when ranks outnumber PUs), which gives it a package, NUMA node, L3 and core;
 * no process is bound anywhere.
 */
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

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

// The machine `description` describes: a path of an existing file is read as hwloc XML,
// anything else as an hwloc synthetic description. Loaded once per description (thread-safe).
// Throws std::invalid_argument naming the description when hwloc rejects it.
const machine_topology& read_described_topology(std::string_view description);
// The place of the `index`-th PU (logical order, modulo the PU count; index >= 0) of that
// machine: its OS index, core, NUMA node, package and L3 (bound: false). Throws as above, and
// std::invalid_argument for a negative index.
process_location locate_described_pu(std::string_view description, int index);

}  // namespace zcoll
