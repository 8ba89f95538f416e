#include "zcoll/crossing_policy.hpp"

#include <algorithm>
#include <stdexcept>

#include "zcoll/aggregate.hpp"

namespace zcoll {

std::uint64_t size_rule_limit(std::uint64_t q, int nodes, op_code op) noexcept {
  if (is_reduction(op) && op != op_code::bcast) {
    const auto others = static_cast<std::uint64_t>(std::max(nodes - 1, 1));
    return std::min(
        {reduction_round_bytes, reduction_unit_bytes * q, reduction_round_bytes * q / others});
  }
  // An allgather's message holds one block per sender, a bcast's the root's buffer.
  const bool one_per_sender = op == op_code::allgather || op == op_code::bcast;
  const std::uint64_t unit = aggregate_unit_block * (one_per_sender ? allgather_block_factor : 1);
  return std::min(aggregate_max_block, unit * q);
}

namespace {

std::uint64_t smallest_node(const node_map& nodes) noexcept {
  std::uint64_t q = nodes.node_of.size();
  for (const auto& members : nodes.members) q = std::min<std::uint64_t>(q, members.size());
  return q;
}

}  // namespace

std::uint64_t max_aggregated_block(const node_map& nodes, op_code op) noexcept {
  return size_rule_limit(smallest_node(nodes), nodes.nodes(), op);
}

std::optional<std::int64_t> round_limit_of(const std::vector<internode_rule>& rules) noexcept {
  if (rules.empty()) return std::nullopt;
  std::int64_t limit = -1;
  for (const internode_rule& rule : rules) {
    if (rule.method != crossing_method::round ||
        rule.min_block > static_cast<std::uint64_t>(limit + 1))
      break;
    if (rule.max_block >= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return std::numeric_limits<std::int64_t>::max();
    limit = static_cast<std::int64_t>(rule.max_block);
  }
  return limit;
}

crossing_policy::crossing_policy(const node_map& nodes)
    : smallest_node_(smallest_node(nodes)), nodes_(nodes.nodes()) {}

int crossing_policy::rules_index(op_code op) noexcept {
  return op == op_code::alltoall ? 0 : op == op_code::allgather ? 1 : -1;
}

void crossing_policy::set_rules(op_code op, std::vector<internode_rule> rules) {
  const int i = rules_index(op);
  if (i < 0)
    throw std::invalid_argument("zcoll: only an alltoall or an allgather has internode rules");
  round_limits_[i] = round_limit_of(rules);
  if (op == op_code::allgather) allgather_rules_ = std::move(rules);
}

std::int64_t crossing_policy::pack_limit(op_code op) const noexcept {
  switch (overrides_.carry) {
    case aggregation::never:
      return -1;
    case aggregation::always:
      return std::numeric_limits<std::int64_t>::max();
    case aggregation::by_size:
      break;
  }
  if (const int i = rules_index(op); i >= 0 && round_limits_[i]) return *round_limits_[i];
  return static_cast<std::int64_t>(size_rule_limit(smallest_node_, nodes_, op));
}

allgather_route crossing_policy::allgather_route_for(std::uint64_t block) const noexcept {
  switch (overrides_.allgather) {
    case allgather_crossing::direct:
      return {crossing_method::direct, 0};
    case allgather_crossing::concurrent:
      return {crossing_method::concurrent, overrides_.concurrency};
    case allgather_crossing::by_policy:
      break;
  }
  for (const internode_rule& rule : allgather_rules_)
    if (rule.method != crossing_method::round && rule.min_block <= block && block <= rule.max_block)
      return {rule.method, rule.concurrency};
  return {crossing_method::direct, 0};
}

}  // namespace zcoll
