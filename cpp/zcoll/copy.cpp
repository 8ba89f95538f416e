#include "zcoll/copy.hpp"

#include <algorithm>
#include <array>

namespace zcoll {

void swap_bytes(void* a, void* b, std::size_t n) noexcept {
  alignas(64) unsigned char tmp[4096];
  auto* pa = static_cast<unsigned char*>(a);
  auto* pb = static_cast<unsigned char*>(b);
  while (n) {
    const std::size_t k = std::min(n, sizeof tmp);
    std::memcpy(tmp, pa, k);
    std::memcpy(pa, pb, k);
    std::memcpy(pb, tmp, k);
    pa += k, pb += k, n -= k;
  }
}

namespace {

constexpr int max_box_dims = 16;

struct box_axis {
  std::uint64_t count;
  std::int64_t dst_stride, src_stride;
};

// The box's axes without unit extents, outermost first, with axes that are contiguous on both
// sides merged into one. Returns the number of axes left; 0 axes means a single element.
int simplify(box_axis* axes, const std::int64_t* dst_strides, const std::int64_t* src_strides,
             const std::uint64_t* count, int ndim) noexcept {
  int n = 0;
  for (int k = 0; k < ndim; ++k) {
    if (count[k] == 1) continue;
    const box_axis next{count[k], dst_strides[k], src_strides[k]};
    if (n > 0) {
      box_axis& outer = axes[n - 1];
      if (outer.dst_stride == next.dst_stride * static_cast<std::int64_t>(next.count) &&
          outer.src_stride == next.src_stride * static_cast<std::int64_t>(next.count)) {
        outer = {outer.count * next.count, next.dst_stride, next.src_stride};
        continue;
      }
    }
    axes[n++] = next;
  }
  return n;
}

// Copies the innermost axis: one run when contiguous on both sides, else element by element.
inline void copy_line(std::byte* dst, const std::byte* src, const box_axis& inner,
                      std::size_t itemsize) noexcept {
  const auto item = static_cast<std::int64_t>(itemsize);
  if (inner.dst_stride == item && inner.src_stride == item) {
    std::memcpy(dst, src, inner.count * itemsize);
    return;
  }
  for (std::uint64_t i = 0; i < inner.count; ++i)
    std::memcpy(dst + static_cast<std::int64_t>(i) * inner.dst_stride,
                src + static_cast<std::int64_t>(i) * inner.src_stride, itemsize);
}

}  // namespace

void copy_box(std::byte* dst, const std::int64_t* dst_strides, const std::byte* src,
              const std::int64_t* src_strides, const std::uint64_t* count, int ndim,
              std::size_t itemsize) noexcept {
  for (int k = 0; k < ndim; ++k)
    if (count[k] == 0) return;
  std::array<box_axis, max_box_dims> axes{};
  const int n = simplify(axes.data(), dst_strides, src_strides, count,
                         std::min(ndim, max_box_dims));
  if (n == 0) {
    std::memcpy(dst, src, itemsize);
    return;
  }
  const box_axis& inner = axes[static_cast<std::size_t>(n - 1)];
  // Odometer over the outer axes.
  std::array<std::uint64_t, max_box_dims> index{};
  for (;;) {
    copy_line(dst, src, inner, itemsize);
    int k = n - 2;
    for (; k >= 0; --k) {
      const box_axis& ax = axes[static_cast<std::size_t>(k)];
      dst += ax.dst_stride, src += ax.src_stride;
      if (++index[static_cast<std::size_t>(k)] < ax.count) break;
      index[static_cast<std::size_t>(k)] = 0;
      dst -= ax.dst_stride * static_cast<std::int64_t>(ax.count);
      src -= ax.src_stride * static_cast<std::int64_t>(ax.count);
    }
    if (k < 0) return;
  }
}

}  // namespace zcoll
