// copy="auto" (copy_choice.hpp): the fixed rule at the cache boundary, and the run-time
// refinement driven with synthetic timings -- which candidates it tries, in what order, what it
// settles on, and that it never settles on something slower than ordinary stores.
#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "zcoll/auto_policy.hpp"
#include "zcoll/copy_choice.hpp"

using zcoll::copy_chooser;
using zcoll::copy_mode;
using zcoll::copy_plan;

namespace {

constexpr std::size_t kib = std::size_t{1} << 10;
constexpr std::size_t mib = kib << 10;
constexpr std::size_t llc = 32 * mib;
constexpr std::size_t start_threshold = 512 * kib;
constexpr std::size_t block = 4 * mib;
constexpr std::size_t beyond_half = llc / 2 + 1;  // node bytes: past the fixed temporal rule
constexpr int runs_per_candidate = 3;             // timed calls per hybrid candidate
constexpr int temporal_runs = 16;                 // and with ordinary stores

// Seconds per byte of a plan.
using cost_model = std::function<double(const copy_plan&)>;

copy_chooser make_chooser() {
  copy_chooser c;
  c.set_threshold(start_threshold);
  c.set_cache_bytes(llc);
  return c;
}

// A readable key for a plan: -1 for ordinary stores, else the hybrid threshold.
long long key(const copy_plan& p) {
  return p.mode == copy_mode::temporal ? -1 : static_cast<long long>(p.threshold);
}

struct drive_result {
  std::vector<long long> tried;  // each candidate once, in the order tried
  int timed_calls = 0;
  copy_plan settled;
};

// Runs "auto" calls of `bytes`-byte blocks, timed by `cost`, until the chooser stops asking for
// timings (at most `limit` calls).
drive_result drive(copy_chooser& c, const cost_model& cost, std::size_t bytes = block,
                   int limit = 200) {
  drive_result r;
  for (int call = 0; call < limit; ++call) {
    bool tuning = false;
    const copy_plan plan = c.choose(zcoll::auto_copy, bytes, beyond_half, &tuning);
    if (!tuning) break;
    if (r.tried.empty() || r.tried.back() != key(plan)) r.tried.push_back(key(plan));
    c.record(bytes, plan, bytes, cost(plan) * static_cast<double>(bytes));
    ++r.timed_calls;
  }
  r.settled = c.peek(bytes, beyond_half);
  return r;
}

// Costs from a table keyed like key(); `temporal` for ordinary stores.
cost_model table(double temporal, std::map<std::size_t, double> hybrid, double otherwise) {
  return [=](const copy_plan& p) {
    if (p.mode == copy_mode::temporal) return temporal;
    const auto it = hybrid.find(p.threshold);
    return it == hybrid.end() ? otherwise : it->second;
  };
}

}  // namespace

TEST_CASE("calls filling at most half the LLC, and blocks below T, stay temporal untimed") {
  copy_chooser c = make_chooser();
  bool tuning = true;
  CHECK(key(c.choose(zcoll::auto_copy, block, llc / 2, &tuning)) == -1);
  CHECK_FALSE(tuning);
  CHECK(key(c.choose(zcoll::auto_copy, start_threshold - 1, 4 * llc, &tuning)) == -1);
  CHECK_FALSE(tuning);
  // Past half the LLC the refinement starts, with ordinary stores.
  CHECK(key(c.choose(zcoll::auto_copy, block, llc / 2 + 1, &tuning)) == -1);
  CHECK(tuning);
}

TEST_CASE("a named mode is used as is and never timed") {
  copy_chooser c = make_chooser();
  bool tuning = true;
  const copy_plan p = c.choose(static_cast<int>(copy_mode::streaming), block, 4 * llc, &tuning);
  CHECK(p.mode == copy_mode::streaming);
  CHECK_FALSE(tuning);
}

TEST_CASE("ordinary stores fastest: auto settles on them after one halving") {
  copy_chooser c = make_chooser();
  const auto r = drive(c, table(1.0, {}, 1.3));
  // Ordinary stores, then T, T/2 (no gain: the halving sequence stops).
  CHECK(r.tried == std::vector<long long>{-1, 512 * kib, 256 * kib});
  CHECK(r.timed_calls == 2 * runs_per_candidate + temporal_runs);
  CHECK(r.settled.mode == copy_mode::temporal);
  CHECK(c.threshold_for(block) == block);  // T = the whole block
}

TEST_CASE("a hybrid threshold inside the sequence wins when it beats ordinary stores") {
  copy_chooser c = make_chooser();
  const auto r = drive(c, table(1.0, {{512 * kib, 0.9}, {256 * kib, 0.8}, {128 * kib, 0.7}}, 0.75));
  // The hybrid copy won: ordinary stores are timed again to confirm.
  CHECK(r.tried == std::vector<long long>{-1, 512 * kib, 256 * kib, 128 * kib, 64 * kib, -1});
  CHECK(r.timed_calls == 4 * runs_per_candidate + 2 * temporal_runs);
  CHECK(r.settled.mode == copy_mode::hybrid);
  CHECK(r.settled.threshold == 128 * kib);
  CHECK(c.threshold_for(block) == 128 * kib);
}

TEST_CASE("pure streaming wins when every halving helps") {
  copy_chooser c = make_chooser();
  // Cost falls with T all the way down: 512 KiB ... 4 KiB, then 0 (streaming).
  const auto r = drive(c, [](const copy_plan& p) {
    if (p.mode == copy_mode::temporal) return 2.0;
    return 0.01 + static_cast<double>(p.threshold) / static_cast<double>(start_threshold);
  });
  REQUIRE(r.tried.size() == 11);  // ordinary stores, 512, 256, ..., 4 KiB (8), 0, again
  CHECK(r.tried[0] == -1);
  CHECK(r.tried[8] == 4 * kib);
  CHECK(r.tried[9] == 0);
  CHECK(r.tried[10] == -1);
  CHECK(r.settled.mode == copy_mode::hybrid);
  CHECK(r.settled.threshold == 0);
}

TEST_CASE("the hybrid copy must beat ordinary stores by 3%") {
  copy_chooser near = make_chooser();
  CHECK(drive(near, table(1.0, {{512 * kib, 0.98}}, 1.2)).settled.mode == copy_mode::temporal);
  copy_chooser clear = make_chooser();
  CHECK(drive(clear, table(1.0, {{512 * kib, 0.96}}, 1.2)).settled.mode == copy_mode::hybrid);
}

TEST_CASE("each candidate counts its best call: one slow call does not decide") {
  copy_chooser c = make_chooser();
  int temporal_calls = 0;
  const auto r = drive(c, [&](const copy_plan& p) {
    if (p.mode == copy_mode::temporal) return ++temporal_calls == 1 ? 10.0 : 1.0;
    return 1.2;
  });
  CHECK(r.settled.mode == copy_mode::temporal);
}

TEST_CASE("ordinary stores get the calls they need to warm the cache up again") {
  copy_chooser c = make_chooser();
  // Ordinary stores start slow (the buffers are not in the cache yet) and reach their speed on
  // their sixth call; the hybrid copy does not change.
  int temporal_calls = 0;
  const double warming[] = {2.0, 1.8, 1.5, 1.3, 1.1, 0.9};
  const auto r = drive(c, [&](const copy_plan& p) {
    if (p.mode == copy_mode::hybrid) return 1.0;
    const int i = temporal_calls++;
    return i < 6 ? warming[i] : 0.9;
  });
  CHECK(temporal_calls == temporal_runs);
  CHECK(r.settled.mode == copy_mode::temporal);
}

TEST_CASE("a hybrid win is confirmed: ordinary stores slow only while first timed are kept") {
  copy_chooser c = make_chooser();
  int temporal_calls = 0;
  const auto r = drive(c, [&](const copy_plan& p) {
    if (p.mode == copy_mode::hybrid) return 1.0;
    return temporal_calls++ < temporal_runs ? 1.5 : 0.9;  // a disturbed core, then a quiet one
  });
  CHECK(r.tried == std::vector<long long>{-1, 512 * kib, 256 * kib, -1});
  CHECK(r.settled.mode == copy_mode::temporal);
}

TEST_CASE("random timings: bounded, and never settled on anything slower than ordinary stores") {
  for (unsigned seed = 1; seed <= 200; ++seed) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> cost(0.5, 1.5);
    std::map<long long, double> costs;  // a fixed cost per candidate
    copy_chooser c = make_chooser();
    const auto r = drive(c, [&](const copy_plan& p) {
      auto [it, fresh] = costs.try_emplace(key(p), 0.0);
      if (fresh) it->second = cost(rng);
      return it->second;
    });
    // log2(512 KiB / 4 KiB) + 2 hybrid candidates at most, ordinary stores at most twice.
    CHECK(r.timed_calls <= 9 * runs_per_candidate + 2 * temporal_runs);
    CHECK(r.tried.front() == -1);  // ordinary stores are always timed, first
    if (r.settled.mode == copy_mode::hybrid) CHECK(r.tried.back() == -1);  // and confirmed
    const double settled = costs.at(key(r.settled));
    CHECK(settled <= costs.at(-1));
    if (r.settled.mode == copy_mode::hybrid) CHECK(settled < 0.97 * costs.at(-1));
  }
}

TEST_CASE("size classes are quarter octaves: 4 MiB and 6 MiB blocks learn apart") {
  copy_chooser c = make_chooser();
  drive(c, table(1.0, {}, 1.3), 4 * mib);
  bool tuning = false;
  CHECK(key(c.choose(zcoll::auto_copy, 4 * mib + 512 * kib, beyond_half, &tuning)) == -1);
  CHECK_FALSE(tuning);  // same class as 4 MiB
  c.choose(zcoll::auto_copy, 6 * mib, beyond_half, &tuning);
  CHECK(tuning);
}

TEST_CASE("timings of another plan are ignored, and a new threshold forgets what was learned") {
  copy_chooser c = make_chooser();
  bool tuning = false;
  c.choose(zcoll::auto_copy, block, beyond_half, &tuning);
  for (int i = 0; i < 10; ++i)
    c.record(block, copy_plan{copy_mode::hybrid, 12345}, block, 1.0);  // not the candidate
  CHECK(c.threshold_for(block) == block);  // still timing ordinary stores
  drive(c, table(2.0, {}, 1.0));
  CHECK(c.peek(block, beyond_half).mode == copy_mode::hybrid);
  c.set_threshold(64 * kib);
  CHECK(c.peek(block, beyond_half).mode == copy_mode::temporal);  // starts again
  CHECK(c.threshold_for(block) == 64 * kib);
}

TEST_CASE("the refinement's clock counts this thread's work, not the time it waits") {
  using clock = std::chrono::steady_clock;
  const double before_sleep = zcoll::thread_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(zcoll::thread_cpu_seconds() - before_sleep < 0.05);
  const double before_work = zcoll::thread_cpu_seconds();
  volatile unsigned sink = 0;
  for (const auto end = clock::now() + std::chrono::milliseconds(50); clock::now() < end;)
    sink = sink + 1;
  // Busy for 50 ms of wall time; on a loaded machine the thread gets less of the CPU.
  CHECK(zcoll::thread_cpu_seconds() - before_work > 0.005);
}

TEST_CASE("the eager slots take private buffers up to their capacity and the CMA size") {
  zcoll::auto_policy policy(2);
  policy.set_eager_bytes(4 * kib, 16 * kib);
  policy.set_cma_bytes(8 * kib);
  CHECK(policy.eager_takes(4 * kib, false));  // within the eager size, whatever the buffers
  CHECK(policy.eager_takes(4 * kib, true));
  CHECK_FALSE(policy.eager_takes(8 * kib, false));     // shared buffers: the one-copy path
  CHECK(policy.eager_takes(8 * kib, true));            // private: the slots, not staging
  CHECK_FALSE(policy.eager_takes(8 * kib + 1, true));  // pulled by CMA from here
  CHECK(policy.pulls(8 * kib + 1));
  policy.set_private_slots(false);  // off: staged or pulled as the threshold says
  CHECK_FALSE(policy.eager_takes(8 * kib, true));
  CHECK(policy.eager_takes(4 * kib, true));
  policy.set_private_slots(true);
  policy.set_cma_bytes(0);  // every private buffer pulled
  CHECK_FALSE(policy.eager_takes(4 * kib + 1, true));
  policy.set_cma_bytes(SIZE_MAX);  // never pulled: the slots, then staged beyond them
  CHECK(policy.eager_takes(16 * kib, true));
  CHECK_FALSE(policy.eager_takes(16 * kib + 1, true));
  policy.set_eager_bytes(0, 16 * kib);  // no eager path at all
  CHECK_FALSE(policy.eager_takes(8, true));
  CHECK(policy.eager_capacity() == 0);
}

TEST_CASE("bcast and the reductions pull from the table's thresholds unless CMA is forced") {
  using zcoll::op_code;
  zcoll::auto_policy policy(2);
  // Built in: 1 MiB (bcast) and 4 MiB (reductions), where the exchanges pull from 16 KiB.
  CHECK(zcoll::default_cma_bytes == 16 * kib);
  CHECK(policy.pull_threshold(op_code::bcast) == 1 << 20);
  CHECK(policy.pull_threshold(op_code::reduce_scatter) == 4 << 20);
  CHECK_FALSE(policy.pulls_bcast((1 << 20) - 1));
  CHECK(policy.pulls_bcast(1 << 20));
  policy.set_pull_bytes(op_code::bcast, 5 << 20);
  policy.set_pull_bytes(op_code::reduce, 64 * kib);
  CHECK_FALSE(policy.pulls_bcast(4 << 20));
  CHECK(policy.pulls_bcast(5 << 20));
  CHECK(policy.pulls_reduction(64 * kib, op_code::reduce));
  CHECK_FALSE(policy.pulls_reduction(64 * kib, op_code::allreduce));  // its own, built in
  CHECK(policy.pulls_reduction(4 << 20, op_code::allreduce));
  policy.set_cma_bytes(32 * kib);  // forced: the defaults scaled by its ratio to the default
  CHECK(policy.cma_forced());
  CHECK(policy.pull_threshold(op_code::bcast) == 2 << 20);
  CHECK(policy.pull_threshold(op_code::reduce) == 8 << 20);
  policy.set_cma_bytes(8 * kib);
  CHECK(policy.pull_threshold(op_code::bcast) == 512 * kib);
  policy.set_cma_bytes(0);  // every size pulled
  CHECK(policy.pulls_reduction(1, op_code::reduce));
  policy.set_cma_bytes(SIZE_MAX);  // never, without overflow
  CHECK(policy.pull_threshold(op_code::bcast) == SIZE_MAX);
  policy.reset_cma_bytes();  // the table's again
  CHECK_FALSE(policy.cma_forced());
  CHECK(policy.cma_bytes() == zcoll::default_cma_bytes);
  CHECK(policy.pull_threshold(op_code::bcast) == 5 << 20);
  policy.set_pull_bytes(op_code::bcast, std::nullopt);  // the built-in rule again
  CHECK(policy.pull_threshold(op_code::bcast) == 1 << 20);
  CHECK_THROWS_AS(policy.set_pull_bytes(op_code::alltoall, 1), std::invalid_argument);
  CHECK_THROWS_AS(policy.pull_threshold(op_code::alltoallv), std::invalid_argument);
}
