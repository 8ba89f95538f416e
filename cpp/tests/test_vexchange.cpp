// Irregular exchanges (vexchange.hpp): the 4-tuple patterns, their order and the byte-balanced
// pieces as properties written out here, the CMA path's split between pulls and pushes, then
// alltoallv-shaped calls on forked ranks of a node (private and arena buffers, the eager and the
// two-barrier path, in place, a call that moves nothing followed by calls that do) and a graph
// whose sources repeat, pulled by CMA, against values computed here from the counts' formulas.
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include "test_util.hpp"
#include "zcoll/error.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/vexchange.hpp"

using namespace zcoll;

namespace {

std::vector<v_edge> everyone(int p) {
  std::vector<v_edge> list;
  for (int c = 0; c < p; ++c) list.push_back({c, 0});
  return list;
}

v_pattern dense(int n, int p, const std::vector<int>& ranks) {
  std::vector<std::vector<v_edge>> lists(static_cast<std::size_t>(n), everyone(p));
  return match_edges(lists, lists, ranks);
}

using tuple4 = std::tuple<int, int, unsigned, unsigned>;

std::multiset<tuple4> as_set(const std::vector<v_tuple>& ts) {
  std::multiset<tuple4> s;
  for (const auto& t : ts) s.insert({t.src, t.dst, t.send_block, t.recv_block});
  return s;
}

}  // namespace

TEST_CASE("vexchange: the dense pattern has every node pair exactly once") {
  for (int p = 1; p <= 9; ++p) {
    std::vector<int> ranks;  // the node holds the odd communicator ranks
    for (int c = 1; c < p; c += 2) ranks.push_back(c);
    const int n = static_cast<int>(ranks.size());
    const v_pattern pat = dense(n, p, ranks);
    std::multiset<tuple4> want;
    for (int s = 0; s < n; ++s)
      for (int d = 0; d < n; ++d)
        want.insert({s, d, static_cast<unsigned>(ranks[static_cast<std::size_t>(d)]),
                     static_cast<unsigned>(ranks[static_cast<std::size_t>(s)])});
    CHECK(as_set(pat.tuples) == want);
    for (int j = 0; j < n; ++j) {
      CHECK(pat.send_blocks[static_cast<std::size_t>(j)] == static_cast<unsigned>(p));
      CHECK(pat.recv_blocks[static_cast<std::size_t>(j)] == static_cast<unsigned>(p));
    }
  }
}

TEST_CASE("vexchange: repeated edges match in order, tags keep directions apart") {
  // Rank 0 sends to 1 twice (blocks 0, 2) and to PROC_NULL (block 1); rank 1 lists 0 twice.
  std::vector<std::vector<v_edge>> sends{{{1, 0}, {-1, 0}, {1, 0}}, {}};
  std::vector<std::vector<v_edge>> recvs{{}, {{0, 0}, {0, 0}}};
  const v_pattern g = match_edges(sends, recvs, std::vector<int>{0, 1});
  CHECK(as_set(g.tuples) == std::multiset<tuple4>{{0, 1, 0, 0}, {0, 1, 2, 1}});
  // A periodic dimension of 2 ranks: both neighbours are the other rank. The block sent toward
  // the positive side (slot 1, tag 0) lands in the negative slot (0) of the receiver.
  std::vector<std::vector<v_edge>> cs{{{1, 1}, {1, 0}}, {{0, 1}, {0, 0}}};
  std::vector<std::vector<v_edge>> cr{{{1, 0}, {1, 1}}, {{0, 0}, {0, 1}}};
  const v_pattern cart = match_edges(cs, cr, std::vector<int>{0, 1});
  CHECK(as_set(cart.tuples) ==
        std::multiset<tuple4>{{0, 1, 1, 0}, {0, 1, 0, 1}, {1, 0, 1, 0}, {1, 0, 0, 1}});
  // Lists that do not describe one topology.
  std::vector<std::vector<v_edge>> lonely{{{1, 0}}, {}};
  std::vector<std::vector<v_edge>> none{{}, {}};
  CHECK_THROWS_AS(match_edges(lonely, none, std::vector<int>{0, 1}), usage_error);
  CHECK_THROWS_AS(match_edges(none, lonely, std::vector<int>{0, 1}), usage_error);
  // Peers off the node make no tuple but keep their slot.
  std::vector<std::vector<v_edge>> far{{{5, 0}, {0, 0}}};
  const v_pattern off = match_edges(far, far, std::vector<int>{0});
  CHECK(as_set(off.tuples) == std::multiset<tuple4>{{0, 0, 1, 1}});
}

TEST_CASE("vexchange: ordered tuples are the pattern along the curve") {
  for (int n : {1, 2, 3, 5, 8}) {
    std::vector<int> ranks;
    for (int c = 0; c < n; ++c) ranks.push_back(c);
    const v_pattern pat = dense(n, n, ranks);
    for (block_order order :
         {block_order::row, block_order::column, block_order::morton, block_order::hilbert}) {
      const auto all = ordered_tuples(pat, n, order, v_in_place::none);
      CHECK(as_set(all) == as_set(pat.tuples));
      const auto gather = ordered_tuples(pat, n, order, v_in_place::gather);
      CHECK(gather.size() == static_cast<std::size_t>(n * (n - 1)));
      for (const auto& t : gather) CHECK(t.src != t.dst);
      const auto swap = ordered_tuples(pat, n, order, v_in_place::swap);
      CHECK(swap.size() == static_cast<std::size_t>(n * (n - 1) / 2));
      for (const auto& t : swap) CHECK(t.src < t.dst);
    }
    // row: receiver-major; column: sender-major (written out, not through the curve).
    auto row = pat.tuples;
    std::sort(row.begin(), row.end(), [](const v_tuple& a, const v_tuple& b) {
      return std::tie(a.dst, a.src) < std::tie(b.dst, b.src);
    });
    CHECK(ordered_tuples(pat, n, block_order::row, v_in_place::none) == row);
    auto column = pat.tuples;
    std::sort(column.begin(), column.end(), [](const v_tuple& a, const v_tuple& b) {
      return std::tie(a.src, a.dst) < std::tie(b.src, b.dst);
    });
    CHECK(ordered_tuples(pat, n, block_order::column, v_in_place::none) == column);
    // numa runs as Morton in the irregular engine (vexchange.hpp).
    for (v_in_place in : {v_in_place::none, v_in_place::gather, v_in_place::swap})
      CHECK(ordered_tuples(pat, n, block_order::numa, in) ==
            ordered_tuples(pat, n, block_order::morton, in));
  }
}

TEST_CASE("vexchange: pieces cover the stream once, balanced, on cache-line cuts") {
  for (std::uint64_t total : {0ull, 1ull, 63ull, 64ull, 1000ull, 4097ull, 1ull << 20, 123456789ull})
    for (int parts : {1, 2, 3, 5, 8, 64}) {
      std::uint64_t at = 0;
      for (int r = 0; r < parts; ++r) {
        const auto [first, last] = v_piece(total, parts, r);
        CHECK(first == at);
        CHECK(last >= first);
        if (last != total) CHECK(last % 64 == 0);
        CHECK(last - first <= total / static_cast<std::uint64_t>(parts) + 64);
        at = last;
      }
      CHECK(at == total);
    }
}

namespace {

// Every pair of n ranks, (src, dst) in row order; the block indices do not matter to the split.
std::vector<v_tuple> all_pairs(int n) {
  std::vector<v_tuple> tuples;
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d)
      tuples.push_back({s, d, static_cast<std::uint32_t>(d), static_cast<std::uint32_t>(s)});
  return tuples;
}

// split_pulls on tuples of these bytes, as execute calls it: their stream's starts and every
// receiver's bytes, summed here.
void split(const std::vector<v_tuple>& tuples, const std::vector<std::uint64_t>& bytes, int n,
           std::uint64_t min_push, std::vector<std::uint64_t>& pushed,
           std::vector<std::uint64_t>& load) {
  std::vector<std::uint64_t> starts{0};
  load.assign(static_cast<std::size_t>(n), 0);
  for (std::size_t i = 0; i < tuples.size(); ++i) {
    starts.push_back(starts.back() + bytes[i]);
    load[static_cast<std::size_t>(tuples[i].dst)] += bytes[i];
  }
  std::vector<bool> busy;
  split_pulls(tuples, starts, min_push, pushed, load, busy);
}

}  // namespace

TEST_CASE("vexchange: split_pulls moves one busy receiver's tail to its idle sender") {
  // The bench's 1 MiB alltoallv at P = 2: rank 0 receives 1215551 B from itself and 805804 B
  // from rank 1, rank 1 nothing.
  const auto tuples = all_pairs(2);
  const std::vector<std::uint64_t> bytes{1215551, 0, 805804, 0};
  std::vector<std::uint64_t> pushed, load;
  split(tuples, bytes, 2, 16 << 10, pushed, load);
  CHECK(pushed == std::vector<std::uint64_t>{0, 0, 805804, 0});
  CHECK(load == std::vector<std::uint64_t>{1215551, 805804});
  split(tuples, bytes, 2, 1 << 20, pushed, load);  // smaller than the smallest push
  CHECK(pushed == std::vector<std::uint64_t>(4, 0));
  CHECK(load == std::vector<std::uint64_t>{2021355, 0});
  // Its 64 KiB counts: rank 1 receives 1.47 times the mean, mostly its own block: not busy.
  const std::vector<std::uint64_t> milder{0, 61882, 52385, 85402};
  split(tuples, milder, 2, 16 << 10, pushed, load);
  CHECK(pushed == std::vector<std::uint64_t>(4, 0));
  CHECK(load == std::vector<std::uint64_t>{52385, 147284});
}

TEST_CASE("vexchange: split_pulls evens the loads within the blocks and past the smallest push") {
  for (int n : {1, 2, 3, 5, 8})
    for (std::uint64_t min_push : {std::uint64_t{0}, std::uint64_t{16} << 10})
      for (unsigned seed = 1; seed <= 20; ++seed) {
        const auto tuples = all_pairs(n);
        std::vector<std::uint64_t> bytes;
        std::uint64_t x = seed * 2654435761u;
        for (std::size_t i = 0; i < tuples.size(); ++i) {  // skewed: some receivers get most
          x = x * 6364136223846793005ull + 1442695040888963407ull;
          const int dst = tuples[i].dst;
          bytes.push_back((x >> 40) % (dst == static_cast<int>(seed) % n ? 400000 : 20000));
        }
        std::vector<std::uint64_t> pushed, load;
        split(tuples, bytes, n, min_push, pushed, load);
        std::vector<std::uint64_t> before(static_cast<std::size_t>(n)), after(before);
        std::uint64_t total = 0;
        for (std::size_t i = 0; i < tuples.size(); ++i) {
          const auto s = static_cast<std::size_t>(tuples[i].src);
          const auto d = static_cast<std::size_t>(tuples[i].dst);
          REQUIRE(pushed[i] <= bytes[i]);
          if (s == d) CHECK(pushed[i] == 0);
          if (pushed[i]) CHECK(pushed[i] >= min_push);
          before[d] += bytes[i];
          after[d] += bytes[i] - pushed[i];
          after[s] += pushed[i];
          total += bytes[i];
        }
        CHECK(load == after);
        const std::uint64_t mean = (total + static_cast<std::uint64_t>(n) - 1) / n;
        CHECK(*std::max_element(after.begin(), after.end()) <=
              *std::max_element(before.begin(), before.end()));
        for (std::size_t r = 0; r < after.size(); ++r) {
          if (after[r] > before[r]) CHECK(after[r] <= mean);  // a pusher stays below the mean
          if (after[r] < before[r]) {  // a relieved receiver was busy and stays above the mean
            CHECK(before[r] * static_cast<std::uint64_t>(n) >= cma_push_load_factor * total);
            CHECK(after[r] >= mean);
          }
        }
        if (min_push == 0 && n > 1 && total > 0) {  // something is pushed where it can be
          const bool uneven =
              *std::max_element(before.begin(), before.end()) * static_cast<std::uint64_t>(n) >=
              cma_push_load_factor * total;
          if (uneven)
            CHECK(*std::max_element(after.begin(), after.end()) <
                  *std::max_element(before.begin(), before.end()));
        }
      }
}

namespace {

constexpr int max_ranks = 8;

struct shared_state {
  std::atomic<int> go;
  std::int32_t pids[max_ranks];
};

// Elements rank s sends rank d in call `k` (0 for every pair in call 0: a call that moves
// nothing); `scale` makes them large enough for the two-barrier path.
std::int64_t count(int s, int d, int k, int scale) {
  return k == 0 ? 0 : ((s * 7 + d * 3 + k) % 5) * scale;
}

double value(int s, int d, std::int64_t i, int k) {
  return s * 1e6 + d * 1e4 + static_cast<double>(i) + k * 0.5;
}

array_view view_of(const void* data, std::size_t n, std::int64_t* shape) {
  array_view v;
  v.data = data;
  v.size = n;
  v.nbytes = n * 8;
  v.ndim = 1;
  shape[0] = static_cast<std::int64_t>(n);
  v.first_dim = n;
  v.shape = shape;
  v.dtype = {'d', 8};
  return v;
}

// A call of `op` on pattern `pid` from `send`'s blocks into `recv`'s by these lists (all of
// which must outlive it).
v_call lists_call(op_code op, int pid, const array_view& send, const array_view& recv,
                  std::span<const std::int64_t> sc, std::span<const std::int64_t> sd,
                  std::span<const std::int64_t> rc, std::span<const std::int64_t> rd) {
  v_call c;
  c.op = op;
  c.pattern = pid;
  c.send = &send;
  c.recv = &recv;
  c.send_counts = sc;
  c.send_displs = sd;
  c.recv_counts = rc;
  c.recv_displs = rd;
  return c;
}

// Calls 0..5 of an alltoallv on every rank, private or arena buffers, `scale` elements per
// count unit, receive blocks in reverse rank order with one-element holes; then one in place.
int alltoallv_body(int r, node_context& ctx, bool arena, int scale) {
  const int p = ctx.config().size;
  std::vector<v_edge> list = everyone(p);
  std::vector<std::vector<v_edge>> lists(static_cast<std::size_t>(p), list);
  const int pid = ctx.irregular().add_pattern(match_edges(lists, lists, ctx.config().comm_ranks),
                                              v_exchange::dense_role);
  int failures = 0;
  for (int k = 0; k < 6; ++k) {
    std::vector<std::int64_t> sc(p), sd(p), rc(p), rd(p);
    std::int64_t s_total = 0, r_total = 0;
    for (int d = 0; d < p; ++d) sd[d] = s_total, sc[d] = count(r, d, k, scale), s_total += sc[d];
    for (int s = p - 1; s >= 0; --s)
      rd[s] = r_total, rc[s] = count(s, r, k, scale), r_total += rc[s] + 1;
    const auto s_len = static_cast<std::size_t>(s_total) + 1,
               r_len = static_cast<std::size_t>(r_total) + 1;
    std::vector<double> own_send(s_len), own_recv(r_len);
    std::shared_ptr<arena_block> sa, ra;
    double* send = own_send.data();
    double* recv = own_recv.data();
    if (arena) {
      sa = ctx.allocate(s_len * 8);
      ra = ctx.allocate(r_len * 8);
      send = reinterpret_cast<double*>(sa->data());
      recv = reinterpret_cast<double*>(ra->data());
    }
    for (int d = 0; d < p; ++d)
      for (std::int64_t i = 0; i < sc[d]; ++i) send[sd[d] + i] = value(r, d, i, k);
    std::fill(recv, recv + r_len, -1.0);
    std::int64_t s1[1], s2[1];
    const array_view sv = view_of(send, s_len, s1), rv = view_of(recv, r_len, s2);
    v_call c = lists_call(op_code::alltoallv, pid, sv, rv, sc, sd, rc, rd);
    c.order = k % 3 == 0   ? static_cast<int>(block_order::morton)
              : k % 3 == 1 ? auto_order
                           : static_cast<int>(block_order::row);
    ctx.irregular().run(c);
    std::vector<bool> covered(r_len);
    for (int s = 0; s < p; ++s)
      for (std::int64_t i = 0; i < rc[s]; ++i) {
        failures += recv[rd[s] + i] != value(s, r, i, k);
        covered[static_cast<std::size_t>(rd[s] + i)] = true;
      }
    for (std::size_t i = 0; i < r_len; ++i) failures += !covered[i] && recv[i] != -1.0;
  }
  // In place: a symmetric count so that the pairs can swap.
  std::vector<std::int64_t> rc(p), rd(p);
  std::int64_t total = 0;
  for (int s = 0; s < p; ++s) rd[s] = total, rc[s] = ((r + s) % 3) * scale, total += rc[s];
  std::vector<double> buf(static_cast<std::size_t>(total) + 1);
  for (int d = 0; d < p; ++d)
    for (std::int64_t i = 0; i < rc[d]; ++i)
      buf[static_cast<std::size_t>(rd[d] + i)] = value(r, d, i, 9);
  std::int64_t s2[1];
  const array_view rv = view_of(buf.data(), buf.size(), s2);
  v_call c;
  c.op = op_code::alltoallv;
  c.pattern = pid;
  c.recv = &rv;
  c.in_place = v_in_place::swap;
  c.recv_counts = rc;
  c.recv_displs = rd;
  ctx.irregular().run(c);
  for (int s = 0; s < p; ++s)
    for (std::int64_t i = 0; i < rc[s]; ++i)
      failures += buf[static_cast<std::size_t>(rd[s] + i)] != value(s, r, i, 9);
  return failures ? 1 : 0;
}

// Counts that disagree on one rank: every rank raises, and the next call works.
int mismatch_body(int r, node_context& ctx) {
  const int p = ctx.config().size;
  std::vector<std::vector<v_edge>> lists(static_cast<std::size_t>(p), everyone(p));
  const int pid = ctx.irregular().add_pattern(match_edges(lists, lists, ctx.config().comm_ranks),
                                              v_exchange::no_role);
  std::vector<double> send(static_cast<std::size_t>(2 * p), 1.0),
      recv(static_cast<std::size_t>(2 * p));
  std::vector<std::int64_t> counts(p, 1), displs(p);
  for (int j = 0; j < p; ++j) displs[j] = j;
  std::vector<std::int64_t> bad = counts;
  if (r == p - 1) bad[0] = 2;  // sends 2 to rank 0, which expects 1
  std::int64_t s1[1], s2[1];
  const array_view sv = view_of(send.data(), send.size(), s1),
                   rv = view_of(recv.data(), recv.size(), s2);
  v_call c = lists_call(op_code::alltoallv, pid, sv, rv, bad, displs, counts, displs);
  int failures = 0;
  try {
    ctx.irregular().run(c);
    failures += p > 1;
  } catch (const usage_error& e) {
    failures += std::string(e.what()).find("counts differ") == std::string::npos;
  }
  c.send_counts = counts;
  ctx.irregular().run(c);
  for (int j = 0; j < p; ++j) failures += recv[static_cast<std::size_t>(j)] != 1.0;
  return failures ? 1 : 0;
}

// Rank 0 sends rank 1 three pages (the only bytes that move), pulled by CMA: rank 0, idle,
// pushes the tail, whose last page rank 1 made read-only, so the push fails while rank 1's own
// pull succeeds. Every rank must raise, rank 1 although its own copies worked, and the next
// call must work. Returns 0 when they do (or when the kernel refuses CMA here, so nothing is
// pulled or pushed).
int failed_push_body(int r, node_context& ctx) {
  std::vector<std::vector<v_edge>> lists(2, everyone(2));
  const int pid = ctx.irregular().add_pattern(match_edges(lists, lists, ctx.config().comm_ranks),
                                              v_exchange::no_role);
  ctx.policy().set_cma_bytes(0);
  ctx.policy().set_cma_push_bytes(0);
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)), n = 3 * page / 8;
  void* mapped =
      ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return 3;
  auto* recv = static_cast<double*>(mapped);
  std::vector<double> send(n + 1, 2.0);
  if (r == 1 && ::mprotect(static_cast<std::byte*>(mapped) + 2 * page, page, PROT_READ) != 0)
    return 3;
  std::vector<std::int64_t> none(2, 0), to_one{0, static_cast<std::int64_t>(n)};
  std::vector<std::int64_t> from_zero{static_cast<std::int64_t>(n), 0}, zeros(2, 0);
  std::int64_t s1[1], s2[1];
  const array_view sv = view_of(send.data(), send.size(), s1), rv = view_of(recv, n, s2);
  v_call c = lists_call(op_code::alltoallv, pid, sv, rv,
                        std::span<const std::int64_t>(r == 0 ? to_one : none), zeros,
                        std::span<const std::int64_t>(r == 1 ? from_zero : none), zeros);
  int code = 1;  // no error: rank 1 would keep a result with a missing tail
  try {
    ctx.irregular().run(c);
    if (ctx.cma().current() != cross_memory::state::works) code = 0;
  } catch (const std::system_error& e) {
    code = std::string(e.what()).find("process_vm_writev to") == std::string::npos ? 2 : 0;
  }
  // The next call works: one element into the writable head.
  std::vector<std::int64_t> one_to_one{0, 1}, one_from_zero{1, 0};
  c.send_counts = r == 0 ? one_to_one : none;
  c.recv_counts = r == 1 ? one_from_zero : none;
  recv[0] = -1.0;
  ctx.irregular().run(c);
  if (r == 1 && recv[0] != 2.0) code = 4;
  ::munmap(mapped, 3 * page);
  return code;
}

// A graph in which every rank lists every other rank twice, as a send and as a receive, pulled
// by CMA (pushes on) from private buffers: rank s's send buffer holds repeated_value(s, i) at
// element i, and its block to d in repetition k starts at repeated_offset and holds
// repeated_count elements -- per `mode` the same bytes twice (neighbor_allgather's repeated
// source), a prefix of the other block's bytes (each pair in the other order), or the two
// halves apart. Each receiver checks its blocks, holes included, against those formulas.
double repeated_value(int s, std::int64_t i) {
  return s * 1e6 + static_cast<double>(i);
}
std::int64_t repeated_length(int s, int scale) {
  return (4 + s) * scale;
}
std::int64_t repeated_count(int s, int d, int k, int mode, int scale) {
  const std::int64_t all = repeated_length(s, scale);
  if (mode == 0) return all;
  if (mode == 1) return k == (s + d) % 2 ? all : all / 3;
  return all / 2;
}
std::int64_t repeated_offset(int s, int k, int mode, int scale) {
  return mode == 2 ? k * (repeated_length(s, scale) / 2) : 0;
}

int repeated_sources_body(int r, node_context& ctx, int mode, int scale) {
  const int p = ctx.config().size;
  std::vector<int> others;
  for (int j = 0; j < p; ++j)
    if (j != r) others.push_back(j);
  std::vector<std::vector<v_edge>> lists(static_cast<std::size_t>(p));
  for (int j = 0; j < p; ++j)
    for (int k = 0; k < 2; ++k)
      for (int c = 0; c < p; ++c)
        if (c != j) lists[static_cast<std::size_t>(j)].push_back({c, 0});
  const int pid = ctx.irregular().add_pattern(match_edges(lists, lists, ctx.config().comm_ranks),
                                              v_exchange::no_role);
  ctx.policy().set_cma_bytes(0);
  ctx.policy().set_cma_push_bytes(0);
  const auto blocks = 2 * others.size();
  std::vector<std::int64_t> sc(blocks), sd(blocks), rc(blocks), rd(blocks);
  std::int64_t r_total = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    const int k = static_cast<int>(b / others.size()), peer = others[b % others.size()];
    sc[b] = repeated_count(r, peer, k, mode, scale);
    sd[b] = repeated_offset(r, k, mode, scale);
    rc[b] = repeated_count(peer, r, k, mode, scale);
    rd[b] = r_total;
    r_total += rc[b] + 1;
  }
  std::vector<double> send(static_cast<std::size_t>(repeated_length(r, scale)));
  for (std::size_t i = 0; i < send.size(); ++i)
    send[i] = repeated_value(r, static_cast<std::int64_t>(i));
  std::vector<double> recv(static_cast<std::size_t>(r_total), -1.0);
  std::int64_t s1[1], s2[1];
  const array_view sv = view_of(send.data(), send.size(), s1),
                   rv = view_of(recv.data(), recv.size(), s2);
  v_call c = lists_call(op_code::neighbor_alltoallv, pid, sv, rv, sc, sd, rc, rd);
  ctx.irregular().run(c);
  int failures = 0;
  std::vector<bool> covered(recv.size());
  for (std::size_t b = 0; b < blocks; ++b) {
    const int k = static_cast<int>(b / others.size()), peer = others[b % others.size()];
    const std::int64_t from = repeated_offset(peer, k, mode, scale);
    for (std::int64_t i = 0; i < rc[b]; ++i) {
      failures += recv[static_cast<std::size_t>(rd[b] + i)] != repeated_value(peer, from + i);
      covered[static_cast<std::size_t>(rd[b] + i)] = true;
    }
  }
  for (std::size_t i = 0; i < recv.size(); ++i) failures += !covered[i] && recv[i] != -1.0;
  return failures ? 1 : 0;
}

template <class Body>
std::vector<int> run_node(int n, Body body) {
  auto* state = static_cast<shared_state*>(::mmap(
      nullptr, sizeof(shared_state), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(state != MAP_FAILED);
  new (state) shared_state{};
  auto control = shm_segment::create(node_context::control_bytes(n));
  control->unlink();
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r)
    kids.push_back(zcoll_test::fork_child([&, r] {
      while (state->go.load() == 0) ::usleep(100);
      context_config c;
      c.rank = r;
      c.size = n;
      c.comm_size = n;
      for (int j = 0; j < n; ++j) {
        c.comm_ranks.push_back(j);
        c.pids.push_back(state->pids[j]);
      }
      c.barrier = barrier_kind::central;
      c.wait.timeout_s = 20;
      c.wait.spin_iterations = 0;
      node_context ctx(control, std::move(c));
      ctx.setup_eager(4096);
      return body(r, ctx);
    }));
  for (int r = 0; r < n; ++r) state->pids[r] = kids[static_cast<std::size_t>(r)];
  state->go = 1;
  std::vector<int> codes;
  for (pid_t k : kids) codes.push_back(zcoll_test::wait_child(k, 60));
  ::munmap(state, sizeof(shared_state));
  return codes;
}

}  // namespace

TEST_CASE("vexchange: alltoallv on forked ranks, every path") {
  for (int n : {1, 2, 3, 5})
    for (bool arena : {false, true})
      for (int scale : {1, 300}) {  // eager-sized, then past the eager slots
        const auto codes = run_node(
            n, [&](int r, node_context& ctx) { return alltoallv_body(r, ctx, arena, scale); });
        for (int c : codes) CHECK_MESSAGE(c == 0, "P=", n, " arena=", arena, " scale=", scale);
      }
}

TEST_CASE("vexchange: a failed push raises on every rank, its receiver's too") {
  const auto codes = run_node(2, failed_push_body);
  for (int c : codes) CHECK(c == 0);
}

TEST_CASE("vexchange: counts that disagree raise on every rank") {
  for (int n : {1, 3}) {
    const auto codes = run_node(n, mismatch_body);
    for (int c : codes) CHECK(c == 0);
  }
}

TEST_CASE("vexchange: a repeated source's blocks pulled by CMA, the same bytes or not") {
  for (int n : {2, 3})
    for (int mode : {0, 1, 2})
      for (int scale : {1, 700}) {  // blocks of a few elements, then of pages
        const auto codes = run_node(n, [&](int r, node_context& ctx) {
          return repeated_sources_body(r, ctx, mode, scale);
        });
        for (int c : codes) CHECK_MESSAGE(c == 0, "P=", n, " mode=", mode, " scale=", scale);
      }
}
