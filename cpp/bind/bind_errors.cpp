#include <pybind11/pybind11.h>

#include <system_error>

#include "bindings.hpp"
#include "zcoll/barrier.hpp"
#include "zcoll/error.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

// The engine's interrupt check (see barrier.hpp): Python's pending signals, their handlers run
// as the interpreter would run them; true when one raised (KeyboardInterrupt, by default).
bool python_signal_raised() {
  const PyGILState_STATE gil = PyGILState_Ensure();
  const bool raised = PyErr_CheckSignals() != 0;
  PyGILState_Release(gil);
  return raised;
}

}  // namespace

void register_errors(py::module_& m) {
  set_interrupt_check(&python_signal_raised);
  static py::exception<peer_error> peer(m, "PeerError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const wait_interrupted& e) {
      if (!PyErr_Occurred()) py::set_error(peer, e.what());  // else KeyboardInterrupt & co.
    } catch (const peer_error& e) {
      py::set_error(peer, e.what());
    } catch (const type_mismatch& e) {
      py::set_error(PyExc_TypeError, e.what());
    } catch (const usage_error& e) {
      py::set_error(PyExc_ValueError, e.what());
    } catch (const std::system_error& e) {
      py::set_error(PyExc_OSError, e.what());
    }
  });
}

}  // namespace zcoll::bind
