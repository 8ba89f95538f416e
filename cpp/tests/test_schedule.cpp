// Block schedules (schedule.hpp): every expected value below is computed here, from the
// definitions in the header's comment, not with the code under test.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "zcoll/options.hpp"
#include "zcoll/schedule.hpp"

using zcoll::block_coord;
using zcoll::block_order;

namespace {

constexpr block_order all_orders[] = {block_order::row, block_order::column, block_order::morton,
                                      block_order::hilbert};

// P = 1..64 and a few larger ones (non powers of two, a prime, a power of two).
std::vector<int> sizes() {
  std::vector<int> ps;
  for (int p = 1; p <= 64; ++p) ps.push_back(p);
  for (int p : {100, 127, 128}) ps.push_back(p);
  return ps;
}

std::string label(int p, block_order order) {
  return std::string(zcoll::name_of(order)) + " P=" + std::to_string(p);
}

__extension__ typedef unsigned __int128 u128;

// Reference cut: floor(n * r / parts) in 128-bit arithmetic (never overflows for 64-bit n).
std::size_t ref_cut(std::size_t n, int parts, int r) {
  return static_cast<std::size_t>(static_cast<u128>(n) * static_cast<unsigned>(r) /
                                  static_cast<unsigned>(parts));
}

// Reference bit de-interleave, one bit at a time: bit 2i+1 of code -> bit i of dst, bit 2i -> src.
std::uint64_t ref_odd_bits(std::uint64_t code) {
  std::uint64_t out = 0;
  for (int i = 0; i < 32; ++i) out |= ((code >> (2 * i + 1)) & 1u) << i;
  return out;
}
std::uint64_t ref_even_bits(std::uint64_t code) {
  std::uint64_t out = 0;
  for (int i = 0; i < 32; ++i) out |= ((code >> (2 * i)) & 1u) << i;
  return out;
}

// Reference balanced Morton recursion (TPDS'18 §2.2 as the header states it): split the longer
// side into floor(n/2) and the rest, rows on a tie, first part first.
void ref_balanced(int d0, int nd, int s0, int ns, std::vector<block_coord>& out) {
  if (nd == 0 || ns == 0) return;
  if (nd == 1 && ns == 1) {
    out.push_back({d0, s0});
  } else if (nd >= ns) {
    ref_balanced(d0, nd / 2, s0, ns, out);
    ref_balanced(d0 + nd / 2, nd - nd / 2, s0, ns, out);
  } else {
    ref_balanced(d0, nd, s0, ns / 2, out);
    ref_balanced(d0, nd, s0 + ns / 2, ns - ns / 2, out);
  }
}

// Checks that `blocks` hits every cell for which `want(d, s)` exactly once and nothing else.
template <class Want>
void check_covers(const std::vector<block_coord>& blocks, int p, Want want,
                  const std::string& what) {
  INFO(what);
  std::vector<int> hits(static_cast<std::size_t>(p) * static_cast<std::size_t>(p), 0);
  int outside = 0;
  for (const auto& b : blocks) {
    if (b.dst < 0 || b.dst >= p || b.src < 0 || b.src >= p || !want(b.dst, b.src)) {
      ++outside;
      continue;
    }
    ++hits[static_cast<std::size_t>(b.dst) * static_cast<std::size_t>(p) +
           static_cast<std::size_t>(b.src)];
  }
  CHECK(outside == 0);
  int wrong = 0;
  for (int d = 0; d < p; ++d)
    for (int s = 0; s < p; ++s)
      if (hits[static_cast<std::size_t>(d * p + s)] != (want(d, s) ? 1 : 0)) ++wrong;
  CHECK(wrong == 0);
}

// Starts are p + 1 monotone offsets from 0 to the block count, pieces differ by at most one and
// agree with the reference cut.
void check_cut(const zcoll::schedule& s, const std::string& what) {
  INFO(what);
  const int p = s.p;
  REQUIRE(s.starts.size() == static_cast<std::size_t>(p) + 1);
  CHECK(s.starts.front() == 0);
  CHECK(s.starts.back() == s.blocks.size());
  std::size_t lo = SIZE_MAX, hi = 0, covered = 0;
  bool monotone = true, matches = true;
  for (int r = 0; r < p; ++r) {
    const auto a = s.starts[static_cast<std::size_t>(r)];
    const auto b = s.starts[static_cast<std::size_t>(r) + 1];
    monotone = monotone && a <= b;
    matches = matches && a == ref_cut(s.blocks.size(), p, r);
    lo = std::min(lo, b - a), hi = std::max(hi, b - a);
    const auto seg = s.segment(r);
    // segment(r) is exactly blocks[starts[r], starts[r+1]).
    matches = matches && seg.size() == b - a && (seg.empty() || seg.data() == s.blocks.data() + a);
    covered += seg.size();
  }
  CHECK(monotone);
  CHECK(matches);
  CHECK(hi - lo <= 1);
  CHECK(covered == s.blocks.size());
}

// True when `sub` appears in `curve` in the same relative order (positions strictly increase).
bool is_subsequence(const std::vector<block_coord>& sub, const std::vector<block_coord>& curve,
                    int p) {
  std::vector<std::size_t> pos(static_cast<std::size_t>(p) * static_cast<std::size_t>(p));
  for (std::size_t i = 0; i < curve.size(); ++i)
    pos[static_cast<std::size_t>(curve[i].dst * p + curve[i].src)] = i;
  for (std::size_t i = 1; i < sub.size(); ++i)
    if (pos[static_cast<std::size_t>(sub[i - 1].dst * p + sub[i - 1].src)] >=
        pos[static_cast<std::size_t>(sub[i].dst * p + sub[i].src)])
      return false;
  return true;
}

}  // namespace

TEST_CASE("segment_of cuts n items into balanced contiguous pieces") {
  std::mt19937_64 rng(42);
  std::vector<std::size_t> ns;
  for (std::size_t n = 0; n <= 300; ++n) ns.push_back(n);
  for (int i = 0; i < 200; ++i) ns.push_back(rng() % (std::size_t{1} << 40));
  for (std::size_t n : ns) {
    for (int parts : {1, 2, 3, 5, 7, 8, 16, 63, 64, 100, 127, 128}) {
      INFO("n=" << n << " parts=" << parts);
      std::size_t prev_end = 0, lo = SIZE_MAX, hi = 0;
      bool ok = true;
      for (int r = 0; r < parts; ++r) {
        const auto [a, b] = zcoll::segment_of(n, parts, r);
        ok = ok && a == prev_end && a <= b && a == ref_cut(n, parts, r) &&
             b == ref_cut(n, parts, r + 1);
        lo = std::min(lo, b - a), hi = std::max(hi, b - a);
        prev_end = b;
      }
      CHECK(ok);
      CHECK(prev_end == n);
      CHECK(hi - lo <= 1);
      CHECK(lo == n / static_cast<std::size_t>(parts));
    }
  }
}

TEST_CASE("block_curve rejects P < 1 and unknown orders") {
  CHECK_THROWS_AS(zcoll::block_curve(0, block_order::row), std::invalid_argument);
  CHECK_THROWS_AS(zcoll::block_curve(-3, block_order::hilbert), std::invalid_argument);
  CHECK_THROWS_AS(zcoll::full_schedule(0, block_order::morton), std::invalid_argument);
  CHECK_THROWS_AS(
      zcoll::block_curve(4, static_cast<block_order>(zcoll::count_of<zcoll::block_order>)),
      std::invalid_argument);
}

TEST_CASE("full_schedule covers every block once in P balanced segments") {
  for (block_order order : all_orders) {
    for (int p : sizes()) {
      const auto s = zcoll::full_schedule(p, order);
      CHECK(s.p == p);
      CHECK(s.order == order);
      REQUIRE(s.blocks.size() == static_cast<std::size_t>(p) * static_cast<std::size_t>(p));
      check_covers(s.blocks, p, [](int, int) { return true; }, label(p, order));
      check_cut(s, label(p, order));
      bool p_each = true;
      for (int r = 0; r < p; ++r)
        p_each = p_each && s.segment(r).size() == static_cast<std::size_t>(p);
      CHECK(p_each);
      CHECK(s.blocks == zcoll::block_curve(p, order));
    }
  }
}

TEST_CASE("swap_schedule covers each off-diagonal pair once as (max min)") {
  for (block_order order : all_orders) {
    for (int p : sizes()) {
      const auto s = zcoll::swap_schedule(p, order);
      const auto n = static_cast<std::size_t>(p) * static_cast<std::size_t>(p - 1) / 2;
      INFO(label(p, order));
      CHECK(s.blocks.size() == n);
      // Only the strict lower triangle (dst > src): each unordered pair once, no diagonal.
      check_covers(s.blocks, p, [](int d, int src) { return d > src; }, label(p, order));
      check_cut(s, label(p, order));
      CHECK(is_subsequence(s.blocks, zcoll::block_curve(p, order), p));
    }
  }
}

TEST_CASE("offdiagonal_schedule covers every off-diagonal block once") {
  for (block_order order : all_orders) {
    for (int p : sizes()) {
      const auto s = zcoll::offdiagonal_schedule(p, order);
      INFO(label(p, order));
      CHECK(s.blocks.size() == static_cast<std::size_t>(p) * static_cast<std::size_t>(p - 1));
      check_covers(s.blocks, p, [](int d, int src) { return d != src; }, label(p, order));
      check_cut(s, label(p, order));
      CHECK(is_subsequence(s.blocks, zcoll::block_curve(p, order), p));
      // P - 1 blocks per rank: the cut of P(P-1) into P pieces is exact.
      bool each = true;
      for (int r = 0; r < p; ++r)
        each = each && s.segment(r).size() == static_cast<std::size_t>(p - 1);
      CHECK(each);
    }
  }
}

TEST_CASE("row order is row-major and column order column-major") {
  for (int p : sizes()) {
    INFO("P=" << p);
    const auto row = zcoll::block_curve(p, block_order::row);
    const auto col = zcoll::block_curve(p, block_order::column);
    bool row_ok = true, col_ok = true;
    for (int i = 0; i < p * p; ++i) {
      const auto& r = row[static_cast<std::size_t>(i)];
      const auto& c = col[static_cast<std::size_t>(i)];
      row_ok = row_ok && r.dst == i / p && r.src == i % p;
      col_ok = col_ok && c.dst == i % p && c.src == i / p;
    }
    CHECK(row_ok);
    CHECK(col_ok);
    // Row order: rank r's segment of the full schedule is its own receive row.
    const auto s = zcoll::full_schedule(p, block_order::row);
    bool own_row = true;
    for (int r = 0; r < p; ++r)
      for (const auto& b : s.segment(r)) own_row = own_row && b.dst == r;
    CHECK(own_row);
  }
}

TEST_CASE("morton decode agrees with a reference de-interleave") {
  for (std::uint64_t code = 0; code < (1u << 16); ++code) {
    if (zcoll::detail::morton_decode_dst(code) != ref_odd_bits(code) ||
        zcoll::detail::morton_decode_src(code) != ref_even_bits(code)) {
      FAIL_CHECK("code " << code);
      break;
    }
  }
  std::mt19937_64 rng(7);
  int bad = 0;
  for (int i = 0; i < 100000; ++i) {
    const std::uint64_t code = rng();
    bad += zcoll::detail::morton_decode_dst(code) != ref_odd_bits(code);
    bad += zcoll::detail::morton_decode_src(code) != ref_even_bits(code);
  }
  CHECK(bad == 0);
  CHECK(zcoll::detail::morton_decode_dst(~0ULL) == 0xFFFFFFFFULL);
  CHECK(zcoll::detail::morton_decode_src(~0ULL) == 0xFFFFFFFFULL);
  CHECK(zcoll::detail::morton_decode_dst(0xAAAAAAAAAAAAAAAAULL) == 0xFFFFFFFFULL);
  CHECK(zcoll::detail::morton_decode_src(0xAAAAAAAAAAAAAAAAULL) == 0);
}

TEST_CASE("have_bmi2 matches /proc/cpuinfo") {
#if defined(__x86_64__)
  CHECK(zcoll::detail::have_bmi2() == zcoll_test::cpu_flag("bmi2"));
#else
  CHECK_FALSE(zcoll::detail::have_bmi2());
#endif
}

TEST_CASE("morton order for power-of-two P is the bit interleave") {
  for (int p = 1; p <= 256; p *= 2) {
    INFO("P=" << p);
    const auto curve = zcoll::block_curve(p, block_order::morton);
    bool ok = true;
    for (std::size_t code = 0; code < curve.size(); ++code)
      ok = ok && curve[code].dst == static_cast<std::int32_t>(ref_odd_bits(code)) &&
           curve[code].src == static_cast<std::int32_t>(ref_even_bits(code));
    CHECK(ok);
    // The header's claim: the balanced recursion reproduces the interleave for powers of two.
    std::vector<block_coord> rec;
    ref_balanced(0, p, 0, p, rec);
    CHECK(rec == curve);
  }
}

TEST_CASE("morton order for other P is the balanced recursion") {
  for (int p : sizes()) {
    if (std::has_single_bit(static_cast<unsigned>(p))) continue;
    INFO("P=" << p);
    std::vector<block_coord> rec;
    ref_balanced(0, p, 0, p, rec);
    CHECK(zcoll::block_curve(p, block_order::morton) == rec);
    // First split is by rows: the first floor(P/2) * P blocks are the top rows.
    const auto curve = zcoll::block_curve(p, block_order::morton);
    bool top = true;
    for (int i = 0; i < (p / 2) * p; ++i)
      top = top && curve[static_cast<std::size_t>(i)].dst < p / 2;
    CHECK(top);
  }
}

TEST_CASE("hilbert order steps to a grid neighbour every time") {
  std::vector<int> ps = sizes();
  for (int p : {200, 255, 256}) ps.push_back(p);
  for (int p : ps) {
    INFO("P=" << p);
    const auto curve = zcoll::block_curve(p, block_order::hilbert);
    REQUIRE(curve.size() == static_cast<std::size_t>(p) * static_cast<std::size_t>(p));
    CHECK(curve.front() == block_coord{0, 0});
    int jumps = 0;
    std::size_t first_jump = 0;
    for (std::size_t i = 1; i < curve.size(); ++i) {
      const int step =
          std::abs(curve[i].dst - curve[i - 1].dst) + std::abs(curve[i].src - curve[i - 1].src);
      if (step != 1 && jumps++ == 0) first_jump = i;
    }
    INFO("first non-neighbour step at index " << first_jump);
    CHECK(jumps == 0);
    check_covers(curve, p, [](int, int) { return true; }, "hilbert P=" + std::to_string(p));
  }
}

TEST_CASE("space-filling segments touch about sqrt(P) rows and columns") {
  // The point of Morton/Hilbert (header comment): a rank's segment spans few send and receive
  // rows. For P = 64 a row-order segment spans 1 receive row but all 64 send rows.
  auto spread = [](const zcoll::schedule& s) {
    std::size_t worst = 0;
    for (int r = 0; r < s.p; ++r) {
      std::set<int> d, src;
      for (const auto& b : s.segment(r)) d.insert(b.dst), src.insert(b.src);
      worst = std::max(worst, d.size() + src.size());
    }
    return worst;
  };
  const int p = 64;
  CHECK(spread(zcoll::full_schedule(p, block_order::row)) == 65);
  CHECK(spread(zcoll::full_schedule(p, block_order::column)) == 65);
  CHECK(spread(zcoll::full_schedule(p, block_order::morton)) == 16);  // 8 x 8 squares
  CHECK(spread(zcoll::full_schedule(p, block_order::hilbert)) <= 24);
}

// ---- NUMA order (TPDS'18 §2.4) --------------------------------------------------------------
// Expected properties from schedule.hpp's comment, checked against domains computed here.

namespace {

constexpr zcoll::schedule_kind all_kinds[] = {
    zcoll::schedule_kind::full, zcoll::schedule_kind::swap, zcoll::schedule_kind::offdiagonal};

// Ranks' NUMA nodes: `sizes[k]` ranks on node `ids[k]`, consecutive ranks (blocked) or dealt
// round-robin over the nodes while they have room (interleaved).
std::vector<int> layout(const std::vector<int>& sizes, const std::vector<int>& ids,
                        bool interleaved) {
  std::vector<int> numa;
  if (!interleaved) {
    for (std::size_t k = 0; k < sizes.size(); ++k) numa.insert(numa.end(), sizes[k], ids[k]);
    return numa;
  }
  std::vector<int> left(sizes);
  for (bool any = true; any;) {
    any = false;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      if (left[k] > 0) --left[k], numa.push_back(ids[k]), any = true;
  }
  return numa;
}

// 2- and 4-socket layouts at P = 4...64, uneven ones, one-rank domains, odd node ids.
std::vector<std::vector<int>> numa_layouts() {
  std::vector<std::vector<int>> all;
  for (bool inter : {false, true}) {
    all.push_back(layout({2, 2}, {0, 1}, inter));
    all.push_back(layout({4, 4, 4, 4}, {0, 1, 2, 3}, inter));
    all.push_back(layout({3, 5}, {0, 1}, inter));
    all.push_back(layout({5, 3}, {4, 9}, inter));
    all.push_back(layout({1, 3, 2, 5}, {7, 2, 5, 9}, inter));
    all.push_back(layout({1, 1, 1, 1}, {0, 1, 2, 3}, inter));
    all.push_back(layout({1, 6}, {1, 0}, inter));
    for (int p : {6, 10, 16, 24, 32, 48, 64}) {
      all.push_back(layout({p / 2, p - p / 2}, {0, 1}, inter));
      all.push_back(layout({p / 4, p / 4, p / 4, p - 3 * (p / 4)}, {0, 1, 2, 3}, inter));
    }
    all.push_back(layout({20, 44}, {1, 0}, inter));
    all.push_back(layout({7, 13, 1, 19}, {3, 0, 2, 1}, inter));
    all.push_back(layout({8, 8, 8, 8, 8, 8, 8, 8}, {0, 1, 2, 3, 4, 5, 6, 7}, inter));
  }
  return all;
}

// Domain index of each rank: node ids in increasing order -> 0, 1, ...
std::vector<int> ref_domains(const std::vector<int>& numa) {
  std::set<int> ids(numa.begin(), numa.end());
  std::vector<int> sorted(ids.begin(), ids.end()), out;
  for (int v : numa)
    out.push_back(static_cast<int>(std::find(sorted.begin(), sorted.end(), v) - sorted.begin()));
  return out;
}

std::string numa_label(const std::vector<int>& numa, zcoll::schedule_kind kind) {
  std::string s = std::string(zcoll::name_of(kind)) + " numa=";
  for (int v : numa) s += std::to_string(v) + ",";
  return s;
}

zcoll::schedule numa_schedule(zcoll::schedule_kind kind, const std::vector<int>& numa) {
  return zcoll::make_schedule({kind, static_cast<int>(numa.size()), block_order::numa, numa});
}

// The domain a block belongs to as seen by domain r: the other end's domain (in place swaps
// write both ends; out of place, the source's).
int other_domain(const block_coord& b, int r, const std::vector<int>& dom, bool swap) {
  const int a = dom[static_cast<std::size_t>(b.dst)], c = dom[static_cast<std::size_t>(b.src)];
  if (!swap) return c;
  return a == r ? c : a;
}

}  // namespace

TEST_CASE("numa schedule: every block once, each domain writes only its own receive buffers") {
  for (const auto& numa : numa_layouts()) {
    const int p = static_cast<int>(numa.size());
    const auto dom = ref_domains(numa);
    for (const auto kind : all_kinds) {
      INFO(numa_label(numa, kind));
      const bool swap = kind == zcoll::schedule_kind::swap;
      const auto s = numa_schedule(kind, numa);
      CHECK(s.p == p);
      CHECK(s.order == block_order::numa);
      REQUIRE(s.starts.size() == static_cast<std::size_t>(p) + 1);
      CHECK(s.starts.front() == 0);
      CHECK(s.starts.back() == s.blocks.size());
      CHECK(std::is_sorted(s.starts.begin(), s.starts.end()));
      if (kind == zcoll::schedule_kind::full)
        check_covers(s.blocks, p, [](int, int) { return true; }, "full");
      else if (swap)
        check_covers(s.blocks, p, [](int d, int src) { return d > src; }, "swap");
      else
        check_covers(s.blocks, p, [](int d, int src) { return d != src; }, "offdiagonal");
      int foreign = 0;  // blocks written outside the copying rank's domain
      for (int e = 0; e < p; ++e) {
        const int r = dom[static_cast<std::size_t>(e)];
        for (const auto& b : s.segment(e)) {
          const int dd = dom[static_cast<std::size_t>(b.dst)],
                    ds = dom[static_cast<std::size_t>(b.src)];
          // Out of place a block is written into dst's buffer; a swap writes both ends, one of
          // which must be in the rank's domain (both, for pairs inside a domain).
          const bool ok = swap ? (dd == r || ds == r) : dd == r;
          foreign += ok ? 0 : 1;
        }
      }
      CHECK(foreign == 0);
    }
  }
}

TEST_CASE("numa schedule: s staggered steps, Morton inside a step, balanced pieces") {
  for (const auto& numa : numa_layouts()) {
    const int p = static_cast<int>(numa.size());
    const auto dom = ref_domains(numa);
    const int domains = *std::max_element(dom.begin(), dom.end()) + 1;
    std::vector<std::vector<int>> members(static_cast<std::size_t>(domains));
    for (int e = 0; e < p; ++e)
      members[static_cast<std::size_t>(dom[static_cast<std::size_t>(e)])].push_back(e);
    for (const auto kind : all_kinds) {
      INFO(numa_label(numa, kind));
      const bool swap = kind == zcoll::schedule_kind::swap;
      const auto s = numa_schedule(kind, numa);
      // step[e][i]: rank e's blocks of its step i (reading domain (r + i) % s).
      std::vector<std::vector<std::vector<block_coord>>> step(static_cast<std::size_t>(p));
      int unordered = 0;
      for (int e = 0; e < p; ++e) {
        const int r = dom[static_cast<std::size_t>(e)];
        auto& mine = step[static_cast<std::size_t>(e)];
        mine.resize(static_cast<std::size_t>(domains));
        int last = 0;
        for (const auto& b : s.segment(e)) {
          const int i = (other_domain(b, r, dom, swap) - r + domains) % domains;
          unordered += i < last ? 1 : 0;  // steps in increasing order: (r + i) % s
          last = i;
          mine[static_cast<std::size_t>(i)].push_back(b);
        }
      }
      CHECK(unordered == 0);
      int uneven_steps = 0, wrong_morton = 0, wrong_halves = 0;
      for (int r = 0; r < domains; ++r) {
        const auto& in_r = members[static_cast<std::size_t>(r)];
        std::size_t lo_total = SIZE_MAX, hi_total = 0;
        for (int e : in_r) {
          std::size_t total = s.segment(e).size();
          lo_total = std::min(lo_total, total), hi_total = std::max(hi_total, total);
          if (kind == zcoll::schedule_kind::full) CHECK(total == static_cast<std::size_t>(p));
          if (kind == zcoll::schedule_kind::offdiagonal)
            CHECK(total == static_cast<std::size_t>(p - 1));
        }
        CHECK(hi_total - lo_total <= 1);  // balanced work inside a domain
        for (int i = 0; i < domains; ++i) {
          const int x = (r + i) % domains;
          std::vector<block_coord> bunch;
          std::size_t lo = SIZE_MAX, hi = 0;
          for (int e : in_r) {
            const auto& piece = step[static_cast<std::size_t>(e)][static_cast<std::size_t>(i)];
            lo = std::min(lo, piece.size()), hi = std::max(hi, piece.size());
            bunch.insert(bunch.end(), piece.begin(), piece.end());
          }
          uneven_steps += hi - lo <= 1 ? 0 : 1;  // the domain's ranks progress together
          // The bunch, pieces in local rank order, is the Morton order of (r's ranks, x's
          // ranks) restricted to what this kind copies (swaps between domains: the lower
          // domain's Morton order over (lower, higher), first half to the lower one).
          std::vector<block_coord> local, want;
          const bool cross_swap = swap && r != x;
          const auto& rows = members[static_cast<std::size_t>(cross_swap ? std::min(r, x) : r)];
          const auto& cols = members[static_cast<std::size_t>(cross_swap ? std::max(r, x) : x)];
          ref_balanced(0, static_cast<int>(rows.size()), 0, static_cast<int>(cols.size()), local);
          for (const auto& b : local) {
            const int d = rows[static_cast<std::size_t>(b.dst)];
            const int src = cols[static_cast<std::size_t>(b.src)];
            if (cross_swap) {
              want.push_back({std::max(d, src), std::min(d, src)});
              continue;
            }
            if (kind == zcoll::schedule_kind::offdiagonal && d == src) continue;
            if (swap && d <= src) continue;
            want.push_back({d, src});
          }
          if (cross_swap) {
            const std::size_t half = want.size() / 2;
            if (r < x)
              want.resize(half);
            else
              want.erase(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(half));
            wrong_halves += bunch.size() == (r < x ? half : local.size() - half) ? 0 : 1;
          }
          wrong_morton += bunch == want ? 0 : 1;
        }
      }
      CHECK(uneven_steps == 0);
      CHECK(wrong_morton == 0);
      CHECK(wrong_halves == 0);
    }
  }
}

TEST_CASE("numa schedule: at each step every domain reads a different domain") {
  // Staggering: in step i domain r reads domain (r + i) % s, a permutation of the domains.
  for (const auto& numa : numa_layouts()) {
    const auto dom = ref_domains(numa);
    const int domains = *std::max_element(dom.begin(), dom.end()) + 1;
    const auto s = numa_schedule(zcoll::schedule_kind::full, numa);
    INFO(numa_label(numa, zcoll::schedule_kind::full));
    // The first block each rank copies comes from its own domain (step 0 is local) and its
    // k-th source domain change moves to the next domain up.
    int bad = 0;
    for (int e = 0; e < static_cast<int>(numa.size()); ++e) {
      const int r = dom[static_cast<std::size_t>(e)];
      std::vector<int> seen;
      for (const auto& b : s.segment(e)) {
        const int x = dom[static_cast<std::size_t>(b.src)];
        if (seen.empty() || seen.back() != x) seen.push_back(x);
      }
      std::vector<int> want;
      for (int i = 0; i < domains; ++i) want.push_back((r + i) % domains);
      bad += seen == want ? 0 : 1;
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("numa schedule over one domain is the Morton schedule") {
  for (int p = 1; p <= 64; ++p) {
    for (const auto kind : all_kinds) {
      INFO(numa_label({}, kind) << " P=" << p);
      const auto morton = zcoll::make_schedule({kind, p, block_order::morton, {}});
      for (const std::vector<int>& numa :
           {std::vector<int>{}, std::vector<int>(static_cast<std::size_t>(p), 3),
            layout({p - p / 2, p / 2}, {-1, 0}, false)}) {
        const auto s = zcoll::make_schedule({kind, p, block_order::numa, numa});
        CHECK(s.blocks == morton.blocks);
        CHECK(s.starts == morton.starts);
        CHECK(s.order == block_order::numa);
      }
    }
  }
  // Other orders ignore the domains.
  const auto row =
      zcoll::make_schedule({zcoll::schedule_kind::full, 4, block_order::row, {0, 0, 1, 1}});
  CHECK(row.blocks == zcoll::block_curve(4, block_order::row));
}

TEST_CASE("numa_domains numbers NUMA nodes in increasing order and checks the length") {
  CHECK(zcoll::numa_domains(4, {7, 2, 7, 5}) == std::vector<int>{2, 0, 2, 1});
  CHECK(zcoll::numa_domains(3, {}) == std::vector<int>{0, 0, 0});
  CHECK(zcoll::numa_domains(3, {1, -1, 0}) == std::vector<int>{0, 0, 0});
  CHECK(zcoll::numa_domain_count(4, {7, 2, 7, 5}) == 3);
  CHECK(zcoll::numa_domain_count(4, {7, 2}) == 1);
  CHECK(zcoll::numa_domain_count(2, {0, -1}) == 1);
  CHECK_THROWS_AS(zcoll::numa_domains(4, {0, 1}), std::invalid_argument);
  CHECK_THROWS_AS(zcoll::make_schedule({zcoll::schedule_kind::full, 4, block_order::numa, {0, 1}}),
                  std::invalid_argument);
  CHECK_THROWS_AS(zcoll::make_schedule({zcoll::schedule_kind::full, 0, block_order::numa, {}}),
                  std::invalid_argument);
}
