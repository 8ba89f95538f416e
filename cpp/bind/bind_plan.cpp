// Plan: a persistent collective (plan.hpp) with the arrays it runs on (see plans.hpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "arrays.hpp"
#include "bindings.hpp"
#include "plans.hpp"
#include "rounds.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

using bound_collective = bound_plan<persistent_plan>;

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

std::unique_ptr<bound_collective> make_plan(const std::shared_ptr<node_context>& ctx,
                                            const std::string& op_name, py::object send,
                                            py::object recv, int order, int copy) {
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
  auto bound = std::make_unique<bound_collective>();
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

std::string order_name(const collective_args& a) {
  return std::string(a.eager ? eager_name : name_of(a.order));
}

}  // namespace

void register_plan(py::module_& m) {
  py::class_<bound_collective> cls(m, "Plan", "A persistent collective (see plan.hpp).");
  cls.def(py::init(&make_plan), py::arg("context"), py::arg("op"), py::arg("sendbuf"),
          py::arg("recvbuf"), py::arg("order"), py::arg("copy"))
      .def("__call__",
           [](bound_collective& b) {
             run_once(b);
             return b.recv;
           })
      .def("start", [](bound_collective& b) { start_run(b); });
  def_plan_runs(cls);
  cls.def(
      "_attach_remote",
      [](bound_collective& b, const nodes_route& route, int tag) {
        const persistent_plan& plan = b.usable();
        const array_view recv = view_of(py::reinterpret_borrow<py::array>(b.recv));
        array_view send;
        if (!is_in_place(b.send)) send = view_of(py::reinterpret_borrow<py::array>(b.send));
        b.remote = collective_plan_blocks(plan.context(), plan.args().op,
                                          is_in_place(b.send) ? nullptr : &send, recv, route, tag);
      },
      py::arg("route"), py::arg("tag"),
      "Local, once after creation on several nodes: the plan's runs also exchange its blocks "
      "between nodes (persistent requests on the route's private dup, with `tag`), in the same "
      "crossing.");
  cls.def_property_readonly("sendbuf", [](const bound_collective& b) { return b.send; })
      .def_property_readonly("recvbuf", [](const bound_collective& b) { return b.recv; })
      .def_property_readonly("op",
                             [](const bound_collective& b) { return name_of(b.plan->args().op); })
      .def_property_readonly("order",
                             [](const bound_collective& b) { return order_name(b.plan->args()); })
      .def_property_readonly(
          "path",
          [](const bound_collective& b) {
            static constexpr const char* names[] = {"empty", "eager", "ordered", "pulled"};
            return names[static_cast<int>(b.plan->path())];
          },
          "How a run moves the blocks: 'empty', 'eager' (the slots, one barrier), 'ordered' "
          "(block copies between two barriers) or 'pulled' (plain buffers read by CMA).")
      .def_property_readonly(
          "shadowed",
          [](const bound_collective& b) {
            return std::make_pair(b.plan->send_shadowed(), b.plan->recv_shadowed());
          },
          "(send, receive): whether each plain buffer has an arena copy (one more per run).");
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
