// NumPy arrays (and call records) as the engine sees them: conversion only, no checks.
// Header-only: these run on every call and are inlined into the binding's entry points.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#include "zcoll/checks.hpp"
#include "zcoll/protocol.hpp"

namespace zcoll::bind {

namespace detail {

inline pybind11::object& in_place_sentinel() {
  // Leaked: it must outlive the interpreter's teardown of module objects.
  static auto* sentinel = new pybind11::object(pybind11::none());
  return *sentinel;
}

}  // namespace detail

// Whether `obj` is the object that means "in place" as a send buffer (mpi4py's MPI.IN_PLACE).
inline bool is_in_place(const pybind11::object& obj) {
  return obj.is(detail::in_place_sentinel());
}
// Registers that object (called once at import).
inline void set_in_place(pybind11::object sentinel) {
  detail::in_place_sentinel() = std::move(sentinel);
}

// The name of `obj`'s type, for messages.
inline std::string type_name(const pybind11::handle& obj) {
  return pybind11::str(pybind11::type::of(obj).attr("__name__")).cast<std::string>();
}

// The engine's view of `a` (pointer, shape, dtype, flags); valid while `a` lives.
inline array_view view_of(const pybind11::array& a) {
  namespace py = pybind11;
  const py::dtype dt = a.dtype();  // fetched once: every accessor below would fetch it again
  array_view v;
  v.data = a.data();
  v.ndim = static_cast<int>(a.ndim());
  const py::ssize_t* shape = a.shape();
  std::size_t size = 1;
  for (int i = 0; i < v.ndim; ++i) size *= static_cast<std::size_t>(shape[i]);
  v.size = size;
  v.first_dim = v.ndim ? static_cast<std::size_t>(shape[0]) : 0;
  static_assert(sizeof(py::ssize_t) == sizeof(std::int64_t));
  v.shape = reinterpret_cast<const std::int64_t*>(shape);
  const auto itemsize = static_cast<std::size_t>(dt.itemsize());
  v.nbytes = size * itemsize;
  v.dtype = {static_cast<std::uint32_t>(static_cast<unsigned char>(dt.char_())),
             static_cast<std::uint32_t>(itemsize)};
  const char kind = dt.kind();
  v.has_objects = kind == 'O' || (kind == 'V' && dt.attr("hasobject").cast<bool>());
  const int flags = a.flags();
  v.c_contiguous = (flags & py::array::c_style) != 0;
  v.writeable = (flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_) != 0;
  return v;
}

// `obj` itself when it is a C-contiguous ndarray, else a C-contiguous copy (null on failure,
// with the Python error cleared).
inline pybind11::array as_c_array(const pybind11::object& obj) {
  namespace py = pybind11;
  if (py::isinstance<py::array>(obj)) {
    auto a = py::reinterpret_borrow<py::array>(obj);
    if (a.flags() & py::array::c_style) return a;
  }
  py::array a = py::array::ensure(obj, py::array::c_style);
  if (!a) PyErr_Clear();
  return a;
}

// A call record as the bytes ranks on other nodes exchange (see protocol.hpp).
inline pybind11::bytes record_bytes(const call_record& r) {
  return pybind11::bytes(reinterpret_cast<const char*>(&r), sizeof r);
}

// The call record in `bytes` (record_bytes' inverse).
inline call_record record_of(const pybind11::bytes& bytes) {
  const std::string_view view = bytes;
  if (view.size() != sizeof(call_record))
    throw std::invalid_argument("record must be one call record");
  call_record r;
  std::memcpy(&r, view.data(), sizeof r);
  return r;
}

}  // namespace zcoll::bind
