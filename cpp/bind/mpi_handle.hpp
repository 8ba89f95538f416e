// MPI handles as mpi4py hands them over (Comm.handle, MPI._handleof): opaque words of pointer
// width, read as such and never narrowed.
//
// Open MPI's handles are pointers. MPICH's, and so Intel MPI's, Cray MPICH's and MVAPICH's, are
// ints whose high bit is set for user communicators (0x84000002); mpi4py shows them as unsigned
// numbers of pointer width (0xffffffff84000002), past the range of a signed long long. An older
// mpi4py may show the same bits as a negative number. Both read here as the same unsigned word
// (the Python int taken modulo 2^64), which MPI's own type gets back from the low bits.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "zcoll/message_flow.hpp"

namespace zcoll::bind {

struct mpi_handle {
  std::uintptr_t bits = 0;
};

// The handle in Python int `o`, or nullopt (no Python error left set) if it is not an int.
inline std::optional<std::uintptr_t> handle_bits(PyObject* o) {
  if (!PyLong_Check(o)) return std::nullopt;
  const unsigned long long bits = PyLong_AsUnsignedLongLongMask(o);
  if (bits == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    return std::nullopt;
  }
  return static_cast<std::uintptr_t>(bits);
}

}  // namespace zcoll::bind

namespace pybind11::detail {

template <>
struct type_caster<zcoll::bind::mpi_handle> {
  PYBIND11_TYPE_CASTER(zcoll::bind::mpi_handle, const_name("int"));

  bool load(handle src, bool /*convert*/) {
    const auto bits = zcoll::bind::handle_bits(src.ptr());
    if (!bits) return false;
    value.bits = *bits;
    return true;
  }

  static handle cast(zcoll::bind::mpi_handle h, return_value_policy, handle) {
    return PyLong_FromUnsignedLongLong(h.bits);
  }
};

// A communicator's route between nodes as Python's Transport.route() gives it: (private dup's
// handle, rank, tag, window).
template <>
struct type_caster<zcoll::nodes_route> {
  using parts = std::tuple<zcoll::bind::mpi_handle, int, int, int>;
  PYBIND11_TYPE_CASTER(zcoll::nodes_route, const_name("tuple[int, int, int, int]"));

  bool load(handle src, bool convert) {
    make_caster<parts> loaded;
    if (!loaded.load(src, convert)) return false;
    const auto& [comm, rank, tag, window] = cast_op<const parts&>(loaded);
    value = {comm.bits, rank, tag, window};
    return true;
  }

  static handle cast(const zcoll::nodes_route& r, return_value_policy policy, handle parent) {
    return make_caster<parts>::cast(parts{{r.comm}, r.rank, r.tag, r.window}, policy, parent);
  }
};

}  // namespace pybind11::detail
