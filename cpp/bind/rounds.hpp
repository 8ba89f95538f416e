// A round between nodes (aggregate.hpp) run from the binding.
#pragma once

#include <cstdint>
#include <string>

#include "zcoll/aggregate.hpp"
#include "zcoll/error.hpp"
#include "zcoll/exchange.hpp"

namespace zcoll::bind {

// How calls on several nodes choose between carrying their blocks in the round and sending them
// rank to rank: the size rule (0, node_messages::max_aggregated_block), always (1) or never
// (-1); zcoll._aggregated.force sets it, for tests and benchmarks.
int& aggregation_mode();
// The largest block a call on `round`'s nodes carries in the round (negative: none).
std::int64_t pack_limit(const node_messages& round);

// Runs `steps` (a round between nodes and what follows it); a peer_error other than an
// interrupt marks the rounds failed first, so every later call raises at once (as the Python
// path's Context.break_context does).
template <class Steps>
void marking_failure(node_messages& round, Steps&& steps) {
  try {
    steps();
  } catch (const wait_interrupted&) {
    throw;
  } catch (const peer_error& e) {
    if (round.failure().empty()) round.mark_failed(e.what());
    throw;
  }
}

#ifdef ZCOLL_HAVE_MPI
// The rest of a begun round: this rank's messages by MPI from C++ (mpi_messages.hpp: at most
// `window` sends in flight, PeerError after `timeout` seconds), the node barrier that ends the
// exchange, then node_messages::finish. Call with the GIL released.
void finish_round_by_mpi(node_context& ctx, node_messages& round, std::uintptr_t comm, int rank,
                         int tag, int window, double timeout, const std::string& what);
#endif

}  // namespace zcoll::bind
