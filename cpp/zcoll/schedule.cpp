#include "zcoll/schedule.hpp"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <stdexcept>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace zcoll {

namespace detail {

bool have_bmi2() noexcept {
#if defined(__x86_64__)
  static const bool bmi2 = __builtin_cpu_supports("bmi2");
  return bmi2;
#else
  return false;
#endif
}

namespace {

std::uint64_t compact_even_bits(std::uint64_t x) noexcept {
  x &= 0x5555555555555555ULL;
  x = (x | (x >> 1)) & 0x3333333333333333ULL;
  x = (x | (x >> 2)) & 0x0F0F0F0F0F0F0F0FULL;
  x = (x | (x >> 4)) & 0x00FF00FF00FF00FFULL;
  x = (x | (x >> 8)) & 0x0000FFFF0000FFFFULL;
  x = (x | (x >> 16)) & 0x00000000FFFFFFFFULL;
  return x;
}

#if defined(__x86_64__)
__attribute__((target("bmi2"))) std::uint64_t pext64(std::uint64_t x, std::uint64_t mask) noexcept {
  return _pext_u64(x, mask);
}
#endif

std::uint64_t extract(std::uint64_t code, std::uint64_t mask, int shift) noexcept {
#if defined(__x86_64__)
  if (have_bmi2()) return pext64(code, mask);
#endif
  (void)mask;
  return compact_even_bits(code >> shift);
}

}  // namespace

std::uint64_t morton_decode_dst(std::uint64_t code) noexcept {
  return extract(code, 0xAAAAAAAAAAAAAAAAULL, 1);
}
std::uint64_t morton_decode_src(std::uint64_t code) noexcept {
  return extract(code, 0x5555555555555555ULL, 0);
}

}  // namespace detail

namespace {

void row_curve(int p, std::vector<block_coord>& out) {
  for (int d = 0; d < p; ++d)
    for (int s = 0; s < p; ++s) out.push_back({d, s});
}

void column_curve(int p, std::vector<block_coord>& out) {
  for (int s = 0; s < p; ++s)
    for (int d = 0; d < p; ++d) out.push_back({d, s});
}

// TPDS'18 §2.2: split the longer side, first part floor(n/2), rows first on a tie.
void balanced_morton(int d0, int nd, int s0, int ns, std::vector<block_coord>& out) {
  if (nd == 0 || ns == 0) return;
  if (nd == 1 && ns == 1) {
    out.push_back({d0, s0});
    return;
  }
  if (nd >= ns) {
    const int half = nd / 2;
    balanced_morton(d0, half, s0, ns, out);
    balanced_morton(d0 + half, nd - half, s0, ns, out);
  } else {
    const int half = ns / 2;
    balanced_morton(d0, nd, s0, half, out);
    balanced_morton(d0, nd, s0 + half, ns - half, out);
  }
}

void morton_curve(int p, std::vector<block_coord>& out) {
  if (p > 0 && std::has_single_bit(static_cast<unsigned>(p))) {
    const auto n = static_cast<std::uint64_t>(p) * static_cast<std::uint64_t>(p);
    for (std::uint64_t code = 0; code < n; ++code)
      out.push_back({static_cast<std::int32_t>(detail::morton_decode_dst(code)),
                     static_cast<std::int32_t>(detail::morton_decode_src(code))});
  } else {
    balanced_morton(0, p, 0, p, out);
  }
}

int sign(int v) noexcept {
  return (v > 0) - (v < 0);
}
int floor_half(int v) noexcept {
  return v >= 0 ? v / 2 : -((-v + 1) / 2);
}

// Generalised Hilbert curve over the rectangle spanned by (ax, ay) and (bx, by) from (x, y);
// x is the source (column), y the destination (row).
void gilbert(int x, int y, int ax, int ay, int bx, int by, std::vector<block_coord>& out) {
  const int w = std::abs(ax + ay), h = std::abs(bx + by);
  const int dax = sign(ax), day = sign(ay), dbx = sign(bx), dby = sign(by);
  if (h == 1) {
    for (int i = 0; i < w; ++i, x += dax, y += day) out.push_back({y, x});
    return;
  }
  if (w == 1) {
    for (int i = 0; i < h; ++i, x += dbx, y += dby) out.push_back({y, x});
    return;
  }
  int ax2 = floor_half(ax), ay2 = floor_half(ay), bx2 = floor_half(bx), by2 = floor_half(by);
  const int w2 = std::abs(ax2 + ay2), h2 = std::abs(bx2 + by2);
  if (2 * w > 3 * h) {
    if ((w2 % 2) && w > 2) ax2 += dax, ay2 += day;
    gilbert(x, y, ax2, ay2, bx, by, out);
    gilbert(x + ax2, y + ay2, ax - ax2, ay - ay2, bx, by, out);
  } else {
    if ((h2 % 2) && h > 2) bx2 += dbx, by2 += dby;
    gilbert(x, y, bx2, by2, ax2, ay2, out);
    gilbert(x + bx2, y + by2, ax, ay, bx - bx2, by - by2, out);
    gilbert(x + (ax - dax) + (bx2 - dbx), y + (ay - day) + (by2 - dby), -bx2, -by2, -(ax - ax2),
            -(ay - ay2), out);
  }
}

void hilbert_curve(int p, std::vector<block_coord>& out) {
  gilbert(0, 0, p, 0, 0, p, out);
}

schedule cut(int p, block_order order, std::vector<block_coord> blocks) {
  schedule s{p, order, std::move(blocks), {}};
  s.starts.reserve(static_cast<std::size_t>(p) + 1);
  for (int r = 0; r < p; ++r) s.starts.push_back(segment_of(s.blocks.size(), p, r).first);
  s.starts.push_back(s.blocks.size());
  return s;
}

}  // namespace

std::vector<block_coord> block_curve(int p, block_order order) {
  if (p < 1) throw std::invalid_argument("zcoll: a schedule needs P >= 1");
  std::vector<block_coord> out;
  out.reserve(static_cast<std::size_t>(p) * static_cast<std::size_t>(p));
  switch (order) {
    case block_order::row:
      row_curve(p, out);
      break;
    case block_order::column:
      column_curve(p, out);
      break;
    case block_order::morton:
      morton_curve(p, out);
      break;
    case block_order::hilbert:
      hilbert_curve(p, out);
      break;
    case block_order::numa:  // one domain
      morton_curve(p, out);
      break;
    default:
      throw std::invalid_argument("zcoll: unknown block order");
  }
  return out;
}

std::pair<std::size_t, std::size_t> segment_of(std::size_t n, int parts, int rank) noexcept {
  const auto k = static_cast<std::size_t>(parts);
  const auto r = static_cast<std::size_t>(rank);
  return {n * r / k, n * (r + 1) / k};
}

schedule full_schedule(int p, block_order order) {
  return cut(p, order, block_curve(p, order));
}

schedule swap_schedule(int p, block_order order) {
  std::vector<block_coord> pairs;
  for (const auto& b : block_curve(p, order))
    if (b.dst > b.src) pairs.push_back(b);
  return cut(p, order, std::move(pairs));
}

schedule offdiagonal_schedule(int p, block_order order) {
  std::vector<block_coord> blocks;
  for (const auto& b : block_curve(p, order))
    if (b.dst != b.src) blocks.push_back(b);
  return cut(p, order, std::move(blocks));
}

namespace detail {

std::vector<block_coord> morton_rectangle(int rows, int cols) {
  std::vector<block_coord> out;
  if (rows < 1 || cols < 1) return out;
  out.reserve(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
  if (rows == cols)
    morton_curve(rows, out);  // the bit interleave for powers of two, as the full curve
  else
    balanced_morton(0, rows, 0, cols, out);
  return out;
}

}  // namespace detail

std::vector<int> numa_domains(int p, const std::vector<int>& numa) {
  if (p < 1) throw std::invalid_argument("zcoll: a schedule needs P >= 1");
  const auto n = static_cast<std::size_t>(p);
  std::vector<int> domain(n, 0);
  if (numa.empty()) return domain;
  if (numa.size() != n)
    throw std::invalid_argument("zcoll: the NUMA schedule needs the NUMA node of each of the " +
                                std::to_string(p) + " ranks, got " + std::to_string(numa.size()));
  if (std::any_of(numa.begin(), numa.end(), [](int v) { return v < 0; })) return domain;
  std::vector<int> ids(numa);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (std::size_t r = 0; r < n; ++r)
    domain[r] = static_cast<int>(std::lower_bound(ids.begin(), ids.end(), numa[r]) - ids.begin());
  return domain;
}

int numa_domain_count(int p, const std::vector<int>& numa) {
  if (p < 1 || numa.size() != static_cast<std::size_t>(p)) return 1;
  const std::vector<int> domain = numa_domains(p, numa);
  return *std::max_element(domain.begin(), domain.end()) + 1;
}

namespace {

// The blocks of `kind` that domain r copies in its step reading domain x (see schedule.hpp),
// in order, as node ranks.
void numa_bunch(schedule_kind kind, const std::vector<std::vector<int>>& members, int r, int x,
                std::vector<block_coord>& bunch) {
  bunch.clear();
  const auto& mine = members[static_cast<std::size_t>(r)];
  const auto& theirs = members[static_cast<std::size_t>(x)];
  if (kind == schedule_kind::swap && r != x) {
    // The pairs between the two domains, in the Morton order of (lower's ranks, higher's
    // ranks): the lower domain swaps the first half, the higher one the rest.
    const bool lower = r < x;
    const auto& rows = lower ? mine : theirs;
    const auto& cols = lower ? theirs : mine;
    const auto curve =
        detail::morton_rectangle(static_cast<int>(rows.size()), static_cast<int>(cols.size()));
    const std::size_t half = curve.size() / 2;
    for (std::size_t k = lower ? 0 : half; k < (lower ? half : curve.size()); ++k) {
      const int a = rows[static_cast<std::size_t>(curve[k].dst)];
      const int b = cols[static_cast<std::size_t>(curve[k].src)];
      bunch.push_back({std::max(a, b), std::min(a, b)});
    }
    return;
  }
  for (const block_coord& b :
       detail::morton_rectangle(static_cast<int>(mine.size()), static_cast<int>(theirs.size()))) {
    const int dst = mine[static_cast<std::size_t>(b.dst)];
    const int src = theirs[static_cast<std::size_t>(b.src)];
    if (kind == schedule_kind::offdiagonal && dst == src) continue;
    if (kind == schedule_kind::swap && dst <= src) continue;  // own domain: (max, min) once
    bunch.push_back({dst, src});
  }
}

schedule plain_schedule(schedule_kind kind, int p, block_order order) {
  switch (kind) {
    case schedule_kind::full:
      return full_schedule(p, order);
    case schedule_kind::swap:
      return swap_schedule(p, order);
    case schedule_kind::offdiagonal:
      return offdiagonal_schedule(p, order);
  }
  throw std::invalid_argument("zcoll: unknown schedule kind");
}

schedule numa_schedule(schedule_kind kind, int p, const std::vector<int>& numa) {
  const std::vector<int> domain = numa_domains(p, numa);
  const int s = *std::max_element(domain.begin(), domain.end()) + 1;
  if (s == 1) {  // one domain: the Morton schedule itself
    schedule one = plain_schedule(kind, p, block_order::morton);
    one.order = block_order::numa;
    return one;
  }
  std::vector<std::vector<int>> members(static_cast<std::size_t>(s));
  for (int r = 0; r < p; ++r)
    members[static_cast<std::size_t>(domain[static_cast<std::size_t>(r)])].push_back(r);
  std::vector<std::vector<block_coord>> work(static_cast<std::size_t>(p));
  std::vector<block_coord> bunch;
  for (int r = 0; r < s; ++r) {
    const auto& mine = members[static_cast<std::size_t>(r)];
    const std::size_t q = mine.size();
    std::size_t next_larger = 0;  // the local rank that takes the next larger piece
    for (int i = 0; i < s; ++i) {
      numa_bunch(kind, members, r, (r + i) % s, bunch);
      // q contiguous pieces of m or m + 1 blocks; the e larger ones go round-robin over steps.
      const std::size_t m = bunch.size() / q, e = bunch.size() % q;
      auto from = bunch.begin();
      for (std::size_t j = 0; j < q; ++j) {
        const std::size_t n = m + ((j + q - next_larger) % q < e ? 1 : 0);
        auto& mine_j = work[static_cast<std::size_t>(mine[j])];
        mine_j.insert(mine_j.end(), from, from + static_cast<std::ptrdiff_t>(n));
        from += static_cast<std::ptrdiff_t>(n);
      }
      next_larger = (next_larger + e) % q;
    }
  }
  schedule out{p, block_order::numa, {}, {}};
  out.starts.reserve(static_cast<std::size_t>(p) + 1);
  for (const auto& w : work) {
    out.starts.push_back(out.blocks.size());
    out.blocks.insert(out.blocks.end(), w.begin(), w.end());
  }
  out.starts.push_back(out.blocks.size());
  return out;
}

}  // namespace

schedule make_schedule(const schedule_spec& spec) {
  if (spec.p < 1) throw std::invalid_argument("zcoll: a schedule needs P >= 1");
  if (spec.order == block_order::numa) return numa_schedule(spec.kind, spec.p, spec.domains);
  return plain_schedule(spec.kind, spec.p, spec.order);
}

}  // namespace zcoll
