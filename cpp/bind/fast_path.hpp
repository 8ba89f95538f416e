// The one-crossing call path's table of contexts (bind_exchange.cpp), shared with the other
// entry points that take it (bind_reduction.cpp).
#pragma once

#include <Python.h>

#include <memory>

#include "zcoll/exchange.hpp"

namespace zcoll::bind {

// The context registered for communicator object `comm` (register_fast), or nullptr: then the
// Python path must run the call.
std::shared_ptr<node_context> registered_context(PyObject* comm);

}  // namespace zcoll::bind
