/*
 * Block schedules: the order in which the P x P block matrix of a collective is traversed, and
 * how that traversal is cut among the P ranks that execute it.
 *
 * Coordinates are (dst, src): row d of the matrix is rank d's receive buffer, column s holds the
 * blocks that came from rank s. The curve is cut into P contiguous segments of P blocks; rank i
 * copies segment i. Row order is the papers' SH-Naive (each rank fills its own receive row);
 * Morton and Hilbert keep consecutive copies close in both the send and the receive matrix
 * (TPDS'18 §2.1), so a segment touches ~sqrt(P) send rows and ~sqrt(P) receive rows instead of P.
 *
 * Morton for power-of-two P is the bit interleave (dst in the odd bits, src in the even bits,
 * BMI2 pext where present). Other P use TPDS'18 §2.2's balanced binary recursion: split the
 * longer side (rows on a tie, which reproduces the interleave for powers of two) into a first
 * part of floor(n/2) and the rest, and number the first part first. Hilbert uses the generalised
 * Hilbert curve for any rectangle (gilbert recursion), so every step is to a neighbouring block
 * on a square grid.
 *
 * Schedules are computed once per (P, order) and cached by the caller.
 */
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "zcoll/options.hpp"

namespace zcoll {

struct block_coord {
  std::int32_t dst;
  std::int32_t src;
  friend bool operator==(const block_coord&, const block_coord&) = default;
};

// All P*P blocks in traversal order.
std::vector<block_coord> block_curve(int p, block_order order);

// Half-open range [first, last) of items rank `rank` of `parts` handles when `n` items are cut
// into `parts` contiguous, balanced pieces (sizes differ by at most one).
std::pair<std::size_t, std::size_t> segment_of(std::size_t n, int parts, int rank) noexcept;

// A schedule: the curve, and the work of each rank as a contiguous slice of it.
struct schedule {
  int p = 0;
  block_order order = block_order::row;
  std::vector<block_coord> blocks;
  std::vector<std::size_t> starts;  // p + 1 entries: rank r copies blocks[starts[r], starts[r+1])

  // The blocks rank r copies, in order.
  std::span<const block_coord> segment(int r) const noexcept {
    const auto i = static_cast<std::size_t>(r);
    return std::span<const block_coord>(blocks).subspan(starts[i], starts[i + 1] - starts[i]);
  }
};

// Out-of-place alltoall and allgather: every block, P per rank.
schedule full_schedule(int p, block_order order);
// In-place alltoall: each off-diagonal pair {(d,s),(s,d)} once, as (max, min), rebalanced.
schedule swap_schedule(int p, block_order order);
// In-place allgather: every off-diagonal block (the diagonal is already in place), rebalanced.
schedule offdiagonal_schedule(int p, block_order order);
// The schedule of `kind`: one of the three above.
schedule make_schedule(schedule_kind kind, int p, block_order order);

namespace detail {
std::uint64_t morton_decode_dst(std::uint64_t code) noexcept;  // odd bits
std::uint64_t morton_decode_src(std::uint64_t code) noexcept;  // even bits
bool have_bmi2() noexcept;
}  // namespace detail

}  // namespace zcoll
