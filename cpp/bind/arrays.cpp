#include "arrays.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

py::object& in_place_sentinel() {
  static py::object* sentinel = new py::object(py::none());  // leaked: outlives the interpreter
  return *sentinel;
}

}  // namespace

bool is_in_place(const py::object& obj) {
  return obj.is(in_place_sentinel());
}
void set_in_place(py::object sentinel) {
  in_place_sentinel() = std::move(sentinel);
}

std::string type_name(const py::handle& obj) {
  return py::str(py::type::of(obj).attr("__name__")).cast<std::string>();
}

array_view view_of(const py::array& a) {
  const py::dtype dt = a.dtype();  // fetched once: every accessor below would fetch it again
  array_view v;
  v.data = a.data();
  v.ndim = static_cast<int>(a.ndim());
  const py::ssize_t* shape = a.shape();
  std::size_t size = 1;
  for (int i = 0; i < v.ndim; ++i) size *= static_cast<std::size_t>(shape[i]);
  v.size = size;
  v.first_dim = v.ndim ? static_cast<std::size_t>(shape[0]) : 0;
  static_assert(sizeof(py::ssize_t) == sizeof(std::int64_t));
  v.shape = reinterpret_cast<const std::int64_t*>(shape);
  const auto itemsize = static_cast<std::size_t>(dt.itemsize());
  v.nbytes = size * itemsize;
  v.dtype = {static_cast<std::uint32_t>(static_cast<unsigned char>(dt.char_())),
             static_cast<std::uint32_t>(itemsize)};
  const char kind = dt.kind();
  v.has_objects = kind == 'O' || (kind == 'V' && dt.attr("hasobject").cast<bool>());
  const int flags = a.flags();
  v.c_contiguous = (flags & py::array::c_style) != 0;
  v.writeable = (flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_) != 0;
  return v;
}

py::array as_c_array(const py::object& obj) {
  if (py::isinstance<py::array>(obj)) {
    auto a = py::reinterpret_borrow<py::array>(obj);
    if (a.flags() & py::array::c_style) return a;
  }
  py::array a = py::array::ensure(obj, py::array::c_style);
  if (!a) PyErr_Clear();
  return a;
}

}  // namespace zcoll::bind
