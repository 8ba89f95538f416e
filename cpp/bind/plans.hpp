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
  std::unique_ptr<plan_between_nodes> remote;  // several nodes: the blocks between them
  pybind11::object send;                       // the array, or the in-place sentinel
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

// A run's start: the blocks between nodes first (unless the node part refuses to start: its
// error comes before any message), then the node part.
template <class Plan>
void start_run(bound_plan<Plan>& b) {
  Plan& plan = b.usable();
  if (b.remote && !plan.active() && !plan.context()->closed() && !plan.context()->broken())
    b.remote->start();
  blocking(b, [](Plan& p) { p.start(); });
}

// A run's end: the node part, then the blocks between nodes.
template <class Plan>
void wait_run(bound_plan<Plan>& b) {
  blocking(b, [](Plan& p) { p.wait(); });
  if (b.remote) {
    pybind11::gil_scoped_release release;
    b.remote->wait();
  }
  b.settled();
}

// One run, whole.
template <class Plan>
void run_once(bound_plan<Plan>& b) {
  if (!b.remote) {
    blocking(b, [](Plan& p) { p.run(); });
    return;
  }
  start_run(b);
  wait_run(b);
}

// Registers what every plan class has besides its constructor, __call__ (run_once) and start
// (start_run): wait, test, free, and the run's state.
template <class Plan>
void def_plan_runs(pybind11::class_<bound_plan<Plan>>& cls) {
  namespace py = pybind11;
  using bound = bound_plan<Plan>;
  auto release_all = [](bound& b) {
    {
      py::gil_scoped_release release;
      b.plan->free();
    }
    b.remote.reset();  // its requests freed (MPI finishes any still in flight)
    b.send = py::none();
    b.recv = py::none();
    b.settled();
  };
  cls.def("wait", [](bound& b) { wait_run(b); })
      .def("test",
           [](bound& b) {
             bool done = blocking(b, [](Plan& p) { return p.test(); });
             if (done && b.remote) done = b.remote->test();
             b.settled();
             return done;
           })
      .def("free",
           [release_all](bound& b) {
             if (b.plan->freed()) return;
             if (b.remote && b.remote->failed()) {
               // Messages in flight may never finish, and MPI may still write into the
               // arrays: the requests and the arrays they point into are kept, not freed.
               static_cast<void>(b.remote.release());
             }
             try {  // a run whose messages are still in flight finishes first
               if (b.remote && (b.plan->active() || !b.remote->test())) wait_run(b);
             } catch (...) {
               release_all(b);
               throw;
             }
             release_all(b);
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
