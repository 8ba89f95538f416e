/*
 * Copy kernels used by every exchange.
 *
 * This is the single place where zcoll moves bytes, so the streaming (non-temporal) and hybrid
 * kernels of the roadmap slot in here without touching the exchange logic. Today: the C library
 * memcpy (which already switches to non-temporal stores past its own threshold) and a chunked
 * swap for in-place exchanges.
 */
#pragma once

#include <cstddef>
#include <cstring>

namespace zcoll {

inline void copy_bytes(void* dst, const void* src, std::size_t n) noexcept {
  if (n) std::memcpy(dst, src, n);
}

// Exchanges the contents of two non-overlapping ranges through a small stack buffer.
void swap_bytes(void* a, void* b, std::size_t n) noexcept;

}  // namespace zcoll
