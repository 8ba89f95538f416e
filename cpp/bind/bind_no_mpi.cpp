// bind_mpi.cpp for a build without MPI: the extension makes no MPI call, says so, and has no
// MpiTranspose (zcoll.fft's transposes then never run through MPI).
#include <pybind11/pybind11.h>

#include <string>

#include "bindings.hpp"

namespace py = pybind11;

namespace zcoll::bind {

void register_mpi(py::module_& m) {
  m.def(
      "mpi_library_matches", [](const std::string&) { return false; }, py::arg("version"),
      "False: this build of zcoll has no MPI of its own.");
  m.def(
      "mpi_build", [] { return py::dict(); },
      "An empty dict: this build of zcoll has no MPI of its own.");
  m.def("mpi_waits", [] { return 0; }, "0: this build of zcoll makes no MPI call of its own.");
}

}  // namespace zcoll::bind
