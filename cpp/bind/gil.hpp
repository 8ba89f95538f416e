// The GIL around blocking engine calls: released when a wait really blocks, or up front for
// long copies; never held while waiting for a peer.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>

#include "zcoll/exchange.hpp"

namespace zcoll::bind {

// Releases the GIL the first time the engine is about to block, and takes it back at scope
// exit: short calls that never wait keep it (saving two mutex handoffs); waits never hold it.
class gil_released_on_block {
 public:
  // Copies of more than this many bytes hold the GIL too long: release it up front.
  static constexpr std::size_t release_above_bytes = std::size_t{1} << 16;

  gil_released_on_block(node_context& ctx, std::size_t bytes) : ctx_(ctx) {
    ctx_.set_block_hook({&gil_released_on_block::release, this});
    if (bytes > release_above_bytes) release(this);
  }
  ~gil_released_on_block() {
    ctx_.set_block_hook({});
    if (state_) PyEval_RestoreThread(state_);
  }
  gil_released_on_block(const gil_released_on_block&) = delete;
  gil_released_on_block& operator=(const gil_released_on_block&) = delete;

 private:
  static void release(void* self) {
    auto* me = static_cast<gil_released_on_block*>(self);
    if (!me->state_) me->state_ = PyEval_SaveThread();
  }
  node_context& ctx_;
  PyThreadState* state_ = nullptr;
};

}  // namespace zcoll::bind
