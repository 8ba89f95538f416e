// NodeContext, the one bound class that several files fill: register_exchange makes it, and
// each other register_* adds the methods of its concept (reductions, irregular calls, tuning).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "zcoll/exchange.hpp"

namespace zcoll::bind {

using context_class = pybind11::class_<node_context, std::shared_ptr<node_context>>;

// The class register_exchange made, from the module.
inline context_class bound_context(const pybind11::module_& m) {
  return pybind11::reinterpret_borrow<context_class>(m.attr("NodeContext"));
}

}  // namespace zcoll::bind
