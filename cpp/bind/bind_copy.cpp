#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "bindings.hpp"
#include "zcoll/copy.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

// Calls that copy at least this many bytes run without the GIL (below it, releasing costs more than
// it frees).
constexpr std::size_t gil_free_bytes = 64 * 1024;

// The value named `text`; ValueError naming `what` and the choices otherwise.
template <class Enum>
Enum parse_or_raise(const std::string& text, const char* what) {
  if (const auto value = parse_name<Enum>(text)) return *value;
  throw py::value_error("zcoll copy: unknown " + std::string(what) + " '" + text +
                        "' (choose among " + joined_names<Enum>(", ") + ")");
}

py::tuple available_isas() {
  py::list names;
  for (int i = 0; i < count_of<copy_isa>; ++i)
    if (isa_available(static_cast<copy_isa>(i)))
      names.append(py::str(std::string(name_of(static_cast<copy_isa>(i)))));
  return py::tuple(names);
}

std::string available_text() {
  return py::str(", ").attr("join")(available_isas()).cast<std::string>();
}

void copy_arrays(py::array dst, const py::array& src, const std::string& mode,
                 std::int64_t threshold, std::int64_t repeat) {
  if (threshold < 0)
    throw py::value_error("zcoll copy: threshold must be >= 0, got " + std::to_string(threshold));
  if (repeat < 1)
    throw py::value_error("zcoll copy: repeat must be >= 1, got " + std::to_string(repeat));
  const copy_plan how{parse_or_raise<copy_mode>(mode, "mode"), static_cast<std::size_t>(threshold)};
  if (!(dst.flags() & py::array::c_style) || !(src.flags() & py::array::c_style))
    throw py::value_error("zcoll copy: dst and src must be C-contiguous");
  if (!dst.writeable()) throw py::value_error("zcoll copy: dst is read-only");
  const auto nbytes = static_cast<std::size_t>(dst.nbytes());
  if (static_cast<std::size_t>(src.nbytes()) != nbytes)
    throw py::value_error("zcoll copy: dst has " + std::to_string(nbytes) + " bytes, src " +
                          std::to_string(src.nbytes()));
  if (nbytes == 0) return;
  void* to = dst.mutable_data();
  const void* from = src.data();
  const auto a = reinterpret_cast<std::uintptr_t>(to);
  const auto b = reinterpret_cast<std::uintptr_t>(from);
  if (a < b + nbytes && b < a + nbytes) throw py::value_error("zcoll copy: dst and src overlap");
  auto run = [&] {
    for (std::int64_t i = 0; i < repeat; ++i) copy_bytes(to, from, nbytes, how);
    store_fence();
  };
  const auto times = static_cast<std::size_t>(repeat);
  if (nbytes >= gil_free_bytes || times >= gil_free_bytes / nbytes) {
    py::gil_scoped_release unlocked;
    run();
  } else {
    run();
  }
}

}  // namespace

void register_copy(py::module_& m) {
  m.def("copy", &copy_arrays, py::arg("dst"), py::arg("src"), py::arg("mode") = "temporal",
        py::arg("threshold") = 0, py::kw_only(), py::arg("repeat") = 1,
        "Copy src's bytes into dst's with zcoll's copy kernels, then a store fence. Both "
        "C-contiguous ndarrays of the same nbytes (any shapes and dtypes), dst writable, not "
        "overlapping (ValueError otherwise). mode: 'temporal' (memcpy), 'streaming' "
        "(non-temporal stores with the active kernel) or 'hybrid' (the first `threshold` bytes "
        "temporal, the rest streaming). repeat: copy that many times, then fence (benchmarks). "
        "The GIL is released while 64 KiB or more are copied.");
  m.def("copy_isas", &available_isas,
        "Names of the copy kernels this CPU runs, in COPY_ISAS order ('portable' always).");
  m.def(
      "active_copy_isa", [] { return std::string(name_of(active_isa())); },
      "Name of the kernel streaming copies use now.");
  m.def(
      "best_copy_isa", [] { return std::string(name_of(best_isa())); },
      "Name of the best kernel this CPU runs: the one chosen at load time.");
  m.def(
      "select_copy_isa",
      [](const std::string& name) {
        const copy_isa isa = parse_or_raise<copy_isa>(name, "copy kernel");
        if (!select_isa(isa))
          throw py::value_error("zcoll copy: this CPU cannot run the '" + name +
                                "' copy kernel (available: " + available_text() + ")");
      },
      py::arg("name"),
      "Make `name` (one of COPY_ISAS) the kernel of streaming copies in this process; "
      "ValueError if it is unknown or this CPU cannot run it.");
}

}  // namespace zcoll::bind
