#include "zcoll/topology.hpp"

#include <hwloc.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace zcoll {

namespace detail {

namespace {

// The loaded hwloc topology and what was read from it. Read-only after loading, so concurrent
// queries from several threads are safe (hwloc allows that on a loaded topology).
struct loaded_topology {
  hwloc_topology_t handle = nullptr;  // null when hwloc failed
  machine_topology machine;

  loaded_topology();  // loads; never throws on hwloc failure (handle stays null)
  // Loads `description` (see read_described_topology); throws std::invalid_argument when hwloc
  // rejects it.
  explicit loaded_topology(std::string_view description);
  loaded_topology(const loaded_topology&) = delete;
  loaded_topology& operator=(const loaded_topology&) = delete;
  ~loaded_topology() {
    if (handle) hwloc_topology_destroy(handle);
  }
};

struct bitmap_deleter {
  void operator()(hwloc_bitmap_s* b) const noexcept { hwloc_bitmap_free(b); }
};
using bitmap_ptr = std::unique_ptr<hwloc_bitmap_s, bitmap_deleter>;

const char* env_value(const char* name) noexcept {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

// Applies HWLOC_SYNTHETIC, else HWLOC_XMLFILE, the way hwloc_topology_load would (same order),
// but here so that we know whether hwloc accepted it: hwloc silently falls back to discovering
// this machine when the value is invalid. Returns the `source` text.
std::string apply_environment(hwloc_topology_t t) {
  std::string rejected;
  if (const char* synthetic = env_value("HWLOC_SYNTHETIC")) {
    if (hwloc_topology_set_synthetic(t, synthetic) == 0)
      return std::string("HWLOC_SYNTHETIC=") + synthetic;
    rejected = std::string("HWLOC_SYNTHETIC='") + synthetic + "' rejected by hwloc";
  }
  std::string used = "this machine";
  if (const char* xml = env_value("HWLOC_XMLFILE")) {
    if (hwloc_topology_set_xml(t, xml) == 0) {
      used = std::string("HWLOC_XMLFILE=") + xml;
    } else {
      if (!rejected.empty()) rejected += "; ";
      rejected += std::string("HWLOC_XMLFILE='") + xml + "' rejected by hwloc";
    }
  }
  return rejected.empty() ? used : used + " (" + rejected + ")";
}

int count_of(hwloc_topology_t t, hwloc_obj_type_t type) {
  const int n = hwloc_get_nbobjs_by_type(t, type);
  return n > 0 ? n : 0;
}

// Size of the first data or unified cache of `type` (L1/L2/L3), 0 when hwloc knows none.
std::uint64_t first_cache_size(hwloc_topology_t t, hwloc_obj_type_t type) {
  const int depths = hwloc_topology_get_depth(t);
  for (int d = 0; d < depths; ++d) {
    if (hwloc_get_depth_type(t, d) != type) continue;
    const hwloc_obj_t obj = hwloc_get_obj_by_depth(t, d, 0);
    if (obj && obj->attr && obj->attr->cache.type != HWLOC_OBJ_CACHE_INSTRUCTION)
      return obj->attr->cache.size;
  }
  return 0;
}

// Counts and caches. A machine without a Package (or Core) level in hwloc's view is one package
// (or one core per PU), so the counts stay positive on every loaded topology.
machine_topology read_machine(hwloc_topology_t t, std::string source) {
  machine_topology m;
  m.pus = count_of(t, HWLOC_OBJ_PU);
  m.cores = count_of(t, HWLOC_OBJ_CORE);
  m.packages = count_of(t, HWLOC_OBJ_PACKAGE);
  m.numa_nodes = count_of(t, HWLOC_OBJ_NUMANODE);
  if (m.pus > 0) {
    if (m.cores == 0) m.cores = m.pus;
    if (m.packages == 0) m.packages = 1;
    if (m.numa_nodes == 0) m.numa_nodes = 1;
  }
  m.caches.l1d = first_cache_size(t, HWLOC_OBJ_L1CACHE);
  m.caches.l2 = first_cache_size(t, HWLOC_OBJ_L2CACHE);
  m.caches.l3 = first_cache_size(t, HWLOC_OBJ_L3CACHE);
  m.source = std::move(source);
  return m;
}

loaded_topology::loaded_topology() {
  if (hwloc_topology_init(&handle) != 0) {
    handle = nullptr;
    machine.source = "hwloc unavailable (" + errno_text("hwloc_topology_init") + ")";
    return;
  }
  std::string source = apply_environment(handle);
  if (hwloc_topology_load(handle) != 0) {
    machine.source =
        "hwloc unavailable (" + errno_text("hwloc_topology_load") + "; " + source + ")";
    hwloc_topology_destroy(handle);
    handle = nullptr;
    return;
  }
  machine = read_machine(handle, std::move(source));
}

bool is_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

loaded_topology::loaded_topology(std::string_view description) {
  const std::string text(description);
  const bool xml = is_file(text);
  std::string why;
  if (hwloc_topology_init(&handle) != 0) {
    handle = nullptr;
    why = errno_text("hwloc_topology_init");
  } else if ((xml ? hwloc_topology_set_xml(handle, text.c_str())
                  : hwloc_topology_set_synthetic(handle, text.c_str())) != 0) {
    why = xml ? "hwloc cannot read the XML file '" + text + "'"
              : "hwloc rejects '" + text + "' as a synthetic description (nor is it a file)";
  } else if (hwloc_topology_load(handle) != 0) {
    why = errno_text("hwloc_topology_load");
  } else if (count_of(handle, HWLOC_OBJ_PU) == 0) {
    why = "the machine '" + text + "' has no PU";
  }
  if (!why.empty()) {
    if (handle) hwloc_topology_destroy(handle);
    handle = nullptr;
    throw std::invalid_argument("zcoll: " + why);
  }
  machine = read_machine(handle, (xml ? "XML file " : "synthetic ") + text);
}

// Loaded on first use; C++ makes the initialisation of a function-local static thread-safe.
const loaded_topology& loaded() {
  static const loaded_topology instance;
  return instance;
}

// The NUMA node nearest the PU: the first memory child (through memory-side caches) of its
// closest ancestor that has any. In hwloc 2, NUMA nodes hang off the tree as memory children.
hwloc_obj_t numa_node_of(hwloc_obj_t pu) {
  for (hwloc_obj_t a = pu; a; a = a->parent) {
    hwloc_obj_t m = a->memory_first_child;
    while (m && m->type != HWLOC_OBJ_NUMANODE) m = m->memory_first_child;
    if (m) return m;
  }
  return nullptr;
}

// Logical index of obj, or `missing` when the level does not exist (see read_machine).
int logical_index_of(hwloc_obj_t obj, int missing) {
  return obj ? static_cast<int>(obj->logical_index) : missing;
}

// The core, package, NUMA node and L3 above `pu` (a missing level as read_machine counts it).
void place_of(hwloc_topology_t t, hwloc_obj_t pu, process_location& where) {
  const int pu_logical = static_cast<int>(pu->logical_index);
  where.core = logical_index_of(hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_CORE, pu), pu_logical);
  where.package = logical_index_of(hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, pu), 0);
  where.numa_node = logical_index_of(numa_node_of(pu), 0);
  where.l3_cache = logical_index_of(hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_L3CACHE, pu), -1);
}

// The described machines loaded so far, by description (never unloaded: a process names few).
const loaded_topology& described(std::string_view description) {
  static std::mutex lock;
  static std::map<std::string, std::unique_ptr<loaded_topology>, std::less<>> loaded_ones;
  const std::lock_guard<std::mutex> hold(lock);
  auto it = loaded_ones.find(description);
  if (it == loaded_ones.end())
    it = loaded_ones
             .emplace(std::string(description), std::make_unique<loaded_topology>(description))
             .first;
  return *it->second;
}

// Where the calling thread last ran, as an OS PU index (-1: unknown). The thread rather than the
// process: with HWLOC_CPUBIND_PROCESS, Linux hwloc returns the union over all threads, and MPI
// and Python run helper threads elsewhere.
int last_pu(hwloc_topology_t t) {
  const bitmap_ptr where(hwloc_bitmap_alloc());
  if (!where) return -1;
  if (hwloc_get_last_cpu_location(t, where.get(), HWLOC_CPUBIND_THREAD) != 0 &&
      hwloc_get_last_cpu_location(t, where.get(), HWLOC_CPUBIND_PROCESS) != 0)
    return -1;
  return hwloc_bitmap_first(where.get());
}

// Whether the calling thread's binding leaves out some PU this process may use (the allowed
// cpuset, which unlike the complete one excludes offline CPUs and those outside its cgroup).
bool is_bound(hwloc_topology_t t) {
  const bitmap_ptr bind(hwloc_bitmap_alloc());
  if (!bind) return false;
  if (hwloc_get_cpubind(t, bind.get(), HWLOC_CPUBIND_THREAD) != 0 &&
      hwloc_get_cpubind(t, bind.get(), HWLOC_CPUBIND_PROCESS) != 0)
    return false;
  return !hwloc_bitmap_isincluded(hwloc_topology_get_allowed_cpuset(t), bind.get());
}

}  // namespace

}  // namespace detail

const machine_topology& read_machine_topology() {
  return detail::loaded().machine;
}

process_location locate_this_process() {
  process_location where;
  const hwloc_topology_t t = detail::loaded().handle;
  // A synthetic or XML topology describes another machine: this process runs on none of it.
  if (!t || !hwloc_topology_is_thissystem(t)) return where;
  where.pu = detail::last_pu(t);
  if (where.pu >= 0) {
    const hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(t, static_cast<unsigned>(where.pu));
    if (pu) detail::place_of(t, pu, where);
  }
  where.bound = detail::is_bound(t);
  return where;
}

const machine_topology& read_described_topology(std::string_view description) {
  return detail::described(description).machine;
}

process_location locate_described_pu(std::string_view description, int index) {
  if (index < 0) throw std::invalid_argument("zcoll: a PU index must be >= 0");
  const hwloc_topology_t t = detail::described(description).handle;
  const int pus = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
  const hwloc_obj_t pu = hwloc_get_obj_by_type(t, HWLOC_OBJ_PU, static_cast<unsigned>(index % pus));
  process_location where;
  where.pu = static_cast<int>(pu->os_index);
  detail::place_of(t, pu, where);
  return where;
}

}  // namespace zcoll
