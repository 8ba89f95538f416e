#include <pybind11/pybind11.h>

#include <string>

#include "bindings.hpp"
#include "zcoll/registry.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

template <class Enum>
py::tuple names_tuple() {
  py::tuple names(count_of<Enum>);
  for (int i = 0; i < count_of<Enum>; ++i)
    names[static_cast<std::size_t>(i)] = py::str(std::string(name_of(static_cast<Enum>(i))));
  return names;
}

}  // namespace

void register_registry(py::module_& m) {
  m.attr("ORDERS") = names_tuple<block_order>();
  m.attr("COPY_MODES") = names_tuple<copy_mode>();
  m.attr("COPY_ISAS") = names_tuple<copy_isa>();
  m.attr("BARRIERS") = names_tuple<barrier_kind>();
  m.attr("SCHEDULE_KINDS") = names_tuple<schedule_kind>();
  m.attr("REDUCE_OPS") = names_tuple<reduce_op>();
  m.attr("REDUCE_ALGORITHMS") = names_tuple<reduce_algorithm>();
  m.attr("ELEMENT_TYPES") = names_tuple<element_type>();
  m.attr("AUTO_ALGORITHM") = auto_algorithm;
  py::dict ops;
  for (int i = 0; i < count_of<op_code>; ++i)
    ops[py::str(std::string(name_of(static_cast<op_code>(i))))] = i;
  m.attr("OPS") = ops;
  py::tuple tuned(tuned_collectives.size());
  for (std::size_t i = 0; i < tuned_collectives.size(); ++i)
    tuned[i] = py::str(std::string(name_of(tuned_collectives[i])));
  m.attr("TUNED_COLLECTIVES") = tuned;
  m.attr("AUTO_NAME") = py::str(std::string(auto_name));
  m.attr("EAGER_NAME") = py::str(std::string(eager_name));
  m.attr("AUTO_ORDER") = auto_order;
  m.attr("EAGER_ORDER") = eager_order;
  m.attr("AUTO_COPY") = auto_copy;
}

}  // namespace zcoll::bind
