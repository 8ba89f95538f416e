#include "zcoll/online_tuner.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace zcoll {

online_tuner::state& online_tuner::at(op_code op, std::size_t received) {
  const auto found = sizes_.find({op, received});
  if (found == sizes_.end()) throw std::logic_error("zcoll: online tuning of an unseen size");
  return found->second;
}

const online_tuner::state& online_tuner::at(op_code op, std::size_t received) const {
  return const_cast<online_tuner*>(this)->at(op, received);
}

void online_tuner::start(op_code op, std::size_t received, bool tune, bool eager_fits) {
  state s;
  if (tune && sizes_.size() < max_sizes) {
    for (int order = 0; order < count_of<block_order>; ++order) s.candidates.push_back(order);
    if (eager_fits) s.candidates.push_back(eager_order);
    s.best.assign(s.candidates.size(), std::numeric_limits<double>::infinity());
  }
  sizes_[{op, received}] = std::move(s);
}

online_tuner::step online_tuner::next(op_code op, std::size_t received) const {
  const state& s = at(op, received);
  if (s.candidates.empty()) return {s.chosen, false};
  return {s.candidates[static_cast<std::size_t>(s.calls / runs)], true};
}

bool online_tuner::record(op_code op, std::size_t received, double seconds) {
  state& s = at(op, received);
  const auto i = static_cast<std::size_t>(s.calls / runs);
  s.best[i] = std::min(s.best[i], seconds);
  ++s.calls;
  return static_cast<std::size_t>(s.calls) == runs * s.candidates.size();
}

std::span<const double> online_tuner::best(op_code op, std::size_t received) const {
  return at(op, received).best;
}

void online_tuner::settle(op_code op, std::size_t received, std::span<const double> worst) {
  state& s = at(op, received);
  if (worst.size() != s.candidates.size())
    throw std::logic_error("zcoll: online tuning settled with the wrong number of times");
  const auto least = std::min_element(worst.begin(), worst.end()) - worst.begin();
  s.chosen = s.candidates[static_cast<std::size_t>(least)];
  s.candidates.clear();
  s.best.clear();
}

std::optional<int> online_tuner::choice(op_code op, std::size_t received) const {
  const auto found = sizes_.find({op, received});
  if (found == sizes_.end() || !found->second.candidates.empty()) return std::nullopt;
  return found->second.chosen;
}

}  // namespace zcoll
