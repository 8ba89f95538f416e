#include "zcoll/transfer.hpp"

#include <algorithm>

namespace zcoll {

axis_share block_share(std::uint64_t n, int p, int rank) noexcept {
  const auto np = static_cast<std::uint64_t>(p);
  const auto r = static_cast<std::uint64_t>(rank);
  const std::uint64_t q = n / np, extra = n % np;
  return {q + (r < extra ? 1 : 0), r * q + std::min(r, extra)};
}

extents transfer_geometry::shape_a(int rank) const noexcept {
  extents s = shape;
  s[static_cast<std::size_t>(axis_b)] =
      block_share(shape[static_cast<std::size_t>(axis_b)], comm_size, rank).count;
  return s;
}

extents transfer_geometry::shape_b(int rank) const noexcept {
  extents s = shape;
  s[static_cast<std::size_t>(axis_a)] =
      block_share(shape[static_cast<std::size_t>(axis_a)], comm_size, rank).count;
  return s;
}

std::string transfer_geometry::invalid() const {
  if (ndim < 2 || ndim > max_transfer_dims)
    return "arrays must have 2 to " + std::to_string(max_transfer_dims) + " dimensions, got " +
           std::to_string(ndim);
  if (axis_a < 0 || axis_a >= ndim || axis_b < 0 || axis_b >= ndim)
    return "axes out of range for " + std::to_string(ndim) + " dimensions";
  if (axis_a == axis_b) return "the two axes of a transfer must differ";
  if (comm_size < 1 || itemsize == 0) return "empty communicator or zero itemsize";
  return {};
}

std::uint64_t transfer_geometry::signature() const noexcept {
  // FNV-1a over the fields that define every block.
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xFF)) * 1099511628211ull;
  };
  mix(static_cast<std::uint64_t>(ndim));
  for (int k = 0; k < ndim; ++k) mix(shape[static_cast<std::size_t>(k)]);
  mix(static_cast<std::uint64_t>(axis_a));
  mix(static_cast<std::uint64_t>(axis_b));
  mix(itemsize);
  mix(static_cast<std::uint64_t>(comm_size));
  return h;
}

byte_strides c_strides(const extents& shape, int ndim, std::size_t itemsize) noexcept {
  byte_strides s{};
  auto stride = static_cast<std::int64_t>(itemsize);
  for (int k = ndim - 1; k >= 0; --k) {
    s[static_cast<std::size_t>(k)] = stride;
    stride *= static_cast<std::int64_t>(shape[static_cast<std::size_t>(k)]);
  }
  return s;
}

transfer_block block_of(const transfer_geometry& g, int src, int dst) noexcept {
  const auto a = static_cast<std::size_t>(g.axis_a);
  const auto b = static_cast<std::size_t>(g.axis_b);
  const axis_share to = block_share(g.shape[a], g.comm_size, dst);    // dst's part of axis a
  const axis_share from = block_share(g.shape[b], g.comm_size, src);  // src's part of axis b
  transfer_block blk;
  blk.src_strides = c_strides(g.shape_a(src), g.ndim, g.itemsize);
  blk.dst_strides = c_strides(g.shape_b(dst), g.ndim, g.itemsize);
  blk.count.fill(1);
  std::copy_n(g.shape.begin(), g.ndim, blk.count.begin());
  blk.count[a] = to.count;
  blk.count[b] = from.count;
  blk.src_offset =
      static_cast<std::size_t>(static_cast<std::int64_t>(to.start) * blk.src_strides[a]);
  blk.dst_offset =
      static_cast<std::size_t>(static_cast<std::int64_t>(from.start) * blk.dst_strides[b]);
  return blk;
}

}  // namespace zcoll
