// How calls across nodes cross them (crossing_policy.hpp): the size rule, the tuning table's
// round limit, an allgather's route beyond the round, and what forcing overrides. Expected
// values are written out from the header's definitions, not computed by the code under test.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "zcoll/aggregate.hpp"
#include "zcoll/crossing_policy.hpp"

using zcoll::crossing_method;
using zcoll::crossing_policy;
using zcoll::internode_rule;
using zcoll::node_map;
using zcoll::op_code;

namespace {

constexpr auto no_end = std::numeric_limits<std::uint64_t>::max();
constexpr auto int64_max = std::numeric_limits<std::int64_t>::max();

// Two nodes: ranks {0, 1, 2} and {3, 4} (the smallest node has q = 2 ranks).
node_map two_nodes() {
  return node_map::from_leaders(std::vector<int>{0, 0, 0, 3, 3});
}

internode_rule rule(std::uint64_t low, std::uint64_t high, crossing_method method, int c = 0) {
  return {low, high, method, c};
}

}  // namespace

TEST_CASE("the size rule grows with the smallest node and stops at its caps") {
  const crossing_policy policy(two_nodes());
  CHECK(policy.pack_limit(op_code::alltoall) == 8 * 1024);    // 4 KiB * q
  CHECK(policy.pack_limit(op_code::allgather) == 32 * 1024);  // 4 times an alltoall's
  CHECK(policy.pack_limit(op_code::bcast) == 32 * 1024);
  CHECK(policy.pack_limit(op_code::allreduce) == 64 * 1024);  // 32 KiB * q, 256 KiB * q / 1
  CHECK(zcoll::size_rule_limit(64, 2, op_code::alltoall) == 64 * 1024);  // capped
  CHECK(zcoll::size_rule_limit(64, 5, op_code::allreduce) == 256 * 1024);
  CHECK(zcoll::size_rule_limit(4, 5, op_code::allreduce) == 128 * 1024);  // 32 KiB * q
  CHECK(policy.carries(op_code::alltoall, 8 * 1024));
  CHECK_FALSE(policy.carries(op_code::alltoall, 8 * 1024 + 1));
}

TEST_CASE("the round's limit is the end of the first run of round rules") {
  using V = std::vector<internode_rule>;
  const auto round = crossing_method::round;
  const auto direct = crossing_method::direct;
  CHECK(zcoll::round_limit_of(V{}) == std::nullopt);
  CHECK(zcoll::round_limit_of(V{rule(0, 32768, round), rule(32769, no_end, direct)}) == 32768);
  CHECK(zcoll::round_limit_of(
            V{rule(0, 100, round), rule(101, 5000, round), rule(5001, no_end, direct)}) == 5000);
  CHECK(zcoll::round_limit_of(V{rule(0, no_end, round)}) == int64_max);
  CHECK(zcoll::round_limit_of(V{rule(0, 64, direct), rule(65, no_end, round)}) == -1);
  CHECK(zcoll::round_limit_of(
            V{rule(0, 64, round), rule(65, 99, direct), rule(100, no_end, round)}) == 64);
  CHECK(zcoll::round_limit_of(V{rule(0, 64, round), rule(200, no_end, round)}) == 64);  // a gap
}

TEST_CASE("table rules set an alltoall's and an allgather's round, others keep the size rule") {
  crossing_policy policy(two_nodes());
  policy.set_rules(op_code::alltoall, {rule(0, 100, crossing_method::round)});
  CHECK(policy.pack_limit(op_code::alltoall) == 100);
  CHECK(policy.pack_limit(op_code::allgather) == 32 * 1024);
  CHECK(policy.pack_limit(op_code::allreduce) == 64 * 1024);
  policy.set_rules(op_code::allgather, {rule(0, 10, crossing_method::direct)});
  CHECK(policy.pack_limit(op_code::allgather) == -1);
  CHECK_FALSE(policy.carries(op_code::allgather, 1));
  policy.set_rules(op_code::alltoall, {});
  CHECK(policy.pack_limit(op_code::alltoall) == 8 * 1024);
  CHECK_THROWS_AS(policy.set_rules(op_code::allreduce, {}), std::invalid_argument);
}

TEST_CASE("an allgather beyond the round: the table's rule, else direct; forcing wins") {
  crossing_policy policy(two_nodes());
  auto route = [&](std::uint64_t block) {
    const zcoll::allgather_route r = policy.allgather_route_for(block);
    return std::pair{r.method, r.concurrency};
  };
  CHECK(route(1 << 20) == std::pair{crossing_method::direct, 0});
  policy.set_rules(op_code::allgather,
                   {rule(0, 64, crossing_method::round), rule(65, 1000, crossing_method::direct),
                    rule(1001, 4096, crossing_method::concurrent, 4)});
  CHECK(route(65) == std::pair{crossing_method::direct, 0});
  CHECK(route(1001) == std::pair{crossing_method::concurrent, 4});
  CHECK(route(4096) == std::pair{crossing_method::concurrent, 4});
  CHECK(route(4097) == std::pair{crossing_method::direct, 0});  // no rule: the built-in choice
  policy.overrides().allgather = zcoll::allgather_crossing::direct;
  CHECK(route(2000) == std::pair{crossing_method::direct, 0});
  policy.overrides().allgather = zcoll::allgather_crossing::concurrent;
  policy.overrides().concurrency = 2;
  CHECK(route(70) == std::pair{crossing_method::concurrent, 2});
}

TEST_CASE("forcing the carry overrides the size rule and the table") {
  crossing_policy policy(two_nodes());
  policy.set_rules(op_code::alltoall, {rule(0, 100, crossing_method::round)});
  policy.overrides().carry = zcoll::aggregation::always;
  CHECK(policy.pack_limit(op_code::alltoall) == int64_max);
  CHECK(policy.carries(op_code::allreduce, std::uint64_t{1} << 40));
  policy.overrides().carry = zcoll::aggregation::never;
  CHECK(policy.pack_limit(op_code::bcast) == -1);
  CHECK_FALSE(policy.carries(op_code::alltoall, 0));
}
