// Copy kernels (copy.hpp): every mode, every ISA this CPU runs, every alignment. Results are
// compared with the source bytes and with a reference element-by-element copy; the bytes around
// each destination must stay untouched.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "zcoll/copy.hpp"

using zcoll::copy_isa;
using zcoll::copy_mode;
using zcoll::copy_plan;

namespace {

constexpr copy_isa all_isas[] = {copy_isa::portable, copy_isa::sse2, copy_isa::avx2,
                                 copy_isa::avx512};
constexpr std::byte guard{0xA5};

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) {
    b = static_cast<std::byte>(rng() & 0xFF);
    if (b == guard) b = std::byte{0x5A};  // a source byte never looks like an untouched guard
  }
  return v;
}

// A 64-byte-aligned buffer of `n` bytes.
struct aligned_buffer {
  explicit aligned_buffer(std::size_t n) : storage(n + 64) {
    const auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    base = storage.data() + ((64 - (addr & 63)) & 63);
  }
  std::vector<std::byte> storage;
  std::byte* base;
};

// The ISAs this CPU runs, with the process's kernel switched to each in turn; restores the best.
template <class Body>
void for_each_isa(Body body) {
  for (copy_isa isa : all_isas) {
    if (!zcoll::isa_available(isa)) continue;
    REQUIRE(zcoll::select_isa(isa));
    REQUIRE(zcoll::active_isa() == isa);
    INFO("isa " << zcoll::name_of(isa));
    body(isa);
  }
  REQUIRE(zcoll::select_isa(zcoll::best_isa()));
}

std::string plan_name(const copy_plan& plan) {
  std::string s(zcoll::name_of(plan.mode));
  if (plan.mode == copy_mode::hybrid) s += " T=" + std::to_string(plan.threshold);
  return s;
}

// Copies `n` bytes from src + soff to dst + doff with the plan, checks the whole destination
// buffer (copied range = source, everything else = guard) and restores the guard. Returns false
// on a mismatch.
bool copy_and_check(std::byte* dst_buf, std::size_t dst_len, const std::byte* src_buf,
                    std::size_t soff, std::size_t doff, std::size_t n, const copy_plan& plan) {
  static const std::vector<std::byte> guards(std::size_t{1} << 21, guard);
  REQUIRE(dst_len <= guards.size());
  zcoll::copy_bytes(dst_buf + doff, src_buf + soff, n, plan);
  const bool ok = std::memcmp(dst_buf + doff, src_buf + soff, n) == 0 &&
                  std::memcmp(dst_buf, guards.data(), doff) == 0 &&
                  std::memcmp(dst_buf + doff + n, guards.data(), dst_len - doff - n) == 0;
  std::memset(dst_buf + (ok ? doff : 0), static_cast<int>(guard), ok ? n : dst_len);
  return ok;
}

// Plans under test for a copy of `n` bytes: hybrid thresholds 0, 1, odd, a line, > n.
std::vector<copy_plan> plans_for(std::size_t n) {
  return {{copy_mode::temporal, 0}, {copy_mode::streaming, 0},  {copy_mode::hybrid, 0},
          {copy_mode::hybrid, 1},   {copy_mode::hybrid, 37},    {copy_mode::hybrid, 64},
          {copy_mode::hybrid, 129}, {copy_mode::hybrid, n + 1}, {copy_mode::hybrid, SIZE_MAX}};
}

}  // namespace

TEST_CASE("mode and isa names") {
  CHECK(zcoll::name_of(copy_mode::temporal) == "temporal");
  CHECK(zcoll::name_of(copy_mode::streaming) == "streaming");
  CHECK(zcoll::name_of(copy_mode::hybrid) == "hybrid");
  CHECK(zcoll::name_of(copy_isa::portable) == "portable");
  CHECK(zcoll::name_of(copy_isa::sse2) == "sse2");
  CHECK(zcoll::name_of(copy_isa::avx2) == "avx2");
  CHECK(zcoll::name_of(copy_isa::avx512) == "avx512");
}

TEST_CASE("isa availability matches the CPU and selection sticks") {
  CHECK(zcoll::active_isa() == zcoll::best_isa());  // the default before any select_isa
  CHECK(zcoll::isa_available(copy_isa::portable));
  CHECK_FALSE(zcoll::isa_available(static_cast<copy_isa>(zcoll::count_of<zcoll::copy_isa>)));
  CHECK_FALSE(zcoll::select_isa(static_cast<copy_isa>(zcoll::count_of<zcoll::copy_isa>)));
#if defined(__x86_64__)
  CHECK(zcoll::isa_available(copy_isa::sse2));
  CHECK(zcoll::isa_available(copy_isa::avx2) == zcoll_test::cpu_flag("avx2"));
  CHECK(zcoll::isa_available(copy_isa::avx512) == zcoll_test::cpu_flag("avx512f"));
  copy_isa expect = copy_isa::sse2;
  if (zcoll_test::cpu_flag("avx2")) expect = copy_isa::avx2;
  if (zcoll_test::cpu_flag("avx512f")) expect = copy_isa::avx512;
  CHECK(zcoll::best_isa() == expect);
#endif
  for (copy_isa isa : all_isas) {
    const copy_isa before = zcoll::active_isa();
    const bool ok = zcoll::select_isa(isa);
    CHECK(ok == zcoll::isa_available(isa));
    CHECK(zcoll::active_isa() == (ok ? isa : before));  // unavailable: no change
  }
  CHECK(zcoll::select_isa(zcoll::best_isa()));
  CHECK(zcoll::active_isa() == zcoll::best_isa());
}

namespace {

// All 64 x 64 source/destination alignments, lengths 0..300, every plan, with one kernel.
void alignment_sweep(copy_isa isa) {
  if (!zcoll::isa_available(isa)) {
    MESSAGE("this CPU does not run " << zcoll::name_of(isa) << ": nothing to test");
    return;
  }
  constexpr std::size_t max_n = 300, pad = 64;
  const auto src = random_bytes(max_n + 2 * pad, 1);
  aligned_buffer src_buf(src.size()), dst_buf(max_n + 3 * pad);
  std::memcpy(src_buf.base, src.data(), src.size());
  const std::size_t dst_len = max_n + 3 * pad;
  std::memset(dst_buf.base, static_cast<int>(guard), dst_len);
  REQUIRE(zcoll::select_isa(isa));
  for (std::size_t n = 0; n <= max_n; ++n) {
    for (const copy_plan& plan : plans_for(n)) {
      int failures = 0;
      for (std::size_t soff = 0; soff < 64 && failures < 3; ++soff)
        for (std::size_t doff = 0; doff < 64 && failures < 3; ++doff)
          if (!copy_and_check(dst_buf.base, dst_len, src_buf.base, soff, pad + doff, n, plan)) {
            ++failures;
            FAIL_CHECK(plan_name(plan) << " n=" << n << " src+" << soff << " dst+" << doff);
          }
    }
  }
  zcoll::store_fence();
  REQUIRE(zcoll::select_isa(zcoll::best_isa()));
}

}  // namespace

// One case per kernel, so that each stays short and ctest can run them side by side.
TEST_CASE("copy_bytes: every mode and alignment up to 300 bytes - portable") {
  alignment_sweep(copy_isa::portable);
}
TEST_CASE("copy_bytes: every mode and alignment up to 300 bytes - sse2") {
  alignment_sweep(copy_isa::sse2);
}
TEST_CASE("copy_bytes: every mode and alignment up to 300 bytes - avx2") {
  alignment_sweep(copy_isa::avx2);
}
TEST_CASE("copy_bytes: every mode and alignment up to 300 bytes - avx512") {
  alignment_sweep(copy_isa::avx512);
}

TEST_CASE("copy_bytes: large copies") {
  constexpr std::size_t pad = 64;
  const std::size_t lengths[] = {4096 + 1, 4096 + 63, 65536 + 7, (std::size_t{1} << 20) + 13};
  const std::size_t max_n = lengths[3];
  const auto src = random_bytes(max_n + 2 * pad, 2);
  aligned_buffer src_buf(src.size()), dst_buf(max_n + 3 * pad);
  std::memcpy(src_buf.base, src.data(), src.size());
  const std::size_t dst_len = max_n + 3 * pad;
  std::memset(dst_buf.base, static_cast<int>(guard), dst_len);
  for_each_isa([&](copy_isa) {
    for (std::size_t n : lengths)
      for (const copy_plan& plan : plans_for(n))
        for (std::size_t soff : {0, 1, 17, 63})
          for (std::size_t doff : {0, 1, 32, 63})
            if (!copy_and_check(dst_buf.base, dst_len, src_buf.base, soff, pad + doff, n, plan))
              FAIL_CHECK(plan_name(plan) << " n=" << n << " src+" << soff << " dst+" << doff);
  });
  zcoll::store_fence();
}

TEST_CASE("copy_bytes without a plan and with n = 0") {
  std::byte a[8], b[8];
  std::memset(a, 1, 8);
  std::memset(b, 2, 8);
  zcoll::copy_bytes(b, a, 0);
  zcoll::copy_bytes(b, a, 0, {copy_mode::streaming, 0});
  CHECK(std::memcmp(b, "\2\2\2\2\2\2\2\2", 8) == 0);
  zcoll::copy_bytes(b, a, 5);
  CHECK(std::memcmp(b, "\1\1\1\1\1\2\2\2", 8) == 0);
  // n = 0 may be called with null pointers (an empty block).
  zcoll::copy_bytes(nullptr, nullptr, 0, {copy_mode::hybrid, 3});
}

TEST_CASE("swap_bytes over lengths and alignments") {
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 300; ++n) lengths.push_back(n);
  for (std::size_t n : {4095, 4096, 4097, 8192 + 5, 3 * 4096 + 100}) lengths.push_back(n);
  const std::size_t max_n = lengths.back(), pad = 64, len = max_n + 3 * pad;
  const auto ra = random_bytes(len, 3), rb = random_bytes(len, 4);
  std::vector<std::byte> a(len), b(len);
  int failures = 0;
  for (std::size_t n : lengths) {
    for (std::size_t aoff : {0, 1, 7, 31, 63}) {
      for (std::size_t boff : {0, 3, 16, 63}) {
        a = ra, b = rb;
        zcoll::swap_bytes(a.data() + pad + aoff, b.data() + pad + boff, n);
        bool ok = std::memcmp(a.data() + pad + aoff, rb.data() + pad + boff, n) == 0 &&
                  std::memcmp(b.data() + pad + boff, ra.data() + pad + aoff, n) == 0;
        // Outside the swapped ranges nothing changes.
        ok = ok && std::memcmp(a.data(), ra.data(), pad + aoff) == 0 &&
             std::memcmp(b.data(), rb.data(), pad + boff) == 0 &&
             std::memcmp(a.data() + pad + aoff + n, ra.data() + pad + aoff + n,
                         len - pad - aoff - n) == 0 &&
             std::memcmp(b.data() + pad + boff + n, rb.data() + pad + boff + n,
                         len - pad - boff - n) == 0;
        if (!ok && failures++ < 3) FAIL_CHECK("n=" << n << " a+" << aoff << " b+" << boff);
      }
    }
  }
  CHECK(failures == 0);
}

namespace {

// Reference strided copy: every element of the box by nested loops over a flat index.
void reference_box(std::byte* dst, const std::vector<std::int64_t>& ds, const std::byte* src,
                   const std::vector<std::int64_t>& ss, const std::vector<std::uint64_t>& count,
                   std::size_t itemsize) {
  std::uint64_t total = 1;
  for (auto c : count) total *= c;
  const std::size_t nd = count.size();
  for (std::uint64_t flat = 0; flat < total; ++flat) {
    std::uint64_t rest = flat;
    std::int64_t doff = 0, soff = 0;
    for (std::size_t k = nd; k-- > 0;) {
      const auto i = static_cast<std::int64_t>(rest % count[k]);
      rest /= count[k];
      doff += i * ds[k], soff += i * ss[k];
    }
    std::memcpy(dst + doff, src + soff, itemsize);
  }
}

struct box_case {
  std::vector<std::uint64_t> count;
  std::size_t itemsize;
  std::vector<std::int64_t> src_extent, dst_extent;  // element extents of the enclosing arrays
  std::vector<std::int64_t> src_step, dst_step;      // element step along each axis (may be < 0)
};

// Byte strides of a C-ordered array of `extent` elements of `itemsize`, times `step`.
std::vector<std::int64_t> strides_of(const std::vector<std::int64_t>& extent,
                                     const std::vector<std::int64_t>& step, std::size_t itemsize) {
  std::vector<std::int64_t> s(extent.size());
  std::int64_t acc = static_cast<std::int64_t>(itemsize);
  for (std::size_t k = extent.size(); k-- > 0;) {
    s[k] = acc * step[k];
    acc *= extent[k];
  }
  return s;
}

// Bytes of a C-ordered array; the box starts in its middle so that negative steps stay inside.
std::int64_t array_bytes(const std::vector<std::int64_t>& extent, std::size_t itemsize) {
  std::int64_t n = static_cast<std::int64_t>(itemsize);
  for (auto e : extent) n *= e;
  return n;
}

// Offset of the box's first element: far enough in that every step (possibly negative) stays
// inside the array.
std::int64_t origin(const box_case& c, const std::vector<std::int64_t>& strides) {
  std::int64_t o = 0;
  for (std::size_t k = 0; k < c.count.size(); ++k)
    if (strides[k] < 0) o -= strides[k] * static_cast<std::int64_t>(c.count[k] - 1);
  return o;
}

void run_box(const box_case& c, const copy_plan& plan, unsigned seed) {
  const auto ss = strides_of(c.src_extent, c.src_step, c.itemsize);
  const auto ds = strides_of(c.dst_extent, c.dst_step, c.itemsize);
  const auto src =
      random_bytes(static_cast<std::size_t>(array_bytes(c.src_extent, c.itemsize)), seed);
  auto dst =
      random_bytes(static_cast<std::size_t>(array_bytes(c.dst_extent, c.itemsize)), seed + 1000);
  auto expect = dst;
  const std::int64_t so = origin(c, ss), dof = origin(c, ds);
  reference_box(expect.data() + dof, ds, src.data() + so, ss, c.count, c.itemsize);
  zcoll::copy_box(dst.data() + dof, ds.data(), src.data() + so, ss.data(), c.count.data(),
                  static_cast<int>(c.count.size()), c.itemsize, plan);
  std::string shape;
  for (auto n : c.count) shape += std::to_string(n) + " ";
  INFO("box " << shape << "item " << c.itemsize << " " << plan_name(plan));
  CHECK(dst == expect);
}

}  // namespace

TEST_CASE("copy_box matches a reference strided copy") {
  const std::vector<box_case> cases = {
      // 2-D sub-block of a C array (inner axis contiguous, rows strided) on both sides.
      {{5, 7}, 8, {9, 11}, {6, 13}, {1, 1}, {1, 1}},
      // Whole C arrays: both axes merge into one run.
      {{6, 10}, 4, {6, 10}, {6, 10}, {1, 1}, {1, 1}},
      // Contiguous on one side only.
      {{4, 33}, 8, {4, 33}, {5, 40}, {1, 1}, {1, 1}},
      // Transpose-like: element-wise inner axis (stride 2 items on the source).
      {{3, 17}, 4, {3, 34}, {3, 17}, {1, 2}, {1, 1}},
      // 3-D sub-boxes, odd item size, unit extents mixed in.
      {{3, 4, 5}, 3, {4, 6, 7}, {5, 4, 9}, {1, 1, 1}, {1, 1, 1}},
      {{1, 4, 1}, 16, {2, 6, 3}, {2, 5, 2}, {1, 1, 1}, {1, 1, 1}},
      {{2, 3, 64}, 8, {2, 3, 64}, {2, 5, 70}, {1, 1, 1}, {1, 1, 1}},
      {{4, 8, 130}, 1, {5, 9, 131}, {4, 8, 130}, {1, 1, 1}, {1, 1, 1}},
      // Large contiguous runs (the streaming kernels' body), strided in the middle axis.
      {{2, 3, 4000}, 2, {2, 5, 4000}, {3, 3, 4003}, {1, 2, 1}, {1, 1, 1}},
      // Negative steps (a reversed NumPy view) on the source, on the destination, on both.
      {{6, 9}, 8, {6, 9}, {6, 9}, {-1, 1}, {1, 1}},
      {{6, 9}, 4, {6, 9}, {6, 9}, {1, 1}, {1, -1}},
      {{3, 4, 5}, 2, {3, 4, 5}, {3, 4, 5}, {-1, 1, -1}, {1, -1, 1}},
      // Single element, empty box.
      {{1, 1, 1}, 24, {2, 2, 2}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}},
      {{3, 0, 5}, 8, {3, 1, 5}, {3, 1, 5}, {1, 1, 1}, {1, 1, 1}},
  };
  const copy_plan plans[] = {{copy_mode::temporal, 0}, {copy_mode::streaming, 0},
                             {copy_mode::hybrid, 0},   {copy_mode::hybrid, 1},
                             {copy_mode::hybrid, 333}, {copy_mode::hybrid, SIZE_MAX}};
  for_each_isa([&](copy_isa) {
    unsigned seed = 10;
    for (const auto& c : cases)
      for (const auto& plan : plans) run_box(c, plan, seed++);
  });
}

TEST_CASE("make_box simplifies once, copy_box of the shape copies the same bytes") {
  const std::vector<box_case> cases = {
      {{5, 7}, 8, {9, 11}, {6, 13}, {1, 1}, {1, 1}},
      {{6, 10}, 4, {6, 10}, {6, 10}, {1, 1}, {1, 1}},
      {{3, 17}, 4, {3, 34}, {3, 17}, {1, 2}, {1, 1}},
      {{1, 4, 1}, 16, {2, 6, 3}, {2, 5, 2}, {1, 1, 1}, {1, 1, 1}},
      {{2, 3, 4000}, 2, {2, 5, 4000}, {3, 3, 4003}, {1, 2, 1}, {1, 1, 1}},
      {{3, 4, 5}, 2, {3, 4, 5}, {3, 4, 5}, {-1, 1, -1}, {1, -1, 1}},
      {{1, 1, 1}, 24, {2, 2, 2}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}},
      {{3, 0, 5}, 8, {3, 1, 5}, {3, 1, 5}, {1, 1, 1}, {1, 1, 1}},
  };
  unsigned seed = 500;
  for (const auto& c : cases) {
    const auto ss = strides_of(c.src_extent, c.src_step, c.itemsize);
    const auto ds = strides_of(c.dst_extent, c.dst_step, c.itemsize);
    const auto src =
        random_bytes(static_cast<std::size_t>(array_bytes(c.src_extent, c.itemsize)), seed);
    auto expect =
        random_bytes(static_cast<std::size_t>(array_bytes(c.dst_extent, c.itemsize)), seed + 1);
    auto dst = expect;
    ++seed;
    const std::int64_t so = origin(c, ss), dof = origin(c, ds);
    const int ndim = static_cast<int>(c.count.size());
    zcoll::copy_box(expect.data() + dof, ds.data(), src.data() + so, ss.data(), c.count.data(),
                    ndim, c.itemsize);
    const zcoll::box_shape box =
        zcoll::make_box(ds.data(), ss.data(), c.count.data(), ndim, c.itemsize);
    std::uint64_t elements = 1;
    for (auto n : c.count) elements *= n;
    CHECK(box.empty() == (elements == 0));
    CHECK(box.bytes() == elements * c.itemsize);
    CHECK(box.rank <= ndim);
    for (const auto& plan :
         {zcoll::copy_plan{copy_mode::temporal, 0}, zcoll::copy_plan{copy_mode::hybrid, 100}}) {
      auto got = dst;
      zcoll::copy_box(got.data() + dof, src.data() + so, box, plan);
      CHECK(got == expect);
    }
  }
  // Whole C arrays merge into a single run; a unit box into a single element.
  const std::vector<std::uint64_t> whole{6, 10};
  const std::vector<std::int64_t> strides{40, 4};
  CHECK(zcoll::make_box(strides.data(), strides.data(), whole.data(), 2, 4).rank == 1);
  const std::vector<std::uint64_t> unit{1, 1};
  CHECK(zcoll::make_box(strides.data(), strides.data(), unit.data(), 2, 4).rank == 0);
}

TEST_CASE("copy_box with ndim 0 copies one element") {
  const std::uint64_t* no_count = nullptr;
  std::byte src[16], dst[16];
  std::memset(src, 7, 16);
  std::memset(dst, 0, 16);
  zcoll::copy_box(dst, nullptr, src, nullptr, no_count, 0, 12);
  CHECK(std::count(dst, dst + 16, std::byte{7}) == 12);
  CHECK(dst[12] == std::byte{0});
}

TEST_CASE("store_fence is callable") {
  zcoll::store_fence();
  std::byte a[256], b[256];
  std::memset(a, 9, sizeof a);
  zcoll::copy_bytes(b, a, sizeof a, {copy_mode::streaming, 0});
  zcoll::store_fence();
  CHECK(std::memcmp(a, b, sizeof a) == 0);
}
