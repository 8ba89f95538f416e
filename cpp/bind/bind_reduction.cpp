// Reductions on a NodeContext (reduction.hpp): allreduce, reduce, reduce_scatter_block and
// bcast among the ranks of a node, their call records for the multi-node path, the cost model
// of algorithm="auto", the local fold the multi-node path combines nodes' results with, and the
// one-crossing call path.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "context_class.hpp"
#include "fast_path.hpp"
#include "gil.hpp"
#include "rounds.hpp"
#include "zcoll/aggregate.hpp"
#include "zcoll/error.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/reduce_kernels.hpp"
#include "zcoll/spread_reduction.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

op_code reduction_op(int code) {
  if (!is_code<op_code>(code) || !is_reduction(static_cast<op_code>(code)))
    throw std::invalid_argument("not the code of a reduction: " + std::to_string(code));
  return static_cast<op_code>(code);
}

// Converts (sendbuf, recvbuf) -- sendbuf IN_PLACE or None: no send view; recvbuf None: no
// receive view -- and calls ok(send view or nullptr, recv view or nullptr), or error(message)
// when an argument cannot be converted.
template <class Ok, class Error>
auto with_reduction_views(op_code op, const py::object& send, const py::object& recv, Ok&& ok,
                          Error&& error) {
  array_view recv_view;
  const bool has_recv = !recv.is_none();
  if (has_recv) {
    if (!py::isinstance<py::array>(recv))
      return error(std::string(op == op_code::bcast ? "buf" : "recvbuf") +
                   " must be a numpy.ndarray, got " + type_name(recv));
    recv_view = view_of(py::reinterpret_borrow<py::array>(recv));
  }
  const array_view* r = has_recv ? &recv_view : nullptr;
  if (is_in_place(send) || send.is_none()) return ok(nullptr, r);
  const py::array send_array = as_c_array(send);  // alive until the call returns
  if (!send_array) return error(std::string("sendbuf cannot be converted to a NumPy array"));
  const array_view send_view = view_of(send_array);
  return ok(&send_view, r);
}

void run(node_context& ctx, op_code op, const py::object& send, const py::object& recv, int reduce,
         int algorithm, int root) {
  with_reduction_views(
      op, send, recv,
      [&](const array_view* s, const array_view* r) {
        gil_released_on_block gil(ctx, s ? s->nbytes : (r ? r->nbytes : 0));
        ctx.run_reduction({op, s, r, reduce, algorithm, root});
      },
      [&](const std::string& why) {
        py::gil_scoped_release release;
        ctx.fail(arg_error::type, public_call_prefix(op) + why);
      });
}

call_record describe(const node_context& ctx, op_code op, const py::object& send,
                     const py::object& recv, int reduce, int algorithm, int root) {
  return with_reduction_views(
      op, send, recv,
      [&](const array_view* s, const array_view* r) {
        return ctx.describe_reduction({op, s, r, reduce, algorithm, root});
      },
      [&](const std::string& why) {
        return error_record(arg_error::type, public_call_prefix(op) + why);
      });
}

// A reduction or bcast on several nodes, whole (across_nodes.hpp): the arguments converted
// here, the call's record (or the conversion's error, which the round raises on every rank).
void reduction_across_nodes(node_context& ctx, op_code op, const py::object& send,
                            const py::object& recv, int reduce, int algorithm, int root,
                            const nodes_route& route) {
  const call_record record = describe(ctx, op, send, recv, reduce, algorithm, root);
  with_reduction_views(
      op, send, recv,
      [&](const array_view* s, const array_view* r) {
        const reduction_call call{op, s, r, reduce, algorithm, root};
        py::gil_scoped_release release;
        zcoll::reduction_across_nodes(ctx, op, &call, record, route);
      },
      [&](const std::string&) {
        py::gil_scoped_release release;
        zcoll::reduction_across_nodes(ctx, op, nullptr, record, route);
      });
}

// The code of a name of `Enum`, "auto" as `auto_code`, or `none` for anything else. The names
// are interned once, so the usual call (a literal such as op="sum") is one identity match.
template <class Enum>
int code_of(PyObject* name, int auto_code, int none) {
  static PyObject* auto_str = PyUnicode_InternFromString(std::string(auto_name).c_str());
  static const auto interned = [] {
    std::array<PyObject*, count_of<Enum>> names{};
    for (int i = 0; i < count_of<Enum>; ++i)
      names[static_cast<std::size_t>(i)] =
          PyUnicode_InternFromString(std::string(name_of(static_cast<Enum>(i))).c_str());
    return names;
  }();
  if (name == auto_str) return auto_code;
  for (int i = 0; i < count_of<Enum>; ++i)
    if (name == interned[static_cast<std::size_t>(i)]) return i;
  if (!PyUnicode_CheckExact(name)) return none;
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(name, &size);
  if (!text) {
    PyErr_Clear();
    return none;
  }
  const std::string_view view(text, static_cast<std::size_t>(size));
  if (view == auto_name) return auto_code;
  const auto value = parse_name<Enum>(view);
  return value ? static_cast<int>(*value) : none;
}

// mpi4py's predefined operations (MPI.SUM ...), by reduce_op code (set_mpi_ops, called once by
// Python): op=MPI.SUM is matched by identity, as an interned name is, so a call given one
// takes this path too. An equal Op object of another identity goes to the Python path.
std::array<PyObject*, count_of<reduce_op>> mpi_ops{};

int reduce_op_code(PyObject* op, int none) {
  const int code = code_of<reduce_op>(op, none, none);
  if (code != none) return code;
  for (int i = 0; i < count_of<reduce_op>; ++i)
    if (op == mpi_ops[static_cast<std::size_t>(i)]) return i;
  return none;
}

void set_mpi_ops(const py::dict& ops) {
  for (const auto& [name, op] : ops) {
    const auto code = parse_name<reduce_op>(py::cast<std::string>(name));
    if (!code)
      throw py::value_error("set_mpi_ops: no reduce op " + py::str(name).cast<std::string>());
    PyObject*& slot = mpi_ops[static_cast<std::size_t>(*code)];
    Py_XDECREF(slot);
    slot = py::reinterpret_borrow<py::object>(op).release().ptr();  // kept for good
  }
}

// fast_reduction(op code, comm, sendbuf, recvbuf, op, algorithm, root): the reduction on the
// communicator's registered context in one crossing, returning True; None, having done
// nothing, when the Python path must run it (no registered context, an op or algorithm given
// other than by a valid name or, for the op, mpi4py's predefined MPI.Op).
PyObject* fast_reduction(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  constexpr int none = -100;
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError,
                    "fast_reduction(code, comm, sendbuf, recvbuf, op, algorithm, root)");
    return nullptr;
  }
  try {
    const long code = PyLong_AsLong(args[0]);
    const long root = PyLong_AsLong(args[6]);
    if (PyErr_Occurred()) return nullptr;
    const op_code op = reduction_op(static_cast<int>(code));
    nodes_route route;
    std::shared_ptr<node_context> ctx = registered_context(args[1]);
    const bool across_nodes = !ctx && (ctx = registered_route(args[1], route));
    const int reduce = op == op_code::bcast ? 0 : reduce_op_code(args[4], none);
    const int algorithm = op == op_code::bcast
                              ? auto_algorithm
                              : code_of<reduce_algorithm>(args[5], auto_algorithm, none);
    if (!ctx || reduce == none || algorithm == none || root < INT32_MIN || root > INT32_MAX)
      Py_RETURN_NONE;
    const auto send = py::reinterpret_borrow<py::object>(args[2]);
    const auto recv = py::reinterpret_borrow<py::object>(args[3]);
    if (across_nodes) {
      if (ctx->closed()) Py_RETURN_NONE;
      reduction_across_nodes(*ctx, op, send, recv, reduce, algorithm, static_cast<int>(root),
                             route);
      Py_RETURN_TRUE;
    }
    run(*ctx, op, send, recv, reduce, algorithm, static_cast<int>(root));
    Py_RETURN_TRUE;
  } catch (...) {
    py::detail::try_translate_exceptions();
    return nullptr;
  }
}

// fast_barrier(comm): the node barrier of the communicator's registered context in one
// crossing, returning True; None, having done nothing, when the Python path must run it.
PyObject* fast_barrier(PyObject*, PyObject* comm) {
  try {
    nodes_route route;
    std::shared_ptr<node_context> ctx = registered_context(comm);
    if (!ctx) {
      // Several nodes: one round of records is a barrier of the whole communicator (a node's
      // messages leave after all its ranks arrived; a rank leaves after its node received them
      // all).
      ctx = registered_route(comm, route);
      if (!ctx || ctx->closed()) Py_RETURN_NONE;
      call_record record;
      record.call.op = op_code::barrier;
      {
        py::gil_scoped_release release;
        agree_across_nodes(*ctx, record, route, "zcoll.barrier (messages between nodes)");
      }
      Py_RETURN_TRUE;
    }
    gil_released_on_block gil(*ctx, 0);
    ctx->barrier();
    Py_RETURN_TRUE;
  } catch (...) {
    py::detail::try_translate_exceptions();
    return nullptr;
  }
}

PyMethodDef fast_barrier_def = {
    "fast_barrier", &fast_barrier, METH_O,
    "fast_barrier(comm): the barrier of a registered context in one crossing (True: on one "
    "node the node barrier, on several a round of records between nodes), or None having "
    "done nothing when the Python path must run it."};

PyMethodDef fast_reduction_def = {
    "fast_reduction", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_reduction)),
    METH_FASTCALL,
    "fast_reduction(code, comm, sendbuf, recvbuf, op, algorithm, root): runs a reduction (or a "
    "bcast of recvbuf) on a registered context in one crossing and returns True, or returns "
    "None having done nothing when the Python path must run it."};

// A cost model as Python passes it: (max_bytes, a seconds, b seconds per byte) per piece.
using cost_tuple = std::tuple<std::uint64_t, double, double>;

// The reductions among a node's ranks and their call records.
void def_node_reductions(context_class& cls) {
  cls.def(
      "reduction",
      [](node_context& ctx, int code, const py::object& send, const py::object& recv, int reduce,
         int algorithm,
         int root) { run(ctx, reduction_op(code), send, recv, reduce, algorithm, root); },
      py::arg("code"), py::arg("sendbuf"), py::arg("recvbuf").none(true), py::arg("op"),
      py::arg("algorithm"), py::arg("root"),
      "Collective: a reduction (op code: allreduce, reduce, reduce_scatter, bcast with the buffer "
      "as recvbuf) among this node's ranks; raises on every rank when any rank's arguments are "
      "invalid.");
  cls.def(
      "reduction_record",
      [](const node_context& ctx, int code, const py::object& send, const py::object& recv,
         int reduce, int algorithm, int root) {
        return record_bytes(describe(ctx, reduction_op(code), send, recv, reduce, algorithm, root));
      },
      py::arg("code"), py::arg("sendbuf"), py::arg("recvbuf").none(true), py::arg("op"),
      py::arg("algorithm"), py::arg("root"),
      "Local: this rank's call record of such a call, for agree() across nodes.");
}

// A reduction or bcast on several nodes, whole, as the one crossing runs it.
void def_reductions_across_nodes(context_class& cls) {
  cls.def(
      "nodes_reduction_call",
      [](node_context& ctx, int code, const py::object& send, const py::object& recv, int reduce,
         int algorithm, int root, const nodes_route& route) {
        reduction_across_nodes(ctx, reduction_op(code), send, recv, reduce, algorithm, root, route);
      },
      py::arg("code"), py::arg("sendbuf"), py::arg("recvbuf").none(true), py::arg("op"),
      py::arg("algorithm"), py::arg("root"), py::arg("route"),
      "Collective (communicator): a reduction or bcast on several nodes, whole, with the "
      "messages from C++: small calls in the round that agrees on the records, larger ones "
      "spread over the ranks after it.");
}

// What algorithm="auto" runs: the cost models and their answer.
void def_reduction_policy(context_class& cls) {
  cls.def(
      "set_reduction_model",
      [](node_context& ctx, int algorithm, const std::vector<cost_tuple>& pieces) {
        if (!is_code<reduce_algorithm>(algorithm))
          throw std::invalid_argument("unknown algorithm code " + std::to_string(algorithm));
        std::vector<reduction_cost> costs;
        for (const auto& [max_bytes, a, b] : pieces) costs.push_back({max_bytes, a, b});
        ctx.policy().set_reduction_model(static_cast<reduce_algorithm>(algorithm),
                                         std::move(costs));
      },
      py::arg("algorithm"), py::arg("pieces"),
      "Local (same on every node rank): the cost model of an algorithm, (max_bytes, a, b) per "
      "piece; [] restores the built-in estimate.");
  cls.def(
      "reduction_choice",
      [](const node_context& ctx, std::size_t bytes, bool private_inputs) {
        return std::string(name_of(ctx.reduction_choice(bytes, private_inputs)));
      },
      py::arg("nbytes"), py::arg("private_inputs") = false,
      "The algorithm algorithm='auto' runs for nbytes per rank (private_inputs: some rank's "
      "input is outside shared memory).");
  cls.def(
      "reduction_cost",
      [](const node_context& ctx, int algorithm, std::size_t bytes) {
        if (!is_code<reduce_algorithm>(algorithm))
          throw std::invalid_argument("unknown algorithm code " + std::to_string(algorithm));
        return ctx.policy().predicted(static_cast<reduce_algorithm>(algorithm), bytes);
      },
      py::arg("algorithm"), py::arg("nbytes"),
      "Predicted seconds of an algorithm for nbytes per rank (the model algorithm='auto' uses).");
}

// Which dtypes and ops reduce, and the spread's segment.
void register_reduction_support(py::module_& m) {
  m.def(
      "reduction_supported",
      [](const py::dtype& dtype, int reduce) {
        const dtype_id d{static_cast<std::uint32_t>(static_cast<unsigned char>(dtype.char_())),
                         static_cast<std::uint32_t>(dtype.itemsize())};
        const auto type = element_type_of(d);
        return type && is_code<reduce_op>(reduce) &&
               op_defined(static_cast<reduce_op>(reduce), *type);
      },
      py::arg("dtype"), py::arg("op"), "Whether the reductions define op code `op` for dtype.");
  m.attr("SPREAD_SEGMENT_BYTES") = spread_segment_bytes;
}

// The one-crossing call path of reductions and the barrier.
void register_fast_reductions(py::module_& m) {
  m.add_object("fast_barrier", py::reinterpret_steal<py::object>(PyCFunction_NewEx(
                                   &fast_barrier_def, nullptr, m.attr("__name__").ptr())));
  m.add_object("fast_reduction", py::reinterpret_steal<py::object>(PyCFunction_NewEx(
                                     &fast_reduction_def, nullptr, m.attr("__name__").ptr())));
  m.def("set_mpi_ops", &set_mpi_ops, py::arg("ops"),
        "Once, from Python: mpi4py's predefined MPI.Op objects by the op names they mean, which "
        "fast_reduction then takes as those names (by identity).");
}

}  // namespace

void register_reduction(py::module_& m) {
  context_class cls = bound_context(m);
  def_node_reductions(cls);
  def_reductions_across_nodes(cls);
  def_reduction_policy(cls);
  register_reduction_support(m);
  register_fast_reductions(m);
}

}  // namespace zcoll::bind
