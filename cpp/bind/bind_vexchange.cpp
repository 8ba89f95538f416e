// Irregular collectives (vexchange.hpp): patterns from neighbour lists, and one call's
// conversion (arrays -> views, counts -> spans); every check is the engine's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "gil.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/vexchange.hpp"

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
    for (py::ssize_t i = 0; i < a.shape(0); ++i) list[static_cast<std::size_t>(i)] = {r(i, 0), r(i, 1)};
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
auto with_call(int code, int pattern, const py::object& send, const py::object& recv,
               int in_place, const counts_array& send_counts, const counts_array& send_displs,
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

std::string call_prefix(int code) {
  return "zcoll." + std::string(name_of(irregular_op(code))) + ": ";
}

}  // namespace

void register_vexchange(py::module_& m) {
  auto cls = py::reinterpret_borrow<py::class_<node_context, std::shared_ptr<node_context>>>(
      m.attr("NodeContext"));
  cls.def(
      "v_pattern",
      [](node_context& ctx, const std::vector<edges_array>& sends,
         const std::vector<edges_array>& recvs) {
        const auto& cr = ctx.config().comm_ranks;
        v_pattern p = match_edges(edge_lists(sends), edge_lists(recvs), cr);
        py::gil_scoped_release release;
        return ctx.irregular().add_pattern(std::move(p));
      },
      py::arg("sends"), py::arg("recvs"),
      "Collective: registers the pattern of the node ranks' send and receive lists (one (k, 2) "
      "array of (communicator rank, tag) per node rank); returns its id.");
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
              ctx.fail(arg_error::type, call_prefix(code) + why);
            });
      },
      py::arg("code"), py::arg("pattern"), py::arg("sendbuf"), py::arg("recvbuf"),
      py::arg("in_place"), py::arg("send_counts"), py::arg("send_displs"),
      py::arg("recv_counts"), py::arg("recv_displs"), py::arg("order"), py::arg("copy"),
      "Collective: the node's part of an irregular collective (counts and displacements in "
      "elements, one per list entry); raises on every rank when any rank's arguments are invalid "
      "or the ranks' counts disagree.");
  cls.def(
      "v_record",
      [](node_context& ctx, int code, int pattern, const py::object& send, const py::object& recv,
         int in_place, const counts_array& sc, const counts_array& sd, const counts_array& rc,
         const counts_array& rd, int order, int copy) {
        return record_bytes(with_call(
            code, pattern, send, recv, in_place, sc, sd, rc, rd, order, copy,
            [&](const v_call& call) { return ctx.irregular().describe(call); },
            [&](const std::string& why) {
              return error_record(arg_error::type, call_prefix(code) + why);
            }));
      },
      py::arg("code"), py::arg("pattern"), py::arg("sendbuf"), py::arg("recvbuf"),
      py::arg("in_place"), py::arg("send_counts"), py::arg("send_displs"),
      py::arg("recv_counts"), py::arg("recv_displs"), py::arg("order"), py::arg("copy"),
      "Local: this rank's call record of such a call, for agree() across nodes.");
  m.def(
      "match_edges",
      [](const std::vector<edges_array>& sends, const std::vector<edges_array>& recvs,
         const std::vector<int>& comm_ranks) {
        v_pattern p = match_edges(edge_lists(sends), edge_lists(recvs), comm_ranks);
        return py::make_tuple(tuple_array(p.tuples), p.send_blocks, p.recv_blocks);
      },
      py::arg("sends"), py::arg("recvs"), py::arg("comm_ranks"),
      "The 4-tuples (src, dst, send block, receive block) in positions of comm_ranks, and each "
      "rank's list lengths, of the ranks' send and receive lists ((k, 2) arrays of (peer, tag)).");
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
  m.def("v_piece", &v_piece, py::arg("total"), py::arg("parts"), py::arg("rank"),
        "[first, last): the bytes of a stream of `total` bytes that rank `rank` of `parts` copies.");
}

}  // namespace zcoll::bind
