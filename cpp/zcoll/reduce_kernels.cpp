#include "zcoll/reduce_kernels.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <type_traits>

#include "zcoll/copy.hpp"

namespace zcoll {

float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    const float magnitude = static_cast<float>(mant) * 0x1p-24f;  // subnormal: mant * 2^-24
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

std::uint16_t float_to_half(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x47800000u) {   // |f| >= 2^16: inf, NaN, or too large for any rounding
    if (ax > 0x7f800000u) {  // NaN: keep the top payload bits, stay a NaN
      const std::uint32_t payload = (ax & 0x7fffffu) >> 13;
      return static_cast<std::uint16_t>(sign | 0x7c00u | (payload ? payload : 1u));
    }
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (ax < 0x38800000u) {  // below 2^-14: a float16 subnormal or zero
    // Adding 0.5 aligns the 10 result bits at the bottom of the float's significand; the FPU's
    // round-to-nearest-even does the rounding, and subtracting 0.5's bits leaves them.
    const float aligned = std::bit_cast<float>(ax) + 0.5f;
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(aligned) - 0x3f000000u));
  }
  // Normal: rebias the exponent, add half an ulp (minus one when the kept part is even: ties
  // to even), truncate; a carry into the exponent is the right result, up to infinity.
  const std::uint32_t odd = (ax >> 13) & 1u;
  const std::uint32_t rounded = ax - (112u << 23) + 0xfffu + odd;
  return static_cast<std::uint16_t>(sign | (rounded >> 13));
}

namespace {

// ---- element-wise operations -------------------------------------------------------------

// Integer arithmetic modulo 2^bits without signed overflow (types narrower than int are
// computed in unsigned int, wider ones in their own unsigned type).
template <class T>
using wide_unsigned =
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

struct op_sum {
  template <class T>
  static T apply(T a, T b) noexcept {
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(static_cast<wide_unsigned<T>>(a) + static_cast<wide_unsigned<T>>(b));
    else
      return a + b;
  }
};
struct op_prod {
  template <class T>
  static T apply(T a, T b) noexcept {
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(static_cast<wide_unsigned<T>>(a) * static_cast<wide_unsigned<T>>(b));
    else
      return a * b;
  }
};
// numpy.minimum / maximum: NaN in either operand propagates (a != a only for NaN).
struct op_min {
  template <class T>
  static T apply(T a, T b) noexcept {
    if constexpr (std::is_floating_point_v<T>)
      return (a <= b || a != a) ? a : b;
    else
      return a < b ? a : b;
  }
};
struct op_max {
  template <class T>
  static T apply(T a, T b) noexcept {
    if constexpr (std::is_floating_point_v<T>)
      return (a >= b || a != a) ? a : b;
    else
      return a > b ? a : b;
  }
};
struct op_land {
  template <class T>
  static T apply(T a, T b) noexcept {
    return static_cast<T>((a != T(0)) & (b != T(0)));
  }
};
struct op_lor {
  template <class T>
  static T apply(T a, T b) noexcept {
    return static_cast<T>((a != T(0)) | (b != T(0)));
  }
};
struct op_lxor {
  template <class T>
  static T apply(T a, T b) noexcept {
    return static_cast<T>((a != T(0)) ^ (b != T(0)));
  }
};
struct op_band {
  template <class T>
  static T apply(T a, T b) noexcept {
    return static_cast<T>(a & b);
  }
};
struct op_bor {
  template <class T>
  static T apply(T a, T b) noexcept {
    return static_cast<T>(a | b);
  }
};
struct op_bxor {
  template <class T>
  static T apply(T a, T b) noexcept {
    return static_cast<T>(a ^ b);
  }
};

// bool (one byte, 0 or 1 as NumPy stores it; any nonzero byte reads as true).
struct bool_or {
  static std::uint8_t apply(std::uint8_t a, std::uint8_t b) noexcept {
    return static_cast<std::uint8_t>((a | b) != 0);
  }
};
struct bool_and {
  static std::uint8_t apply(std::uint8_t a, std::uint8_t b) noexcept {
    return static_cast<std::uint8_t>((a != 0) & (b != 0));
  }
};
struct bool_xor {
  static std::uint8_t apply(std::uint8_t a, std::uint8_t b) noexcept {
    return static_cast<std::uint8_t>((a != 0) ^ (b != 0));
  }
};

// float16: NumPy's half ufuncs convert to float32, combine, and round back per operation.
template <class Op>
struct half_op {
  static std::uint16_t apply(std::uint16_t a, std::uint16_t b) noexcept {
    if constexpr (std::is_same_v<Op, op_min> || std::is_same_v<Op, op_max>) {
      // An ordering returns one of the operands unchanged (its bits, NaN payload included).
      const float fa = half_to_float(a), fb = half_to_float(b);
      const bool first = std::is_same_v<Op, op_min> ? fa <= fb : fa >= fb;
      return (first || fa != fa) ? a : b;
    } else {
      return float_to_half(Op::apply(half_to_float(a), half_to_float(b)));
    }
  }
};

// complex: an element is two consecutive floats (NumPy's layout); sum is two float sums.
template <class F>
struct complex_of {
  F re, im;
};
template <class F>
struct complex_prod {
  static complex_of<F> apply(complex_of<F> a, complex_of<F> b) noexcept {
    return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
  }
};

// Binds a generic op to element type T.
template <class Op, class T>
struct typed {
  using type = T;
  static T apply(T a, T b) noexcept { return Op::template apply<T>(a, b); }
};
template <class Op, class T>
struct as_is {
  using type = T;
  static T apply(T a, T b) noexcept { return Op::apply(a, b); }
};

// ---- the loops ---------------------------------------------------------------------------

// acc[i] = a[i] op b[i]: the vectorised loop of each (type, op).
template <class Bound>
void combine2(typename Bound::type* __restrict acc, const typename Bound::type* __restrict a,
              const typename Bound::type* __restrict b, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) acc[i] = Bound::apply(a[i], b[i]);
}

// acc[i] = acc[i] op b[i].
template <class Bound>
void accumulate(typename Bound::type* __restrict acc, const typename Bound::type* __restrict b,
                std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) acc[i] = Bound::apply(acc[i], b[i]);
}

template <class Bound>
void fold(void* dst, const void* const* srcs, int k, std::size_t n, bool stream) noexcept {
  using T = typename Bound::type;
  constexpr std::size_t chunk = reduce_chunk_bytes / sizeof(T);
  alignas(64) T acc[chunk];
  auto* out = static_cast<std::byte*>(dst);
  if (k == 1) {
    if (dst != srcs[0]) std::memmove(dst, srcs[0], n * sizeof(T));
    return;
  }
  const auto src = [&](int j, std::size_t start) { return static_cast<const T*>(srcs[j]) + start; };
  // A destination that is no source is written by the last step itself (one pass less over
  // the chunk); one that is a source only after the chunk of every source was read.
  const bool direct = !stream && std::find(srcs, srcs + k, dst) == srcs + k;
  for (std::size_t start = 0; start < n; start += chunk) {
    const std::size_t len = std::min(chunk, n - start);
    T* const to = reinterpret_cast<T*>(out) + start;
    if (direct && k == 2) {
      combine2<Bound>(to, src(0, start), src(1, start), len);
      continue;
    }
    combine2<Bound>(acc, src(0, start), src(1, start), len);
    const int last = direct ? k - 1 : k;
    for (int j = 2; j < last; ++j) accumulate<Bound>(acc, src(j, start), len);
    if (direct)
      combine2<Bound>(to, acc, src(k - 1, start), len);
    else if (stream)
      copy_bytes(out + start * sizeof(T), acc, len * sizeof(T), copy_plan{copy_mode::streaming});
    else
      std::memcpy(out + start * sizeof(T), acc, len * sizeof(T));
  }
}

using fold_fn = void (*)(void*, const void* const*, int, std::size_t, bool) noexcept;
constexpr int n_types = count_of<element_type>;
constexpr int n_ops = count_of<reduce_op>;
using fold_table = std::array<std::array<fold_fn, n_ops>, n_types>;

// The folds of a numeric type T: every op, or only the arithmetic and ordering ones.
template <class T>
void set_numeric(fold_table& t, element_type e) {
  auto& row = t[static_cast<std::size_t>(e)];
  row[static_cast<int>(reduce_op::sum)] = &fold<typed<op_sum, T>>;
  row[static_cast<int>(reduce_op::prod)] = &fold<typed<op_prod, T>>;
  row[static_cast<int>(reduce_op::min)] = &fold<typed<op_min, T>>;
  row[static_cast<int>(reduce_op::max)] = &fold<typed<op_max, T>>;
  row[static_cast<int>(reduce_op::land)] = &fold<typed<op_land, T>>;
  row[static_cast<int>(reduce_op::lor)] = &fold<typed<op_lor, T>>;
  row[static_cast<int>(reduce_op::lxor)] = &fold<typed<op_lxor, T>>;
  if constexpr (std::is_integral_v<T>) {
    row[static_cast<int>(reduce_op::band)] = &fold<typed<op_band, T>>;
    row[static_cast<int>(reduce_op::bor)] = &fold<typed<op_bor, T>>;
    row[static_cast<int>(reduce_op::bxor)] = &fold<typed<op_bxor, T>>;
  }
}

template <class F>
void set_complex(fold_table& t, element_type e) {
  auto& row = t[static_cast<std::size_t>(e)];
  row[static_cast<int>(reduce_op::prod)] = &fold<as_is<complex_prod<F>, complex_of<F>>>;
  // sum: see reduce_fold (two float sums per element)
}

void set_half(fold_table& t) {
  auto& row = t[static_cast<std::size_t>(element_type::float16)];
  row[static_cast<int>(reduce_op::sum)] = &fold<as_is<half_op<op_sum>, std::uint16_t>>;
  row[static_cast<int>(reduce_op::prod)] = &fold<as_is<half_op<op_prod>, std::uint16_t>>;
  row[static_cast<int>(reduce_op::min)] = &fold<as_is<half_op<op_min>, std::uint16_t>>;
  row[static_cast<int>(reduce_op::max)] = &fold<as_is<half_op<op_max>, std::uint16_t>>;
  row[static_cast<int>(reduce_op::land)] = &fold<as_is<half_op<op_land>, std::uint16_t>>;
  row[static_cast<int>(reduce_op::lor)] = &fold<as_is<half_op<op_lor>, std::uint16_t>>;
  row[static_cast<int>(reduce_op::lxor)] = &fold<as_is<half_op<op_lxor>, std::uint16_t>>;
}

void set_bool(fold_table& t) {
  auto& row = t[static_cast<std::size_t>(element_type::boolean)];
  using B = std::uint8_t;
  const fold_fn any = &fold<as_is<bool_or, B>>, all = &fold<as_is<bool_and, B>>;
  const fold_fn odd = &fold<as_is<bool_xor, B>>;
  for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::lor, reduce_op::bor})
    row[static_cast<int>(op)] = any;
  for (reduce_op op : {reduce_op::prod, reduce_op::min, reduce_op::land, reduce_op::band})
    row[static_cast<int>(op)] = all;
  for (reduce_op op : {reduce_op::lxor, reduce_op::bxor}) row[static_cast<int>(op)] = odd;
}

fold_table make_table() {
  fold_table t{};
  set_bool(t);
  set_numeric<std::int8_t>(t, element_type::int8);
  set_numeric<std::uint8_t>(t, element_type::uint8);
  set_numeric<std::int16_t>(t, element_type::int16);
  set_numeric<std::uint16_t>(t, element_type::uint16);
  set_numeric<std::int32_t>(t, element_type::int32);
  set_numeric<std::uint32_t>(t, element_type::uint32);
  set_numeric<std::int64_t>(t, element_type::int64);
  set_numeric<std::uint64_t>(t, element_type::uint64);
  set_half(t);
  set_numeric<float>(t, element_type::float32);
  set_numeric<double>(t, element_type::float64);
  set_complex<float>(t, element_type::complex64);
  set_complex<double>(t, element_type::complex128);
  return t;
}

const fold_table& table() noexcept {
  static const fold_table t = make_table();
  return t;
}

}  // namespace

std::optional<element_type> element_type_of(const dtype_id& d) noexcept {
  const auto c = static_cast<char>(d.kind);
  const std::uint32_t s = d.itemsize;
  auto integer = [s](bool is_signed) -> std::optional<element_type> {
    switch (s) {
      case 1:
        return is_signed ? element_type::int8 : element_type::uint8;
      case 2:
        return is_signed ? element_type::int16 : element_type::uint16;
      case 4:
        return is_signed ? element_type::int32 : element_type::uint32;
      case 8:
        return is_signed ? element_type::int64 : element_type::uint64;
      default:
        return std::nullopt;
    }
  };
  switch (c) {
    case '?':
      return s == 1 ? std::optional(element_type::boolean) : std::nullopt;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'p':
      return integer(true);
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
    case 'P':
      return integer(false);
    case 'e':
      return s == 2 ? std::optional(element_type::float16) : std::nullopt;
    case 'f':
      return s == 4 ? std::optional(element_type::float32) : std::nullopt;
    case 'd':
      return s == 8 ? std::optional(element_type::float64) : std::nullopt;
    case 'F':
      return s == 8 ? std::optional(element_type::complex64) : std::nullopt;
    case 'D':
      return s == 16 ? std::optional(element_type::complex128) : std::nullopt;
    default:
      return std::nullopt;
  }
}

std::size_t element_bytes(element_type t) noexcept {
  static constexpr std::array<std::size_t, n_types> bytes{1, 1, 1, 2, 2, 4, 4,
                                                          8, 8, 2, 4, 8, 8, 16};
  return bytes[static_cast<std::size_t>(t)];
}

bool op_defined(reduce_op op, element_type t) noexcept {
  if ((t == element_type::complex64 || t == element_type::complex128) && op == reduce_op::sum)
    return true;
  return table()[static_cast<std::size_t>(t)][static_cast<std::size_t>(op)] != nullptr;
}

void reduce_fold(reduce_op op, element_type t, void* dst, const void* const* srcs, int k,
                 std::size_t n, bool stream) noexcept {
  if (k < 1 || n == 0) return;
  if (op == reduce_op::sum && (t == element_type::complex64 || t == element_type::complex128)) {
    const element_type part =
        t == element_type::complex64 ? element_type::float32 : element_type::float64;
    reduce_fold(op, part, dst, srcs, k, 2 * n, stream);
    return;
  }
  const fold_fn f = table()[static_cast<std::size_t>(t)][static_cast<std::size_t>(op)];
  if (f) f(dst, srcs, k, n, stream);
}

}  // namespace zcoll
