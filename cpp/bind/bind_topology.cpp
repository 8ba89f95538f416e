#include <pybind11/pybind11.h>

#include <string>

#include "bindings.hpp"
#include "zcoll/topology.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

py::dict to_dict(const machine_topology& t) {
  py::dict d;
  d["packages"] = t.packages;
  d["numa_nodes"] = t.numa_nodes;
  d["cores"] = t.cores;
  d["pus"] = t.pus;
  d["l1d"] = t.caches.l1d;
  d["l2"] = t.caches.l2;
  d["l3"] = t.caches.l3;
  d["source"] = t.source;
  return d;
}

py::dict to_dict(const process_location& p) {
  py::dict d;
  d["pu"] = p.pu;
  d["core"] = p.core;
  d["numa_node"] = p.numa_node;
  d["package"] = p.package;
  d["l3_cache"] = p.l3_cache;
  d["bound"] = p.bound;
  return d;
}

}  // namespace

void register_topology(py::module_& m) {
  m.def(
      "machine_topology", [] { return to_dict(read_machine_topology()); },
      "This machine as hwloc sees it (loaded once per process): dict with packages, numa_nodes, "
      "cores, pus, l1d, l2, l3 (bytes, 0: unknown) and source.");
  m.def(
      "locate_this_process", [] { return to_dict(locate_this_process()); },
      "Where the calling thread runs now: dict with pu (OS index), core, numa_node, package, "
      "l3_cache (logical indexes; -1: unknown) and bound (pinned to a strict subset of the allowed "
      "PUs).");
  m.def(
      "described_topology",
      [](const std::string& description) { return to_dict(read_described_topology(description)); },
      py::arg("description"),
      "The machine an hwloc synthetic description or XML file path describes (ZCOLL_TOPOLOGY), "
      "as machine_topology's dict; ValueError when hwloc rejects it.");
  m.def(
      "locate_described_pu",
      [](const std::string& description, int index) {
        return to_dict(locate_described_pu(description, index));
      },
      py::arg("description"), py::arg("index"),
      "Where the index-th PU (logical order, wrapping) of the described machine is, as "
      "locate_this_process's dict (bound: False): the place of node rank `index` under "
      "ZCOLL_TOPOLOGY.");
}

}  // namespace zcoll::bind
