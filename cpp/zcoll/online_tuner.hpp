/*
 * Online tuning: HINT's online selection of the block order (section V-C), ZCOLL_TUNING=online.
 *
 * For the alltoall and allgather calls with order="auto" that no tuning-table rule covers, the
 * first calls of each size (the bytes each rank receives) try each candidate -- every block
 * order, and the eager path where the call fits it -- `runs` calls each, in turn, timing each
 * call. Then the node's ranks agree on the candidate whose slowest rank's best time is least (a
 * node allreduce, MAX over the ranks, which node_context runs), and later calls of that size run
 * it. The ranks make the same calls in the same order (collectives), so they step through a
 * trial in lockstep; a call that raises records nothing, on every rank. Every candidate gives
 * the same result.
 *
 * Trade-offs: a trial runs every candidate, the slow ones too (runs * candidates calls per
 * size); only the first max_sizes sizes are tried, later new sizes keep the policy's rule, so
 * a program that cycles through many sizes pays no trial beyond them. Calls are timed by the
 * wall clock: the barriers are part of what an order costs. One node only: a context spanning
 * nodes resolves "auto" by the policy's rules.
 */
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "zcoll/registry.hpp"

namespace zcoll {

class online_tuner {
 public:
  static constexpr int runs = 3;  // calls per candidate
  static constexpr std::size_t max_sizes = 256;

  // What one call with order="auto" runs.
  struct step {
    int code = auto_order;  // a block_order value, eager_order, or auto_order (the policy's rule)
    bool timed = false;     // a trial's call: time it, then record()
  };

  // Switches online tuning on or off; either way, forgets every trial and choice.
  void enable(bool on) {
    on_ = on;
    sizes_.clear();
  }
  bool enabled() const noexcept { return on_; }

  // Whether calls of `op` receiving `received` bytes per rank have been seen (start() first).
  bool knows(op_code op, std::size_t received) const { return sizes_.contains({op, received}); }
  // The first such call: a trial of every order (and the eager path when `eager_fits`), or,
  // when `tune` is false or max_sizes sizes are tracked already, the policy's rule for good.
  void start(op_code op, std::size_t received, bool tune, bool eager_fits);
  // What the next such call runs (known sizes only).
  step next(op_code op, std::size_t received) const;
  // Records a timed call's seconds; true once every candidate has had its runs: the ranks then
  // agree on the worst of their best() times and settle() on them.
  bool record(op_code op, std::size_t received, double seconds);
  // This rank's best time of each candidate of a trial, in candidate order.
  std::span<const double> best(op_code op, std::size_t received) const;
  // Ends a trial with the ranks' worst best times (`worst`, in candidate order): the least wins
  // (ties: the earlier candidate).
  void settle(op_code op, std::size_t received, std::span<const double> worst);
  // What calls of that size run once settled (auto_order: the policy's rule); nullopt while
  // still trying, or for a size not seen.
  std::optional<int> choice(op_code op, std::size_t received) const;

 private:
  struct state {
    std::vector<int> candidates;  // empty once settled
    std::vector<double> best;
    int calls = 0;
    int chosen = auto_order;
  };
  state& at(op_code op, std::size_t received);
  const state& at(op_code op, std::size_t received) const;

  bool on_ = false;
  std::map<std::pair<op_code, std::size_t>, state> sizes_;
};

}  // namespace zcoll
