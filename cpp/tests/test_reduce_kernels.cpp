// Reduction kernels (reduce_kernels.hpp): every (element type, op) against a scalar reference
// written here, fold order (left to right), destinations that are one of the sources, lengths
// around the chunk size, and float16 conversions against values known exactly.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "zcoll/reduce_kernels.hpp"

using namespace zcoll;

namespace {

template <class T>
std::vector<T> random_values(std::size_t n, unsigned seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(u(rng));
  return v;
}

// The reference for integers: exact arithmetic modulo 2^bits, written with 64-bit unsigned.
template <class T>
T int_ref(reduce_op op, T a, T b) {
  using U = std::uint64_t;
  switch (op) {
    case reduce_op::sum:
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    case reduce_op::prod:
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    case reduce_op::min:
      return std::min(a, b);
    case reduce_op::max:
      return std::max(a, b);
    case reduce_op::land:
      return static_cast<T>(a != 0 && b != 0);
    case reduce_op::lor:
      return static_cast<T>(a != 0 || b != 0);
    case reduce_op::lxor:
      return static_cast<T>((a != 0) != (b != 0));
    case reduce_op::band:
      return static_cast<T>(a & b);
    case reduce_op::bor:
      return static_cast<T>(a | b);
    case reduce_op::bxor:
      return static_cast<T>(a ^ b);
  }
  return 0;
}

template <class T>
void check_integer_type(element_type t) {
  const std::size_t n = 3 * reduce_chunk_bytes / sizeof(T) + 5;  // several chunks and a tail
  std::mt19937_64 rng(static_cast<unsigned>(t));
  std::vector<std::vector<T>> in(4, std::vector<T>(n));
  for (auto& v : in)
    for (auto& x : v) x = static_cast<T>(rng() % 7 == 0 ? 0 : rng());
  for (int o = 0; o < count_of<reduce_op>; ++o) {
    const auto op = static_cast<reduce_op>(o);
    REQUIRE(op_defined(op, t));
    std::vector<T> got(n);
    const void* srcs[4] = {in[0].data(), in[1].data(), in[2].data(), in[3].data()};
    reduce_fold(op, t, got.data(), srcs, 4, n);
    bool same = true;
    for (std::size_t i = 0; i < n; ++i) {
      const T want = int_ref(op, int_ref(op, int_ref(op, in[0][i], in[1][i]), in[2][i]), in[3][i]);
      same &= got[i] == want;
    }
    CHECK_MESSAGE(same, name_of(t), " ", name_of(op));
  }
}

}  // namespace

TEST_CASE("reduce kernels: every integer type and op, exact, modulo 2^bits") {
  check_integer_type<std::int8_t>(element_type::int8);
  check_integer_type<std::uint8_t>(element_type::uint8);
  check_integer_type<std::int16_t>(element_type::int16);
  check_integer_type<std::uint16_t>(element_type::uint16);
  check_integer_type<std::int32_t>(element_type::int32);
  check_integer_type<std::uint32_t>(element_type::uint32);
  check_integer_type<std::int64_t>(element_type::int64);
  check_integer_type<std::uint64_t>(element_type::uint64);
}

TEST_CASE("reduce kernels: bool ops are logical and give 0 or 1") {
  const std::uint8_t a[4] = {0, 0, 1, 2}, b[4] = {0, 1, 0, 1};
  const void* srcs[2] = {a, b};
  auto fold = [&](reduce_op op) {
    std::vector<std::uint8_t> out(4);
    reduce_fold(op, element_type::boolean, out.data(), srcs, 2, 4);
    return out;
  };
  const std::vector<std::uint8_t> any{0, 1, 1, 1}, all{0, 0, 0, 1}, odd{0, 1, 1, 0};
  for (auto op : {reduce_op::sum, reduce_op::max, reduce_op::lor, reduce_op::bor})
    CHECK(fold(op) == any);
  for (auto op : {reduce_op::prod, reduce_op::min, reduce_op::land, reduce_op::band})
    CHECK(fold(op) == all);
  for (auto op : {reduce_op::lxor, reduce_op::bxor}) CHECK(fold(op) == odd);
}

TEST_CASE("reduce kernels: floats fold left to right, NaN propagates through min and max") {
  const std::size_t n = reduce_chunk_bytes / 8 + 3;
  auto a = random_values<double>(n, 1, -1e3, 1e3), b = random_values<double>(n, 2, -1, 1),
       c = random_values<double>(n, 3, -1e-3, 1e-3);
  a[5] = NAN;
  b[6] = NAN;
  const void* srcs[3] = {a.data(), b.data(), c.data()};
  std::vector<double> sum(n), lo(n), hi(n);
  reduce_fold(reduce_op::sum, element_type::float64, sum.data(), srcs, 3, n);
  reduce_fold(reduce_op::min, element_type::float64, lo.data(), srcs, 3, n);
  reduce_fold(reduce_op::max, element_type::float64, hi.data(), srcs, 3, n);
  bool order = true, nan = true;
  for (std::size_t i = 0; i < n; ++i) {
    if (i == 5 || i == 6) {
      nan &= std::isnan(sum[i]) && std::isnan(lo[i]) && std::isnan(hi[i]);
      continue;
    }
    const double want = (a[i] + b[i]) + c[i];  // this order, bit for bit
    order &= std::memcmp(&want, &sum[i], 8) == 0;
    order &= lo[i] == std::min({a[i], b[i], c[i]}) && hi[i] == std::max({a[i], b[i], c[i]});
  }
  CHECK(order);
  CHECK(nan);
  CHECK_FALSE(op_defined(reduce_op::bxor, element_type::float32));
  CHECK_FALSE(op_defined(reduce_op::max, element_type::complex64));
  CHECK_FALSE(op_defined(reduce_op::land, element_type::complex128));
  CHECK(op_defined(reduce_op::prod, element_type::complex128));
}

TEST_CASE("reduce kernels: complex sum and product") {
  using C = std::complex<float>;
  std::vector<C> a{{1, 2}, {3, -1}}, b{{0.5f, 4}, {-2, 2}}, out(2);
  const void* srcs[2] = {a.data(), b.data()};
  reduce_fold(reduce_op::prod, element_type::complex64, out.data(), srcs, 2, 2);
  for (int i = 0; i < 2; ++i) {
    const C w{a[i].real() * b[i].real() - a[i].imag() * b[i].imag(),
              a[i].real() * b[i].imag() + a[i].imag() * b[i].real()};
    CHECK(out[i] == w);
  }
  reduce_fold(reduce_op::sum, element_type::complex64, out.data(), srcs, 2, 2);
  CHECK(out[0] == a[0] + b[0]);
  CHECK(out[1] == a[1] + b[1]);
}

TEST_CASE("reduce kernels: every source count, written directly, through the chunk or streamed") {
  const std::size_t n = 2 * reduce_chunk_bytes / 4 + 9;  // chunks and a tail
  std::mt19937_64 rng(11);
  std::vector<std::vector<std::int32_t>> in(5, std::vector<std::int32_t>(n));
  for (auto& v : in)
    for (auto& x : v) x = static_cast<std::int32_t>(rng());
  const void* srcs[5] = {in[0].data(), in[1].data(), in[2].data(), in[3].data(), in[4].data()};
  for (reduce_op op : {reduce_op::sum, reduce_op::max})
    for (int k = 1; k <= 5; ++k)
      for (bool stream : {false, true}) {
        std::vector<std::int32_t> got(n, 7);
        reduce_fold(op, element_type::int32, got.data(), srcs, k, n, stream);
        bool same = true;
        for (std::size_t i = 0; i < n; ++i) {
          std::int32_t want = in[0][i];
          for (int j = 1; j < k; ++j) want = int_ref(op, want, in[static_cast<std::size_t>(j)][i]);
          same &= got[i] == want;
        }
        CHECK_MESSAGE(same, name_of(op), " k=", k, stream ? " streamed" : "");
      }
}

TEST_CASE("reduce kernels: the destination may be any of the sources") {
  const std::size_t n = 2 * reduce_chunk_bytes / 4 + 17;
  auto a = random_values<float>(n, 4, -1, 1), b = random_values<float>(n, 5, -1, 1),
       c = random_values<float>(n, 6, -1, 1);
  std::vector<float> want(n);
  const void* srcs[3] = {a.data(), b.data(), c.data()};
  reduce_fold(reduce_op::sum, element_type::float32, want.data(), srcs, 3, n);
  auto c2 = c;
  const void* alias[3] = {a.data(), b.data(), c2.data()};
  reduce_fold(reduce_op::sum, element_type::float32, c2.data(), alias, 3, n);
  CHECK(std::memcmp(want.data(), c2.data(), n * 4) == 0);
  auto a2 = a;
  const void* first[3] = {a2.data(), b.data(), c.data()};
  reduce_fold(reduce_op::sum, element_type::float32, a2.data(), first, 3, n);
  CHECK(std::memcmp(want.data(), a2.data(), n * 4) == 0);
}

TEST_CASE("reduce kernels: float16 conversions round to nearest even, as NumPy") {
  CHECK(half_to_float(0x3c00) == 1.0f);
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(half_to_float(0x7bff) == 65504.0f);
  CHECK(std::isinf(half_to_float(0x7c00)));
  CHECK(std::isnan(half_to_float(0x7e00)));
  CHECK(float_to_half(1.0f) == 0x3c00);
  CHECK(float_to_half(-2.0f) == 0xc000);
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(65520.0f) == 0x7c00);  // halfway to the next: rounds to even = inf
  CHECK(float_to_half(65519.0f) == 0x7bff);
  CHECK(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie: to even (down)
  CHECK(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie: to even (up)
  CHECK(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);             // tie below min: to 0
  CHECK(float_to_half(std::ldexp(3.0f, -25)) == 0x0002);             // tie: to even
  CHECK(float_to_half(std::ldexp(1.0f, -14)) == 0x0400);             // smallest normal
  CHECK((float_to_half(NAN) & 0x7c00) == 0x7c00);
  CHECK((float_to_half(NAN) & 0x03ff) != 0);
  bool round_trip = true;  // every float16 survives half -> float -> half
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto x = static_cast<std::uint16_t>(h);
    const float f = half_to_float(x);
    round_trip &= std::isnan(f) ? (float_to_half(f) & 0x7fff) > 0x7c00 : float_to_half(f) == x;
  }
  CHECK(round_trip);
  // A sum rounded back to float16 after each step: 2048 + 1 + 1 = 2048 (1 is half an ulp).
  const std::uint16_t big = float_to_half(2048.0f), one = float_to_half(1.0f);
  const std::uint16_t v[3] = {big, one, one};
  const void* srcs[3] = {&v[0], &v[1], &v[2]};
  std::uint16_t out = 0;
  reduce_fold(reduce_op::sum, element_type::float16, &out, srcs, 3, 1);
  CHECK(half_to_float(out) == 2048.0f);
}

TEST_CASE("reduce kernels: element types of NumPy dtypes") {
  CHECK(element_type_of({'d', 8}) == element_type::float64);
  CHECK(element_type_of({'l', 8}) == element_type::int64);
  CHECK(element_type_of({'Q', 8}) == element_type::uint64);
  CHECK(element_type_of({'?', 1}) == element_type::boolean);
  CHECK(element_type_of({'e', 2}) == element_type::float16);
  CHECK(element_type_of({'D', 16}) == element_type::complex128);
  CHECK_FALSE(element_type_of({'g', 16}).has_value());  // longdouble
  CHECK_FALSE(element_type_of({'V', 8}).has_value());
  CHECK(element_bytes(element_type::complex64) == 8);
}
