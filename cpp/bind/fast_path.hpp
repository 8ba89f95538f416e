// The one-crossing call path's table of contexts (bind_exchange.cpp), shared with the other
// entry points that take it (bind_reduction.cpp).
#pragma once

#include <Python.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "mpi_handle.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/message_flow.hpp"

namespace zcoll::bind {

using zcoll::nodes_route;  // message_flow.hpp

// The context registered for communicator object `comm` (register_fast) on one node, or
// nullptr: then the Python path must run the call.
std::shared_ptr<node_context> registered_context(PyObject* comm);
// The context registered for `comm` with its route between nodes (a communicator on several
// nodes, messages from C++), or nullptr.
std::shared_ptr<node_context> registered_route(PyObject* comm, nodes_route& route);

// What an order= / copy= value names (fast_collective's parsing: "auto" by identity, other
// names parsed), or no_option_code when it names nothing.
inline constexpr int no_option_code = -100;
int order_code(PyObject* name);
int copy_code(PyObject* name);

}  // namespace zcoll::bind
