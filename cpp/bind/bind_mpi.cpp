// The extension's own MPI (mpi_messages.hpp), in a build that has one: whether it is mpi4py's
// library, what it was built against, and the collectives of a transpose on a communicator
// without a context (MpiTranspose, mpi_agree_min: zcoll.fft's first runs). bind_no_mpi.cpp
// is this file for a build without MPI.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "zcoll/mpi_messages.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

std::atomic<std::uint64_t> waits{0};  // bounded waits made here (mpi_waits)

// The smallest of the ranks' `code` over `comm`, the GIL released.
int agree(MPI_Comm comm, int code, int rank, double timeout, const std::string& what) {
  const message_round_options options =
      round_options(timeout, what + " (agreeing on a run through MPI)");
  waits.fetch_add(1, std::memory_order_relaxed);
  py::gil_scoped_release release;
  return agree_min(comm, code, rank, options);
}

void* data_of(const py::object& array) {
  return py::reinterpret_borrow<py::array>(array).mutable_data();
}

// A run's exchange, the GIL released.
void exchange(collective_transpose& t, std::uintptr_t handle, int side, const py::object& src,
              const py::object& dst, int rank, double timeout, const std::string& what) {
  const void* send = data_of(src);
  void* recv = data_of(dst);
  const message_round_options options = round_options(timeout, what + " (through MPI)");
  waits.fetch_add(1, std::memory_order_relaxed);
  py::gil_scoped_release release;
  t.run(comm_from_handle(handle), side, send, recv, rank, options);
}

void def_transpose(py::module_& m) {
  py::class_<collective_transpose>(m, "MpiTranspose")
      .def(py::init([](int size, std::size_t itemsize, const std::vector<std::uint64_t>& shape_a,
                       int axis_a, const std::vector<std::uint64_t>& shape_b, int axis_b) {
             return new collective_transpose(size, itemsize, shape_a, axis_a, shape_b, axis_b);
           }),
           py::arg("size"), py::arg("itemsize"), py::arg("shape_a"), py::arg("axis_a"),
           py::arg("shape_b"), py::arg("axis_b"),
           "Local: the datatypes of a global transpose between `size` ranks: this rank's array "
           "A of `shape_a` cut along `axis_a` into the ranks' blocks, B likewise.")
      .def(
          "run",
          [](collective_transpose& t, std::uintptr_t handle, int side, const py::object& src,
             const py::object& dst, bool suits, int rank, double timeout, const std::string& what) {
            if (agree(comm_from_handle(handle), suits ? 1 : 0, rank, timeout, what) == 0)
              return false;
            exchange(t, handle, side, src, dst, rank, timeout, what);
            return true;
          },
          py::arg("handle"), py::arg("side"), py::arg("src"), py::arg("dst"), py::arg("suits"),
          py::arg("rank"), py::arg("timeout"), py::arg("what"),
          "Collective over the communicator of C handle `handle` (MPI._handleof): whether every "
          "rank's arrays suit a run (`suits`: this rank's are C-contiguous, of A's and B's "
          "shapes and dtype, `dst` writable and apart from `src`), and if so direction `side` "
          "(0: A to B) from `src` into `dst`. Each wait bounded by `timeout` s (then PeerError "
          "naming `what`); the caller keeps the arrays of a run that gave up.")
      .def("exchange", &exchange, py::arg("handle"), py::arg("side"), py::arg("src"),
           py::arg("dst"), py::arg("rank"), py::arg("timeout"), py::arg("what"),
           "Collective, with no agreement: run's exchange of arrays known to suit it on every "
           "rank.");
}

}  // namespace

void register_mpi(py::module_& m) {
  m.def("mpi_library_matches", &mpi_library_matches, py::arg("version"),
        "Whether the extension's MPI calls can run: zcoll was built with an MPI, and it is the "
        "initialized library whose MPI_Get_library_version is `version` (mpi4py's).");
  m.def(
      "mpi_build",
      [] {
        py::dict out;
        out["libraries"] = ZCOLL_MPI_LIBRARIES;
        out["chosen_by"] = ZCOLL_MPI_CHOSEN_BY;
        out["version"] = linked_library_version();
        return out;
      },
      "Local: the MPI the C++ sender was built against -- libraries (its link line's), chosen_by "
      "(MPI_C_COMPILER, MPICC or mpi4py) and version (that library's MPI_Get_library_version) "
      "-- or an empty dict when zcoll was built without one.");
  m.def(
      "mpi_agree_min",
      [](std::uintptr_t handle, int code, int rank, double timeout, const std::string& what) {
        return agree(comm_from_handle(handle), code, rank, timeout, what);
      },
      py::arg("handle"), py::arg("code"), py::arg("rank"), py::arg("timeout"), py::arg("what"),
      "Collective over the communicator of C handle `handle`: the smallest of the ranks' `code` "
      "(one MPI_Iallreduce), the wait bounded by `timeout` s.");
  m.def(
      "mpi_waits", [] { return waits.load(std::memory_order_relaxed); },
      "Local: how many bounded waits on MPI requests mpi_agree_min and MpiTranspose made.");
  def_transpose(m);
}

}  // namespace zcoll::bind
