// Registration functions, one per concept; module.cpp only calls them. Each is a list of short
// register_* (module) or def_* (class) helpers, one per bound concept, each a list of .defs.
#pragma once

#include <pybind11/pybind11.h>

namespace zcoll::bind {
void register_errors(pybind11::module_& m);
void register_registry(pybind11::module_& m);
void register_arena(pybind11::module_& m);
void register_copy(pybind11::module_& m);
void register_departure(pybind11::module_& m);
void register_exchange(pybind11::module_& m);
void register_heap(pybind11::module_& m);
void register_mpi(pybind11::module_& m);  // bind_mpi.cpp, or bind_no_mpi.cpp without MPI
void register_reduction(pybind11::module_& m);
void register_transfer(pybind11::module_& m);
void register_plan(pybind11::module_& m);
void register_tuning(pybind11::module_& m);
void register_schedule(pybind11::module_& m);
void register_topology(pybind11::module_& m);
void register_vexchange(pybind11::module_& m);
}  // namespace zcoll::bind
