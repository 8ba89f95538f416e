// Reductions (reduction.hpp) on real node contexts: forked processes stand in for the ranks of
// a node, sharing one control segment. Every algorithm must give the closed-form result, the
// same bits on every rank, whether inputs are in the arena or private, in place or not; the
// checks must raise on every rank. Also the reduction tree's shape.
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "zcoll/error.hpp"
#include "zcoll/exchange.hpp"

using namespace zcoll;

namespace {

constexpr int max_ranks = 8;

// Shared between the parent and its forked ranks (an anonymous shared mapping).
struct shared_state {
  std::atomic<int> go;
  std::int32_t pids[max_ranks];
  std::uint64_t digest[max_ranks][16];  // per rank, per check: a hash of its result
};

std::uint64_t hash_bytes(const void* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

array_view view_of(const void* data, std::size_t n, dtype_id dt, std::int64_t* shape) {
  array_view v;
  v.data = data;
  v.size = n;
  v.nbytes = n * dt.itemsize;
  v.ndim = 1;
  shape[0] = static_cast<std::int64_t>(n);
  v.first_dim = n;
  v.shape = shape;
  v.dtype = dt;
  return v;
}

// Runs body(rank, ctx, state) on `n` forked ranks of one node; returns their exit codes.
template <class Body>
std::vector<int> run_node(int n, shared_state* state, Body body) {
  auto control = shm_segment::create(node_context::control_bytes(n));
  control->unlink();
  state->go = 0;
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
      c.barrier = barrier_kind::flat;
      c.wait.timeout_s = 20;
      c.wait.spin_iterations = 0;
      c.numa_nodes.assign(static_cast<std::size_t>(n), 0);
      for (int j = 0; j < n; ++j) c.numa_nodes[static_cast<std::size_t>(j)] = j / 2;  // pairs
      c.packages.assign(static_cast<std::size_t>(n), 0);
      node_context ctx(control, std::move(c));
      ctx.setup_eager(4096);
      return body(r, ctx, state);
    }));
  for (int r = 0; r < n; ++r) state->pids[r] = kids[static_cast<std::size_t>(r)];
  state->go = 1;
  std::vector<int> codes;
  for (pid_t k : kids) codes.push_back(zcoll_test::wait_child(k, 60));
  return codes;
}

shared_state* new_state() {
  void* p = ::mmap(nullptr, sizeof(shared_state), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  return new (p) shared_state{};
}

constexpr dtype_id f8{'d', 8};
constexpr dtype_id i8{'l', 8};

// One rank's checks: every algorithm, sizes around the eager size and tiles, arena or private
// inputs, in place or not. Returns 0 when every result is right (digests go to `state`).
int reductions_body(int r, node_context& ctx, shared_state* state) {
  const int p = ctx.config().size;
  int failures = 0, check = 0;
  std::int64_t s1[1], s2[1];
  for (int alg = 0; alg < count_of<reduce_algorithm>; ++alg) {
    for (std::size_t n : {std::size_t{1}, std::size_t{37}, std::size_t{20001}}) {
      for (bool arena : {false, true}) {
        auto block = arena ? ctx.allocate(n * 8) : nullptr;
        std::vector<double> own(n);
        double* in = arena ? reinterpret_cast<double*>(block->data()) : own.data();
        for (std::size_t i = 0; i < n; ++i) in[i] = 0.1 * static_cast<double>(r + 1) + 1e-3 * i;
        std::vector<double> out(n, -1);
        const array_view sv = view_of(in, n, f8, s1), rv = view_of(out.data(), n, f8, s2);
        ctx.run_reduction({op_code::allreduce, &sv, &rv, 0, alg, 0});
        bool ok = true;
        for (std::size_t i = 0; i < n; ++i) {
          double want = 0;
          for (int q = 0; q < p; ++q) want += 0.1 * (q + 1) + 1e-3 * i;
          ok &= std::abs(out[i] - want) <= 1e-12 * p * (1 + std::abs(want));
        }
        failures += !ok;
        state->digest[r][check++ % 16] ^= hash_bytes(out.data(), n * 8);
        // In place, integers: the sum of ranks, exactly.
        std::vector<std::int64_t> v(n, r);
        const array_view iv = view_of(v.data(), n, i8, s1);
        ctx.run_reduction({op_code::allreduce, nullptr, &iv, 0, alg, 0});
        for (auto x : v) failures += x != p * (p - 1) / 2;
        // reduce_scatter_block: block r of the sum.
        std::vector<std::int64_t> all(n * static_cast<std::size_t>(p)), mine(n, -1);
        for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i) + r;
        const array_view av = view_of(all.data(), all.size(), i8, s1);
        const array_view mv = view_of(mine.data(), n, i8, s2);
        ctx.run_reduction({op_code::reduce_scatter, &av, &mv, 0, alg, 0});
        for (std::size_t i = 0; i < n; ++i)
          failures += mine[i] != p * static_cast<std::int64_t>(r * n + i) + p * (p - 1) / 2;
        // reduce (max) to the last rank only.
        std::vector<std::int64_t> top(n, -1), x(n, r);
        const array_view xv = view_of(x.data(), n, i8, s1), tv = view_of(top.data(), n, i8, s2);
        ctx.run_reduction({op_code::reduce, &xv, r == p - 1 ? &tv : nullptr, 3, alg, p - 1});
        for (auto t : top) failures += t != (r == p - 1 ? p - 1 : -1);
      }
    }
  }
  // bcast from every root, small (eager) and large.
  for (int root = 0; root < p; ++root)
    for (std::size_t n : {std::size_t{3}, std::size_t{30000}}) {
      std::vector<std::int64_t> b(n, r == root ? 7 + root : 0);
      const array_view bv = view_of(b.data(), n, i8, s1);
      ctx.run_reduction({op_code::bcast, nullptr, &bv, 0, auto_algorithm, root});
      for (auto x : b) failures += x != 7 + root;
    }
  return failures ? 1 : 0;
}

// Every rank raises the error of one rank's bad arguments, and the context stays usable.
int errors_body(int r, node_context& ctx, shared_state*) {
  const int p = ctx.config().size;
  std::int64_t s1[1], s2[1];
  std::vector<double> in(8, 1.0), out(8);
  const array_view sv = view_of(in.data(), 8, f8, s1), rv = view_of(out.data(), 8, f8, s2);
  int failures = 0;
  try {  // bxor on floats on the last rank only, a valid call elsewhere
    const int op = r == p - 1 ? 9 : 0;
    ctx.run_reduction({op_code::allreduce, &sv, &rv, op, auto_algorithm, 0});
    failures += 1;
  } catch (const type_mismatch& e) {
    failures += std::string(e.what()).find("not defined for dtype float64") == std::string::npos;
  }
  try {  // different sizes
    const array_view small = view_of(in.data(), r == p - 1 ? 7 : 8, f8, s1);
    const array_view res = view_of(out.data(), r == p - 1 ? 7 : 8, f8, s2);
    ctx.run_reduction({op_code::allreduce, &small, &res, 0, 3, 0});
    failures += p > 1;
  } catch (const usage_error& e) {
    failures += std::string(e.what()).find("sizes differ") == std::string::npos;
  }
  ctx.run_reduction({op_code::allreduce, &sv, &rv, 0, auto_algorithm, 0});
  for (double x : out) failures += x != p;
  return failures ? 1 : 0;
}

}  // namespace

TEST_CASE("reduction: every algorithm on forked ranks of a node, results identical") {
  shared_state* state = new_state();
  for (int n : {1, 2, 3, 4, 5}) {
    std::memset(state->digest, 0, sizeof state->digest);
    const auto codes = run_node(n, state, reductions_body);
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(codes[static_cast<std::size_t>(r)] == 0, "P=", n);
    for (int r = 1; r < n; ++r)  // every rank's float results: the same bits
      CHECK(std::memcmp(state->digest[r], state->digest[0], sizeof state->digest[0]) == 0);
  }
  ::munmap(state, sizeof(shared_state));
}

TEST_CASE("reduction: bad arguments on one rank raise on every rank") {
  shared_state* state = new_state();
  for (int n : {1, 3}) {
    const auto codes = run_node(n, state, errors_body);
    for (int c : codes) CHECK(c == 0);
  }
  ::munmap(state, sizeof(shared_state));
}

TEST_CASE("reduction: the tree follows NUMA nodes, then packages") {
  // Ranks 0-3 on package 0 (NUMA 0: 0,1; NUMA 1: 2,3), ranks 4-5 on package 1 (NUMA 2).
  const auto levels = make_reduction_tree(6, {0, 0, 1, 1, 2, 2}, {0, 0, 0, 0, 1, 1});
  REQUIRE(levels.size() == 3);
  CHECK(levels[0] == std::vector<tree_group>{{0, 1}, {2, 3}, {4, 5}});
  CHECK(levels[1] == std::vector<tree_group>{{0, 2}});
  CHECK(levels[2] == std::vector<tree_group>{{0, 4}});
  const auto flat = make_reduction_tree(4, {}, {});  // nothing known: one group
  REQUIRE(flat.size() == 1);
  CHECK(flat[0] == std::vector<tree_group>{{0, 1, 2, 3}});
  CHECK(make_reduction_tree(1, {}, {}).empty());
}

TEST_CASE("reduction: the tree's first level is the ranks under one L3 cache") {
  // One package, one NUMA node, two L3 caches (ranks 0-2 and 3-5): the L3 groups, then their
  // leaders. A NUMA level would only repeat the package's group, so it is left out.
  const auto levels =
      make_reduction_tree(6, {0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0}, {0, 0, 0, 1, 1, 1});
  REQUIRE(levels.size() == 2);
  CHECK(levels[0] == std::vector<tree_group>{{0, 1, 2}, {3, 4, 5}});
  CHECK(levels[1] == std::vector<tree_group>{{0, 3}});
  // Two packages, two NUMA nodes each, two L3 caches per NUMA node, two ranks per L3.
  std::vector<int> numa, package, l3;
  for (int r = 0; r < 16; ++r) {
    l3.push_back(r / 2);
    numa.push_back(r / 4);
    package.push_back(r / 8);
  }
  const auto deep = make_reduction_tree(16, numa, package, l3);
  REQUIRE(deep.size() == 4);
  CHECK(deep[0].size() == 8);  // 8 L3 pairs
  CHECK(deep[0][1] == tree_group{2, 3});
  CHECK(deep[1] == std::vector<tree_group>{{0, 2}, {4, 6}, {8, 10}, {12, 14}});
  CHECK(deep[2] == std::vector<tree_group>{{0, 4}, {8, 12}});
  CHECK(deep[3] == std::vector<tree_group>{{0, 8}});
  // Unknown L3s: the tree of NUMA nodes and packages, as before.
  CHECK(make_reduction_tree(16, numa, package, {}).size() == 3);
}
