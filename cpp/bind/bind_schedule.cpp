#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.hpp"
#include "zcoll/schedule.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

schedule schedule_named(int p, int order, const std::string& kind,
                        const std::vector<int>& domains) {
  if (!is_code<block_order>(order)) throw std::invalid_argument("unknown order code");
  const auto k = parse_name<schedule_kind>(kind);
  if (!k)
    throw std::invalid_argument("kind must be one of " + joined_names<schedule_kind>(", ") +
                                ", got '" + kind + "'");
  return make_schedule({*k, p, static_cast<block_order>(order), domains});
}

}  // namespace

void register_schedule(py::module_& m) {
  m.def(
      "schedule",
      [](int p, int order, const std::string& kind, const std::vector<int>& domains) {
        const schedule s = schedule_named(p, order, kind, domains);
        py::array_t<std::int32_t> blocks(
            {static_cast<py::ssize_t>(s.blocks.size()), py::ssize_t{2}});
        auto b = blocks.mutable_unchecked<2>();
        for (std::size_t k = 0; k < s.blocks.size(); ++k) {
          b(static_cast<py::ssize_t>(k), 0) = s.blocks[k].dst;
          b(static_cast<py::ssize_t>(k), 1) = s.blocks[k].src;
        }
        py::array_t<std::int64_t> starts(static_cast<py::ssize_t>(s.starts.size()));
        auto st = starts.mutable_unchecked<1>();
        for (std::size_t k = 0; k < s.starts.size(); ++k)
          st(static_cast<py::ssize_t>(k)) = static_cast<std::int64_t>(s.starts[k]);
        return py::make_tuple(blocks, starts);
      },
      py::arg("p"), py::arg("order"), py::arg("kind") = "full",
      py::arg("numa_nodes") = std::vector<int>{},
      "(blocks, starts): the (dst, src) blocks in order; rank r copies "
      "blocks[starts[r]:starts[r+1]]. numa_nodes: each rank's NUMA node (order numa; empty: one "
      "domain).");
  m.def(
      "morton_decode",
      [](std::uint64_t code) {
        return py::make_tuple(detail::morton_decode_dst(code), detail::morton_decode_src(code));
      },
      py::arg("code"),
      "(dst, src) of a Morton code: dst from the odd bits, src from the even bits.");
  m.def("have_bmi2", &detail::have_bmi2, "Whether the CPU has BMI2 (pext) for Morton decoding.");
}

}  // namespace zcoll::bind
