// Online tuning's trials (online_tuner.hpp): the candidates, their turns, the settled choice,
// sizes that are not tried, and the bound on tracked sizes. The node's agreement itself is
// node_context's (tests/test_tuning.py runs it on ranks).
#include <doctest/doctest.h>

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <vector>

#include "zcoll/online_tuner.hpp"

using zcoll::online_tuner;
using zcoll::op_code;

namespace {

constexpr int orders = 5;  // row, column, morton, hilbert, numa

// Runs every timed call of a trial, candidate k taking seconds[k] (its first run; later runs
// take longer), and returns whether the last call completed the trial.
bool run_trial(online_tuner& t, op_code op, std::size_t received, const std::vector<double>& s) {
  bool complete = false;
  for (std::size_t k = 0; k < s.size(); ++k)
    for (int run = 0; run < online_tuner::runs; ++run) {
      const online_tuner::step step = t.next(op, received);
      REQUIRE(step.timed);
      CHECK(!complete);
      complete = t.record(op, received, s[k] + run);
    }
  return complete;
}

}  // namespace

TEST_CASE("a trial runs every order, then the eager path, runs calls each, in turn") {
  online_tuner t;
  t.enable(true);
  CHECK(!t.knows(op_code::alltoall, 64));
  t.start(op_code::alltoall, 64, true, true);
  CHECK(t.knows(op_code::alltoall, 64));
  std::vector<int> seen;
  for (int call = 0; call < online_tuner::runs * (orders + 1); ++call) {
    const online_tuner::step step = t.next(op_code::alltoall, 64);
    CHECK(step.timed);
    seen.push_back(step.code);
    CHECK(t.record(op_code::alltoall, 64, 1.0) == (call == online_tuner::runs * (orders + 1) - 1));
  }
  const std::vector<int> want{0,
                              0,
                              0,
                              1,
                              1,
                              1,
                              2,
                              2,
                              2,
                              3,
                              3,
                              3,
                              4,
                              4,
                              4,
                              zcoll::eager_order,
                              zcoll::eager_order,
                              zcoll::eager_order};
  CHECK(seen == want);
  CHECK(!t.choice(op_code::alltoall, 64).has_value());  // still to agree
}

TEST_CASE("the ranks' worst best times decide; ties go to the earlier candidate") {
  online_tuner t;
  t.enable(true);
  t.start(op_code::allgather, 4096, true, false);
  REQUIRE(run_trial(t, op_code::allgather, 4096, {5, 4, 3, 2, 1}));
  const std::vector<double> mine(t.best(op_code::allgather, 4096).begin(),
                                 t.best(op_code::allgather, 4096).end());
  CHECK(mine == std::vector<double>{5, 4, 3, 2, 1});  // each candidate's first (fastest) run
  // Another rank was slow on hilbert and numa: morton's worst is the least.
  t.settle(op_code::allgather, 4096, std::vector<double>{5, 4, 3, 9, 9});
  CHECK(t.choice(op_code::allgather, 4096) == std::optional<int>{2});
  const online_tuner::step after = t.next(op_code::allgather, 4096);
  CHECK(after.code == 2);
  CHECK(!after.timed);

  t.start(op_code::alltoall, 8, true, false);
  REQUIRE(run_trial(t, op_code::alltoall, 8, {1, 1, 1, 1, 1}));
  t.settle(op_code::alltoall, 8, std::vector<double>{2, 1, 1, 3, 1});
  CHECK(t.choice(op_code::alltoall, 8) == std::optional<int>{1});
  CHECK_THROWS_AS(t.settle(op_code::alltoall, 8, std::vector<double>{1}), std::logic_error);
}

TEST_CASE("sizes not tried keep the policy's rule, untimed") {
  online_tuner t;
  t.enable(true);
  t.start(op_code::alltoall, 0, false, true);  // a rule covers it, or empty blocks
  const online_tuner::step step = t.next(op_code::alltoall, 0);
  CHECK(step.code == zcoll::auto_order);
  CHECK(!step.timed);
  CHECK(t.choice(op_code::alltoall, 0) == std::optional<int>{zcoll::auto_order});
  CHECK(!t.choice(op_code::allgather, 0).has_value());  // another collective: unseen
  CHECK_THROWS_AS(t.next(op_code::allgather, 0), std::logic_error);
}

TEST_CASE("only the first max_sizes sizes are tried, and enable() forgets them all") {
  online_tuner t;
  t.enable(true);
  for (std::size_t n = 1; n <= online_tuner::max_sizes; ++n)
    t.start(op_code::alltoall, n, true, false);
  CHECK(t.next(op_code::alltoall, online_tuner::max_sizes).timed);
  t.start(op_code::alltoall, online_tuner::max_sizes + 1, true, false);
  CHECK(!t.next(op_code::alltoall, online_tuner::max_sizes + 1).timed);
  t.enable(false);
  CHECK(!t.enabled());
  CHECK(!t.knows(op_code::alltoall, 1));
}
