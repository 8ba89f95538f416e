// The round between nodes (aggregate.hpp) as the binding asks it: whether a call carries its
// data in it.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "arrays.hpp"
#include "fast_path.hpp"
#include "zcoll/across_nodes.hpp"
#include "zcoll/aggregate.hpp"
#include "zcoll/error.hpp"
#include "zcoll/exchange.hpp"

namespace zcoll::bind {

// Whether a call of `op` across nodes carries its data whole in its round, by the engine's size
// rule (node_messages::carries): an allgather's block (`recv`'s bytes / P), a reduction's or
// bcast's input (`send`, or `recv` in place and for a bcast), non-empty. The one-crossing paths
// and the Python path (NodeContext.nodes_carries) decide by it alike.
inline bool round_carries(node_context& ctx, op_code op, const pybind11::object& send,
                          const pybind11::object& recv) {
  const bool gather = op == op_code::allgather;
  const pybind11::object& data = gather || is_in_place(send) || send.is_none() ? recv : send;
  if (!pybind11::isinstance<pybind11::array>(data)) return false;
  const auto bytes =
      static_cast<std::uint64_t>(pybind11::reinterpret_borrow<pybind11::array>(data).nbytes());
  const node_messages& round = ctx.between_nodes(node_map{});
  if (gather) return round.carries(op, bytes / static_cast<std::uint64_t>(ctx.config().comm_size));
  return bytes > 0 && round.carries(op, bytes);
}

}  // namespace zcoll::bind
