#include "zcoll/copy_choice.hpp"

#include <algorithm>
#include <bit>
#include <stdexcept>

namespace zcoll {

namespace {

constexpr int runs_per_candidate = 3;  // best of this many timed calls per hybrid candidate
// Ordinary stores get more: their calls speed up as the buffers settle into the LLC, slowly
// near its size (measured at P = 2 after hybrid calls, 4 MiB blocks: 546, 438, 417, 435, 343,
// 371, 341, 360, 323, 302, 292 us per call, against 313-365 for the hybrid copy). Timed twice
// when the hybrid copy wins (see advance).
constexpr int temporal_runs = 16;
constexpr double required_gain = 0.97;  // a halving, or hybrid over temporal, must save 3%
constexpr std::size_t smallest_threshold = std::size_t{4} << 10;  // below: pure streaming

}  // namespace

void copy_chooser::set_threshold(std::size_t bytes) {
  threshold_ = bytes;
  classes_.clear();
}

// Quarter octaves: the bit length and the two bits below the leading one.
int copy_chooser::class_of(std::size_t block_bytes) noexcept {
  const auto width = static_cast<int>(std::bit_width(block_bytes));
  const int below = width > 3 ? width - 3 : 0;
  return 4 * width + static_cast<int>((block_bytes >> below) & 3);
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
  return refined(block_bytes, tuning);
}

copy_plan copy_chooser::refined(std::size_t block_bytes, bool* tuning) {
  const size_class& c = classes_[class_of(block_bytes)];
  *tuning = !c.settled;
  return plan_of(c.candidate);
}

void copy_chooser::record(std::size_t block_bytes, const copy_plan& plan, std::size_t bytes,
                          double seconds) {
  auto it = classes_.find(class_of(block_bytes));
  if (it == classes_.end() || it->second.settled || bytes == 0) return;
  size_class& c = it->second;
  const std::size_t tried = plan.mode == copy_mode::temporal ? whole_block : plan.threshold;
  if (tried != c.candidate) return;
  const double cost = seconds / static_cast<double>(bytes);
  if (c.runs == 0 || cost < c.candidate_cost) c.candidate_cost = cost;
  if (++c.runs == (c.candidate == whole_block ? temporal_runs : runs_per_candidate)) advance(c);
}

// Ordinary stores first, all ranks together (every rank makes the same calls): timed while a
// peer streams, they would look faster than they are. Then the halving sequence T, T/2, ...
// (then 0: pure streaming) while each step saves `required_gain`. Its best must beat ordinary
// stores by as much, twice: when it does, they are timed once more (a core disturbed for a
// while, by another process or tenant, would otherwise decide), and the best of both counts.
void copy_chooser::advance(size_class& c) const noexcept {
  c.runs = 0;
  if (c.candidate == whole_block) {
    const bool first = c.temporal_cost == 0;
    c.temporal_cost = first ? c.candidate_cost : std::min(c.temporal_cost, c.candidate_cost);
    if (first) {
      c.candidate = threshold_;
      return;
    }
  } else {
    const bool gained = c.hybrid_cost == 0 || c.candidate_cost < required_gain * c.hybrid_cost;
    if (gained) {
      c.hybrid = c.candidate;
      c.hybrid_cost = c.candidate_cost;
    }
    if (gained && c.candidate != 0) {
      c.candidate = c.candidate / 2 < smallest_threshold ? 0 : c.candidate / 2;
      return;
    }
  }
  const bool hybrid_wins = c.hybrid_cost < required_gain * c.temporal_cost;
  if (hybrid_wins && c.candidate != whole_block) {
    c.candidate = whole_block;  // confirm
    return;
  }
  c.candidate = hybrid_wins ? c.hybrid : whole_block;
  c.settled = true;
}

copy_plan copy_chooser::peek(std::size_t block_bytes, std::size_t node_bytes, int table) const {
  if (const auto plan = fixed_plan(table, block_bytes, node_bytes)) return *plan;
  auto it = classes_.find(class_of(block_bytes));
  return plan_of(it == classes_.end() ? whole_block : it->second.candidate);
}

std::size_t copy_chooser::threshold_for(std::size_t block_bytes) const {
  auto it = classes_.find(class_of(block_bytes));
  if (it == classes_.end()) return threshold_;
  return it->second.candidate == whole_block ? block_bytes : it->second.candidate;
}

}  // namespace zcoll
