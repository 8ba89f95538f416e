#include <pybind11/pybind11.h>

#include <system_error>

#include "bindings.hpp"
#include "zcoll/error.hpp"

namespace py = pybind11;

namespace zcoll::bind {

void register_errors(py::module_& m) {
  static py::exception<peer_error> peer(m, "PeerError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
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
