// The shared heap (heap.hpp) as NumPy's memory handler (NEP 49): array data of at least the
// heap's small size comes from node shared memory; everything the heap does not take (small
// requests, a fork child, a refused segment) goes to NumPy's default handler, so an array is
// never lost for want of shared memory -- NumPy raises MemoryError only when that fails too.
// Each array keeps the handler that allocated it, so switching the heap off later still frees
// heap arrays here.
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define NPY_TARGET_VERSION NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL zcoll_ARRAY_API
#include <numpy/arrayobject.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>

#include "bindings.hpp"
#include "zcoll/heap.hpp"

namespace py = pybind11;

namespace zcoll::bind {

namespace {

PyDataMem_Handler* fallback = nullptr;  // NumPy's default handler

void* fallback_malloc(std::size_t n) {
  return fallback->allocator.malloc(fallback->allocator.ctx, n);
}

void* heap_malloc(void* /*ctx*/, std::size_t n) {
  if (void* p = heap::allocate(n, false)) return p;
  return fallback_malloc(n);
}

void* heap_calloc(void* /*ctx*/, std::size_t count, std::size_t size) {
  if (size && count > SIZE_MAX / size) return nullptr;
  if (void* p = heap::allocate(count * size, true)) return p;
  return fallback->allocator.calloc(fallback->allocator.ctx, count, size);
}

void* heap_realloc(void* ctx, void* p, std::size_t n) {
  if (!p) return heap_malloc(ctx, n);
  const std::size_t have = heap::usable_bytes(p);  // 0: not the heap's
  if (!have) return fallback->allocator.realloc(fallback->allocator.ctx, p, n);
  if (n <= have && n > have / 2) return p;  // still the right block
  void* q = heap_malloc(ctx, n);
  if (!q) return nullptr;  // NumPy keeps p, as realloc's contract says
  std::memcpy(q, p, std::min(have, n));
  heap::release(p);
  return q;
}

void heap_free(void* /*ctx*/, void* p, std::size_t size) {
  if (!heap::release(p)) fallback->allocator.free(fallback->allocator.ctx, p, size);
}

PyDataMem_Handler handler = {
    "zcoll_shared_heap", 1, {nullptr, heap_malloc, heap_calloc, heap_realloc, heap_free}};

// The capsules of zcoll's handler and NumPy's default one (made once, never freed: arrays
// hold them).
py::object handler_capsule() {
  static PyObject* capsule = PyCapsule_New(&handler, "mem_handler", nullptr);
  if (!capsule) throw py::error_already_set();
  return py::reinterpret_borrow<py::object>(capsule);
}

py::object default_capsule() {
  return py::reinterpret_borrow<py::object>(PyDataMem_DefaultHandler);
}

py::object set_handler(const py::object& capsule) {
  PyObject* previous = PyDataMem_SetHandler(capsule.ptr());
  if (!previous) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(previous);
}

}  // namespace

void register_heap(py::module_& m) {
  if (_import_array() < 0) throw py::error_already_set();
  fallback = static_cast<PyDataMem_Handler*>(
      PyCapsule_GetPointer(PyDataMem_DefaultHandler, "mem_handler"));
  if (!fallback) throw py::error_already_set();
  m.def("heap_handler", &handler_capsule, "The shared heap's NumPy memory handler (a capsule).");
  m.def("default_handler", &default_capsule, "NumPy's default memory handler (a capsule).");
  m.def("set_memory_handler", &set_handler, py::arg("handler"),
        "Makes `handler` NumPy's memory handler in the current context; returns the previous.");
  m.def(
      "set_heap_limits",
      [](std::size_t small, std::size_t large, std::optional<std::size_t> keep_total) {
        heap::limits l = heap::current_limits();
        l.small_bytes = small;
        l.large_bytes = large;
        l.keep_total_bytes = keep_total.value_or(heap::limits{}.keep_total_bytes);
        heap::set_limits(l);
      },
      py::arg("small_bytes"), py::arg("large_bytes"), py::arg("keep_total_bytes") = py::none(),
      "Requests below small_bytes stay with NumPy's allocator; from large_bytes a segment each; "
      "freed segments kept for reuse up to keep_total_bytes (None: the default).");
  m.def("heap_stats", [] {
    const heap::stats s = heap::current_stats();
    const heap::limits l = heap::current_limits();
    py::dict d;
    d["segments"] = s.segments;
    d["segment_bytes"] = s.segment_bytes;
    d["blocks"] = s.blocks;
    d["kept_bytes"] = s.kept_bytes;
    d["attached"] = s.attached;
    d["forked_child"] = s.forked_child;
    d["small_bytes"] = l.small_bytes;
    d["large_bytes"] = l.large_bytes;
    d["huge_bytes"] = l.huge_bytes;
    d["shmem_huge_pages"] = heap::shmem_huge_pages();
    return d;
  });
  m.def(
      "in_heap", [](const py::buffer& b) { return heap::owns(b.request().ptr); }, py::arg("buffer"),
      "Whether the buffer's first byte lies in this process's shared heap.");
}

}  // namespace zcoll::bind
