#include "zcoll/copy.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <limits>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define ZCOLL_X86 1
#if defined(__GNUC__) || defined(__clang__)
// Streaming kernels: each compiled for its own instruction set, whatever the build's -march.
#define ZCOLL_STREAM_KERNELS 1
#define ZCOLL_TARGET(isa) __attribute__((target(isa)))
#endif
#endif

namespace zcoll {

void store_fence() noexcept {
#ifdef ZCOLL_X86
  _mm_sfence();
#else
  std::atomic_thread_fence(std::memory_order_release);
#endif
}

namespace {

using stream_fn = void (*)(std::byte*, const std::byte*, std::size_t) noexcept;

void stream_portable(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
  std::memcpy(dst, src, n);
}

#ifdef ZCOLL_STREAM_KERNELS

// The streaming kernels. Each one copies
//   head: memcpy up to the next 64-byte (cache-line) boundary of dst,
//   body: whole cache lines, unaligned loads and aligned non-temporal stores, `step` bytes per
//         iteration, prefetching the source `prefetch_distance` bytes ahead,
//   tail: the last partial line with memcpy,
// so that no destination line gets both temporal and streaming stores and every streamed line
// is written whole (a full write-combining buffer: no read-for-ownership, one burst to memory).
// Copies below `small_copy` bytes are a plain memcpy. No fence: see store_fence().
constexpr std::size_t line = 64;
constexpr std::size_t small_copy = 2 * line;
constexpr std::size_t prefetch_distance = 512;  // ahead of the loads; see ZCOLL_PREFETCH_HINT
#ifndef ZCOLL_PREFETCH_HINT
#define ZCOLL_PREFETCH_HINT _MM_HINT_NTA
#endif

// Bytes from p up to the next cache-line boundary.
inline std::size_t line_gap(const void* p) noexcept {
  return (line - (reinterpret_cast<std::uintptr_t>(p) & (line - 1))) & (line - 1);
}

// Prefetches the source line `prefetch_distance + offset` bytes past p. The address is formed
// with integer arithmetic: near the end of the source it points past the buffer, which a
// prefetch (never faulting) tolerates but C++ pointer arithmetic does not.
inline void prefetch_ahead(const std::byte* p, std::size_t offset) noexcept {
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(p) + prefetch_distance + offset;
  _mm_prefetch(reinterpret_cast<const char*>(at), ZCOLL_PREFETCH_HINT);
}

// Copies the head, returns false (everything copied) for small copies.
inline bool copy_head(std::byte*& dst, const std::byte*& src, std::size_t& n) noexcept {
  if (n < small_copy) {
    std::memcpy(dst, src, n);
    return false;
  }
  const std::size_t head = line_gap(dst);
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  return true;
}

// Unaligned loads of the i-th vector at p.
inline __m128i load128(const std::byte* p, std::size_t i) noexcept {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p) + i);
}
ZCOLL_TARGET("avx2") inline __m256i load256(const std::byte* p, std::size_t i) noexcept {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p) + i);
}
ZCOLL_TARGET("avx512f") inline __m512i load512(const std::byte* p, std::size_t i) noexcept {
  return _mm512_loadu_si512(reinterpret_cast<const __m512i*>(p) + i);
}

// 16-byte vectors, two lines (8 vectors) per iteration.
void stream_sse2(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
  if (!copy_head(dst, src, n)) return;
  constexpr std::size_t step = 2 * line;
  for (; n >= step; dst += step, src += step, n -= step) {
    prefetch_ahead(src, 0);
    prefetch_ahead(src, line);
    const __m128i a = load128(src, 0), b = load128(src, 1), c = load128(src, 2);
    const __m128i d = load128(src, 3), e = load128(src, 4), f = load128(src, 5);
    const __m128i g = load128(src, 6), h = load128(src, 7);
    auto* out = reinterpret_cast<__m128i*>(dst);
    _mm_stream_si128(out + 0, a), _mm_stream_si128(out + 1, b);
    _mm_stream_si128(out + 2, c), _mm_stream_si128(out + 3, d);
    _mm_stream_si128(out + 4, e), _mm_stream_si128(out + 5, f);
    _mm_stream_si128(out + 6, g), _mm_stream_si128(out + 7, h);
  }
  if (n >= line) {
    const __m128i a = load128(src, 0), b = load128(src, 1), c = load128(src, 2);
    const __m128i d = load128(src, 3);
    auto* out = reinterpret_cast<__m128i*>(dst);
    _mm_stream_si128(out + 0, a), _mm_stream_si128(out + 1, b);
    _mm_stream_si128(out + 2, c), _mm_stream_si128(out + 3, d);
    dst += line, src += line, n -= line;
  }
  std::memcpy(dst, src, n);
}

// 32-byte vectors, two lines (4 vectors) per iteration.
ZCOLL_TARGET("avx2")
void stream_avx2(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
  if (!copy_head(dst, src, n)) return;
  constexpr std::size_t step = 2 * line;
  for (; n >= step; dst += step, src += step, n -= step) {
    prefetch_ahead(src, 0);
    prefetch_ahead(src, line);
    const __m256i a = load256(src, 0), b = load256(src, 1);
    const __m256i c = load256(src, 2), d = load256(src, 3);
    auto* out = reinterpret_cast<__m256i*>(dst);
    _mm256_stream_si256(out + 0, a), _mm256_stream_si256(out + 1, b);
    _mm256_stream_si256(out + 2, c), _mm256_stream_si256(out + 3, d);
  }
  if (n >= line) {
    const __m256i a = load256(src, 0), b = load256(src, 1);
    auto* out = reinterpret_cast<__m256i*>(dst);
    _mm256_stream_si256(out + 0, a), _mm256_stream_si256(out + 1, b);
    dst += line, src += line, n -= line;
  }
  std::memcpy(dst, src, n);
}

// 64-byte vectors (one line each), four lines per iteration.
ZCOLL_TARGET("avx512f")
void stream_avx512(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
  if (!copy_head(dst, src, n)) return;
  constexpr std::size_t step = 4 * line;
  for (; n >= step; dst += step, src += step, n -= step) {
    prefetch_ahead(src, 0);
    prefetch_ahead(src, line);
    prefetch_ahead(src, 2 * line);
    prefetch_ahead(src, 3 * line);
    const __m512i a = load512(src, 0), b = load512(src, 1);
    const __m512i c = load512(src, 2), d = load512(src, 3);
    auto* out = reinterpret_cast<__m512i*>(dst);
    _mm512_stream_si512(out + 0, a), _mm512_stream_si512(out + 1, b);
    _mm512_stream_si512(out + 2, c), _mm512_stream_si512(out + 3, d);
  }
  for (; n >= line; dst += line, src += line, n -= line)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), load512(src, 0));
  std::memcpy(dst, src, n);
}

bool cpu_has(copy_isa isa) noexcept {
  __builtin_cpu_init();  // harmless when libgcc's constructor already ran
  if (isa == copy_isa::avx512) return __builtin_cpu_supports("avx512f");
  if (isa == copy_isa::avx2) return __builtin_cpu_supports("avx2");
  return isa == copy_isa::portable || isa == copy_isa::sse2;  // SSE2 is part of x86-64
}

constexpr std::array<stream_fn, count_of<copy_isa>> kernels{&stream_portable, &stream_sse2,
                                                            &stream_avx2, &stream_avx512};

#else  // no streaming store: every kernel is memcpy

bool cpu_has(copy_isa isa) noexcept {
  return isa == copy_isa::portable;
}

constexpr std::array<stream_fn, count_of<copy_isa>> kernels{&stream_portable, &stream_portable,
                                                            &stream_portable, &stream_portable};

#endif

copy_isa find_best_isa() noexcept {
  for (int i = count_of<copy_isa> - 1; i > 0; --i)
    if (cpu_has(static_cast<copy_isa>(i))) return static_cast<copy_isa>(i);
  return copy_isa::portable;
}

// The kernel streaming copies run. Constant-initialised to a resolver that installs the best one,
// so a copy made before this file's dynamic initialisation (below) is still correct.
void resolve_and_stream(std::byte* dst, const std::byte* src, std::size_t n) noexcept;
std::atomic<stream_fn> active_kernel{&resolve_and_stream};

stream_fn current_kernel() noexcept {
  return active_kernel.load(std::memory_order_relaxed);
}

void install_best() noexcept {
  stream_fn expected = &resolve_and_stream;
  active_kernel.compare_exchange_strong(expected, kernels[static_cast<int>(best_isa())],
                                        std::memory_order_relaxed);
}

void resolve_and_stream(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
  install_best();
  current_kernel()(dst, src, n);
}

// Chooses the kernel once, when the library is loaded.
[[maybe_unused]] const bool chosen_at_load = (install_best(), true);

// Copies the runs of one block: the first `temporal_left` bytes with memcpy, the rest with the
// streaming kernel (temporal: the budget never runs out; streaming: it starts at 0).
class block_writer {
 public:
  explicit block_writer(const copy_plan& how) noexcept
      : temporal_left_(how.mode == copy_mode::temporal ? std::numeric_limits<std::size_t>::max()
                       : how.mode == copy_mode::hybrid ? how.threshold
                                                       : 0),
        stream_(how.mode == copy_mode::temporal ? &stream_portable : current_kernel()) {}

  void run(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
    const std::size_t t = std::min(n, temporal_left_);
    if (t) std::memcpy(dst, src, t);
    if (t < n) stream_(dst + t, src + t, n - t);
    temporal_left_ -= t;
  }

  // Bytes that were copied with temporal stores whatever the plan (element-wise loops).
  void count_temporal(std::size_t n) noexcept { temporal_left_ -= std::min(n, temporal_left_); }

 private:
  std::size_t temporal_left_;
  stream_fn stream_;
};

}  // namespace

bool isa_available(copy_isa isa) noexcept {
  const int i = static_cast<int>(isa);
  return i >= 0 && i < count_of<copy_isa> && cpu_has(isa);
}

copy_isa best_isa() noexcept {
  static const copy_isa best = find_best_isa();
  return best;
}

copy_isa active_isa() noexcept {
  const stream_fn k = current_kernel();
  if (k == &resolve_and_stream) return best_isa();
  // Kernels may share a function (portable builds): the highest available one is reported.
  for (int i = count_of<copy_isa> - 1; i > 0; --i)
    if (kernels[i] == k && cpu_has(static_cast<copy_isa>(i))) return static_cast<copy_isa>(i);
  return copy_isa::portable;
}

bool select_isa(copy_isa isa) noexcept {
  if (!isa_available(isa)) return false;
  active_kernel.store(kernels[static_cast<int>(isa)], std::memory_order_relaxed);
  return true;
}

void copy_bytes(void* dst, const void* src, std::size_t n, const copy_plan& how) noexcept {
  if (n == 0) return;
  block_writer(how).run(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), n);
}

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

// Copies the innermost axis: one run (as the plan says) when contiguous on both sides, else
// element by element with temporal stores.
inline void copy_line(std::byte* dst, const std::byte* src, const box_axis& inner,
                      std::size_t itemsize, block_writer& out) noexcept {
  const auto item = static_cast<std::int64_t>(itemsize);
  if (inner.dst_stride == item && inner.src_stride == item) {
    out.run(dst, src, inner.count * itemsize);
    return;
  }
  for (std::uint64_t i = 0; i < inner.count; ++i)
    std::memcpy(dst + static_cast<std::int64_t>(i) * inner.dst_stride,
                src + static_cast<std::int64_t>(i) * inner.src_stride, itemsize);
  out.count_temporal(inner.count * itemsize);
}

// Copies `n` (>= 1) simplified axes.
void copy_axes(std::byte* dst, const std::byte* src, const box_axis* axes, int n,
               std::size_t itemsize, const copy_plan& how) noexcept {
  const box_axis& inner = axes[n - 1];
  block_writer out(how);  // the whole box is one block: hybrid's budget spans all its runs
  // Odometer over the outer axes.
  std::array<std::uint64_t, max_box_dims> index{};
  for (;;) {
    copy_line(dst, src, inner, itemsize, out);
    int k = n - 2;
    for (; k >= 0; --k) {
      const box_axis& ax = axes[k];
      dst += ax.dst_stride, src += ax.src_stride;
      if (++index[static_cast<std::size_t>(k)] < ax.count) break;
      index[static_cast<std::size_t>(k)] = 0;
      dst -= ax.dst_stride * static_cast<std::int64_t>(ax.count);
      src -= ax.src_stride * static_cast<std::int64_t>(ax.count);
    }
    if (k < 0) return;
  }
}

}  // namespace

void copy_box(std::byte* dst, const std::int64_t* dst_strides, const std::byte* src,
              const std::int64_t* src_strides, const std::uint64_t* count, int ndim,
              std::size_t itemsize, const copy_plan& how) noexcept {
  for (int k = 0; k < ndim; ++k)
    if (count[k] == 0) return;
  std::array<box_axis, max_box_dims> axes{};
  const int n =
      simplify(axes.data(), dst_strides, src_strides, count, std::min(ndim, max_box_dims));
  if (n == 0) {
    std::memcpy(dst, src, itemsize);
    return;
  }
  copy_axes(dst, src, axes.data(), n, itemsize, how);
}

std::size_t box_shape::bytes() const noexcept {
  if (rank < 0) return 0;
  std::size_t n = itemsize;
  for (int k = 0; k < rank; ++k) n *= axes[static_cast<std::size_t>(k)].count;
  return n;
}

box_shape make_box(const std::int64_t* dst_strides, const std::int64_t* src_strides,
                   const std::uint64_t* count, int ndim, std::size_t itemsize) noexcept {
  box_shape box;
  box.itemsize = itemsize;
  for (int k = 0; k < ndim; ++k)
    if (count[k] == 0) {
      box.rank = -1;
      return box;
    }
  box.rank =
      simplify(box.axes.data(), dst_strides, src_strides, count, std::min(ndim, max_box_dims));
  return box;
}

void copy_box(std::byte* dst, const std::byte* src, const box_shape& box,
              const copy_plan& how) noexcept {
  if (box.rank < 0) return;
  if (box.rank == 0) {
    std::memcpy(dst, src, box.itemsize);
    return;
  }
  copy_axes(dst, src, box.axes.data(), box.rank, box.itemsize, how);
}

}  // namespace zcoll
