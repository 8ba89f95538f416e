// Irregular collectives (vexchange.hpp): patterns from neighbour lists, and one call's
// conversion (arrays -> views, counts -> spans); every check is the engine's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "context_class.hpp"
#include "fast_path.hpp"
#include "gil.hpp"
#include "plans.hpp"
#include "rounds.hpp"
#include "zcoll/aggregate.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/vexchange.hpp"
#include "zcoll/vplan.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

using counts_array = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;
using edges_array = py::array_t<std::int32_t, py::array::c_style | py::array::forcecast>;

// Lists given as arrays of shape (k, 2): (peer, tag) per entry.
std::vector<std::vector<v_edge>> edge_lists(const std::vector<edges_array>& lists) {
  std::vector<std::vector<v_edge>> out;
  out.reserve(lists.size());
  for (const auto& a : lists) {
    if (a.ndim() != 2 || a.shape(1) != 2)
      throw std::invalid_argument("an edge list is an int array of shape (k, 2): (peer, tag)");
    auto& list = out.emplace_back(static_cast<std::size_t>(a.shape(0)));
    const auto r = a.unchecked<2>();
    for (py::ssize_t i = 0; i < a.shape(0); ++i)
      list[static_cast<std::size_t>(i)] = {r(i, 0), r(i, 1)};
  }
  return out;
}

py::array_t<std::int64_t> tuple_array(const std::vector<v_tuple>& tuples) {
  py::array_t<std::int64_t> out({static_cast<py::ssize_t>(tuples.size()), py::ssize_t{4}});
  auto w = out.mutable_unchecked<2>();
  for (std::size_t i = 0; i < tuples.size(); ++i) {
    const auto k = static_cast<py::ssize_t>(i);
    w(k, 0) = tuples[i].src;
    w(k, 1) = tuples[i].dst;
    w(k, 2) = tuples[i].send_block;
    w(k, 3) = tuples[i].recv_block;
  }
  return out;
}

std::span<const std::int64_t> span_of(const counts_array& a) {
  return {a.data(), static_cast<std::size_t>(a.size())};
}

v_in_place in_place_code(int code) {
  if (code < 0 || code > static_cast<int>(v_in_place::swap))
    throw std::invalid_argument("unknown in-place code " + std::to_string(code));
  return static_cast<v_in_place>(code);
}

op_code irregular_op(int code) {
  if (!is_code<op_code>(code) || !is_irregular(static_cast<op_code>(code)))
    throw std::invalid_argument("not an irregular collective: code " + std::to_string(code));
  return static_cast<op_code>(code);
}

// Calls `f(call)` with `call` built from the Python arguments, or `error(message)` when a
// buffer cannot be converted.
template <class F, class Error>
auto with_call(int code, int pattern, const py::object& send, const py::object& recv, int in_place,
               const counts_array& send_counts, const counts_array& send_displs,
               const counts_array& recv_counts, const counts_array& recv_displs, int order,
               int copy, F&& f, Error&& error) {
  v_call call;
  call.op = irregular_op(code);
  call.pattern = pattern;
  call.in_place = in_place_code(in_place);
  call.send_counts = span_of(send_counts);
  call.send_displs = span_of(send_displs);
  call.recv_counts = span_of(recv_counts);
  call.recv_displs = span_of(recv_displs);
  call.order = order;
  call.copy = copy;
  if (!py::isinstance<py::array>(recv))
    return error("recvbuf must be a numpy.ndarray, got " + type_name(recv));
  const array_view recv_view = view_of(py::reinterpret_borrow<py::array>(recv));
  call.recv = &recv_view;
  if (is_in_place(send)) {
    if (call.in_place == v_in_place::none)
      return error(std::string("IN_PLACE is not allowed for this collective"));
    return f(call);
  }
  if (call.in_place != v_in_place::none)
    return error(std::string("an in-place call takes zcoll.IN_PLACE as sendbuf"));
  if (send.is_none()) return error(std::string("sendbuf is None (use zcoll.IN_PLACE)"));
  const py::array send_array = as_c_array(send);  // alive until the call returns
  if (!send_array) return error(std::string("sendbuf cannot be converted to a NumPy array"));
  const array_view send_view = view_of(send_array);
  call.send = &send_view;
  return f(call);
}

// An irregular call on several nodes, whole (across_nodes.hpp), the GIL released. `call`
// nullptr: this rank's arguments could not be converted (`record` says why; the round raises
// it on every rank).
void run_across_nodes(node_context& ctx, op_code op, const v_call* call, const call_record& record,
                      const nodes_route& route) {
  py::gil_scoped_release release;
  irregular_across_nodes(ctx, op, call, record, route);
}

// --- the one-crossing path -------------------------------------------------------------------
// fast_irregular parses mpi4py's buffer specifications itself, in the forms programs use on
// every call ([array, counts], [array, counts, displs], [array, (counts, displs)], plain
// arrays), on one node or (by its route) several; anything else (a datatype, the first call on
// a communicator) goes back to the Python path, which makes the pattern and raises the errors
// a parse can find. A call without recvbuf gets its result from Python first, then comes here.
namespace fast {

// One side of a call: the array and its blocks' counts and displacements in elements.
struct side {
  PyObject* array = nullptr;  // borrowed from the arguments
  std::vector<std::int64_t> counts, displs;
};

bool is_array(PyObject* o) {
  return py::isinstance<py::array>(o);
}

std::size_t array_size(PyObject* o) {
  return static_cast<std::size_t>(py::reinterpret_borrow<py::array>(o).size());
}

// An integer, a sequence of integers or a 1-D integer array as `blocks` values; one integer
// means that value for every block, or with `stride` (displacements) i times it for block i.
bool int_vector(PyObject* o, std::size_t blocks, std::vector<std::int64_t>& out,
                bool stride = false) {
  if (PyLong_CheckExact(o)) {
    const long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return PyErr_Clear(), false;
    out.resize(blocks);
    for (std::size_t i = 0; i < blocks; ++i) out[i] = stride ? static_cast<std::int64_t>(i) * v : v;
    return true;
  }
  if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject** items = PySequence_Fast_ITEMS(o);
    out.resize(static_cast<std::size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!PyLong_Check(items[i]) || PyBool_Check(items[i])) return false;
      out[static_cast<std::size_t>(i)] = PyLong_AsLongLong(items[i]);
      if (out[static_cast<std::size_t>(i)] == -1 && PyErr_Occurred()) return PyErr_Clear(), false;
    }
    return true;
  }
  if (!is_array(o)) return false;
  const auto a = py::reinterpret_borrow<py::array>(o);
  const char kind = a.dtype().kind();
  if (a.ndim() != 1 || (kind != 'i' && kind != 'u')) return false;
  const auto ints = counts_array::ensure(a);
  if (!ints) return PyErr_Clear(), false;
  out.assign(ints.data(), ints.data() + ints.size());
  return true;
}

void packed_displs(side& s) {
  s.displs.resize(s.counts.size());
  std::int64_t at = 0;
  for (std::size_t i = 0; i < s.counts.size(); ++i) {
    s.displs[i] = at;
    at += s.counts[i];
  }
}

// A v-variant's buffer specification with `blocks` entries, read as mpi4py reads it: a tuple
// as the second of two items is (counts, displs); an integer count is every block's, integer
// displacements a stride; no counts split the array as mpi4py does. A datatype anywhere (or
// anything else unusual) is left to the Python path.
bool vector_spec(PyObject* spec, std::size_t blocks, side& out) {
  PyObject *counts = nullptr, *displs = nullptr;
  if (is_array(spec)) {
    out.array = spec;
  } else if (PyList_CheckExact(spec) || PyTuple_CheckExact(spec)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(spec);
    PyObject** items = PySequence_Fast_ITEMS(spec);
    if (n < 2 || n > 3) return false;
    out.array = items[0];
    counts = items[1];
    if (n == 3) {
      displs = items[2];
    } else if (PyTuple_CheckExact(counts)) {
      if (PyTuple_GET_SIZE(counts) != 2) return false;
      displs = PyTuple_GET_ITEM(counts, 1);
      counts = PyTuple_GET_ITEM(counts, 0);
    }
  } else {
    return false;
  }
  if (!is_array(out.array)) return false;
  if (!counts) {
    const std::size_t size = array_size(out.array);
    out.counts.resize(blocks);
    for (std::size_t i = 0; i < blocks; ++i)
      out.counts[i] = static_cast<std::int64_t>(size / blocks + (i < size % blocks ? 1 : 0));
  } else if (!int_vector(counts, blocks, out.counts)) {
    return false;
  }
  if (!displs || displs == Py_None)
    packed_displs(out);
  else if (!int_vector(displs, blocks, out.displs, true))
    return false;
  return true;
}

// A plain array cut into `blocks` equal blocks.
bool strided_spec(PyObject* spec, std::size_t blocks, side& out) {
  if (!is_array(spec)) return false;
  out.array = spec;
  const std::size_t size = array_size(spec);
  if (blocks ? size % blocks != 0 : size != 0) return false;
  out.counts.assign(blocks, blocks ? static_cast<std::int64_t>(size / blocks) : 0);
  packed_displs(out);
  return true;
}

// A plain array sent whole to each of `blocks` peers.
bool whole_spec(PyObject* spec, std::size_t blocks, side& out) {
  if (!is_array(spec)) return false;
  out.array = spec;
  out.counts.assign(blocks, static_cast<std::int64_t>(array_size(spec)));
  out.displs.assign(blocks, 0);
  return true;
}

// Parses the arguments of `op` on the pattern's lists; false: the Python path must run it.
bool parse(op_code op, const node_context& ctx, const v_pattern& pat, PyObject* send,
           PyObject* recv, side& s, side& r, v_in_place& in_place) {
  const auto me = static_cast<std::size_t>(ctx.config().rank);
  const std::size_t ns = pat.send_blocks[me], nr = pat.recv_blocks[me];
  const bool in_place_send = is_in_place(py::reinterpret_borrow<py::object>(send));
  in_place = v_in_place::none;
  switch (op) {
    case op_code::alltoallv:
      if (!vector_spec(recv, nr, r)) return false;
      if (in_place_send) {
        in_place = v_in_place::swap;
        return true;
      }
      return vector_spec(send, ns, s);
    case op_code::allgatherv: {
      if (!vector_spec(recv, nr, r)) return false;
      if (!in_place_send) return whole_spec(send, ns, s);
      const auto own = static_cast<std::size_t>(ctx.config().comm_ranks[me]);
      if (own >= r.counts.size() || own >= r.displs.size()) return false;
      in_place = v_in_place::gather;
      s.counts.assign(ns, r.counts[own]);
      s.displs.assign(ns, r.displs[own]);
      return true;
    }
    case op_code::neighbor_alltoall:
      return strided_spec(send, ns, s) && strided_spec(recv, nr, r);
    case op_code::neighbor_allgather:
      return whole_spec(send, ns, s) && strided_spec(recv, nr, r);
    case op_code::neighbor_alltoallv:
      return vector_spec(send, ns, s) && vector_spec(recv, nr, r);
    case op_code::neighbor_allgatherv:
      return whole_spec(send, ns, s) && vector_spec(recv, nr, r);
    default:
      return false;
  }
}

PyObject* fast_irregular(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "fast_irregular(op, comm, sendbuf, recvbuf, order, copy)");
    return nullptr;
  }
  try {
    const op_code op = irregular_op(static_cast<int>(PyLong_AsLong(args[0])));
    nodes_route route;
    auto ctx = registered_context(args[1]);
    const bool across_nodes = !ctx && (ctx = registered_route(args[1], route));
    const int order = order_code(args[4]), copy = copy_code(args[5]);
    if (!ctx || order == no_option_code || copy == no_option_code || args[3] == Py_None ||
        ctx->closed())
      Py_RETURN_NONE;
    v_exchange& vx = ctx->irregular();
    const bool neighbours = op != op_code::alltoallv && op != op_code::allgatherv;
    const int pid =
        vx.role_pattern(neighbours ? v_exchange::topology_role : v_exchange::dense_role);
    if (pid < 0) Py_RETURN_NONE;
    thread_local side s, r;
    v_in_place in_place = v_in_place::none;
    if (!parse(op, *ctx, vx.pattern(pid), args[2], args[3], s, r, in_place)) Py_RETURN_NONE;
    const auto recv_array = py::reinterpret_borrow<py::array>(r.array);
    const array_view recv_view = view_of(recv_array);
    py::object send_array;  // not py::array: its default constructor makes an empty array
    array_view send_view;
    v_call call;
    call.op = op;
    call.pattern = pid;
    call.recv = &recv_view;
    call.in_place = in_place;
    call.send_counts = s.counts;
    call.send_displs = s.displs;
    call.recv_counts = r.counts;
    call.recv_displs = r.displs;
    call.order = order;
    call.copy = copy;
    if (in_place == v_in_place::none) {
      send_array = as_c_array(py::reinterpret_borrow<py::object>(s.array));
      if (!send_array) Py_RETURN_NONE;
      send_view = view_of(py::reinterpret_borrow<py::array>(send_array));
      call.send = &send_view;
    }
    if (across_nodes) {
      run_across_nodes(*ctx, op, &call, vx.describe(call), route);
    } else {
      gil_released_on_block gil(*ctx, recv_view.nbytes);
      vx.run(call);
    }
    Py_INCREF(r.array);
    return r.array;
  } catch (...) {
    py::detail::try_translate_exceptions();
    return nullptr;
  }
}

PyMethodDef fast_irregular_def = {
    "fast_irregular", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_irregular)),
    METH_FASTCALL,
    "fast_irregular(op, comm, sendbuf, recvbuf, order, copy): runs an irregular collective on a "
    "registered context in one crossing and returns the receive array, or returns None having "
    "done nothing when the Python path must run it."};

}  // namespace fast

using bound_vplan = bound_plan<v_plan>;

// A persistent irregular call on arrays the caller checked (plan_buffers_error): an ndarray or
// IN_PLACE, and a C-contiguous ndarray.
std::unique_ptr<bound_vplan> make_vplan(const std::shared_ptr<node_context>& ctx, int code,
                                        int pattern, py::object send, py::object recv, int in_place,
                                        const counts_array& sc, const counts_array& sd,
                                        const counts_array& rc, const counts_array& rd, int order,
                                        int copy) {
  auto bound = std::make_unique<bound_vplan>();
  with_call(
      code, pattern, send, recv, in_place, sc, sd, rc, rd, order, copy,
      [&](const v_call& call) {
        py::gil_scoped_release release;
        bound->plan = std::make_unique<v_plan>(ctx, call);
        bound->bytes = call.recv->nbytes;
      },
      [&](const std::string& why) {
        py::gil_scoped_release release;
        ctx->fail(arg_error::type, call_prefix(irregular_op(code), "_init") + why);
      });
  bound->send = std::move(send);
  bound->recv = std::move(recv);
  return bound;
}

// Phase 1 of an irregular round (node_messages::begin_irregular) for the Python arguments, then
// `then(round)` while the arrays' views are alive. The record is this rank's call's, or the
// conversion's error.
template <class Then>
void begin_irregular_round(node_context& ctx, int code, int pattern, const py::object& send,
                           const py::object& recv, int in_place, const counts_array& sc,
                           const counts_array& sd, const counts_array& rc, const counts_array& rd,
                           int order, int copy, bool carry, Then&& then) {
  node_messages& round = ctx.between_nodes(node_map{});
  with_call(
      code, pattern, send, recv, in_place, sc, sd, rc, rd, order, copy,
      [&](const v_call& call) {
        const call_record record = ctx.irregular().describe(call);
        {
          gil_released_on_block gil(ctx, call.recv->nbytes);
          round.begin_irregular(record, &call, carry);
        }
        then(round);
      },
      [&](const std::string& why) {
        const call_record record =
            error_record(arg_error::type, call_prefix(irregular_op(code)) + why);
        {
          py::gil_scoped_release release;
          round.begin_irregular(record, nullptr, carry);
        }
        then(round);
      });
}

// An irregular call's pattern, and the node's part of a call on it.
void def_irregular_calls(context_class& cls) {
  cls.def(
      "v_pattern",
      [](node_context& ctx, const std::vector<edges_array>& sends,
         const std::vector<edges_array>& recvs, int role, const std::vector<edges_array>& all_sends,
         const std::vector<edges_array>& all_recvs) {
        const auto& cr = ctx.config().comm_ranks;
        v_pattern p = match_edges(edge_lists(sends), edge_lists(recvs), cr);
        if (!all_sends.empty() || !all_recvs.empty()) {
          std::vector<int> everyone(all_sends.size());
          for (std::size_t r = 0; r < everyone.size(); ++r) everyone[r] = static_cast<int>(r);
          v_pattern whole = match_edges(edge_lists(all_sends), edge_lists(all_recvs), everyone);
          p.all_send_blocks = std::move(whole.send_blocks);
          p.all_recv_blocks = std::move(whole.recv_blocks);
          p.all_tuples = std::move(whole.tuples);
        }
        py::gil_scoped_release release;
        return ctx.irregular().add_pattern(std::move(p), role);
      },
      py::arg("sends"), py::arg("recvs"), py::arg("role") = v_exchange::no_role,
      py::arg("all_sends") = std::vector<edges_array>{},
      py::arg("all_recvs") = std::vector<edges_array>{},
      "Collective: registers the pattern of the node ranks' send and receive lists (one (k, 2) "
      "array of (communicator rank, tag) per node rank); returns its id. role: 0 for "
      "alltoallv/allgatherv, 1 for the topology's neighbour calls (what fast_irregular runs), "
      "-1 none. On several nodes, all_sends and all_recvs: every communicator rank's lists, "
      "for the rounds between nodes.");
  cls.def(
      "vexchange",
      [](node_context& ctx, int code, int pattern, const py::object& send, const py::object& recv,
         int in_place, const counts_array& sc, const counts_array& sd, const counts_array& rc,
         const counts_array& rd, int order, int copy) {
        with_call(
            code, pattern, send, recv, in_place, sc, sd, rc, rd, order, copy,
            [&](const v_call& call) {
              gil_released_on_block gil(ctx, call.recv->nbytes);
              ctx.irregular().run(call);
            },
            [&](const std::string& why) {
              py::gil_scoped_release release;
              ctx.fail(arg_error::type, call_prefix(irregular_op(code)) + why);
            });
      },
      py::arg("code"), py::arg("pattern"), py::arg("sendbuf"), py::arg("recvbuf"),
      py::arg("in_place"), py::arg("send_counts"), py::arg("send_displs"), py::arg("recv_counts"),
      py::arg("recv_displs"), py::arg("order"), py::arg("copy"),
      "Collective: the node's part of an irregular collective (counts and displacements in "
      "elements, one per list entry); raises on every rank when any rank's arguments are invalid "
      "or the ranks' counts disagree.");
}

// An irregular call's round between nodes, whole with the messages from C++.
void def_irregular_rounds(context_class& cls) {
  cls.def(
      "nodes_v_round",
      [](node_context& ctx, int code, int pattern, const py::object& send, const py::object& recv,
         int in_place, const counts_array& sc, const counts_array& sd, const counts_array& rc,
         const counts_array& rd, int order, int copy, bool carry, const nodes_route& route,
         const std::string& what) {
        std::size_t direct = 0;
        begin_irregular_round(ctx, code, pattern, send, recv, in_place, sc, sd, rc, rd, order, copy,
                              carry, [&](node_messages& round) {
                                py::gil_scoped_release release;
                                marking_failure(round,
                                                [&] { finish_round(ctx, round, route, what); });
                                direct = round.direct_blocks();
                              });
        return direct;
      },
      py::arg("code"), py::arg("pattern"), py::arg("sendbuf"), py::arg("recvbuf"),
      py::arg("in_place"), py::arg("send_counts"), py::arg("send_displs"), py::arg("recv_counts"),
      py::arg("recv_displs"), py::arg("order"), py::arg("copy"), py::arg("carry"), py::arg("route"),
      py::arg("what"),
      "Collective (node): a whole irregular round between nodes in one call (phase 1, the "
      "messages by MPI from C++, the node barrier, the verdict). Returns how many of this "
      "rank's blocks between nodes the round did not carry (to go rank to rank).");
}

// An irregular call on several nodes, whole, from C++; and the rounds' failure.
void def_irregular_across_nodes(context_class& cls) {
  cls.def(
      "nodes_v_call",
      [](const std::shared_ptr<node_context>& ctx, int code, int pattern, const py::object& send,
         const py::object& recv, int in_place, const counts_array& sc, const counts_array& sd,
         const counts_array& rc, const counts_array& rd, int order, int copy,
         const nodes_route& route) {
        const op_code op = irregular_op(code);
        with_call(
            code, pattern, send, recv, in_place, sc, sd, rc, rd, order, copy,
            [&](const v_call& call) {
              run_across_nodes(*ctx, op, &call, ctx->irregular().describe(call), route);
            },
            [&](const std::string& why) {
              run_across_nodes(*ctx, op, nullptr,
                               error_record(arg_error::type, call_prefix(op) + why), route);
            });
      },
      py::arg("code"), py::arg("pattern"), py::arg("sendbuf"), py::arg("recvbuf"),
      py::arg("in_place"), py::arg("send_counts"), py::arg("send_displs"), py::arg("recv_counts"),
      py::arg("recv_displs"), py::arg("order"), py::arg("copy"), py::arg("route"),
      "Collective (communicator): an irregular call on several nodes, whole, with the messages "
      "from C++ -- the round (every rank's record and counts checked, the blocks up to the pack "
      "limit carried), the node's part, the larger blocks rank to rank -- the GIL released "
      "while it waits.");
  cls.def(
      "nodes_check",
      [](node_context& ctx) {
        ctx.protocol().check_usable();
        if (const node_messages* rounds = ctx.rounds()) rounds->check_unbroken();
      },
      "Raises ValueError once the context is closed, PeerError once it or a round between "
      "nodes failed (mark_failed).");
  cls.def(
      "mark_failed",
      [](node_context& ctx, std::string why) {
        if (!ctx.protocol().broken()) ctx.protocol().mark_broken(why);
        if (node_messages* rounds = ctx.rounds()) rounds->mark_failed(std::move(why));
      },
      py::arg("why"),
      "Marks the context failed after a wait of its gave up (the first reason is kept): every "
      "later call, and every later round between nodes, raises PeerError at once.");
}

// The copies an irregular call makes on one node, and a rank's share of a stream.
void register_irregular_schedule(py::module_& m) {
  m.def(
      "v_schedule",
      [](const std::vector<edges_array>& sends, const std::vector<edges_array>& recvs, int order,
         int in_place) {
        std::vector<int> ranks(sends.size());
        for (std::size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int>(i);
        if (!is_code<block_order>(order))
          throw std::invalid_argument("unknown order code " + std::to_string(order));
        const v_pattern p = match_edges(edge_lists(sends), edge_lists(recvs), ranks);
        return tuple_array(ordered_tuples(p, static_cast<int>(ranks.size()),
                                          static_cast<block_order>(order),
                                          in_place_code(in_place)));
      },
      py::arg("sends"), py::arg("recvs"), py::arg("order"), py::arg("in_place") = 0,
      "The tuples an irregular call on one node of len(sends) ranks copies, in the order the "
      "engine copies them.");
  m.def(
      "v_piece", &v_piece, py::arg("total"), py::arg("parts"), py::arg("rank"),
      "[first, last): the bytes of a stream of `total` bytes that rank `rank` of `parts` copies.");
}

// VPlan: a persistent irregular call with the arrays it runs on.
void register_vplan(py::module_& m) {
  py::class_<bound_vplan> plan(m, "VPlan", "A persistent irregular collective (see vplan.hpp).");
  plan.def(py::init(&make_vplan), py::arg("context"), py::arg("code"), py::arg("pattern"),
           py::arg("sendbuf"), py::arg("recvbuf"), py::arg("in_place"), py::arg("send_counts"),
           py::arg("send_displs"), py::arg("recv_counts"), py::arg("recv_displs"), py::arg("order"),
           py::arg("copy"))
      .def("__call__",
           [](bound_vplan& b) {
             run_once(b);
             return b.recv;
           })
      .def("start", [](bound_vplan& b) { start_run(b); });
  def_plan_runs(plan);
  plan.def(
      "_attach_remote",
      [](bound_vplan& b, const nodes_route& route, int tag_base) {
        const v_plan& vp = b.usable();
        b.remote = irregular_plan_blocks(vp.context(), vp.op(), vp.in_place() == v_in_place::swap,
                                         route, tag_base);
      },
      py::arg("route"), py::arg("tag_base"),
      "Local, right after creation on several nodes (the round that agreed on it the last one "
      "of the context): the plan's runs also exchange its blocks between nodes rank to rank "
      "(persistent requests, tags from `tag_base`), in the same crossing.");
  plan.def_property_readonly("sendbuf", [](const bound_vplan& b) { return b.send; })
      .def_property_readonly("recvbuf", [](const bound_vplan& b) { return b.recv; })
      .def_property_readonly("op", [](const bound_vplan& b) { return name_of(b.plan->op()); })
      .def_property_readonly("order", [](const bound_vplan& b) { return name_of(b.plan->order()); })
      .def_property_readonly("copied_bytes",
                             [](const bound_vplan& b) { return b.plan->copied_bytes(); })
      .def_property_readonly(
          "shadowed",
          [](const bound_vplan& b) {
            return std::make_pair(b.plan->send_shadowed(), b.plan->recv_shadowed());
          },
          "(send, receive): whether each private buffer has an arena copy (one more per run).");
}

// The one-crossing call path of irregular calls.
void register_fast_irregular(py::module_& m) {
  m.add_object("fast_irregular",
               py::reinterpret_steal<py::object>(PyCFunction_NewEx(
                   &fast::fast_irregular_def, nullptr, m.attr("__name__").ptr())));
}

}  // namespace

void register_vexchange(py::module_& m) {
  context_class cls = bound_context(m);
  def_irregular_calls(cls);
  def_irregular_rounds(cls);
  def_irregular_across_nodes(cls);
  register_irregular_schedule(m);
  register_vplan(m);
  register_fast_irregular(m);
}

}  // namespace zcoll::bind
