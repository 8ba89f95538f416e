/*
 * Copy kernels used by every exchange.
 *
 * This is the single place where zcoll moves bytes, so the streaming (non-temporal) and hybrid
 * kernels of the roadmap slot in here without touching the exchange logic. Today: the C library
 * memcpy (which already switches to non-temporal stores past its own threshold), a chunked
 * swap for in-place exchanges, and a strided box copy for global transposes (FFT).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace zcoll {

inline void copy_bytes(void* dst, const void* src, std::size_t n) noexcept {
  if (n) std::memcpy(dst, src, n);
}

// Exchanges the contents of two non-overlapping ranges through a small stack buffer.
void swap_bytes(void* a, void* b, std::size_t n) noexcept;

// Copies a box of `ndim` axes with extents `count` between two strided arrays of `itemsize`-byte
// elements (strides in bytes, may differ on each side). Axes that are contiguous on both sides
// are merged, so C-ordered sub-blocks copy as a few long memcpy runs.
void copy_box(std::byte* dst, const std::int64_t* dst_strides, const std::byte* src,
              const std::int64_t* src_strides, const std::uint64_t* count, int ndim,
              std::size_t itemsize) noexcept;

}  // namespace zcoll
