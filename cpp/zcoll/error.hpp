/*
 * Exceptions thrown by the core. The binding maps them to Python:
 *   peer_error     -> zcoll.PeerError (a peer died, left, never arrived, or the context is broken)
 *   wait_interrupted (a peer_error) -> the exception the interrupt check left pending (Python's
 *                     KeyboardInterrupt), else zcoll.PeerError
 *   usage_error    -> ValueError      (arguments that are wrong or differ between ranks)
 *   type_mismatch  -> TypeError       (dtypes that differ between ranks or send/receive)
 * std::system_error (shm_open, mmap, fallocate failures) maps to OSError-like RuntimeError.
 */
#pragma once

#include <stdexcept>
#include <string>

namespace zcoll {

class peer_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait abandoned because the interrupt check (set_interrupt_check) asked for it; the context is
// unusable afterwards, as after any peer_error.
class wait_interrupted : public peer_error {
 public:
  using peer_error::peer_error;
};

class usage_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class type_mismatch : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace zcoll
