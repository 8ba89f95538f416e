// Persistent plans (plan.hpp, transfer_plan.hpp) as Python objects: what Plan and TransferPlan
// share. The binding converts the arrays once, keeps them alive as long as the plan (and the
// arrays a started run was given, until it finishes), and releases the GIL whenever a run
// blocks.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <string>

#include "gil.hpp"
#include "zcoll/error.hpp"
#include "zcoll/plan.hpp"

namespace zcoll::bind {

// A plan and the Python objects behind its pointers.
template <class Plan>
struct bound_plan {
  std::unique_ptr<Plan> plan;
  pybind11::object send;  // the array, or the in-place sentinel
  pybind11::object recv;
  pybind11::object run_send;  // arrays a started run was given in place of the plan's (or None)
  pybind11::object run_recv;
  std::size_t bytes = 0;  // what a run receives on this rank (GIL release rule)

  Plan& usable() {
    if (plan->freed()) throw usage_error("zcoll: this plan was freed");
    return *plan;
  }
  // The run is over: the arrays it was given may go.
  void settled() {
    if (plan->active()) return;
    run_send = pybind11::none();
    run_recv = pybind11::none();
  }
};

// Runs `step(plan)` with the GIL released whenever it blocks.
template <class Plan, class Step>
auto blocking(bound_plan<Plan>& b, Step step) {
  Plan& plan = b.usable();
  gil_released_on_block gil(*plan.context(), b.bytes);
  return step(plan);
}

// Registers what every plan class has besides its constructor, __call__ and start: wait, test,
// free, and the run's state.
template <class Plan>
void def_plan_runs(pybind11::class_<bound_plan<Plan>>& cls) {
  namespace py = pybind11;
  using bound = bound_plan<Plan>;
  cls.def("wait",
          [](bound& b) {
            blocking(b, [](Plan& p) { p.wait(); });
            b.settled();
          })
      .def("test",
           [](bound& b) {
             const bool done = blocking(b, [](Plan& p) { return p.test(); });
             b.settled();
             return done;
           })
      .def("free",
           [](bound& b) {
             if (b.plan->freed()) return;
             {
               py::gil_scoped_release release;
               b.plan->free();
             }
             b.send = py::none();
             b.recv = py::none();
             b.settled();
           })
      .def_property_readonly("active", [](const bound& b) { return b.plan->active(); })
      .def_property_readonly("freed", [](const bound& b) { return b.plan->freed(); })
      .def_property_readonly("id", [](const bound& b) { return b.plan->id(); })
      .def_property_readonly("copy_mode",
                             [](const bound& b) { return name_of(b.plan->copy().mode); })
      .def_property_readonly("copy_threshold",
                             [](const bound& b) { return b.plan->copy().threshold; });
}

}  // namespace zcoll::bind
