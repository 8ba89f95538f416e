/*
 * zcoll_replay: one collective's block copies, replayed rank after rank in one process, for
 * cache simulation (python -m zcoll.cachemiss runs it under valgrind) and for checking the
 * engine's schedule-to-copy mapping without MPI (--verify).
 *
 * Model (TPDS'18 §2.3, the ideal distributed-cache model: a private cache per process, misses
 * analysed per process): P send and P receive buffers laid out as in the arena (each rank's own
 * page-aligned partition, send then receive at the allocator's 64-byte alignment), first touched
 * in rank order. Then for each rank r: evict_caches() reads a buffer larger than every simulated
 * cache, so rank r starts with a cold private cache, as on its own core (§2.3 counts every line
 * a rank touches); with --warm own, warm_own_buffers() reads r's own send and receive buffers,
 * as the benchmark of TPDS'18 Fig. 9 does before every call; then zcoll_replay_segment() runs
 * r's segment through zcoll::copy_segment, the function the engine itself calls. Only
 * zcoll_replay_segment is measured (callgrind --toggle-collect, inclusive of the memcpy calls),
 * so setup, eviction and warm-up misses are excluded.
 *
 * What this leaves out, on purpose: barriers and descriptor reads (the paper's PAPI counts
 * include its MPI call's synchronisation), ranks running at the same time (a shared last-level
 * cache, coherence traffic), hardware prefetchers (see callgrind --simulate-hwpref).
 */
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "zcoll/arena.hpp"
#include "zcoll/copy.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/schedule.hpp"

namespace zcoll::detail {

namespace {

constexpr std::size_t page_bytes = 4096;
constexpr std::size_t line_bytes = 64;
constexpr std::size_t arena_alignment = partition_allocator::alignment;

struct replay_options {
  op_code op = op_code::alltoall;
  block_order order = block_order::row;
  int p = 0;
  std::size_t block = 0;
  bool in_place = false;
  bool warm_own = false;
  std::size_t evict_bytes = std::size_t{64} << 20;
  bool verify = false;
  // Rank r's buffers start r * skew bytes (mod a page) into its pages: the arena's colouring.
  std::size_t skew = zcoll::detail::partition_allocator::colour_stride;
  int skip_rank = -1;  // leave this rank's segment out (shows that --verify catches it)
};

struct free_deleter {
  void operator()(void* p) const noexcept { std::free(p); }
};
using buffer = std::unique_ptr<std::byte[], free_deleter>;

buffer page_aligned(std::size_t bytes) {
  const std::size_t n = round_up(std::max<std::size_t>(bytes, 1), page_bytes);
  void* p = std::aligned_alloc(page_bytes, n);
  if (p == nullptr) throw std::runtime_error("out of memory (" + std::to_string(n) + " bytes)");
  return buffer(static_cast<std::byte*>(p));
}

// The P ranks' buffers, one page-aligned partition each.
struct rank_buffers {
  buffer memory;
  std::vector<std::byte*> send, recv;  // send empty in place
  std::vector<int> comm_ranks;
  std::size_t send_bytes = 0, recv_bytes = 0;
};

rank_buffers allocate_buffers(const replay_options& o) {
  rank_buffers b;
  const auto p = static_cast<std::size_t>(o.p);
  b.send_bytes = o.in_place ? 0 : (o.op == op_code::alltoall ? p * o.block : o.block);
  b.recv_bytes = p * o.block;
  const std::size_t send_part = round_up(b.send_bytes, arena_alignment);
  const std::size_t partition =
      round_up(send_part + b.recv_bytes, page_bytes) + (o.skew ? page_bytes : 0);
  b.memory = page_aligned(partition * p);
  for (std::size_t r = 0; r < p; ++r) {
    std::byte* base = b.memory.get() + r * partition + r * o.skew % page_bytes;
    if (!o.in_place) b.send.push_back(base);
    b.recv.push_back(base + send_part);
    b.comm_ranks.push_back(static_cast<int>(r));
  }
  return b;
}

// Byte `k` of the block rank `src` sends to rank `dst` (allgather: dst = p, the same for all).
std::uint8_t pattern(std::size_t src, std::size_t dst, std::size_t k) noexcept {
  std::uint64_t x = (src + 1) * 0x9E3779B97F4A7C15ull ^ (dst + 1) * 0xC2B2AE3D27D4EB4Full ^
                    (k + 1) * 0x165667B19E3779F9ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<std::uint8_t>(x);
}

constexpr std::uint8_t unwritten = 0xA5;

void fill_block(std::byte* at, std::size_t src, std::size_t dst, std::size_t block) noexcept {
  for (std::size_t k = 0; k < block; ++k) at[k] = std::byte{pattern(src, dst, k)};
}

// What rank r holds before the call: its send blocks (or, in place, its receive buffer's
// blocks that hold the data), every other receive byte `unwritten`. Each rank touches only its
// own partition (first touch by the owner, as in the arena).
void first_touch(const replay_options& o, rank_buffers& b) {
  const auto p = static_cast<std::size_t>(o.p);
  for (std::size_t r = 0; r < p; ++r) {
    std::memset(b.recv[r], unwritten, b.recv_bytes);
    std::byte* data = o.in_place ? b.recv[r] : b.send[r];
    if (o.op == op_code::alltoall) {
      for (std::size_t d = 0; d < p; ++d) fill_block(data + d * o.block, r, d, o.block);
    } else {
      fill_block(data + (o.in_place ? r * o.block : 0), r, p, o.block);
    }
  }
}

// Reads one byte of each cache line of `bytes`; the sum keeps the reads.
std::uint64_t read_lines(const std::byte* at, std::size_t bytes) noexcept {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < bytes; i += line_bytes)
    sum += static_cast<std::uint8_t>(*static_cast<const volatile std::byte*>(at + i));
  return sum;
}

volatile std::uint64_t sink;

[[gnu::noinline]] void evict_caches(const std::byte* scratch, std::size_t bytes) noexcept {
  sink = sink + read_lines(scratch, bytes);
}

[[gnu::noinline]] void warm_own_buffers(const rank_buffers& b, std::size_t r) noexcept {
  if (!b.send.empty()) sink = sink + read_lines(b.send[r], b.send_bytes);
  sink = sink + read_lines(b.recv[r], b.recv_bytes);
}

// The mismatches of rank d's receive buffer after the call (printed up to a few).
std::size_t check_receive(const replay_options& o, const rank_buffers& b, std::size_t d,
                          std::size_t reported) {
  const auto p = static_cast<std::size_t>(o.p);
  std::size_t bad = 0;
  for (std::size_t s = 0; s < p; ++s) {
    const std::byte* got = b.recv[d] + s * o.block;
    const std::size_t key = o.op == op_code::alltoall ? d : p;
    for (std::size_t k = 0; k < o.block; ++k) {
      if (got[k] == std::byte{pattern(s, key, k)}) continue;
      if (reported + bad < 5)
        std::fprintf(stderr, "zcoll_replay: rank %zu's block from rank %zu differs at byte %zu\n",
                     d, s, k);
      ++bad;
      break;
    }
  }
  return bad;
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr,
               "zcoll_replay: %s\n"
               "usage: zcoll_replay --op %s --order %s|auto"
               " --p P --block BYTES [--in-place] [--warm none|own] [--evict-bytes BYTES]"
               " [--skew BYTES] [--verify [--skip-rank R]]\n",
               message.c_str(), tuned_names("|").c_str(), joined_names<block_order>("|").c_str());
  std::exit(2);
}

std::size_t parse_size(std::string_view flag, std::string_view text) {
  std::size_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    usage_error(std::string(flag) + " wants a non-negative integer, got '" + std::string(text) +
                "'");
  return v;
}

replay_options parse_arguments(int argc, char** argv) {
  replay_options o;
  std::string_view order = "row";
  bool have_op = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) usage_error(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "--op") {
      const std::string_view v = value();
      const auto op = parse_name<op_code>(v);
      if (!op || tuned_index(*op) == no_rules) usage_error("unknown --op '" + std::string(v) + "'");
      o.op = *op;
      have_op = true;
    } else if (a == "--order") {
      order = value();
    } else if (a == "--p") {
      o.p = static_cast<int>(std::min<std::size_t>(parse_size(a, value()), 1u << 20));
    } else if (a == "--block") {
      o.block = parse_size(a, value());
    } else if (a == "--in-place") {
      o.in_place = true;
    } else if (a == "--warm") {
      const std::string_view v = value();
      if (v != "own" && v != "none")
        usage_error("--warm is 'none' or 'own', not '" + std::string(v) + "'");
      o.warm_own = v == "own";
    } else if (a == "--evict-bytes") {
      o.evict_bytes = parse_size(a, value());
    } else if (a == "--skew") {
      o.skew = parse_size(a, value());
      if (o.skew % arena_alignment) usage_error("--skew must be a multiple of 64");
    } else if (a == "--verify") {
      o.verify = true;
    } else if (a == "--skip-rank") {
      o.skip_rank = static_cast<int>(std::min<std::size_t>(parse_size(a, value()), 1u << 20));
    } else {
      usage_error("unknown argument '" + std::string(a) + "'");
    }
  }
  if (!have_op) usage_error("--op is required");
  if (o.p < 1 || o.p > 4096) usage_error("--p must be in 1..4096");
  if (o.block < 1 || o.block > (std::size_t{1} << 30)) usage_error("--block must be in 1..2^30");
  if (order == auto_name)
    o.order = default_order(o.p, o.block);
  else if (const auto named = parse_name<block_order>(order))
    o.order = *named;
  else
    usage_error("unknown --order '" + std::string(order) + "'");
  return o;
}

}  // namespace

}  // namespace zcoll::detail

// The measured region: rank r's part of the collective. A C name, so that valgrind's
// --toggle-collect can name it exactly.
extern "C" [[gnu::noinline]] void zcoll_replay_segment(std::span<const zcoll::block_coord> segment,
                                                       zcoll::op_code op, bool in_place,
                                                       std::size_t block, std::byte* const* send,
                                                       std::byte* const* recv,
                                                       const int* comm_ranks) {
  zcoll::copy_segment(segment, op, in_place, block, send, recv, comm_ranks,
                      zcoll::copy_plan{zcoll::copy_mode::temporal, 0});
}

int main(int argc, char** argv) {
  using namespace zcoll;
  using namespace zcoll::detail;
  try {
    const replay_options o = parse_arguments(argc, argv);
    rank_buffers b = allocate_buffers(o);
    first_touch(o, b);
    const schedule sched = make_schedule(schedule_kind_of(o.op, o.in_place), o.p, o.order);
    const buffer scratch = page_aligned(o.evict_bytes);
    std::memset(scratch.get(), 0, o.evict_bytes);
    for (int r = 0; r < o.p; ++r) {
      evict_caches(scratch.get(), o.evict_bytes);
      if (o.warm_own) warm_own_buffers(b, static_cast<std::size_t>(r));
      if (r == o.skip_rank) continue;
      zcoll_replay_segment(sched.segment(r), o.op, o.in_place, o.block,
                           o.in_place ? nullptr : b.send.data(), b.recv.data(),
                           b.comm_ranks.data());
    }
    std::size_t bad = 0;
    if (o.verify)
      for (std::size_t d = 0; d < static_cast<std::size_t>(o.p); ++d)
        bad += check_receive(o, b, d, bad);
    std::printf("%.*s %.*s p=%d block=%zu in_place=%d blocks=%zu%s\n",
                static_cast<int>(name_of(o.op).size()), name_of(o.op).data(),
                static_cast<int>(name_of(o.order).size()), name_of(o.order).data(), o.p, o.block,
                o.in_place ? 1 : 0, sched.blocks.size(),
                !o.verify ? ""
                : bad     ? " verify=FAILED"
                          : " verify=ok");
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zcoll_replay: %s\n", e.what());
    return 3;
  }
}
