#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <tuple>

#include "bindings.hpp"
#include "zcoll/exchange.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

wait_options make_wait(double timeout, std::uint32_t spin, std::uint32_t yields, double slice) {
  if (!(timeout > 0)) throw std::invalid_argument("timeout must be positive");
  wait_options w;
  w.timeout_s = timeout;
  w.spin_iterations = spin;
  w.yield_iterations = yields;
  w.sleep_slice_s = slice;
  return w;
}

py::object& in_place_sentinel() {
  static py::object* sentinel = new py::object(py::none());  // leaked: outlives the interpreter
  return *sentinel;
}

array_view view_of(const py::array& a) {
  const py::dtype dt = a.dtype();  // fetched once: every accessor below would fetch it again
  array_view v;
  v.data = a.data();
  v.ndim = static_cast<int>(a.ndim());
  const py::ssize_t* shape = a.shape();
  std::size_t size = 1;
  for (int i = 0; i < v.ndim; ++i) size *= static_cast<std::size_t>(shape[i]);
  v.size = size;
  v.first_dim = v.ndim ? static_cast<std::size_t>(shape[0]) : 0;
  static_assert(sizeof(py::ssize_t) == sizeof(std::int64_t));
  v.shape = reinterpret_cast<const std::int64_t*>(shape);
  const auto itemsize = static_cast<std::size_t>(dt.itemsize());
  v.nbytes = size * itemsize;
  v.dtype = {static_cast<std::uint32_t>(static_cast<unsigned char>(dt.char_())),
             static_cast<std::uint32_t>(itemsize)};
  const char kind = dt.kind();
  v.has_objects = kind == 'O' || (kind == 'V' && dt.attr("hasobject").cast<bool>());
  const int flags = a.flags();
  v.c_contiguous = (flags & py::array::c_style) != 0;
  v.writeable = (flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_) != 0;
  return v;
}

// `obj` itself when it is a C-contiguous ndarray, else a C-contiguous copy (null on failure).
py::array as_c_array(const py::object& obj) {
  if (py::isinstance<py::array>(obj)) {
    auto a = py::reinterpret_borrow<py::array>(obj);
    if (a.flags() & py::array::c_style) return a;
  }
  return py::array::ensure(obj, py::array::c_style);
}

// Releases the GIL the first time the engine is about to block, and takes it back at scope
// exit: short calls that never wait keep it (saving two mutex handoffs); waits never hold it.
class gil_released_on_block {
 public:
  explicit gil_released_on_block(node_context& ctx) : ctx_(ctx) {
    ctx_.set_block_hook({&gil_released_on_block::release, this});
  }
  ~gil_released_on_block() {
    ctx_.set_block_hook({});
    if (state_) PyEval_RestoreThread(state_);
  }
  gil_released_on_block(const gil_released_on_block&) = delete;
  gil_released_on_block& operator=(const gil_released_on_block&) = delete;
  void release_now() { release(this); }

 private:
  static void release(void* self) {
    auto* me = static_cast<gil_released_on_block*>(self);
    if (!me->state_) me->state_ = PyEval_SaveThread();
  }
  node_context& ctx_;
  PyThreadState* state_ = nullptr;
};

// Copies this long hold the GIL too long: release it up front.
constexpr std::size_t release_gil_above_bytes = std::size_t{1} << 16;

[[noreturn]] void fail_everywhere(node_context& ctx, op_code op, bool type_error,
                                  const std::string& why) {
  const std::string name(name_of(op));
  py::gil_scoped_release release;
  ctx.fail(op, type_error ? arg_error::type : arg_error::value, "zcoll." + name + ": " + why);
}

// Converts the Python arguments, then runs the collective (or its collective failure).
// `order` is a block_order code, or auto_order for "auto".
void run(node_context& ctx, op_code op, const py::object& send, const py::object& recv,
         int order, int copy) {
  if (!py::isinstance<py::array>(recv))
    fail_everywhere(ctx, op, true,
                    "recvbuf must be a numpy.ndarray, got " +
                        py::str(py::type::of(recv).attr("__name__")).cast<std::string>());
  const auto recv_array = py::reinterpret_borrow<py::array>(recv);
  const array_view recv_view = view_of(recv_array);
  if (send.is(in_place_sentinel())) {
    gil_released_on_block gil(ctx);
    if (recv_view.nbytes > release_gil_above_bytes) gil.release_now();
    ctx.run(op, nullptr, recv_view, order, copy);
    return;
  }
  if (send.is_none()) fail_everywhere(ctx, op, true, "sendbuf is None (use zcoll.IN_PLACE)");
  py::array send_array = as_c_array(send);
  if (!send_array) {
    PyErr_Clear();
    fail_everywhere(ctx, op, true, "sendbuf cannot be converted to a NumPy array");
  }
  const array_view send_view = view_of(send_array);
  gil_released_on_block gil(ctx);
  if (recv_view.nbytes > release_gil_above_bytes) gil.release_now();
  ctx.run(op, &send_view, recv_view, order, copy);
}

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

// The node's part of a global transpose; arguments checked in the core, on every rank.
void transfer(node_context& ctx, const py::object& send, const py::object& recv,
              const std::vector<std::uint64_t>& shape, int axis_a, int axis_b, int order,
              int copy) {
  for (const py::object* a : {&send, &recv})
    if (!py::isinstance<py::array>(*a))
      fail_everywhere(ctx, op_code::transfer, true,
                      "expected numpy.ndarray arrays, got " +
                          py::str(py::type::of(*a).attr("__name__")).cast<std::string>());
  const array_view send_view = view_of(py::reinterpret_borrow<py::array>(send));
  const array_view recv_view = view_of(py::reinterpret_borrow<py::array>(recv));
  const transfer_geometry g =
      make_geometry(shape, axis_a, axis_b, recv_view.dtype.itemsize, ctx.config().comm_size);
  gil_released_on_block gil(ctx);
  if (recv_view.nbytes > release_gil_above_bytes) gil.release_now();
  ctx.run_transfer(g, send_view, recv_view, order, copy);
}

// (error kind or None, message, signature): the local checks of a transfer, no sync.
py::tuple check_transfer(const node_context& ctx, const py::array& send, const py::array& recv,
                         const std::vector<std::uint64_t>& shape, int axis_a, int axis_b,
                         int comm_rank) {
  const array_view send_view = view_of(send), recv_view = view_of(recv);
  const transfer_geometry g =
      make_geometry(shape, axis_a, axis_b, recv_view.dtype.itemsize, ctx.config().comm_size);
  const local_check c = check_transfer_args(g, comm_rank, send_view, recv_view);
  if (!c.ok())
    return py::make_tuple(c.error == arg_error::type ? "type" : "value", c.message, 0);
  return py::make_tuple(py::none(), "", g.signature());
}

// The tuned collective named `name` (alltoall, allgather).
op_code collective_op(const std::string& name) {
  const auto op = parse_name<op_code>(name);
  if (!op || tuned_index(*op) == no_rules)
    throw std::invalid_argument("op must name a tuned collective, got '" + name + "'");
  return *op;
}

// One tuning rule as Python passes it: (min_block, max_block or None, order code, copy code,
// fixed hybrid threshold or None).
using rule_tuple = std::tuple<std::size_t, std::optional<std::size_t>, int, int,
                              std::optional<std::size_t>>;

void set_tuning_rules(node_context& ctx, const std::string& op, const std::vector<rule_tuple>& rules) {
  std::vector<order_rule> orders;
  std::vector<copy_rule> copies;
  for (const auto& [min_block, max_block, order, copy, threshold] : rules) {
    block_range range{min_block, max_block.value_or(block_range{}.max_block)};
    orders.push_back({range, order});
    copies.push_back({range, copy, threshold.value_or(0), threshold.has_value()});
  }
  ctx.set_tuning_rules(collective_op(op), std::move(orders), std::move(copies));
}

py::tuple check(node_context& ctx, op_code op, const py::object& send, const py::object& recv,
                const std::string& order) {
  auto error = [](bool type_error, const std::string& why) {
    return py::make_tuple(type_error ? "type" : "value", why, 0, 0);
  };
  if (!py::isinstance<py::array>(recv)) return error(true, "recvbuf must be a numpy.ndarray");
  const array_view recv_view = view_of(py::reinterpret_borrow<py::array>(recv));
  const bool in_place = send.is(in_place_sentinel());
  py::object send_array = py::none();
  if (!in_place) {
    if (send.is_none()) return error(true, "sendbuf is None (use zcoll.IN_PLACE)");
    send_array = as_c_array(send);
    if (!send_array) {
      PyErr_Clear();
      return error(true, "sendbuf cannot be converted to a NumPy array");
    }
  }
  const array_view send_view =
      in_place ? array_view{} : view_of(py::reinterpret_borrow<py::array>(send_array));
  const local_check c =
      check_local_args(op, ctx.config().comm_size, in_place ? nullptr : &send_view, recv_view);
  if (!c.ok()) return error(c.error == arg_error::type, c.message);
  block_order o{};
  if (order == "auto")  // the node's part runs the ordered schedule (no eager path here)
    o = ctx.resolve_auto(op, c.block_bytes, recv_view.nbytes).order;
  else if (!parse_order(order, ctx.config().size, c.block_bytes, &o))
    return error(false, "order must be 'auto' or one of " + joined_names<block_order>(", ") +
                            ", got '" + order + "'");
  return py::make_tuple(py::none(), "", c.block_bytes, static_cast<int>(o));
}

}  // namespace

void register_exchange(py::module_& m) {
  py::class_<node_context, std::shared_ptr<node_context>>(
      m, "NodeContext", "The node-local engine of one communicator (see exchange.hpp).")
      .def(py::init([](std::shared_ptr<shm_segment> control, int rank, int size, int comm_size,
                       std::vector<int> comm_ranks, std::vector<std::int32_t> pids, int barrier,
                       double timeout, std::uint32_t spin, std::uint32_t yields, double slice) {
             context_config c;
             c.rank = rank;
             c.size = size;
             c.comm_size = comm_size;
             c.comm_ranks = std::move(comm_ranks);
             c.pids = std::move(pids);
             c.barrier = static_cast<barrier_kind>(barrier);
             c.wait = make_wait(timeout, spin, yields, slice);
             return std::make_shared<node_context>(std::move(control), std::move(c));
           }),
           py::arg("control"), py::arg("rank"), py::arg("size"), py::arg("comm_size"),
           py::arg("comm_ranks"), py::arg("pids"), py::arg("barrier"), py::arg("timeout"),
           py::arg("spin"), py::arg("yields"), py::arg("sleep_slice"))
      .def_static("control_bytes", &node_context::control_bytes, py::arg("size"))
      .def(
          "allocate",
          [](node_context& ctx, std::size_t nbytes) {
            py::gil_scoped_release release;
            return ctx.allocate(nbytes);
          },
          py::arg("nbytes"))
      .def(
          "alltoall",
          [](node_context& ctx, const py::object& send, const py::object& recv, int order,
             int copy) { run(ctx, op_code::alltoall, send, recv, order, copy); },
          py::arg("sendbuf"), py::arg("recvbuf"), py::arg("order"), py::arg("copy") = auto_copy)
      .def(
          "allgather",
          [](node_context& ctx, const py::object& send, const py::object& recv, int order,
             int copy) { run(ctx, op_code::allgather, send, recv, order, copy); },
          py::arg("sendbuf"), py::arg("recvbuf"), py::arg("order"), py::arg("copy") = auto_copy)
      .def(
          "check",
          [](node_context& ctx, const std::string& op, const py::object& send,
             const py::object& recv, const std::string& order) {
            return check(ctx, collective_op(op), send,
                         recv, order);
          },
          py::arg("op"), py::arg("sendbuf"), py::arg("recvbuf"), py::arg("order"),
          "(error kind or None, message, block bytes, order code): local checks only, no sync.")
      .def(
          "execute",
          [](node_context& ctx, const std::string& op, const py::object& send, py::array& recv,
             std::size_t block, int order, int copy) {
            collective_args a;
            a.copy = copy;
            a.op = collective_op(op);
            if (!send.is(in_place_sentinel())) {
              const auto s = py::reinterpret_borrow<py::array>(send);
              a.send = s.data();
              a.send_bytes = static_cast<std::size_t>(s.nbytes());
            }
            a.recv = recv.mutable_data();
            a.recv_bytes = static_cast<std::size_t>(recv.nbytes());
            a.block_bytes = block;
            a.dtype = view_of(recv).dtype;
            a.order = static_cast<block_order>(order);
            py::gil_scoped_release release;
            ctx.execute(a);
          },
          py::arg("op"), py::arg("sendbuf"), py::arg("recvbuf"), py::arg("block_bytes"),
          py::arg("order"), py::arg("copy") = auto_copy,
          "Runs a call whose arguments check() accepted (no local checks).")
      .def("transfer", &transfer, py::arg("src"), py::arg("dst"), py::arg("shape"),
           py::arg("axis_a"), py::arg("axis_b"), py::arg("order"), py::arg("copy") = auto_copy,
           "Collective: the node's blocks of a global transpose (see transfer.hpp).")
      .def("check_transfer", &check_transfer, py::arg("src"), py::arg("dst"), py::arg("shape"),
           py::arg("axis_a"), py::arg("axis_b"), py::arg("comm_rank"),
           "(error kind or None, message, signature): local checks of a transfer, no sync.")
      .def(
          "fail",
          [](node_context& ctx, int op, bool type_error, const std::string& message) {
            py::gil_scoped_release release;
            ctx.fail(static_cast<op_code>(op), type_error ? arg_error::type : arg_error::value,
                     message);
          },
          py::arg("op"), py::arg("type_error"), py::arg("message"))
      .def(
          "barrier",
          [](node_context& ctx) {
            py::gil_scoped_release release;
            ctx.barrier();
          })
      .def(
          "setup_eager",
          [](node_context& ctx, std::size_t nbytes) {
            py::gil_scoped_release release;
            ctx.setup_eager(nbytes);
          },
          py::arg("nbytes"), "Collective: small-message path for calls moving <= nbytes per rank.")
      .def(
          "set_wait",
          [](node_context& ctx, double timeout, std::uint32_t spin, std::uint32_t yields,
             double slice) { ctx.set_wait_options(make_wait(timeout, spin, yields, slice)); },
          py::arg("timeout"), py::arg("spin"), py::arg("yields"), py::arg("sleep_slice"))
      .def(
          "where",
          [](node_context& ctx, const py::array& a) {
            const buffer_ref r = ctx.where(a.data(), static_cast<std::size_t>(a.nbytes()));
            return py::make_tuple(r.segment, r.offset);
          },
          py::arg("a"), "(segment id, offset) of an arena array, (0, 0) when not shareable.")
      .def(
          "view",
          [](node_context& ctx, std::uint64_t segment, std::uint64_t offset, std::size_t nbytes) {
            return ctx.view(buffer_ref{segment, offset}, nbytes);
          },
          py::arg("segment"), py::arg("offset"), py::arg("nbytes"))
      .def(
          "set_copy_threshold",
          [](node_context& ctx, std::size_t bytes) { ctx.copy_choice().set_threshold(bytes); },
          py::arg("nbytes"), "Initial hybrid-copy threshold of copy='auto' (forgets tuning).")
      .def(
          "set_copy_cache",
          [](node_context& ctx, std::size_t bytes) { ctx.copy_choice().set_cache_bytes(bytes); },
          py::arg("nbytes"), "copy='auto' keeps calls moving at most this much on the node temporal.")
      .def_property_readonly("copy_cache",
                             [](node_context& ctx) { return ctx.copy_choice().cache_bytes(); })
      .def(
          "auto_copy_plan",
          [](node_context& ctx, std::size_t block, std::size_t received, const std::string& op) {
            const copy_plan p = ctx.copy_choice().peek(block, ctx.touched_bytes(received),
                                                       tuned_index(collective_op(op)));
            return py::make_tuple(std::string(name_of(p.mode)), p.threshold);
          },
          py::arg("block_bytes"), py::arg("received_bytes"), py::arg("op") = "alltoall",
          "(mode, threshold) copy='auto' uses now for op's blocks of this size, each rank "
          "receiving received_bytes.")
      .def(
          "set_tuning_rules", &set_tuning_rules, py::arg("op"), py::arg("rules"),
          "Tuning-table rules of op: (min_block, max_block or None, order code, copy code, "
          "fixed threshold or None) each; replaces earlier ones. Local: same on every node rank.")
      .def(
          "auto_order",
          [](const node_context& ctx, const std::string& op, std::size_t block,
             std::size_t received) {
            const auto_choice c = ctx.resolve_auto(collective_op(op), block, received);
            return py::make_tuple(c.eager ? "eager" : std::string(name_of(c.order)),
                                  c.from_rule);
          },
          py::arg("op"), py::arg("block_bytes"), py::arg("received_bytes"),
          "(order or 'eager', decided by a tuning rule) of order='auto' for such a call.")
      .def_property_readonly("eager_bytes", &node_context::eager_bytes,
                             "Largest per-rank receive size of the eager path (0: none).")
      .def(
          "copy_threshold",
          [](node_context& ctx, std::size_t block) {
            return ctx.copy_choice().threshold_for(block);
          },
          py::arg("block_bytes"),
          "The hybrid threshold copy='auto' uses (or is trying) for blocks of this size.")
      .def("close", &node_context::close)
      .def_property_readonly("closed", &node_context::closed)
      .def_property_readonly("broken", &node_context::broken)
      .def_property_readonly("calls", &node_context::calls)
      .def_property_readonly("arena_bytes_in_use", &node_context::arena_bytes_in_use)
      .def_property_readonly("segment_count", &node_context::segment_count)
      .def_property_readonly("rank", [](const node_context& c) { return c.config().rank; })
      .def_property_readonly("size", [](const node_context& c) { return c.config().size; });

  m.def(
      "_set_in_place", [](py::object sentinel) { in_place_sentinel() = std::move(sentinel); },
      "Registers the object that means 'in place' as sendbuf (mpi4py's MPI.IN_PLACE).");
  m.def(
      "default_order",
      [](int p, std::size_t block_bytes) { return static_cast<int>(default_order(p, block_bytes)); },
      py::arg("p"), py::arg("block_bytes"), "Order code used for order='auto'.");
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

}  // namespace zcoll::bind
