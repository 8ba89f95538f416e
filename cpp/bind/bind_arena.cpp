#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "zcoll/arena.hpp"
#include "zcoll/pool.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

// Arena blocks (NumPy's buffers) and the shared segments under them.
void register_blocks(py::module_& m) {
  py::class_<arena_block, std::shared_ptr<arena_block>>(m, "ArenaBlock", py::buffer_protocol(),
                                                        "One allocation in the shared arena.")
      .def_buffer([](arena_block& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<unsigned char>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {py::ssize_t{1}},
                               /*readonly=*/false);
      })
      .def_property_readonly("nbytes", &arena_block::size)
      .def_property_readonly("address", [](const arena_block& b) {
        return reinterpret_cast<std::uintptr_t>(b.data());
      });

  py::class_<shm_segment, std::shared_ptr<shm_segment>>(m, "SharedSegment",
                                                        "A mapped POSIX shared-memory object.")
      .def_static("create", &shm_segment::create, py::arg("nbytes"))
      .def_static("attach", &shm_segment::attach, py::arg("name"), py::arg("nbytes"))
      .def("unlink", &shm_segment::unlink)
      .def_property_readonly("name", &shm_segment::name)
      .def_property_readonly("nbytes", &shm_segment::size);
}

// A node's pool of context blocks and its arena (pool.hpp).
void register_pool(py::module_& m) {
  py::class_<pool_arena, std::shared_ptr<pool_arena>>(
      m, "PoolArena", "One rank's view of a node pool's arena (pool.hpp).")
      .def("allocate", &pool_arena::allocate, py::arg("nbytes"),
           "Local: `nbytes` in this rank's region (an ArenaBlock), or None where the region "
           "cannot hold them or memory is short.");

  py::class_<node_pool, std::shared_ptr<node_pool>>(
      m, "NodePool", "A node's shared segment of context blocks (pool.hpp).")
      .def_static(
          "create",
          [](int size, std::size_t eager_bytes) { return node_pool::create({size, eager_bytes}); },
          py::arg("size"), py::arg("eager_bytes"),
          "Leader: a new pool for `size` node ranks, its block 0 claimed for them.")
      .def_static(
          "attach",
          [](const std::string& name, int size, std::size_t eager_bytes) {
            return node_pool::attach(name, {size, eager_bytes});
          },
          py::arg("name"), py::arg("size"), py::arg("eager_bytes"))
      .def_property_readonly("name", [](const node_pool& p) { return p.segment()->name(); })
      .def("unlink", [](node_pool& p) { p.segment()->unlink(); })
      .def("claim", &node_pool::claim, py::arg("users"),
           "Local: a free block claimed for `users` node ranks, or -1 when none is free.")
      .def("abandon", &node_pool::abandon, py::arg("index"))
      .def("users", &node_pool::users, py::arg("index"))
      .def("arena", &node_pool::arena, py::arg("rank"), py::arg("sorted_pids"),
           "Local: the pool's arena as pool node rank `rank` uses it (None once dropped).")
      .def_property_readonly("blocks_in_use", &node_pool::blocks_in_use)
      .def_property_readonly("blocks", [](const node_pool& p) { return p.layout().blocks(); })
      .def_property_readonly("size", [](const node_pool& p) { return p.layout().size; })
      .def_property_readonly("eager_bytes",
                             [](const node_pool& p) { return p.layout().eager_bytes; })
      .def_property_readonly("eager_partition",
                             [](const node_pool& p) { return p.layout().eager_partition(); });
}

// Whether memory lies in the arena, and the arena's constants.
void register_arena_queries(py::module_& m) {
  m.def(
      "array_in_arena",
      [](const py::array& a) { return in_arena(a.data(), static_cast<std::size_t>(a.nbytes())); },
      py::arg("a"), "True when the array's memory lies in the arena.");
  m.def(
      "in_arena",
      [](std::uintptr_t address, std::size_t nbytes) {
        return in_arena(reinterpret_cast<const void*>(address), nbytes);
      },
      py::arg("address"), py::arg("nbytes"),
      "True when [address, address+nbytes) is in the arena.");
  m.attr("SEGMENT_PREFIX") = segment_prefix;
  // Rank r's arena arrays start r * this (mod 4096) bytes into its pages (see arena.hpp).
  m.attr("ARENA_COLOUR_STRIDE") = detail::partition_allocator::colour_stride;
}

}  // namespace

void register_arena(py::module_& m) {
  register_blocks(m);
  register_pool(m);
  register_arena_queries(m);
}

}  // namespace zcoll::bind
