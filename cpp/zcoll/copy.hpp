/*
 * Copy kernels: the single place where zcoll moves bytes.
 *
 * Large blocks are bandwidth-bound. Ordinary (temporal) stores make the core read every
 * destination cache line before writing it (read-for-ownership) and evict useful data;
 * non-temporal (streaming) stores write whole lines straight to memory, so a copy moves 2 bytes
 * of memory traffic per byte instead of 3 -- but they are slower than cached stores while the
 * data fits in cache, and they are weakly ordered. HINT (Alg. 4) combines both: the first
 * `threshold` bytes of a block with temporal stores, the rest streaming, with the threshold
 * starting at L2 / ranks per node (see copy_mode).
 *
 * Streaming kernels exist for SSE2, AVX2 and AVX-512 (aligned streaming stores, unaligned loads,
 * software prefetch, head and tail copied with memcpy); the best one the CPU supports is picked
 * once at load time, and select_isa() overrides it (tests, benchmarks, ZCOLL_COPY_ISA). Where no
 * streaming store exists (non-x86), "portable" is memcpy.
 *
 * Ordering: no kernel fences. Whoever publishes that data is there (the node barrier, see
 * node_context::sync) calls store_fence() first, once per batch of copies.
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "zcoll/registry.hpp"

namespace zcoll {

// What a collective's copies use.
struct copy_plan {
  copy_mode mode = copy_mode::temporal;
  std::size_t threshold = 0;  // hybrid: temporal bytes at the start of each block
};

// Whether this CPU runs `isa`'s kernel (portable: always).
bool isa_available(copy_isa isa) noexcept;
// The kernel streaming copies use now, and the best available one (the default).
copy_isa active_isa() noexcept;
copy_isa best_isa() noexcept;
// Makes `isa` the streaming kernel of this process; false (and no change) if unavailable.
bool select_isa(copy_isa isa) noexcept;

// Orders every earlier streaming store before later stores (sfence on x86).
void store_fence() noexcept;

inline void copy_bytes(void* dst, const void* src, std::size_t n) noexcept {
  if (n) std::memcpy(dst, src, n);
}

// Copies one block as `how` says (no fence).
void copy_bytes(void* dst, const void* src, std::size_t n, const copy_plan& how) noexcept;

// Exchanges the contents of two non-overlapping ranges through a small stack buffer.
void swap_bytes(void* a, void* b, std::size_t n) noexcept;

// Most axes copy_box takes.
inline constexpr int max_box_dims = 16;

// Copies a box of `ndim` (<= max_box_dims) axes with extents `count` between two strided arrays of
// `itemsize`-byte elements (strides in bytes, may differ on each side). Axes that are contiguous on
// both sides are merged, so C-ordered sub-blocks copy as a few long runs; `how` applies to the box
// as one block (hybrid: its first `threshold` bytes temporal). No fence.
void copy_box(std::byte* dst, const std::int64_t* dst_strides, const std::byte* src,
              const std::int64_t* src_strides, const std::uint64_t* count, int ndim,
              std::size_t itemsize, const copy_plan& how = {}) noexcept;

// One axis of a box copy: extent and byte strides on each side.
struct box_axis {
  std::uint64_t count = 0;
  std::int64_t dst_stride = 0, src_stride = 0;
};

// A box copy with its axes simplified once (unit extents dropped, axes contiguous on both sides
// merged, outermost first), for copies that repeat: persistent transfer plans.
struct box_shape {
  int rank = 0;  // axes left: 0 is a single element, -1 an empty box (nothing to copy)
  std::size_t itemsize = 0;
  std::array<box_axis, max_box_dims> axes{};
  bool empty() const noexcept { return rank < 0; }
  // Bytes the box holds.
  std::size_t bytes() const noexcept;
};

// The simplified shape of copy_box's box (same arguments, no addresses).
box_shape make_box(const std::int64_t* dst_strides, const std::int64_t* src_strides,
                   const std::uint64_t* count, int ndim, std::size_t itemsize) noexcept;

// copy_box on a box simplified by make_box: the same bytes, the same stores.
void copy_box(std::byte* dst, const std::byte* src, const box_shape& box,
              const copy_plan& how = {}) noexcept;

}  // namespace zcoll
