// Global transposes on a NodeContext (transfer.hpp, transfer_exec.cpp).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "gil.hpp"
#include "zcoll/exchange.hpp"

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

constexpr const char* not_arrays = "zcoll.transfer: expected numpy.ndarray arrays, got ";

// Converts a transfer's arrays and returns ok(geometry, send view, recv view), or
// error(TypeError message) when one of them is not an ndarray (as with_views in
// bind_exchange.cpp).
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
        ctx.fail(arg_error::type, why);
      });
}

py::bytes transfer_record(const node_context& ctx, const py::object& send, const py::object& recv,
                          const std::vector<std::uint64_t>& shape, int axis_a, int axis_b,
                          int order, int copy) {
  return record_bytes(with_transfer_views(
      ctx, send, recv, shape, axis_a, axis_b,
      [&](const transfer_geometry& g, const array_view& send_view, const array_view& recv_view) {
        return ctx.describe_transfer(g, send_view, recv_view, order, copy);
      },
      [](const std::string& why) { return error_record(arg_error::type, why); }));
}

}  // namespace

void register_transfer(py::module_& m) {
  auto cls = py::reinterpret_borrow<py::class_<node_context, std::shared_ptr<node_context>>>(
      m.attr("NodeContext"));
  cls.def("transfer", &transfer, py::arg("src"), py::arg("dst"), py::arg("shape"),
          py::arg("axis_a"), py::arg("axis_b"), py::arg("order"), py::arg("copy") = auto_copy,
          "Collective: the node's blocks of a global transpose (see transfer.hpp).");
  cls.def("transfer_record", &transfer_record, py::arg("src"), py::arg("dst"), py::arg("shape"),
          py::arg("axis_a"), py::arg("axis_b"), py::arg("order"), py::arg("copy") = auto_copy,
          "Local: this rank's call record of a transfer, for agree() across nodes.");
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
