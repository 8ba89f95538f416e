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
 * NUMA order (TPDS'18 §2.4, SH-NUMA-CO): the node's ranks fall into s NUMA domains (the NUMA
 * node each runs on, numbered 0..s-1 in increasing node id; ranks of a domain in rank order).
 * Each domain writes only into its own ranks' receive buffers: blocks (dst, src) with dst in
 * domain r are copied by the ranks of r. Domain r works in s steps; in step i it copies the bunch
 * sent by domain x = (r + i) % s, the q_r x q_x sub-matrix (dst in r, src in x), in Morton order
 * over the ranks' positions in their domains (balanced recursion for any shape). So at every
 * step each domain reads from a different domain (cross-domain reads are staggered) and step 0
 * is local. Each step's bunch is cut into q_r contiguous pieces, one per rank of r (local rank
 * j takes piece j), so a domain's ranks move through the steps together; the pieces of a step
 * differ by at most one block, and the larger ones are dealt round-robin over the steps, so
 * a rank's total differs from its domain peers' by at most one. Out of place every rank copies
 * exactly P blocks (P - 1 for an in-place allgather), whatever the domains' sizes.
 * In place alltoall (swap): a swap writes both blocks of its pair. Pairs inside a domain are
 * swapped by that domain; the q_a x q_b pairs between domains a < b are split in the Morton
 * order of (a's ranks, b's ranks): a swaps the first half (floor), b the rest, each in its step
 * that reads the other domain. So there, "writes only its own domain" means: every swap a rank
 * makes writes one block in its own domain, and a cross-domain swap also the partner's block in
 * the other (a swap cannot avoid it without staging); each domain does half of those.
 * One domain (or unknown NUMA nodes) gives exactly the Morton schedule.
 *
 * Schedules are computed once per (kind, order, domains) and cached by the caller.
 */
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "zcoll/options.hpp"

namespace zcoll {

struct block_coord {
  std::int32_t dst;
  std::int32_t src;
  friend bool operator==(const block_coord&, const block_coord&) = default;
};

// All P*P blocks in traversal order. numa without domains is one domain: the Morton curve.
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

// What a schedule is made for. `domains` (order numa only; other orders ignore it): the NUMA
// node of each of the p ranks, any integers (empty, or any negative entry: unknown, one
// domain); a non-empty list of another length is an error.
struct schedule_spec {
  schedule_kind kind = schedule_kind::full;
  int p = 0;
  block_order order = block_order::row;
  std::vector<int> domains;
  friend bool operator==(const schedule_spec&, const schedule_spec&) = default;
  friend auto operator<=>(const schedule_spec&, const schedule_spec&) = default;
};

// Out-of-place alltoall and allgather: every block, P per rank.
schedule full_schedule(int p, block_order order);
// In-place alltoall: each off-diagonal pair {(d,s),(s,d)} once, as (max, min), rebalanced.
schedule swap_schedule(int p, block_order order);
// In-place allgather: every off-diagonal block (the diagonal is already in place), rebalanced.
schedule offdiagonal_schedule(int p, block_order order);
// The schedule `spec` asks for: one of the three above, or for order numa the NUMA schedule of
// that kind over spec.domains (the three above treat numa as one domain). Throws
// std::invalid_argument for P < 1, an unknown order or kind, or domains of the wrong length.
schedule make_schedule(const schedule_spec& spec);

// The domain of each of p ranks, numbered 0..s-1 in increasing order of `numa` (empty or any
// negative entry: all 0). Throws std::invalid_argument when `numa` is non-empty and not p long.
std::vector<int> numa_domains(int p, const std::vector<int>& numa);
// How many NUMA domains the p ranks span (1 when `numa` is unknown or not p long).
int numa_domain_count(int p, const std::vector<int>& numa);

namespace detail {
std::uint64_t morton_decode_dst(std::uint64_t code) noexcept;  // odd bits
std::uint64_t morton_decode_src(std::uint64_t code) noexcept;  // even bits
bool have_bmi2() noexcept;
// Morton order of a rows x cols rectangle (TPDS'18 §2.2's balanced recursion; the bit
// interleave for a power-of-two square), coordinates from (0, 0).
std::vector<block_coord> morton_rectangle(int rows, int cols);
}  // namespace detail

}  // namespace zcoll
