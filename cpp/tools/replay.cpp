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
 * so setup, eviction and warm-up misses are excluded. --order numa takes the ranks' NUMA nodes
 * from --numa (as ZCOLL_TOPOLOGY places them; without it, one domain: Morton).
 *
 * Neighbourhood collectives (--op neighbor_alltoall --grid AxB[xC]): the P = A*B[*C] ranks of a
 * periodic Cartesian grid (row-major ranks, as MPI_Cart_create without reordering), each with
 * the send and receive lists zcoll builds for such a communicator (_vcollectives.py: per
 * dimension the negative then the positive neighbour, tagged by the direction of travel),
 * matched into 4-tuples by zcoll::match_edges and ordered by zcoll::ordered_tuples, as the
 * engine (vexchange.hpp) does; every edge carries --block bytes. Rank r's send buffer holds its
 * outdegree blocks, its receive buffer its indegree blocks, in list order, laid out as above;
 * each rank's block tables (offsets and bytes, send then receive) take whole cache lines, as the
 * ranks' published metadata does in the engine. Rank r's piece is what the engine's
 * v_exchange::my_piece gives it: under row order (the naive baseline) its own receive blocks,
 * otherwise bytes zcoll::v_piece(total, P, r) of the ordered stream (a block may be split at a
 * cache-line cut); zcoll_replay_tuples() copies it through zcoll::copy_tuples, the engine's own
 * copy loop, which walks the ordered tuples (and their receive blocks' sizes) from the start of
 * the stream to the piece. Before it, after the eviction (and --warm own), warm_metadata()
 * reads every tuple's block sizes, as the engine does just before copying (it checks every
 * pair's counts and sums the stream): so the walk mostly hits, and what is counted is the
 * data's misses, plus the metadata the copies evict. --metadata cold leaves that out: each rank
 * then pays cold misses for every tuple up to the end of its piece (~(r + 1) / P of the tuples
 * and the ranks' tables), which at small blocks outweigh the data.
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
#include "zcoll/vexchange.hpp"

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
  int skip_rank = -1;          // leave this rank's segment out (shows that --verify catches it)
  std::vector<int> grid;       // neighbor_alltoall: the periodic Cartesian grid's dimensions
  bool cold_metadata = false;  // neighbor_alltoall: skip warm_metadata()
  std::vector<int> numa;       // --order numa: each rank's NUMA node (empty: one domain)
};

bool neighbourhood(const replay_options& o) noexcept {
  return o.op == op_code::neighbor_alltoall;
}

// The send and receive lists of a periodic Cartesian grid's ranks (row-major ranks), as
// python/zcoll/_vcollectives.py's _topology_lists builds them: per dimension the negative then
// the positive neighbour; the tag is the direction of travel (2d: positive, 2d + 1: negative).
struct topology_lists {
  std::vector<std::vector<v_edge>> sends, recvs;
};

topology_lists cartesian_lists(const std::vector<int>& dims) {
  int p = 1;
  for (int d : dims) p *= d;
  topology_lists l;
  l.sends.resize(static_cast<std::size_t>(p));
  l.recvs.resize(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    int stride = p;  // ranks between neighbours along dimension d (row-major: the last is 1)
    for (std::size_t d = 0; d < dims.size(); ++d) {
      stride /= dims[d];
      const int coord = r / stride % dims[d];
      const int below = r + ((coord + dims[d] - 1) % dims[d] - coord) * stride;
      const int above = r + ((coord + 1) % dims[d] - coord) * stride;
      const auto up = static_cast<std::int32_t>(2 * d), down = static_cast<std::int32_t>(2 * d + 1);
      auto& sends = l.sends[static_cast<std::size_t>(r)];
      auto& recvs = l.recvs[static_cast<std::size_t>(r)];
      sends.push_back({below, down});
      sends.push_back({above, up});
      recvs.push_back({below, up});
      recvs.push_back({above, down});
    }
  }
  return l;
}

// Per rank, its send blocks then its receive blocks (--block bytes each, in list order), each
// rank's table on its own cache lines; `sent[r]`, `received[r]` point at rank r's two halves.
struct block_tables {
  std::vector<v_span> storage;
  std::vector<const v_span*> sent, received;
};

block_tables make_tables(const topology_lists& l, std::size_t block) {
  const std::size_t p = l.sends.size();
  std::size_t stride = 0;
  for (std::size_t r = 0; r < p; ++r)
    stride = std::max(stride, l.sends[r].size() + l.recvs[r].size());
  stride = round_up(std::max<std::size_t>(stride, 1), line_bytes / sizeof(v_span));
  block_tables t;
  t.storage.resize(p * stride + line_bytes / sizeof(v_span));
  // The storage's first line boundary.
  const auto misalign = reinterpret_cast<std::uintptr_t>(t.storage.data()) % line_bytes;
  const std::size_t skip = misalign ? (line_bytes - misalign) / sizeof(v_span) : 0;
  for (std::size_t r = 0; r < p; ++r) {
    v_span* at = t.storage.data() + skip + r * stride;
    t.sent.push_back(at);
    for (std::size_t b = 0; b < l.sends[r].size(); ++b) *at++ = {b * block, block};
    t.received.push_back(at);
    for (std::size_t b = 0; b < l.recvs[r].size(); ++b) *at++ = {b * block, block};
  }
  return t;
}

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

// Neighbourhood collectives: `degree` blocks each way (every rank of a Cartesian grid has
// 2 * dimensions neighbours).
rank_buffers allocate_buffers(const replay_options& o, std::size_t degree = 0) {
  rank_buffers b;
  const auto p = static_cast<std::size_t>(o.p);
  b.send_bytes = o.in_place ? 0 : (o.op == op_code::alltoall ? p * o.block : o.block);
  b.recv_bytes = p * o.block;
  if (neighbourhood(o)) b.send_bytes = b.recv_bytes = degree * o.block;
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

// Byte `k` of the block rank `src` sends to rank `dst` (allgather: dst = p, the same for all;
// neighbourhood collectives: along the direction `tag`).
std::uint8_t pattern(std::size_t src, std::size_t dst, std::size_t k,
                     std::size_t tag = 0) noexcept {
  std::uint64_t x = (src + 1) * 0x9E3779B97F4A7C15ull ^ (dst + 1) * 0xC2B2AE3D27D4EB4Full ^
                    (k + 1) * 0x165667B19E3779F9ull ^ tag * 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<std::uint8_t>(x);
}

constexpr std::uint8_t unwritten = 0xA5;

void fill_block(std::byte* at, std::size_t src, std::size_t dst, std::size_t block,
                std::size_t tag = 0) noexcept {
  for (std::size_t k = 0; k < block; ++k) at[k] = std::byte{pattern(src, dst, k, tag)};
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

// Neighbourhood collectives: send block b of rank r goes to sends[r][b], along its tag.
void first_touch_lists(const replay_options& o, rank_buffers& b, const topology_lists& l) {
  for (std::size_t r = 0; r < static_cast<std::size_t>(o.p); ++r) {
    std::memset(b.recv[r], unwritten, b.recv_bytes);
    for (std::size_t k = 0; k < l.sends[r].size(); ++k) {
      const v_edge& e = l.sends[r][k];
      fill_block(b.send[r] + k * o.block, r, static_cast<std::size_t>(e.peer), o.block,
                 static_cast<std::size_t>(e.tag));
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

// What the engine reads of the call's metadata just before a rank copies its piece (every
// tuple's send and receive block: v_exchange::check_counts; the ordered tuples and their receive
// blocks: the stream's total; the tables of the ranks' buffers and blocks it then fills: both in
// v_exchange::execute), so that the copy loop's walk through the stream up to the piece finds
// them in cache as it does in the engine.
[[gnu::noinline]] void warm_metadata(std::span<const v_tuple> tuples, const v_span* const* sent,
                                     const v_span* const* received,
                                     const rank_buffers& b) noexcept {
  std::uint64_t sum = 0;
  for (const v_tuple& t : tuples)
    sum += sent[static_cast<std::size_t>(t.src)][t.send_block].bytes +
           received[static_cast<std::size_t>(t.dst)][t.recv_block].bytes;
  for (std::size_t j = 0; j < b.recv.size(); ++j)
    sum +=
        reinterpret_cast<std::uintptr_t>(b.send[j]) + reinterpret_cast<std::uintptr_t>(b.recv[j]);
  sink = sink + sum;
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

// The same for a neighbourhood collective: receive block b of rank d comes from recvs[d][b].
std::size_t check_receive_lists(const replay_options& o, const rank_buffers& b,
                                const topology_lists& l, std::size_t d, std::size_t reported) {
  std::size_t bad = 0;
  for (std::size_t j = 0; j < l.recvs[d].size(); ++j) {
    const v_edge& e = l.recvs[d][j];
    const std::byte* got = b.recv[d] + j * o.block;
    for (std::size_t k = 0; k < o.block; ++k) {
      if (got[k] == std::byte{pattern(static_cast<std::size_t>(e.peer), d, k,
                                      static_cast<std::size_t>(e.tag))})
        continue;
      if (reported + bad < 5)
        std::fprintf(stderr,
                     "zcoll_replay: rank %zu's block %zu (from rank %d) differs at byte %zu\n", d,
                     j, e.peer, k);
      ++bad;
      break;
    }
  }
  return bad;
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(
      stderr,
      "zcoll_replay: %s\n"
      "usage: zcoll_replay --op %s --order %s|auto"
      " --p P --block BYTES [--in-place] [--warm none|own] [--evict-bytes BYTES]"
      " [--skew BYTES] [--numa N0,N1,...] [--verify [--skip-rank R]]\n"
      "       zcoll_replay --op neighbor_alltoall --grid AxB[xC...] (periodic; P = A*B...)"
      " [--order ...] --block BYTES [--warm ...] [--metadata warm|cold] [--evict-bytes ...]"
      " [--skew ...]"
      " [--verify [--skip-rank R]]\n",
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

// "8x8", "4x4x4": the grid's dimensions, each at least 1.
std::vector<int> parse_grid(std::string_view text) {
  std::vector<int> dims;
  while (true) {
    const std::size_t x = text.find('x');
    const std::size_t d = parse_size("--grid", text.substr(0, x));
    if (d < 1 || d > 4096) usage_error("--grid dimensions must be in 1..4096");
    dims.push_back(static_cast<int>(d));
    if (x == std::string_view::npos) break;
    text.remove_prefix(x + 1);
  }
  return dims;
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
      if (!op || (tuned_index(*op) == no_rules && *op != op_code::neighbor_alltoall))
        usage_error("unknown --op '" + std::string(v) + "'");
      o.op = *op;
      have_op = true;
    } else if (a == "--order") {
      order = value();
    } else if (a == "--p") {
      o.p = static_cast<int>(std::min<std::size_t>(parse_size(a, value()), 1u << 20));
    } else if (a == "--grid") {
      o.grid = parse_grid(value());
    } else if (a == "--block") {
      o.block = parse_size(a, value());
    } else if (a == "--in-place") {
      o.in_place = true;
    } else if (a == "--warm") {
      const std::string_view v = value();
      if (v != "own" && v != "none")
        usage_error("--warm is 'none' or 'own', not '" + std::string(v) + "'");
      o.warm_own = v == "own";
    } else if (a == "--metadata") {
      const std::string_view v = value();
      if (v != "warm" && v != "cold")
        usage_error("--metadata is 'warm' or 'cold', not '" + std::string(v) + "'");
      o.cold_metadata = v == "cold";
    } else if (a == "--numa") {
      std::string_view v = value();
      o.numa.clear();
      while (true) {
        const std::size_t comma = v.find(',');
        o.numa.push_back(static_cast<int>(
            std::min<std::size_t>(parse_size("--numa", v.substr(0, comma)), 1u << 20)));
        if (comma == std::string_view::npos) break;
        v.remove_prefix(comma + 1);
      }
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
  if (neighbourhood(o)) {
    if (o.grid.empty()) usage_error("--op neighbor_alltoall needs --grid");
    if (o.in_place) usage_error("neighbourhood collectives have no --in-place form");
    std::size_t p = 1;
    for (int d : o.grid) p *= static_cast<std::size_t>(d);
    if (p > 4096) usage_error("--grid must have at most 4096 ranks");
    if (o.p != 0 && static_cast<std::size_t>(o.p) != p)
      usage_error("--p differs from the grid's number of ranks");
    o.p = static_cast<int>(p);
  } else if (!o.grid.empty() || o.cold_metadata) {
    usage_error(std::string(o.grid.empty() ? "--metadata" : "--grid") +
                " goes with --op neighbor_alltoall only");
  }
  if (o.p < 1 || o.p > 4096) usage_error("--p must be in 1..4096");
  if (!o.numa.empty() && (neighbourhood(o) || o.numa.size() != static_cast<std::size_t>(o.p)))
    usage_error("--numa gives the NUMA node of each of the --p ranks (not with --grid)");
  if (o.block < 1 || o.block > (std::size_t{1} << 30)) usage_error("--block must be in 1..2^30");
  if (order == auto_name)  // the irregular engine's default ignores the block size
    o.order = default_order(o.p, neighbourhood(o) ? 0 : o.block, numa_domain_count(o.p, o.numa));
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

// The measured region of a neighbourhood collective: bytes [first, last) of the ordered
// tuples' stream, through the engine's copy loop.
extern "C" [[gnu::noinline]] void zcoll_replay_tuples(std::span<const zcoll::v_tuple> tuples,
                                                      const zcoll::v_span* const* sent,
                                                      const zcoll::v_span* const* received,
                                                      std::byte* const* send,
                                                      std::byte* const* recv, std::uint64_t first,
                                                      std::uint64_t last) {
  zcoll::copy_tuples(tuples, sent, received, send, recv, first, last, false,
                     zcoll::copy_plan{zcoll::copy_mode::temporal, 0});
}

namespace zcoll::detail {
namespace {

std::string grid_text(const std::vector<int>& dims) {
  std::string s;
  for (int d : dims) {
    if (!s.empty()) s.push_back('x');
    s.append(std::to_string(d));
  }
  return s;
}

int replay_neighbourhood(const replay_options& o) {
  const topology_lists lists = cartesian_lists(o.grid);
  std::vector<int> ranks(static_cast<std::size_t>(o.p));
  for (int r = 0; r < o.p; ++r) ranks[static_cast<std::size_t>(r)] = r;
  const v_pattern pat = match_edges(lists.sends, lists.recvs, ranks);
  const std::vector<v_tuple> tuples = ordered_tuples(pat, o.p, o.order, v_in_place::none);
  rank_buffers b = allocate_buffers(o, 2 * o.grid.size());
  first_touch_lists(o, b, lists);
  const block_tables tables = make_tables(lists, o.block);
  std::uint64_t total = 0;
  for (const v_tuple& t : tuples)
    total += tables.received[static_cast<std::size_t>(t.dst)][t.recv_block].bytes;
  const buffer scratch = page_aligned(o.evict_bytes);
  std::memset(scratch.get(), 0, o.evict_bytes);
  for (int r = 0; r < o.p; ++r) {
    // v_exchange::my_piece: row order (the naive baseline) copies the rank's own receive
    // blocks (one run of the stream, sorted by receiver), the other orders an equal share.
    std::pair<std::uint64_t, std::uint64_t> piece = v_piece(total, o.p, r);
    if (o.order == block_order::row) {
      piece = {0, 0};
      for (const v_tuple& t : tuples) {
        const std::uint64_t bytes =
            tables.received[static_cast<std::size_t>(t.dst)][t.recv_block].bytes;
        if (t.dst < r) piece.first += bytes;
        if (t.dst <= r) piece.second += bytes;
      }
    }
    evict_caches(scratch.get(), o.evict_bytes);
    if (o.warm_own) warm_own_buffers(b, static_cast<std::size_t>(r));
    if (!o.cold_metadata) warm_metadata(tuples, tables.sent.data(), tables.received.data(), b);
    if (r == o.skip_rank) continue;
    zcoll_replay_tuples(tuples, tables.sent.data(), tables.received.data(), b.send.data(),
                        b.recv.data(), piece.first, piece.second);
  }
  std::size_t bad = 0;
  if (o.verify)
    for (std::size_t d = 0; d < static_cast<std::size_t>(o.p); ++d)
      bad += check_receive_lists(o, b, lists, d, bad);
  std::printf("%.*s %.*s grid=%s p=%d block=%zu tuples=%zu%s\n",
              static_cast<int>(name_of(o.op).size()), name_of(o.op).data(),
              static_cast<int>(name_of(o.order).size()), name_of(o.order).data(),
              grid_text(o.grid).c_str(), o.p, o.block, tuples.size(),
              !o.verify ? ""
              : bad     ? " verify=FAILED"
                        : " verify=ok");
  return bad ? 1 : 0;
}

}  // namespace
}  // namespace zcoll::detail

int main(int argc, char** argv) {
  using namespace zcoll;
  using namespace zcoll::detail;
  try {
    const replay_options o = parse_arguments(argc, argv);
    if (neighbourhood(o)) return replay_neighbourhood(o);
    rank_buffers b = allocate_buffers(o);
    first_touch(o, b);
    const schedule sched =
        make_schedule({schedule_kind_of(o.op, o.in_place), o.p, o.order, o.numa});
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
