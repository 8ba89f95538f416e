#include "zcoll/copy_choice.hpp"

#include <bit>
#include <stdexcept>

namespace zcoll {

namespace {

constexpr int runs_per_candidate = 3;   // best of this many timed calls per threshold
constexpr double required_gain = 0.97;  // a halving must save at least 3% to be kept
constexpr std::size_t smallest_threshold = std::size_t{4} << 10;  // below: pure streaming

}  // namespace

void copy_chooser::set_threshold(std::size_t bytes) {
  threshold_ = bytes;
  classes_.clear();
}

int copy_chooser::class_of(std::size_t block_bytes) noexcept {
  return static_cast<int>(std::bit_width(block_bytes));
}

void copy_chooser::set_rules(int table, std::vector<copy_rule> rules) {
  if (table < 0 || table >= rule_tables) throw std::invalid_argument("zcoll: no such rule table");
  sort_rules(rules);
  rules_[static_cast<std::size_t>(table)] = std::move(rules);
}

std::optional<copy_plan> copy_chooser::fixed_plan(int table, std::size_t block_bytes,
                                                  std::size_t node_bytes) const noexcept {
  if (const copy_rule* rule = rule_for(table, block_bytes)) {
    const auto ruled = static_cast<copy_mode>(rule->mode);
    if (ruled != copy_mode::hybrid) return copy_plan{ruled, 0};
    if (rule->fixed) return copy_plan{copy_mode::hybrid, rule->threshold};
    return std::nullopt;
  }
  if (fits_in_cache(node_bytes) || block_bytes < threshold_ || block_bytes == 0)
    return copy_plan{copy_mode::temporal, 0};
  return std::nullopt;
}

copy_plan copy_chooser::choose(int mode, std::size_t block_bytes, std::size_t node_bytes,
                               bool* tuning, int table) {
  *tuning = false;
  if (mode != auto_copy) return {static_cast<copy_mode>(mode), threshold_};
  if (const auto plan = fixed_plan(table, block_bytes, node_bytes)) return *plan;
  return refining(block_bytes, tuning);
}

copy_plan copy_chooser::refining(std::size_t block_bytes, bool* tuning) {
  auto [it, fresh] = classes_.try_emplace(class_of(block_bytes));
  size_class& c = it->second;
  if (fresh) c.candidate = threshold_;
  *tuning = !c.settled;
  return {copy_mode::hybrid, c.settled ? c.best : c.candidate};
}

void copy_chooser::record(std::size_t block_bytes, const copy_plan& plan, std::size_t bytes,
                          double seconds) {
  auto it = classes_.find(class_of(block_bytes));
  if (it == classes_.end() || it->second.settled || bytes == 0) return;
  size_class& c = it->second;
  if (plan.threshold != c.candidate) return;
  const double cost = seconds / static_cast<double>(bytes);
  if (c.runs == 0 || cost < c.candidate_cost) c.candidate_cost = cost;
  if (++c.runs < runs_per_candidate) return;
  if (c.best_cost == 0 || c.candidate_cost < required_gain * c.best_cost) {
    c.best = c.candidate;
    c.best_cost = c.candidate_cost;
    if (c.candidate == 0) {
      c.settled = true;
      return;
    }
    c.candidate = c.candidate / 2 < smallest_threshold ? 0 : c.candidate / 2;
    c.runs = 0;
    return;
  }
  c.settled = true;  // halving stopped helping: keep the best
}

copy_plan copy_chooser::peek(std::size_t block_bytes, std::size_t node_bytes, int table) const {
  if (const auto plan = fixed_plan(table, block_bytes, node_bytes)) return *plan;
  return {copy_mode::hybrid, threshold_for(block_bytes)};
}

std::size_t copy_chooser::threshold_for(std::size_t block_bytes) const {
  auto it = classes_.find(class_of(block_bytes));
  if (it == classes_.end()) return threshold_;
  return it->second.settled ? it->second.best : it->second.candidate;
}

}  // namespace zcoll
