// NodeContext: the engine of one communicator (exchange.hpp), and the call records that the
// ranks of a communicator spanning several nodes compare (protocol.hpp).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "context_class.hpp"
#include "fast_path.hpp"
#include "gil.hpp"
#include "rounds.hpp"
#include "zcoll/aggregate.hpp"
#include "zcoll/context_setup.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/leaders_exchange.hpp"
#include "zcoll/pool.hpp"
#include "zcoll/spread_reduction.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

double positive_timeout(double seconds) {
  if (!(seconds > 0)) throw std::invalid_argument("timeout must be positive");
  return seconds;
}

wait_options make_wait(double timeout, std::uint32_t spin, std::uint32_t yields, double slice) {
  wait_options w;
  w.timeout_s = positive_timeout(timeout);
  w.spin_iterations = spin;
  w.yield_iterations = yields;
  w.sleep_slice_s = slice;
  return w;
}

op_code op_named(const std::string& name) {
  const auto op = parse_name<op_code>(name);
  if (!op) throw std::invalid_argument("no operation is named '" + name + "'");
  return *op;
}

// Converts (sendbuf, recvbuf) and returns ok(send view or nullptr in place, recv view), or
// error(TypeError message) when they cannot be converted. A template, so that the per-call path
// builds its views on the stack with nothing else around them.
template <class Ok, class Error>
auto with_views(const py::object& send, const py::object& recv, Ok&& ok, Error&& error) {
  if (!py::isinstance<py::array>(recv))
    return error("recvbuf must be a numpy.ndarray, got " + type_name(recv));
  const array_view recv_view = view_of(py::reinterpret_borrow<py::array>(recv));
  if (is_in_place(send)) return ok(nullptr, recv_view);
  if (send.is_none()) return error(std::string("sendbuf is None (use zcoll.IN_PLACE)"));
  const py::array send_array = as_c_array(send);  // alive until the call returns
  if (!send_array) return error(std::string("sendbuf cannot be converted to a NumPy array"));
  const array_view send_view = view_of(send_array);
  return ok(&send_view, recv_view);
}

// Runs alltoall or allgather; the engine checks everything the conversion did not.
void run(node_context& ctx, op_code op, const py::object& send, const py::object& recv, int order,
         int copy) {
  with_views(
      send, recv,
      [&](const array_view* send_view, const array_view& recv_view) {
        gil_released_on_block gil(ctx, recv_view.nbytes);
        ctx.run(op, send_view, recv_view, order, copy);
      },
      [&](const std::string& why) {
        py::gil_scoped_release release;
        ctx.fail(arg_error::type, call_prefix(op) + why);
      });
}

call_record describe(const node_context& ctx, const std::string& name, const py::object& send,
                     const py::object& recv, int order, int copy) {
  const op_code op = op_named(name);
  return with_views(
      send, recv,
      [&](const array_view* send_view, const array_view& recv_view) {
        return ctx.describe(op, send_view, recv_view, order, copy);
      },
      [&](const std::string& why) { return error_record(arg_error::type, call_prefix(op) + why); });
}

// Whether `value` is a str naming "auto" or a value of `Enum`.
template <class Enum>
bool names_auto_or(const py::object& value) {
  if (!PyUnicode_CheckExact(value.ptr())) return false;
  const auto name = value.cast<std::string>();
  return name == auto_name || parse_name<Enum>(name).has_value();
}

std::optional<std::string> option_error(const py::object& order, const py::object& copy) {
  if (!names_auto_or<block_order>(order))
    return bad_option_message("order", py::repr(order).cast<std::string>());
  if (!names_auto_or<copy_mode>(copy))
    return bad_option_message("copy", py::repr(copy).cast<std::string>());
  return std::nullopt;
}

// The one-crossing call path: `fast_collective(op, comm, sendbuf, recvbuf, order, copy)` finds
// the context of `comm` by its MPI handle in a table Python keeps (register_fast), turns the
// option names into codes and runs the call, all in one crossing with no pybind11 dispatch. It
// returns None, having done nothing, whenever the Python path must run instead: no registered
// context (its first call, online tuning), or an option that names nothing (the Python path
// raises the error on every rank). A communicator spanning several nodes is registered with
// its route.
namespace fast_path {

// A registered communicator: its context, and its route when it spans several nodes.
struct entry {
  std::shared_ptr<node_context> ctx;
  std::optional<nodes_route> route;
};

std::unordered_map<std::uintptr_t, entry>& contexts() {
  static auto* table = new std::unordered_map<std::uintptr_t, entry>();
  return *table;  // leaked: contexts may still be registered at interpreter teardown
}

constexpr int no_code = no_option_code;

// The code of an order or copy name: "auto" by identity (the interned default), others parsed.
template <class Enum>
int code_of(PyObject* name, PyObject* auto_str, int auto_code) {
  if (name == auto_str) return auto_code;
  if (!PyUnicode_CheckExact(name)) return no_code;
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(name, &size);
  if (!text) {
    PyErr_Clear();
    return no_code;
  }
  const std::string_view view(text, static_cast<std::size_t>(size));
  if (view == auto_name) return auto_code;
  const auto value = parse_name<Enum>(view);
  return value ? static_cast<int>(*value) : no_code;
}

// The communicator object of the last call and its context. The object is held (a strong
// reference), so its address cannot come back as another communicator; any change to the
// table (a context registered, or gone when its communicator is freed) forgets it.
struct last_call {
  PyObject* comm = nullptr;
  entry found;
  void forget() {
    Py_CLEAR(comm);
    found = {};
  }
  void remember(PyObject* c, entry e) {
    Py_INCREF(c);
    Py_XSETREF(comm, c);
    found = std::move(e);
  }
};

last_call& last() {
  static auto* cache = new last_call();  // leaked, like the table
  return *cache;
}

const entry* entry_by_handle(PyObject* comm) {
  static PyObject* handle_attr = PyUnicode_InternFromString("handle");
  PyObject* handle = PyObject_GetAttr(comm, handle_attr);
  if (!handle) {
    PyErr_Clear();
    return nullptr;
  }
  const std::optional<std::uintptr_t> key = handle_bits(handle);
  Py_DECREF(handle);
  if (!key) return nullptr;
  auto& table = contexts();
  const auto it = table.find(*key);
  return it == table.end() ? nullptr : &it->second;
}

const entry& entry_of(PyObject* comm) {
  last_call& cached = last();
  if (comm == cached.comm) return cached.found;
  static const entry none;
  const entry* found = entry_by_handle(comm);
  if (!found) return none;
  cached.remember(comm, *found);
  return cached.found;
}

// A context on one node only: the calls that take no route.
std::shared_ptr<node_context> context_of(PyObject* comm) {
  const entry& e = entry_of(comm);
  return e.route ? nullptr : e.ctx;
}

void register_context(mpi_handle handle, std::shared_ptr<node_context> ctx,
                      std::optional<nodes_route> route) {
  last().forget();
  if (!ctx) {
    contexts().erase(handle.bits);
    return;
  }
  contexts()[handle.bits] = entry{std::move(ctx), route};
}

// An alltoall or allgather on several nodes, whole (across_nodes.hpp): the arguments converted
// here, the call's record (or the conversion's error, which the round raises on every rank).
void collective_across_nodes(node_context& ctx, op_code op, const py::object& send,
                             const py::object& recv, int order, int copy,
                             const nodes_route& route) {
  with_views(
      send, recv,
      [&](const array_view* send_view, const array_view& recv_view) {
        const call_record record = ctx.describe(op, send_view, recv_view, order, copy);
        py::gil_scoped_release release;
        zcoll::collective_across_nodes(ctx, op, send_view, recv_view, order, copy, record, route);
      },
      [&](const std::string& why) {
        const call_record record = error_record(arg_error::type, call_prefix(op) + why);
        py::gil_scoped_release release;
        agree_across_nodes(ctx, record, route,
                           "zcoll." + std::string(name_of(op)) + " (messages between nodes)");
      });
}

PyObject* fast_collective(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  static PyObject* auto_str = PyUnicode_InternFromString(std::string(auto_name).c_str());
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "fast_collective(op, comm, sendbuf, recvbuf, order, copy)");
    return nullptr;
  }
  try {
    const long op = PyLong_AsLong(args[0]);
    if (op != static_cast<long>(op_code::alltoall) && op != static_cast<long>(op_code::allgather)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "not a collective's code");
      return nullptr;
    }
    const entry& found = entry_of(args[1]);
    const int order = code_of<block_order>(args[4], auto_str, auto_order);
    const int copy = code_of<copy_mode>(args[5], auto_str, auto_copy);
    if (!found.ctx || order == no_code || copy == no_code) Py_RETURN_NONE;
    const auto send = py::reinterpret_borrow<py::object>(args[2]);
    const auto recv = py::reinterpret_borrow<py::object>(args[3]);
    if (found.route) {  // several nodes
      if (found.ctx->closed()) Py_RETURN_NONE;
      const std::shared_ptr<node_context> ctx = found.ctx;  // alive through the call
      collective_across_nodes(*ctx, static_cast<op_code>(op), send, recv, order, copy,
                              *found.route);
    } else {
      run(*found.ctx, static_cast<op_code>(op), send, recv, order, copy);
    }
    Py_INCREF(args[3]);
    return args[3];
  } catch (...) {
    py::detail::try_translate_exceptions();
    return nullptr;
  }
}

PyMethodDef fast_collective_def = {
    "fast_collective",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&fast_collective)), METH_FASTCALL,
    "fast_collective(op, comm, sendbuf, recvbuf, order, copy): runs an alltoall or allgather on a "
    "registered context in one crossing and returns recvbuf, or returns None having done "
    "nothing when the Python path must run it."};

}  // namespace fast_path

}  // namespace

std::shared_ptr<node_context> registered_context(PyObject* comm) {
  return fast_path::context_of(comm);
}

std::shared_ptr<node_context> registered_route(PyObject* comm, nodes_route& route) {
  const fast_path::entry& e = fast_path::entry_of(comm);
  if (!e.route) return nullptr;
  route = *e.route;
  return e.ctx;
}

int order_code(PyObject* name) {
  static PyObject* auto_str = PyUnicode_InternFromString(std::string(auto_name).c_str());
  return fast_path::code_of<block_order>(name, auto_str, auto_order);
}

int copy_code(PyObject* name) {
  static PyObject* auto_str = PyUnicode_InternFromString(std::string(auto_name).c_str());
  return fast_path::code_of<copy_mode>(name, auto_str, auto_copy);
}

namespace {

// What the node setup learned of this rank's node: its ranks, their processes and places.
context_config make_config(int rank, int size, int comm_size, std::vector<int> comm_ranks,
                           std::vector<std::int32_t> pids, int barrier, double timeout,
                           std::uint32_t spin, std::uint32_t yields, double slice,
                           std::vector<int> numa_nodes, std::vector<int> packages,
                           std::vector<int> l3_caches) {
  if (!is_code<barrier_kind>(barrier)) throw std::invalid_argument("unknown barrier code");
  context_config c;
  c.rank = rank;
  c.size = size;
  c.comm_size = comm_size;
  c.comm_ranks = std::move(comm_ranks);
  c.pids = std::move(pids);
  c.barrier = static_cast<barrier_kind>(barrier);
  c.wait = make_wait(timeout, spin, yields, slice);
  c.numa_nodes = std::move(numa_nodes);
  c.packages = std::move(packages);
  c.l3_caches = std::move(l3_caches);
  return c;
}

// NodeContext(control, setup): a context on a control segment of its own, with the node the
// set-up describes (its configuration only: eager slots and thresholds come with open_context).
std::shared_ptr<node_context> make_context(std::shared_ptr<shm_segment> control,
                                           const context_setup& setup) {
  return std::make_shared<node_context>(std::move(control), setup.config);
}

cross_memory::state cma_state(const std::string& name) {
  using state = cross_memory::state;
  return name == "works" ? state::works : name == "refused" ? state::refused : state::untested;
}

// ContextSetup(rank, size, ...): a context's set-up (context_setup.hpp), made once per layout.
context_setup make_setup(int rank, int size, int comm_size, std::vector<int> comm_ranks,
                         std::vector<std::int32_t> pids, int barrier, double timeout,
                         std::uint32_t spin, std::uint32_t yields, double slice,
                         std::vector<int> numa_nodes, std::vector<int> packages,
                         std::vector<int> l3_caches, std::size_t eager_bytes,
                         std::optional<std::size_t> copy_threshold,
                         std::optional<std::size_t> copy_cache,
                         std::optional<std::size_t> cma_bytes, std::vector<int> node_of,
                         std::optional<std::pair<std::string, std::string>> cma) {
  context_setup s;
  s.config = make_config(rank, size, comm_size, std::move(comm_ranks), std::move(pids), barrier,
                         timeout, spin, yields, slice, std::move(numa_nodes), std::move(packages),
                         std::move(l3_caches));
  s.eager_bytes = eager_bytes;
  s.copy_threshold = copy_threshold;
  s.copy_cache = copy_cache;
  s.cma_bytes = cma_bytes;
  s.node_of = std::move(node_of);
  if (cma) s.cma.emplace(cma_state(cma->first), std::move(cma->second));
  return s;
}

// A context's set-up, and the one call that opens a context of a pool with it.
void register_context_setup(py::module_& m) {
  py::class_<context_setup>(m, "ContextSetup",
                            "A node context's set-up, kept per layout (context_setup.hpp).")
      .def(py::init(&make_setup), py::arg("rank"), py::arg("size"), py::arg("comm_size"),
           py::arg("comm_ranks"), py::arg("pids"), py::arg("barrier"), py::arg("timeout"),
           py::arg("spin"), py::arg("yields"), py::arg("sleep_slice"),
           py::arg("numa_nodes") = std::vector<int>{}, py::arg("packages") = std::vector<int>{},
           py::arg("l3_caches") = std::vector<int>{}, py::arg("eager_bytes") = 0,
           py::arg("copy_threshold") = py::none(), py::arg("copy_cache") = py::none(),
           py::arg("cma_bytes") = py::none(), py::arg("node_of") = std::vector<int>{},
           py::arg("cma") = py::none());
  m.def("open_context", &open_context, py::arg("pool"), py::arg("index"), py::arg("setup"),
        py::arg("arena"),
        "Local: this rank's NodeContext on claimed block `index` of `pool`, configured by "
        "`setup` (a ContextSetup), its arrays from `arena` (a PoolArena or None) first.");
}

// The context's construction, its arena and the node's alltoall and allgather.
void def_node_calls(context_class& cls) {
  cls.def(py::init(&make_context), py::arg("control"), py::arg("setup"),
          "A context on `control`, a segment of its own (node_context::control_bytes), for the "
          "node `setup` (a ContextSetup) describes; contexts of a pool: open_context.");
  cls.def_static("control_bytes", &node_context::control_bytes, py::arg("size"));
  cls.def(
      "allocate",
      [](node_context& ctx, std::size_t nbytes) {
        py::gil_scoped_release release;
        return ctx.allocate(nbytes);
      },
      py::arg("nbytes"));
  cls.def(
      "alltoall",
      [](node_context& ctx, const py::object& send, const py::object& recv, int order, int copy) {
        run(ctx, op_code::alltoall, send, recv, order, copy);
      },
      py::arg("sendbuf"), py::arg("recvbuf"), py::arg("order"), py::arg("copy") = auto_copy);
  cls.def(
      "allgather",
      [](node_context& ctx, const py::object& send, const py::object& recv, int order, int copy) {
        run(ctx, op_code::allgather, send, recv, order, copy);
      },
      py::arg("sendbuf"), py::arg("recvbuf"), py::arg("order"), py::arg("copy") = auto_copy);
}

// A tuning table's internode rule as Python gives it: (min_block, max_block or None, method
// code, concurrency).
using rule_tuple = std::tuple<std::uint64_t, std::optional<std::uint64_t>, int, int>;

// Sets one field of the context's crossing_overrides; returns its previous value.
template <class T>
T force_crossing(node_context& ctx, T crossing_overrides::* field, T value) {
  return std::exchange(ctx.between_nodes(node_map{}).overrides().*field, value);
}

// What a test, benchmark or the tuner forces for this communicator's calls across nodes
// (crossing_overrides): each setter returns the previous setting.
void def_crossing_overrides(context_class& cls) {
  cls.def(
      "nodes_force_aggregation",
      [](node_context& ctx, int mode) {
        if (mode < -1 || mode > 1) throw std::invalid_argument("aggregation mode is -1, 0 or 1");
        return static_cast<int>(
            force_crossing(ctx, &crossing_overrides::carry, static_cast<aggregation>(mode)));
      },
      py::arg("mode"),
      "After setup_nodes, every rank alike, between collectives: calls across nodes carry "
      "their blocks in the round by the size rule (0), always (1) or never (-1).");
  cls.def(
      "nodes_force_allgather_crossing",
      [](node_context& ctx, int mode, int concurrency) {
        if (mode < 0 || mode > 2) throw std::invalid_argument("allgather crossing is 0, 1 or 2");
        if (mode == 2 && concurrency < 1)
          throw std::invalid_argument("the concurrent exchange's index is at least 1");
        force_crossing(ctx, &crossing_overrides::concurrency, concurrency);
        return static_cast<int>(force_crossing(ctx, &crossing_overrides::allgather,
                                               static_cast<allgather_crossing>(mode)));
      },
      py::arg("mode"), py::arg("concurrency") = 0,
      "After setup_nodes, every rank alike, between collectives: allgathers beyond the round "
      "cross nodes as the policy chooses (0), all rank to rank (1), or by the leaders' "
      "concurrent exchange with index `concurrency` (2: the Python path runs them). Returns "
      "the previous mode.");
  cls.def(
      "nodes_force_spread_segment",
      [](node_context& ctx, std::int64_t bytes) {
        if (bytes < 0) throw std::invalid_argument("a segment's bytes cannot be negative");
        check_spread_segment(static_cast<std::size_t>(bytes));
        return force_crossing(ctx, &crossing_overrides::spread_segment,
                              static_cast<std::size_t>(bytes));
      },
      py::arg("nbytes"),
      "After setup_nodes, every rank alike, between collectives: the segment (bytes, a "
      "multiple of 64) of the messages of reductions spread across nodes; 0: the default.");
}

// The rounds between nodes: the node map, and what a round carries (the size rule).
void def_round_rules(context_class& cls) {
  cls.def(
      "set_sender_packs_bytes",
      [](node_context& ctx, std::size_t nbytes) {
        return ctx.between_nodes(node_map{}).set_sender_packs_bytes(nbytes);
      },
      py::arg("nbytes"),
      "After setup_nodes; every rank of the node alike: the largest aggregated message "
      "payload its sender packs alone, with no barrier after (default 64 KiB; 0: always "
      "in shares). For measuring both sides of the threshold. Returns the previous value.");
  cls.def(
      "nodes_carries",
      [](node_context& ctx, int code, const py::object& send, const py::object& recv) {
        if (!is_code<op_code>(code)) throw py::value_error("not an operation's code");
        return round_carries(ctx, static_cast<op_code>(code), send, recv);
      },
      py::arg("code"), py::arg("sendbuf"), py::arg("recvbuf").none(true),
      "After setup_nodes: whether an allgather, reduction or bcast of op code `code` on "
      "these buffers travels whole in its round between nodes (the size rule), as the "
      "one-crossing path decides.");
  cls.def(
      "nodes_allgather_route",
      [](node_context& ctx, std::uint64_t block) {
        const allgather_route route =
            ctx.between_nodes(node_map{}).policy().allgather_route_for(block);
        return py::make_tuple(static_cast<int>(route.method), route.concurrency);
      },
      py::arg("block"),
      "After setup_nodes: how an allgather's blocks of `block` bytes beyond its round cross "
      "nodes, (method, concurrency): 1 rank to rank, 2 the leaders' concurrent exchange "
      "(crossing_policy.hpp: forced, else the table's rules, else rank to rank).");
  cls.def(
      "nodes_pack_limit",
      [](node_context& ctx, int op) {
        if (!is_code<op_code>(op)) throw py::value_error("not an operation's code");
        return ctx.between_nodes(node_map{}).pack_limit(static_cast<op_code>(op));
      },
      py::arg("op"),
      "After setup_nodes: the largest block a call across nodes carries in its round "
      "(crossing_policy.hpp: the size rule, the table's rules, or what nodes_force_aggregation "
      "forces; -1: none).");
  def_crossing_overrides(cls);
  cls.def(
      "nodes_set_internode_rules",
      [](node_context& ctx, int op, const std::vector<rule_tuple>& rules) {
        if (!is_code<op_code>(op)) throw py::value_error("not an operation's code");
        std::vector<internode_rule> made;
        for (const auto& [low, high, method, concurrency] : rules) {
          if (method < 0 || method > 2) throw std::invalid_argument("method is 0, 1 or 2");
          made.push_back({low, high ? *high : std::numeric_limits<std::uint64_t>::max(),
                          static_cast<crossing_method>(method), concurrency});
        }
        ctx.between_nodes(node_map{}).policy().set_rules(static_cast<op_code>(op), std::move(made));
      },
      py::arg("op"), py::arg("rules"),
      "After setup_nodes, every rank alike: the tuning table's internode rules of an alltoall "
      "or allgather for these nodes, (min_block, max_block or None, method: 0 round, 1 "
      "direct, 2 concurrent, concurrency) sorted by min_block; [] restores the built-in rules.");
}

// Calls across nodes, each whole in one call with the messages from C++: a round that only
// agrees on the ranks' records, and an alltoall or allgather (as the one crossing runs them).
void def_calls_across_nodes(context_class& cls) {
  cls.def(
      "nodes_round",
      [](node_context& ctx, const py::bytes& record, const nodes_route& route,
         const std::string& what) {
        const call_record r = record_of(record);
        py::gil_scoped_release release;
        agree_across_nodes(ctx, r, route, what);
      },
      py::arg("record"), py::arg("route"), py::arg("what"),
      "Collective (communicator): a round between nodes that carries every rank's call record "
      "to every rank and raises on every rank the error the records call for (aggregate.hpp), "
      "the GIL released.");
  cls.def(
      "nodes_call",
      [](node_context& ctx, int op, const py::object& send, const py::object& recv, int order,
         int copy, const nodes_route& route) {
        if (op != static_cast<int>(op_code::alltoall) && op != static_cast<int>(op_code::allgather))
          throw py::value_error("not alltoall's or allgather's code");
        fast_path::collective_across_nodes(ctx, static_cast<op_code>(op), send, recv, order, copy,
                                           route);
      },
      py::arg("op"), py::arg("sendbuf"), py::arg("recvbuf"), py::arg("order"), py::arg("copy"),
      py::arg("route"),
      "Collective (communicator): an alltoall or allgather on several nodes, whole, as the one "
      "crossing runs it: blocks up to the pack limit in the round, larger ones rank to rank "
      "after the node's part.");
  cls.def(
      "nodes_exchange_remote",
      [](node_context& ctx, int op, const py::object& send, const py::object& recv,
         const nodes_route& route) {
        with_views(
            send, recv,
            [&](const array_view* send_view, const array_view& recv_view) {
              py::gil_scoped_release release;
              blocks_between_nodes(ctx, static_cast<op_code>(op), send_view, recv_view, route);
            },
            [](const std::string& why) { throw py::type_error(why); });
      },
      py::arg("op"), py::arg("sendbuf"), py::arg("recvbuf"), py::arg("route"),
      "Collective (communicator, benchmarks): only the blocks of an alltoall or allgather "
      "between this rank's node and the others, after the node's part: rank to rank, or by the "
      "leaders' concurrent exchange where the crossing policy routes the allgather so.");
}

// This rank's call records, and the argument errors every rank raises.
void def_call_records(context_class& cls) {
  cls.def(
      "record",
      [](const node_context& ctx, const std::string& op, const py::object& send,
         const py::object& recv, int order, int copy, bool planned) {
        call_record r = describe(ctx, op, send, recv, order, copy);
        if (planned && r.call.op != op_code::error) {
          r.call.target = r.call.op;
          r.call.op = op_code::plan;
        }
        return record_bytes(r);
      },
      py::arg("op"), py::arg("sendbuf"), py::arg("recvbuf"), py::arg("order"),
      py::arg("copy") = auto_copy, py::arg("planned") = false,
      "Local: this rank's call record of a collective (of a plan's creation when planned), "
      "for agree() across nodes.");
  cls.def(
      "fail",
      [](node_context& ctx, bool type_error, const std::string& message) {
        py::gil_scoped_release release;
        ctx.fail(type_error ? arg_error::type : arg_error::value, message);
      },
      py::arg("type_error"), py::arg("message"),
      "Collective: this rank's arguments are invalid; every rank raises.");
}

// The node barrier, waits, views of peers' arrays and the context's state.
void def_context_state(context_class& cls) {
  cls.def("barrier", [](node_context& ctx) {
    py::gil_scoped_release release;
    ctx.barrier();
  });
  cls.def(
      "gone_peers",
      [](node_context& ctx) {
        using gone = std::vector<std::pair<std::int32_t, std::string>>;
        return ctx.closed() ? gone{} : ctx.protocol().barrier().gone_peers();
      },
      "Local: (pid, why) of each node peer that announced its departure (why: \"left ...\") or "
      "whose process is gone (\"died\"); none once the context is closed.");
  cls.def(
      "setup_eager",
      [](node_context& ctx, std::size_t nbytes) {
        py::gil_scoped_release release;
        ctx.setup_eager(nbytes);
      },
      py::arg("nbytes"), "Collective: small-message path for calls moving <= nbytes per rank.");
  cls.def(
      "set_wait",
      [](node_context& ctx, double timeout, std::uint32_t spin, std::uint32_t yields,
         double slice) { ctx.set_wait_options(make_wait(timeout, spin, yields, slice)); },
      py::arg("timeout"), py::arg("spin"), py::arg("yields"), py::arg("sleep_slice"));
  cls.def(
      "where",
      [](node_context& ctx, const py::array& a) {
        const buffer_ref r = ctx.where(a.data(), static_cast<std::size_t>(a.nbytes()));
        return py::make_tuple(r.segment, r.offset);
      },
      py::arg("a"), "(segment id, offset) of an arena array; (0, address) when not shareable.");
  cls.def(
      "view",
      [](node_context& ctx, std::uint64_t segment, std::uint64_t offset, std::size_t nbytes) {
        return ctx.view(buffer_ref{segment, offset}, nbytes);
      },
      py::arg("segment"), py::arg("offset"), py::arg("nbytes"));
  cls.def("close", &node_context::close);
  cls.def_property_readonly("closed", &node_context::closed);
  cls.def_property_readonly("broken", &node_context::broken);
  cls.def_property_readonly("calls", &node_context::calls);
  cls.def_property_readonly(
      "barriers", [](node_context& c) { return c.protocol().barriers(); },
      "Node barriers this rank has completed on the context; 0 once it is closed.");
  cls.def_property_readonly("arena_bytes_in_use", &node_context::arena_bytes_in_use);
  cls.def_property_readonly("segment_count", &node_context::segment_count);
  cls.def_property_readonly("rank", [](const node_context& c) { return c.config().rank; });
  cls.def_property_readonly("size", [](const node_context& c) { return c.config().size; });
}

// Call records of the module's own, for agree() across nodes.
void register_call_records(py::module_& m) {
  m.attr("CALL_RECORD_BYTES") = sizeof(call_record);
  m.def(
      "error_record",
      [](bool type_error, const std::string& message) {
        return record_bytes(error_record(type_error ? arg_error::type : arg_error::value, message));
      },
      py::arg("type_error"), py::arg("message"),
      "The call record of a rank whose arguments are invalid (TypeError when type_error).");
  m.def(
      "op_record",
      [](const std::string& op) {
        call_record r;
        r.call.op = op_named(op);
        return record_bytes(r);
      },
      py::arg("op"), "The call record of an operation without arguments (allocate, barrier).");
}

// The size rule's bounds, and the leaders' concurrent exchange's schedule.
void register_crossing(py::module_& m) {
  m.attr("AGGREGATE_MAX_BLOCK") = aggregate_max_block;
  m.attr("AGGREGATE_UNIT_BLOCK") = aggregate_unit_block;
  m.attr("LEADERS_SPLIT_BYTES") = leaders_split_bytes;
  py::dict methods;  // the tuning table's internode methods, as the crossing policy codes them
  methods["round"] = static_cast<int>(crossing_method::round);
  methods["direct"] = static_cast<int>(crossing_method::direct);
  methods["concurrent"] = static_cast<int>(crossing_method::concurrent);
  m.attr("INTERNODE_METHOD_CODES") = methods;
  m.def(
      "leaders_schedule",
      [](int nodes, int concurrency, bool split) {
        if (nodes < 1 || concurrency < 1)
          throw std::invalid_argument("need nodes >= 1 and concurrency >= 1");
        py::list out;
        for (const leader_message& msg : leaders_schedule(nodes, concurrency, split))
          out.append(py::make_tuple(msg.source, msg.dest, msg.round,
                                    py::tuple(py::cast(msg.content)), msg.part, msg.preamble,
                                    msg.tag()));
        return out;
      },
      py::arg("nodes"), py::arg("concurrency"), py::arg("split") = false,
      "Every message of the leaders' concurrent exchange (leaders_exchange.hpp): (source, dest, "
      "round, content nodes, part, preamble, tag).");
}

// The one-crossing call path: the table of contexts and fast_collective.
void register_fast_collective(py::module_& m) {
  m.def("option_error", &option_error, py::arg("order"), py::arg("copy"),
        "What is wrong with an order= / copy= value (None when both name an order and a mode).");
  m.def("register_fast", &fast_path::register_context, py::arg("handle"),
        py::arg("context").none(true), py::arg("route") = py::none(),
        "Local: fast_collective and its kin run calls on the communicator with this MPI handle "
        "on `context` (None: no longer). route: (private dup's handle, rank, tag, window) of a "
        "communicator on several nodes whose messages between nodes go from C++: then only "
        "fast_irregular takes it.");
  m.add_object("fast_collective",
               py::reinterpret_steal<py::object>(PyCFunction_NewEx(
                   &fast_path::fast_collective_def, nullptr, m.attr("__name__").ptr())));
  m.def("_set_in_place", &set_in_place,
        "Registers the object that means 'in place' as sendbuf (mpi4py's MPI.IN_PLACE).");
}

}  // namespace

void register_exchange(py::module_& m) {
  context_class cls(m, "NodeContext",
                    "The node-local engine of one communicator (see exchange.hpp).");
  def_node_calls(cls);
  def_round_rules(cls);
  def_calls_across_nodes(cls);
  def_call_records(cls);
  def_context_state(cls);
  register_call_records(m);
  register_crossing(m);
  register_fast_collective(m);
  register_context_setup(m);
}

}  // namespace zcoll::bind
