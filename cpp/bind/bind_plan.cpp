// Plan: a persistent collective (plan.hpp) with the arrays it runs on. The binding converts the
// arrays once, keeps them alive as long as the plan, and releases the GIL whenever a run blocks.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "arrays.hpp"
#include "bindings.hpp"
#include "gil.hpp"
#include "zcoll/error.hpp"
#include "zcoll/plan.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

// A plan and the Python objects behind its pointers.
struct bound_plan {
  std::unique_ptr<persistent_plan> plan;
  py::object send;  // the array, or the in-place sentinel
  py::object recv;
  std::size_t bytes = 0;  // what a run receives on this rank (GIL release rule)

  persistent_plan& usable() {
    if (plan->freed()) throw usage_error("zcoll: this plan was freed");
    return *plan;
  }
  node_context& context() { return *usable().context(); }
};

// Why `send` / `recv` cannot back a plan (empty when they can). A plan keeps their addresses,
// so they are never copied: a copy would not see what the caller writes between runs.
std::string unusable(const py::object& send, const py::object& recv) {
  if (!py::isinstance<py::array>(recv))
    return "recvbuf must be a numpy.ndarray, got " + type_name(recv);
  if (is_in_place(send)) return {};
  if (!py::isinstance<py::array>(send))
    return "sendbuf of a plan must be a numpy.ndarray (a plan reads it on every run), got " +
           type_name(send);
  if (!(py::reinterpret_borrow<py::array>(send).flags() & py::array::c_style))
    return "sendbuf of a plan must be C-contiguous (a plan reads it in place on every run; "
           "pass numpy.ascontiguousarray(sendbuf) and write into that)";
  return {};
}

std::unique_ptr<bound_plan> make_plan(const std::shared_ptr<node_context>& ctx,
                                      const std::string& op_name, py::object send, py::object recv,
                                      int order, int copy) {
  const auto op = parse_name<op_code>(op_name);
  if (!op || tuned_index(*op) == no_rules)
    throw std::invalid_argument("no collective is named '" + op_name + "'");
  const std::string why = unusable(send, recv);
  if (!why.empty()) {
    py::gil_scoped_release release;
    ctx->fail(arg_error::type, "zcoll." + op_name + "_init: " + why);
  }
  const array_view recv_view = view_of(py::reinterpret_borrow<py::array>(recv));
  array_view send_view;
  const bool in_place = is_in_place(send);
  if (!in_place) send_view = view_of(py::reinterpret_borrow<py::array>(send));
  auto bound = std::make_unique<bound_plan>();
  {
    py::gil_scoped_release release;
    bound->plan = std::make_unique<persistent_plan>(ctx, *op, in_place ? nullptr : &send_view,
                                                    recv_view, order, copy);
  }
  bound->send = std::move(send);
  bound->recv = std::move(recv);
  bound->bytes = recv_view.nbytes;
  return bound;
}

template <class Step>
auto blocking(bound_plan& b, Step step) {
  persistent_plan& plan = b.usable();
  gil_released_on_block gil(*plan.context(), b.bytes);
  return step(plan);
}

std::string order_name(const collective_args& a) {
  return std::string(a.eager ? eager_name : name_of(a.order));
}

}  // namespace

void register_plan(py::module_& m) {
  py::class_<bound_plan>(m, "Plan", "A persistent collective (see plan.hpp).")
      .def(py::init(&make_plan), py::arg("context"), py::arg("op"), py::arg("sendbuf"),
           py::arg("recvbuf"), py::arg("order"), py::arg("copy"))
      .def("__call__",
           [](bound_plan& b) {
             blocking(b, [](persistent_plan& p) { p.run(); });
             return b.recv;
           })
      .def("start", [](bound_plan& b) { blocking(b, [](persistent_plan& p) { p.start(); }); })
      .def("wait", [](bound_plan& b) { blocking(b, [](persistent_plan& p) { p.wait(); }); })
      .def("test",
           [](bound_plan& b) { return blocking(b, [](persistent_plan& p) { return p.test(); }); })
      .def("free",
           [](bound_plan& b) {
             if (b.plan->freed()) return;
             {
               py::gil_scoped_release release;
               b.plan->free();
             }
             b.send = py::none();
             b.recv = py::none();
           })
      .def_property_readonly("active", [](const bound_plan& b) { return b.plan->active(); })
      .def_property_readonly("freed", [](const bound_plan& b) { return b.plan->freed(); })
      .def_property_readonly("id", [](const bound_plan& b) { return b.plan->id(); })
      .def_property_readonly("sendbuf", [](const bound_plan& b) { return b.send; })
      .def_property_readonly("recvbuf", [](const bound_plan& b) { return b.recv; })
      .def_property_readonly("op", [](const bound_plan& b) { return name_of(b.plan->args().op); })
      .def_property_readonly("order",
                             [](const bound_plan& b) { return order_name(b.plan->args()); })
      .def_property_readonly("copy_mode",
                             [](const bound_plan& b) { return name_of(b.plan->copy().mode); })
      .def_property_readonly("copy_threshold",
                             [](const bound_plan& b) { return b.plan->copy().threshold; });
  m.def(
      "plan_buffers_error",
      [](const py::object& send, const py::object& recv) -> std::optional<std::string> {
        std::string why = unusable(send, recv);
        if (why.empty()) return std::nullopt;
        return why;
      },
      py::arg("sendbuf"), py::arg("recvbuf"),
      "Why these buffers cannot back a plan (None when they can): a plan never copies them.");
}

}  // namespace zcoll::bind
