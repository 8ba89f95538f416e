// NumPy arrays as the engine sees them: conversion only, no checks (those are the engine's).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "zcoll/checks.hpp"

namespace zcoll::bind {

// The engine's view of `a` (pointer, shape, dtype, flags); valid while `a` lives.
array_view view_of(const pybind11::array& a);

// `obj` itself when it is a C-contiguous ndarray, else a C-contiguous copy (null on failure,
// with the Python error cleared).
pybind11::array as_c_array(const pybind11::object& obj);

// Whether `obj` is the object that means "in place" as a send buffer (mpi4py's MPI.IN_PLACE).
bool is_in_place(const pybind11::object& obj);
// Registers that object (called once at import).
void set_in_place(pybind11::object sentinel);

// The name of `obj`'s type, for messages.
std::string type_name(const pybind11::handle& obj);

}  // namespace zcoll::bind
