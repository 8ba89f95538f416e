#include <pybind11/pybind11.h>

#include <string>

#include "bindings.hpp"
#include "zcoll/departure.hpp"

namespace py = pybind11;

namespace zcoll::bind {

void register_departure(py::module_& m) {
  m.attr("DEPARTED_EXITED") = static_cast<int>(departure_reason::exited);
  m.attr("DEPARTED_EXCEPTION") = static_cast<int>(departure_reason::exception);
  m.attr("DEPARTED_SIGNAL") = static_cast<int>(departure_reason::signal);
  m.def(
      "depart_everywhere",
      [](int reason, const std::string& text) {
        if (reason < static_cast<int>(departure_reason::exited) ||
            reason > static_cast<int>(departure_reason::signal))
          throw std::invalid_argument("unknown departure reason " + std::to_string(reason));
        depart_everywhere(static_cast<departure_reason>(reason), text.c_str());
      },
      py::arg("reason"), py::arg("text"),
      "Local: announce in every live context of this process that this rank leaves (peers "
      "waiting for it raise PeerError at once). The first announcement per context counts.");
  m.def("install_departure_handler", &install_departure_handler, py::arg("signo"),
        "Local, once per signal: on `signo`, announce the departure, then hand the signal on to "
        "the handler installed before (or its default action). False if sigaction failed.");
}

}  // namespace zcoll::bind
