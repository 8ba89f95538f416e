#include "bindings.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "zcoll's private C++ core: shared arena, node barrier, schedules, exchange, copy kernels, "
      "topology";
  zcoll::bind::register_errors(m);
  zcoll::bind::register_registry(m);
  zcoll::bind::register_arena(m);
  zcoll::bind::register_schedule(m);
  zcoll::bind::register_exchange(m);
  zcoll::bind::register_heap(m);
  zcoll::bind::register_mpi(m);
  zcoll::bind::register_reduction(m);
  zcoll::bind::register_vexchange(m);
  zcoll::bind::register_transfer(m);
  zcoll::bind::register_plan(m);
  zcoll::bind::register_tuning(m);
  zcoll::bind::register_topology(m);
  zcoll::bind::register_copy(m);
  zcoll::bind::register_departure(m);
}
