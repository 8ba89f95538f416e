// Global transposes on a NodeContext (transfer.hpp, transfer_exec.cpp), and TransferPlan: a
// persistent transfer (transfer_plan.hpp) with the arrays it runs on (see plans.hpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "context_class.hpp"
#include "gil.hpp"
#include "plans.hpp"
#include "rounds.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/transfer_plan.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

transfer_geometry make_geometry(const std::vector<std::uint64_t>& shape, int axis_a, int axis_b,
                                std::size_t itemsize, int comm_size) {
  transfer_geometry g;
  g.ndim = static_cast<int>(shape.size());
  std::copy_n(shape.begin(), std::min<std::size_t>(shape.size(), max_transfer_dims),
              g.shape.begin());
  g.axis_a = axis_a;
  g.axis_b = axis_b;
  g.itemsize = itemsize;
  g.comm_size = comm_size;
  return g;
}

constexpr const char* not_arrays = "expected numpy.ndarray arrays, got ";

// Converts a transfer's arrays and returns ok(geometry, send view, recv view), or
// error(TypeError message, without the call's name) when one of them is not an ndarray (as
// with_views in bind_exchange.cpp).
template <class Ok, class Error>
auto with_transfer_views(const node_context& ctx, const py::object& send, const py::object& recv,
                         const std::vector<std::uint64_t>& shape, int axis_a, int axis_b, Ok&& ok,
                         Error&& error) {
  for (const py::object* a : {&send, &recv})
    if (!py::isinstance<py::array>(*a)) return error(not_arrays + type_name(*a));
  const array_view send_view = view_of(py::reinterpret_borrow<py::array>(send));
  const array_view recv_view = view_of(py::reinterpret_borrow<py::array>(recv));
  return ok(make_geometry(shape, axis_a, axis_b, recv_view.dtype.itemsize, ctx.config().comm_size),
            send_view, recv_view);
}

void transfer(node_context& ctx, const py::object& send, const py::object& recv,
              const std::vector<std::uint64_t>& shape, int axis_a, int axis_b, int order,
              int copy) {
  with_transfer_views(
      ctx, send, recv, shape, axis_a, axis_b,
      [&](const transfer_geometry& g, const array_view& send_view, const array_view& recv_view) {
        gil_released_on_block gil(ctx, recv_view.nbytes);
        ctx.run_transfer(g, send_view, recv_view, order, copy);
      },
      [&](const std::string& why) {
        py::gil_scoped_release release;
        ctx.fail(arg_error::type, "zcoll.transfer: " + why);
      });
}

py::bytes transfer_record(node_context& ctx, const py::object& send, const py::object& recv,
                          const std::vector<std::uint64_t>& shape, int axis_a, int axis_b,
                          int order, int copy, bool planned) {
  const char* name = planned ? "zcoll.transfer_init: " : "zcoll.transfer: ";
  return record_bytes(with_transfer_views(
      ctx, send, recv, shape, axis_a, axis_b,
      [&](const transfer_geometry& g, const array_view& send_view, const array_view& recv_view) {
        call_record r = ctx.describe_transfer(g, send_view, recv_view, order, copy);
        if (!planned || r.call.op == op_code::error) return r;
        // A plan keeps the arrays' addresses: they must be in the arena (the node part would
        // raise on the nodes where one is not; this way every rank raises).
        for (const array_view* a : {&send_view, &recv_view})
          if (ctx.where(a->data, a->nbytes).segment == 0)
            return error_record(
                arg_error::value,
                std::string(name) + (a == &send_view ? "the source" : "the destination") +
                    " array is not in the shared arena (allocate it with zcoll.empty)");
        r.call.target = r.call.op;
        r.call.op = op_code::plan;
        return r;
      },
      [&](const std::string& why) { return error_record(arg_error::type, name + why); }));
}

// -- TransferPlan ------------------------------------------------------------------------------

using bound_transfer = bound_plan<transfer_plan>;

std::unique_ptr<bound_transfer> make_transfer_plan(const std::shared_ptr<node_context>& ctx,
                                                   py::object send, py::object recv,
                                                   const std::vector<std::uint64_t>& shape,
                                                   int axis_a, int axis_b, int order, int copy) {
  auto bound = std::make_unique<bound_transfer>();
  with_transfer_views(
      *ctx, send, recv, shape, axis_a, axis_b,
      [&](const transfer_geometry& g, const array_view& send_view, const array_view& recv_view) {
        py::gil_scoped_release release;
        bound->plan = std::make_unique<transfer_plan>(ctx, g, send_view, recv_view, order, copy);
        bound->bytes = recv_view.nbytes;
      },
      [&](const std::string& why) {
        py::gil_scoped_release release;
        ctx->fail(arg_error::type, "zcoll.transfer_init: " + why);
      });
  bound->send = std::move(send);
  bound->recv = std::move(recv);
  return bound;
}

// TransferPlan(forward, copy): the plan of `forward`'s inverse transfer, agreeing on nothing.
std::unique_ptr<bound_transfer> make_reversed_plan(bound_transfer& forward, int copy) {
  if (forward.remote)
    throw usage_error("zcoll.transfer_init: a plan across nodes is not reversed (make both)");
  auto bound = std::make_unique<bound_transfer>();
  bound->plan = forward.usable().reversed(copy);
  bound->bytes = static_cast<std::size_t>(py::reinterpret_borrow<py::array>(forward.send).nbytes());
  bound->send = forward.recv;
  bound->recv = forward.send;
  return bound;
}

// Calls `use(send view or nullptr, recv view or nullptr)` with the arrays a run was given
// (None: the plan's own), or `error(TypeError message)` when one is not an array.
template <class Use, class Error>
auto with_run_views(bound_transfer& b, const py::object& send, const py::object& recv, Use&& use,
                    Error&& error) {
  b.usable();
  for (const py::object* a : {&send, &recv})
    if (!a->is_none() && !py::isinstance<py::array>(*a))
      return error("zcoll.transfer: " + std::string(not_arrays) + type_name(*a));
  array_view send_view, recv_view;
  if (!send.is_none()) send_view = view_of(py::reinterpret_borrow<py::array>(send));
  if (!recv.is_none()) recv_view = view_of(py::reinterpret_borrow<py::array>(recv));
  return use(send.is_none() ? nullptr : &send_view, recv.is_none() ? nullptr : &recv_view);
}

// A run given something else than arrays: every rank raises.
auto fail_run(bound_transfer& b) {
  return [&b](const std::string& why) {
    py::gil_scoped_release release;
    b.plan->context()->fail(arg_error::type, why);
  };
}

// TransferPlan.record(): this rank's call record of a run on these arrays.
py::bytes run_record(bound_transfer& b, const py::object& send, const py::object& recv) {
  return record_bytes(with_run_views(
      b, send, recv,
      [&](const array_view* s, const array_view* r) { return b.plan->describe_start(s, r); },
      [](const std::string& why) { return error_record(arg_error::type, why); }));
}

// A round between nodes that only agrees on the ranks' records, the GIL released.
void agree(node_context& ctx, const call_record& record, const nodes_route& route,
           const std::string& what) {
  py::gil_scoped_release release;
  agree_across_nodes(ctx, record, route, what);
}

// A transfer on several nodes, whole (across_nodes.hpp): the round that agrees on every rank's
// call (a conversion's error raises there, on every rank), then the rest with the GIL released.
void transfer_across_nodes(node_context& ctx, const py::object& send, const py::object& recv,
                           const std::vector<std::uint64_t>& shape, int axis_a, int axis_b,
                           int order, int copy, const nodes_route& route) {
  agree(ctx, record_of(transfer_record(ctx, send, recv, shape, axis_a, axis_b, order, copy, false)),
        route, "zcoll.transfer (messages between nodes)");
  with_transfer_views(
      ctx, send, recv, shape, axis_a, axis_b,
      [&](const transfer_geometry& g, const array_view& send_view, const array_view& recv_view) {
        py::gil_scoped_release release;
        zcoll::transfer_across_nodes(ctx, g, send_view, recv_view, order, copy, route);
      },
      [](const std::string&) {});  // the round raised already
}

// TransferPlan.start on several nodes: the plan's or the engine's error first (freed, active,
// closed: before any message), then the round that agrees on every rank's run, the messages
// between nodes posted on this run's arrays, then the node part.
void start_across_nodes(bound_transfer& b, transfer_between_nodes& remote, const py::object& send,
                        const py::object& recv) {
  transfer_plan& plan = b.usable();
  if (plan.active() || plan.context()->closed() || plan.context()->broken()) {
    blocking(b, [](transfer_plan& p) { p.start(); });  // raises the engine's error
    return;
  }
  {
    const call_record record = record_of(run_record(b, send, recv));
    py::gil_scoped_release release;
    remote.agree(record);
  }
  auto data = [](const py::object& given, const py::object& own) {
    return const_cast<void*>(
        py::reinterpret_borrow<py::array>(given.is_none() ? own : given).data());
  };
  remote.set_arrays(data(recv, b.recv), data(send, b.send));
  with_run_views(
      b, send, recv,
      [&](const array_view* s, const array_view* r) {
        remote.start();
        blocking(b, [&](transfer_plan& p) { p.start(s, r); });
      },
      fail_run(b));
  b.run_send = send;
  b.run_recv = recv;
}

void start_transfer(bound_transfer& b, const py::object& send, const py::object& recv) {
  if (auto* remote = dynamic_cast<transfer_between_nodes*>(b.remote.get()))
    return start_across_nodes(b, *remote, send, recv);
  if (send.is_none() && recv.is_none()) {
    blocking(b, [](transfer_plan& p) { p.start(); });
    return;
  }
  with_run_views(
      b, send, recv,
      [&](const array_view* s, const array_view* r) {
        blocking(b, [&](transfer_plan& p) { p.start(s, r); });
      },
      fail_run(b));
  b.run_send = send;
  b.run_recv = recv;
}

// TransferPlan(): one run, on the plan's arrays or (`src` / `dst`) others for this run.
py::object run_plan(bound_transfer& b, const py::object& send, const py::object& recv) {
  if (b.remote) {
    start_transfer(b, send, recv);
    wait_run(b);
    return recv.is_none() ? b.recv : recv;
  }
  if (send.is_none() && recv.is_none()) {
    blocking(b, [](transfer_plan& p) { p.run(); });
    return b.recv;
  }
  with_run_views(
      b, send, recv,
      [&](const array_view* s, const array_view* r) {
        blocking(b, [&](transfer_plan& p) {
          p.start(s, r);
          p.wait();
        });
      },
      fail_run(b));
  return recv.is_none() ? b.recv : recv;
}

// The node's part of a transfer, and its call record.
void def_node_transfers(context_class& cls) {
  cls.def("transfer", &transfer, py::arg("src"), py::arg("dst"), py::arg("shape"),
          py::arg("axis_a"), py::arg("axis_b"), py::arg("order"), py::arg("copy") = auto_copy,
          "Collective: the node's blocks of a global transpose (see transfer.hpp).");
  cls.def("transfer_record", &transfer_record, py::arg("src"), py::arg("dst"), py::arg("shape"),
          py::arg("axis_a"), py::arg("axis_b"), py::arg("order"), py::arg("copy") = auto_copy,
          py::arg("planned") = false,
          "Local: this rank's call record of a transfer (of a transfer plan's creation when "
          "planned), for agree() across nodes.");
  cls.def(
      "nodes_transfer",
      [](node_context& ctx, const py::object& src, const py::object& dst,
         const std::vector<std::uint64_t>& shape, int axis_a, int axis_b, int order, int copy,
         const nodes_route& route) {
        transfer_across_nodes(ctx, src, dst, shape, axis_a, axis_b, order, copy, route);
      },
      py::arg("src"), py::arg("dst"), py::arg("shape"), py::arg("axis_a"), py::arg("axis_b"),
      py::arg("order"), py::arg("copy"), py::arg("route"),
      "Collective (communicator): a transfer on several nodes, whole: the round that agrees on "
      "every rank's call, the node's blocks, the blocks between nodes by MPI subarray "
      "messages.");
}

// TransferPlan's construction and runs.
void def_transfer_runs(py::class_<bound_transfer>& plan) {
  plan.def(py::init(&make_transfer_plan), py::arg("context"), py::arg("src"), py::arg("dst"),
           py::arg("shape"), py::arg("axis_a"), py::arg("axis_b"), py::arg("order"),
           py::arg("copy") = auto_copy);
  plan.def(py::init(&make_reversed_plan), py::arg("forward"), py::arg("copy"),
           "Local, at the same point on every rank: the plan of `forward`'s inverse transfer "
           "(its destination into its source), from what `forward`'s agreement resolved.");
  plan.def("__call__", &run_plan, py::arg("src") = py::none(), py::arg("dst") = py::none(),
           "Collective: one run; `src` / `dst` replace this rank's arrays for this run.");
  plan.def("start", &start_transfer, py::arg("src") = py::none(), py::arg("dst") = py::none());
  plan.def("record", &run_record, py::arg("src") = py::none(), py::arg("dst") = py::none(),
           "Local: this rank's call record of a run on these arrays, for agree() across nodes.");
  plan.def(
      "_attach_remote",
      [](bound_transfer& b, const nodes_route& route, int tag) {
        const auto& ctx = b.usable().context();
        b.remote = transfer_plan_blocks(ctx, b.plan->geometry(), route, tag);
      },
      py::arg("route"), py::arg("tag"),
      "Local, once after creation on several nodes: every run then agrees across nodes on its "
      "record (rounds on `route`) and exchanges the plan's blocks between nodes as MPI "
      "subarray messages with `tag`, in the same crossing.");
  def_plan_runs(plan);
}

// What a TransferPlan runs on: its arrays, geometry and order, and the arrays it may bind.
void def_transfer_state(py::class_<bound_transfer>& plan) {
  plan.def_property_readonly("src", [](const bound_transfer& b) { return b.send; })
      .def_property_readonly("dst", [](const bound_transfer& b) { return b.recv; })
      .def_property_readonly("order",
                             [](const bound_transfer& b) { return name_of(b.plan->order()); })
      .def_property_readonly("shape",
                             [](const bound_transfer& b) {
                               const transfer_geometry& g = b.plan->geometry();
                               return std::vector<std::uint64_t>(g.shape.begin(),
                                                                 g.shape.begin() + g.ndim);
                             })
      .def_property_readonly("axis_a",
                             [](const bound_transfer& b) { return b.plan->geometry().axis_a; })
      .def_property_readonly("axis_b",
                             [](const bound_transfer& b) { return b.plan->geometry().axis_b; })
      .def_property_readonly("copied_bytes",
                             [](const bound_transfer& b) { return b.plan->copied_bytes(); })
      .def_property_readonly(
          "pulls", [](const bound_transfer& b) { return b.plan->pulls(); },
          "Whether runs may bind plain (private) arrays, pulled by CMA.")
      .def(
          "accepts",
          [](const bound_transfer& b, const py::array& a) {
            return b.plan->accepts(a.data(), static_cast<std::size_t>(a.nbytes()));
          },
          py::arg("a"),
          "Local: whether a run may bind `a` (C-contiguous, of this rank's shape and dtype) "
          "without staging: shared memory, or any array when the plan pulls.");
}

// The block rule of mpi4py-fft's decompositions.
void register_block_share(py::module_& m) {
  m.def(
      "block_share",
      [](std::uint64_t n, int p, int rank) {
        if (p < 1 || rank < 0 || rank >= p) throw std::invalid_argument("need 0 <= rank < p");
        const axis_share s = block_share(n, p, rank);
        return py::make_tuple(s.count, s.start);
      },
      py::arg("n"), py::arg("p"), py::arg("rank"),
      "(count, start) of rank's block of n elements split over p ranks (mpi4py-fft's rule).");
}

}  // namespace

void register_transfer(py::module_& m) {
  context_class cls = bound_context(m);
  def_node_transfers(cls);
  py::class_<bound_transfer> plan(m, "TransferPlan",
                                  "A persistent transfer (see transfer_plan.hpp).");
  def_transfer_runs(plan);
  def_transfer_state(plan);
  register_block_share(m);
}

}  // namespace zcoll::bind
