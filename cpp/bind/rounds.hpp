// A round between nodes (aggregate.hpp) run from the binding.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "fast_path.hpp"
#include "plans.hpp"
#include "zcoll/aggregate.hpp"
#include "zcoll/error.hpp"
#include "zcoll/exchange.hpp"
#ifdef ZCOLL_HAVE_MPI
#include "zcoll/across_nodes.hpp"
#include "zcoll/mpi_messages.hpp"
#endif

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

#ifdef ZCOLL_HAVE_MPI
// Whether `ctx` failed (a peer died or never came): a plan's messages in flight may never finish.
inline bool plan_messages_failed(node_context& ctx) {
  const node_messages* rounds = ctx.rounds();
  return ctx.broken() || (rounds && !rounds->failure().empty());
}

// Waits for a plan's messages between nodes (persistent_messages, slab_messages) within `ctx`'s
// bound; a peer_error marks the rounds failed.
template <class Messages>
void wait_plan_messages(node_context& ctx, Messages& messages, int rank, const std::string& what) {
  message_round_options options;
  options.timeout_s = wait_timeout(ctx);
  options.what = what;
  node_messages* rounds = ctx.rounds();
  if (!rounds) return messages.wait(rank, options);
  marking_failure(*rounds, [&] { messages.wait(rank, options); });
}

// [(peer, tag, C-contiguous ndarray)] as the rank-to-rank paths' buffers (writable to receive);
// the caller keeps the arrays alive.
std::vector<peer_buffer> peer_buffers(const pybind11::list& items, bool receive);

// The blocks between nodes of a plan on several nodes, run after run from C++: persistent MPI
// requests on the private dup, started before the node part and waited for after it, with a
// round's bounds (a peer_error marks the rounds failed; a failed context's plans raise at
// start). In place, each outgoing block is refreshed from its live place before a start.
class remote_runs final : public plan_remote {
 public:
  remote_runs(std::shared_ptr<node_context> ctx, const nodes_route& route,
              const pybind11::list& recvs, const pybind11::list& sends, const pybind11::list& saved,
              std::string what);
  void start() override;
  void wait() override;
  bool test() override { return messages_.test(); }
  bool failed() const override;

 private:
  std::shared_ptr<node_context> ctx_;
  persistent_messages messages_;
  int rank_;
  std::string what_;
  std::vector<std::pair<peer_buffer, peer_buffer>> refresh_;  // (saved copy, live block)
  pybind11::list keep_;                                       // the arrays the requests point into
};

// Registers Plan._attach_remote(route, recvs, sends, saved, what): from then on the plan's
// runs also exchange its blocks between nodes from C++ (remote_runs), in the same crossing.
template <class Plan>
void def_remote_runs(pybind11::class_<bound_plan<Plan>>& cls) {
  cls.def(
      "_attach_remote",
      [](bound_plan<Plan>& b, const nodes_route& route, const pybind11::list& recvs,
         const pybind11::list& sends, const pybind11::list& saved, std::string what) {
        b.remote = std::make_unique<remote_runs>(b.usable().context(), route, recvs, sends, saved,
                                                 std::move(what));
      },
      pybind11::arg("route"), pybind11::arg("recvs"), pybind11::arg("sends"),
      pybind11::arg("saved"), pybind11::arg("what"),
      "Local, once after creation: the plan's blocks between nodes, [(peer, tag, ndarray)] "
      "received and sent on the route's private dup on every run, and (saved copy, live block) "
      "pairs refreshed before each start (in place).");
}
#endif

}  // namespace zcoll::bind
