/*
 * Registry: the one list of zcoll's names and codes.
 *
 * Every enumeration that crosses a layer -- the operations a node context runs, the block
 * orders, copy modes and kernels, barrier algorithms, schedule kinds -- is declared here with
 * its names, in code order. The binding exports these lists to Python once (bind_registry.cpp);
 * python/zcoll/_registry.py builds its lookup tables from them. Adding an operation or an
 * order means adding one enumerator and one name here, and nothing is retyped elsewhere.
 *
 * Codes travel as small integers (descriptor bytes, Python ints), so each enum's values are
 * 0..count-1 and index its name table. A few codes stand outside the enums: "auto" for an order
 * or a copy mode, and the eager path, which a tuning rule may name in place of an order.
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace zcoll {

// What a node context runs; every rank publishes one per call (see protocol.hpp).
enum class op_code : std::uint8_t {
  none = 0,                 // no call published yet
  error = 1,                // a rank found its own arguments invalid
  allocate = 2,             // collective arena allocation
  alltoall = 3,             // block j of rank i's send buffer -> block i of rank j's receive buffer
  allgather = 4,            // rank i's send buffer -> block i of every receive buffer
  barrier = 5,              // a node barrier
  transfer = 6,             // global transpose of a distributed array (see transfer.hpp)
  plan = 7,                 // creation of a persistent plan (see plan.hpp)
  start = 8,                // a run of a persistent plan
  allreduce = 9,            // every rank's buffer combined element-wise; the result on every rank
  reduce = 10,              // the same, the result on one root rank only
  reduce_scatter = 11,      // the same, block i of the result on rank i (reduce_scatter_block)
  bcast = 12,               // the root's buffer copied to every rank
  alltoallv = 13,           // alltoall with per-pair counts and displacements (vexchange.hpp)
  allgatherv = 14,          // allgather with per-rank counts and displacements
  neighbor_alltoall = 15,   // block i to the i-th destination of a process topology
  neighbor_allgather = 16,  // the whole buffer to every destination of a process topology
  neighbor_alltoallv = 17,  // neighbor_alltoall with per-edge counts and displacements
  neighbor_allgatherv = 18,  // neighbor_allgather with per-edge receive counts and displacements
};

// Order in which the P x P block matrix of a collective is traversed (and then cut into P
// contiguous segments, one per rank). Coordinates are (dst, src): row d of the matrix is rank
// d's receive buffer.
enum class block_order : std::uint8_t {
  row = 0,      // row-major: each rank fills its own receive row (the papers' SH-Naive baseline)
  column = 1,   // column-major: each rank pushes its own send row to every peer
  morton = 2,   // Z-order; bit de-interleave for power-of-two P, balanced recursion otherwise
  hilbert = 3,  // generalised Hilbert curve, defined for any P; consecutive blocks are neighbours
  numa = 4,     // TPDS'18 §2.4 (SH-NUMA-CO): each NUMA domain fills its own ranks' receive
                // buffers in s staggered steps (step i: from domain (r + i) % s), Morton inside
                // a step; needs the ranks' NUMA nodes (one domain: exactly Morton). The
                // irregular collectives run it as Morton (vexchange.hpp)
};

// How a copy treats the destination's cache lines (see copy.hpp).
enum class copy_mode : std::uint8_t {
  temporal = 0,   // ordinary stores (the C library's memcpy); best while the data fits in cache
  streaming = 1,  // non-temporal stores for everything past the alignment head
  hybrid = 2,     // temporal for the first `threshold` bytes of each block, streaming after
};

// Instruction set of the streaming-copy kernel (see copy.hpp).
enum class copy_isa : std::uint8_t {
  portable = 0,  // memcpy: no streaming store on this CPU/architecture
  sse2 = 1,      // 16-byte movntdq
  avx2 = 2,      // 32-byte vmovntdq
  avx512 = 3,    // 64-byte vmovntdq (AVX-512F)
};

// Node barrier algorithm (HPDC'13 §3). All wait with spin -> yield -> futex and bounded time.
enum class barrier_kind : std::uint8_t {
  flat = 0,           // each rank bumps its own line and polls everyone's: no shared hot line,
                      // and the line also carries the call's descriptor (one transfer per peer)
  central = 1,        // one shared arrival counter + generation word: O(1) reads per rank
  dissemination = 2,  // ceil(log2 P) rounds of pairwise flags: O(log P) depth, no shared line
};

// Which blocks of the P x P matrix a schedule visits (see schedule.hpp).
enum class schedule_kind : std::uint8_t {
  full = 0,         // every block: out-of-place alltoall and allgather
  swap = 1,         // each off-diagonal pair once, as (max, min): in-place alltoall
  offdiagonal = 2,  // every off-diagonal block: in-place allgather
};

// The element-wise operation of a reduction (reduce_kernels.hpp), with NumPy's semantics per
// element type: sum/prod wrap for integers, are logical or/and for bool; min/max propagate NaN.
enum class reduce_op : std::uint8_t {
  sum = 0,   // a + b (bool: a or b)
  prod = 1,  // a * b (bool: a and b)
  min = 2,   // smaller of a, b; NaN if either is NaN (numpy.minimum)
  max = 3,   // larger of a, b; NaN if either is NaN (numpy.maximum)
  land = 4,  // 1 if a and b are both nonzero, else 0, in the element type
  lor = 5,   // 1 if a or b is nonzero
  lxor = 6,  // 1 if exactly one of a, b is nonzero
  band = 7,  // bitwise and (integers and bool only)
  bor = 8,   // bitwise or
  bxor = 9,  // bitwise exclusive or
};

// The element types reductions combine (NumPy dtypes; longdouble has no portable layout).
enum class element_type : std::uint8_t {
  boolean = 0,
  int8 = 1,
  uint8 = 2,
  int16 = 3,
  uint16 = 4,
  int32 = 5,
  uint32 = 6,
  int64 = 7,
  uint64 = 8,
  float16 = 9,
  float32 = 10,
  float64 = 11,
  complex64 = 12,
  complex128 = 13,
};

// How the ranks of a node combine their buffers (reduction.hpp; HPDC'13 §2).
enum class reduce_algorithm : std::uint8_t {
  flat = 0,           // every rank folds every rank's buffer itself, in rank order: one barrier
                      // when the buffers fit the eager slots; P reads of m bytes per rank
  tree = 1,           // reduce up a tree that follows the hwloc hierarchy (each group's leader
                      // folds its members), then every rank copies the root's result
  dissemination = 2,  // recursive doubling in ceil(log2 P) rounds, each rank reading its
                      // partner; ranks beyond a power of two folded in first, copied out last
  tiled = 3,          // rank i folds tile i of every buffer (reduce-scatter), then every rank
                      // copies every tile (allgather): m/P + m bytes written per rank
};

// Algorithm code meaning "auto" (the cost model picks one).
inline constexpr int auto_algorithm = -1;

// The name of "let zcoll choose" for an order or a copy mode, and of the eager path where a
// tuning rule names it in place of an order.
inline constexpr std::string_view auto_name = "auto";
inline constexpr std::string_view eager_name = "eager";

// Order code meaning "auto" where orders travel as integers (block_order values otherwise).
inline constexpr int auto_order = -1;
// Order code of the eager path (not a public order: tuning rules and the tuner name it).
inline constexpr int eager_order = -2;
// Mode code meaning "auto" where copy modes travel as integers (copy_mode values otherwise).
inline constexpr int auto_copy = -1;

// The names of an enumeration, indexed by value. Specialised once per enum below.
template <class Enum>
struct registry;

template <>
struct registry<op_code> {
  static constexpr std::array<std::string_view, 19> names{"none",
                                                          "error",
                                                          "allocate",
                                                          "alltoall",
                                                          "allgather",
                                                          "barrier",
                                                          "transfer",
                                                          "plan",
                                                          "start",
                                                          "allreduce",
                                                          "reduce",
                                                          "reduce_scatter",
                                                          "bcast",
                                                          "alltoallv",
                                                          "allgatherv",
                                                          "neighbor_alltoall",
                                                          "neighbor_allgather",
                                                          "neighbor_alltoallv",
                                                          "neighbor_allgatherv"};
  // How error messages name a call of each operation ("rank 1 called an arena allocation").
  static constexpr std::array<std::string_view, 19> descriptions{"nothing",
                                                                 "an invalid call",
                                                                 "an arena allocation",
                                                                 "alltoall",
                                                                 "allgather",
                                                                 "barrier",
                                                                 "transfer",
                                                                 "a plan's creation",
                                                                 "a plan's run",
                                                                 "allreduce",
                                                                 "reduce",
                                                                 "reduce_scatter_block",
                                                                 "bcast",
                                                                 "alltoallv",
                                                                 "allgatherv",
                                                                 "neighbor_alltoall",
                                                                 "neighbor_allgather",
                                                                 "neighbor_alltoallv",
                                                                 "neighbor_allgatherv"};
};
template <>
struct registry<block_order> {
  static constexpr std::array<std::string_view, 5> names{"row", "column", "morton", "hilbert",
                                                         "numa"};
};
template <>
struct registry<copy_mode> {
  static constexpr std::array<std::string_view, 3> names{"temporal", "streaming", "hybrid"};
};
template <>
struct registry<copy_isa> {
  static constexpr std::array<std::string_view, 4> names{"portable", "sse2", "avx2", "avx512"};
};
template <>
struct registry<barrier_kind> {
  static constexpr std::array<std::string_view, 3> names{"flat", "central", "dissemination"};
};
template <>
struct registry<schedule_kind> {
  static constexpr std::array<std::string_view, 3> names{"full", "swap", "offdiagonal"};
};
template <>
struct registry<reduce_op> {
  static constexpr std::array<std::string_view, 10> names{"sum", "prod", "min",  "max", "land",
                                                          "lor", "lxor", "band", "bor", "bxor"};
};
template <>
struct registry<element_type> {
  static constexpr std::array<std::string_view, 14> names{
      "bool",  "int8",   "uint8",   "int16",   "uint16",  "int32",     "uint32",
      "int64", "uint64", "float16", "float32", "float64", "complex64", "complex128"};
};
template <>
struct registry<reduce_algorithm> {
  static constexpr std::array<std::string_view, 4> names{"flat", "tree", "dissemination", "tiled"};
};

// Number of values of `Enum`.
template <class Enum>
inline constexpr int count_of = static_cast<int>(registry<Enum>::names.size());

// The name of `value`.
template <class Enum>
constexpr std::string_view name_of(Enum value) noexcept {
  return registry<Enum>::names[static_cast<std::size_t>(value)];
}

// How error messages begin for a call of `op`: "zcoll.alltoallv: " (`suffix` "_init": of its
// persistent form).
inline std::string call_prefix(op_code op, std::string_view suffix = {}) {
  std::string text = "zcoll.";
  text.append(name_of(op)).append(suffix).append(": ");
  return text;
}

// The same with the name users call it by ("zcoll.reduce_scatter_block: "): the reductions'.
inline std::string public_call_prefix(op_code op) {
  std::string text = "zcoll.";
  text.append(registry<op_code>::descriptions[static_cast<std::size_t>(op)]).append(": ");
  return text;
}

// Whether `code` is a value of `Enum`.
template <class Enum>
constexpr bool is_code(int code) noexcept {
  return code >= 0 && code < count_of<Enum>;
}

// The value named `name`, or nullopt.
template <class Enum>
constexpr std::optional<Enum> parse_name(std::string_view name) noexcept {
  for (int i = 0; i < count_of<Enum>; ++i)
    if (registry<Enum>::names[static_cast<std::size_t>(i)] == name) return static_cast<Enum>(i);
  return std::nullopt;
}

// The names of `Enum` joined by `separator` ("row|column|...").
template <class Enum>
std::string joined_names(std::string_view separator) {
  std::string text;
  for (const std::string_view name : registry<Enum>::names)
    text.append(text.empty() ? "" : separator).append(name);
  return text;
}

// The collectives that tuning tables and online tuning know, each with its own rule table
// (tuned_index: 0, 1, ...), in this order.
inline constexpr std::array<op_code, 2> tuned_collectives{op_code::alltoall, op_code::allgather};
inline constexpr int no_rules = -1;

// The tuned collectives' names joined by `separator` ("alltoall|allgather").
inline std::string tuned_names(std::string_view separator) {
  std::string text;
  for (const op_code op : tuned_collectives)
    text.append(text.empty() ? "" : separator).append(name_of(op));
  return text;
}

// Index of `op`'s rule table, or no_rules.
constexpr int tuned_index(op_code op) noexcept {
  for (std::size_t i = 0; i < tuned_collectives.size(); ++i)
    if (tuned_collectives[i] == op) return static_cast<int>(i);
  return no_rules;
}

// Whether `op` is one of the reduction family (reduction.hpp): its calls carry a reduce_op, a
// reduce_algorithm and a root in their descriptors.
constexpr bool is_reduction(op_code op) noexcept {
  return op == op_code::allreduce || op == op_code::reduce || op == op_code::reduce_scatter ||
         op == op_code::bcast;
}

// Whether `op` is an irregular collective (vexchange.hpp): its calls carry the id of their
// communication pattern where others carry a block size.
constexpr bool is_irregular(op_code op) noexcept {
  return op == op_code::alltoallv || op == op_code::allgatherv ||
         op == op_code::neighbor_alltoall || op == op_code::neighbor_allgather ||
         op == op_code::neighbor_alltoallv || op == op_code::neighbor_allgatherv;
}

}  // namespace zcoll
