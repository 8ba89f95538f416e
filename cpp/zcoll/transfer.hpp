/*
 * Transfer: the geometry of a global transpose (pencil/slab redistribution).
 *
 * A d-dimensional array is distributed over the p ranks of a communicator. Before the
 * transfer it is aligned in axis `a` (every rank holds all of axis a) and block-distributed
 * over axis `b`; afterwards it is aligned in `b` and distributed over `a`. Every other axis
 * keeps the local extent it had (it may be distributed over another communicator: the same
 * extent on every rank of this one). This is mpi4py-fft's Transfer between two pencils, and the
 * global transpose of a pencil or slab FFT.
 *
 * Seen as a collective it is an alltoall whose P x P blocks are strided boxes: the block from
 * rank i to rank j is the part of i's array with axis a in j's range, written into the part of
 * j's array with axis b in i's range. With both arrays in the shared arena one strided box copy
 * does packing, moving and unpacking at once (one read and one write per element), in any block
 * order of schedule.hpp. Every rank derives every block's geometry from the global shape and
 * the block distribution, so a call publishes only a hash of its geometry for the agreement
 * check.
 *
 * Block distribution (mpi4py-fft's): n elements over p ranks, rank r holds
 * n/p + (r < n%p) elements starting at r*(n/p) + min(r, n%p). Ranks may hold zero elements.
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace zcoll {

inline constexpr int max_transfer_dims = 8;

using extents = std::array<std::uint64_t, max_transfer_dims>;
using byte_strides = std::array<std::int64_t, max_transfer_dims>;

// A rank's share of an axis of length n split over p ranks.
struct axis_share {
  std::uint64_t count = 0;
  std::uint64_t start = 0;
};
axis_share block_share(std::uint64_t n, int p, int rank) noexcept;

struct transfer_geometry {
  int ndim = 0;
  // Axis a and b: their global lengths. Other axes: the local extent (same on every rank).
  extents shape{};
  int axis_a = 0;  // aligned before, distributed after
  int axis_b = 1;  // distributed before, aligned after
  std::size_t itemsize = 1;
  int comm_size = 1;

  // Local shape of rank `rank`'s array before (aligned in a) and after (aligned in b).
  extents shape_a(int rank) const noexcept;
  extents shape_b(int rank) const noexcept;
  // Describes what is wrong ("" when the geometry is valid).
  std::string invalid() const;
  // Hash of everything the ranks must agree on.
  std::uint64_t signature() const noexcept;
};

// One strided box to copy: the block from rank src to rank dst.
struct transfer_block {
  std::size_t src_offset = 0;  // bytes into src's array (aligned in a)
  std::size_t dst_offset = 0;  // bytes into dst's array (aligned in b)
  extents count{};             // box extents per axis
  byte_strides src_strides{};  // of src's C-contiguous array
  byte_strides dst_strides{};  // of dst's C-contiguous array
};

transfer_block block_of(const transfer_geometry& g, int src, int dst) noexcept;

// Byte strides of a C-contiguous array of `shape`.
byte_strides c_strides(const extents& shape, int ndim, std::size_t itemsize) noexcept;

}  // namespace zcoll
