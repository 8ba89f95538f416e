// A round between nodes (aggregate.hpp) run from the binding.
#pragma once

#include <cstdint>
#include <string>

#include "zcoll/aggregate.hpp"
#include "zcoll/exchange.hpp"

namespace zcoll::bind {

#ifdef ZCOLL_HAVE_MPI
// The rest of a begun round: this rank's messages by MPI from C++ (mpi_messages.hpp: at most
// `window` sends in flight, PeerError after `timeout` seconds), the node barrier that ends the
// exchange, then node_messages::finish. Call with the GIL released.
void finish_round_by_mpi(node_context& ctx, node_messages& round, std::uintptr_t comm, int rank,
                         int tag, int window, double timeout, const std::string& what);
#endif

}  // namespace zcoll::bind
