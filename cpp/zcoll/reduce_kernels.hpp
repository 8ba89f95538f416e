/*
 * Reduction kernels: element-wise combination of buffers, one templated loop per (element
 * type, operation), with NumPy's semantics.
 *
 * The one entry point, reduce_fold, combines k sources left to right (((s0 op s1) op s2) ...):
 * a fixed order, so a result depends only on the inputs and the order the algorithm chose,
 * never on timing. It works through the buffers in chunks of chunk_bytes: each chunk is
 * accumulated in an L1-resident buffer on the stack (every source chunk read once) and written
 * to the destination once, so the destination may be one of the sources, and the memory
 * traffic of a fold is k reads and one write of the chunk -- the bound of any fold.
 *
 * The inner loops are plain loops over __restrict pointers with branch-free bodies, which GCC
 * and Clang vectorise at -O2/-O3 (checked with objdump on the Release build: the float64 sum
 * loop is addpd, the int32 max loop pcmpgtd/pand/pandn/por blends, the float32 min loop
 * cmpleps with andps/andnps/orps blends). float16 is combined as NumPy does it -- each step
 * converted to float32, combined, rounded back to float16 (round to nearest even) -- and is
 * scalar. tools/check_reduce_vectorised.py repeats the check on a CMake build.
 *
 * Semantics (NumPy's ufuncs add, multiply, minimum, maximum, logical_*, bitwise_*):
 *   integers: sum and prod wrap modulo 2^bits; logical ops give 0 or 1 in the element type.
 *   bool:     sum = lor, prod = land, min = land, max = lor; bitwise ops = logical ops.
 *   floats:   min/max return NaN when either operand is NaN; logical ops give 0.0 or 1.0.
 *   complex:  sum and prod only (prod as (ar*br - ai*bi, ar*bi + ai*br)).
 * Bitwise ops on floats and min/max/logical ops on complex are undefined (op_defined).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "zcoll/checks.hpp"
#include "zcoll/registry.hpp"

namespace zcoll {

// Bytes of a fold's stack accumulator (a chunk of every source is combined into it).
inline constexpr std::size_t reduce_chunk_bytes = 8192;

// The element type of NumPy dtype `d` (its char code and itemsize), or nullopt when reductions
// do not support it (longdouble, structured, strings, objects).
std::optional<element_type> element_type_of(const dtype_id& d) noexcept;

// Bytes per element.
std::size_t element_bytes(element_type t) noexcept;

// Whether `op` is defined for `t` (NumPy defines it, and it is not a bitwise op on floats or an
// ordering or logical op on complex numbers).
bool op_defined(reduce_op op, element_type t) noexcept;

// dst[i] = ((srcs[0][i] op srcs[1][i]) op srcs[2][i]) ... op srcs[k-1][i] for i < n, k >= 1.
// `dst` may be the same buffer as any source (not a partial overlap). Undefined ops: no-op.
// With `stream`, each chunk is written with non-temporal stores (copy.hpp): for results far
// larger than the cache, which then cost one write instead of a read-for-ownership and a write;
// the caller fences (store_fence) before publishing them.
void reduce_fold(reduce_op op, element_type t, void* dst, const void* const* srcs, int k,
                 std::size_t n, bool stream = false) noexcept;

// float16 <-> float32 as NumPy converts them (round to nearest even; NaN payloads kept).
float half_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_half(float f) noexcept;

}  // namespace zcoll
