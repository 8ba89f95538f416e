#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "zcoll/arena.hpp"

namespace py = pybind11;

namespace zcoll::bind {

void register_arena(py::module_& m) {
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

}  // namespace zcoll::bind
