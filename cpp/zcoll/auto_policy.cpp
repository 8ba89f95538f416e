#include "zcoll/auto_policy.hpp"

#include <time.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>

#include "zcoll/checks.hpp"

namespace zcoll {

double thread_cpu_seconds() noexcept {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

block_order default_order(int p, std::size_t block_bytes, int numa_domains) noexcept {
  (void)block_bytes;
  if (numa_domains > 1) return block_order::numa;
  return p <= 2 ? block_order::row : block_order::morton;
}

std::size_t pulled_index(op_code op) noexcept {
  switch (op) {
    case op_code::bcast:
      return 0;
    case op_code::allreduce:
      return 1;
    case op_code::reduce:
      return 2;
    case op_code::reduce_scatter:
      return 3;
    default:
      return pulled_calls;
  }
}

namespace {

std::size_t checked_pulled_index(op_code op) {
  const std::size_t i = pulled_index(op);
  if (i == pulled_calls)
    throw std::invalid_argument("zcoll: " + std::string(name_of(op)) +
                                " has no pull threshold of its own");
  return i;
}

}  // namespace

std::size_t builtin_pull_bytes(op_code op, std::size_t cma_bytes) {
  checked_pulled_index(op);
  const std::size_t base =
      op == op_code::bcast ? default_bcast_pull_bytes : default_reduction_pull_bytes;
  const unsigned __int128 scaled =
      static_cast<unsigned __int128>(base) * cma_bytes / default_cma_bytes;
  return scaled < SIZE_MAX ? static_cast<std::size_t>(scaled) : SIZE_MAX;
}

void auto_policy::set_pull_bytes(op_code op, std::optional<std::size_t> bytes) {
  tuned_pulls_[checked_pulled_index(op)] = bytes;
}

std::size_t auto_policy::pull_threshold(op_code op) const {
  const std::optional<std::size_t> tuned = tuned_pulls_[checked_pulled_index(op)];
  return !cma_forced_ && tuned ? *tuned : builtin_pull_bytes(op, cma_bytes_);
}

void auto_policy::set_rules(op_code op, std::vector<order_rule> orders,
                            std::vector<copy_rule> copies) {
  const int table = tuned_index(op);
  if (table == no_rules)
    throw std::invalid_argument("zcoll: " + std::string(name_of(op)) + " has no tuning rules");
  for (const order_rule& r : orders)
    if (!valid_order_code(r.order, true))
      throw std::invalid_argument("zcoll: unknown order code in a tuning rule");
  for (const copy_rule& r : copies)
    if (!valid_copy_code(r.mode))
      throw std::invalid_argument("zcoll: unknown copy code in a tuning rule");
  sort_rules(orders);
  copy_.set_rules(table, std::move(copies));
  order_rules_[static_cast<std::size_t>(table)] = std::move(orders);
}

auto_choice auto_policy::resolve(op_code op, std::size_t block_bytes,
                                 std::size_t recv_bytes) const {
  // Eager is judged by what a rank receives (P blocks), the bulk of the pull for both.
  auto_choice c{builtin_order(block_bytes), eager_fits(recv_bytes), false};
  const int table = tuned_index(op);
  if (table == no_rules || order_rules_[static_cast<std::size_t>(table)].empty()) return c;
  const order_rule* r = find_rule(order_rules_[static_cast<std::size_t>(table)], block_bytes);
  if (!r || r->order == auto_order) return c;
  c.from_rule = true;
  if (r->order == eager_order) return c;  // eager where the call fits it, else the default
  c.order = static_cast<block_order>(r->order);
  c.eager = false;
  return c;
}

namespace {

// Built-in estimates, for a node of p ranks, when no tuning table measured the algorithms:
// barriers at ~1 us (~20 us when ranks outnumber cores is left to the table: it scales all
// algorithms alike) and ~4 GB/s per rank for the bytes each rank reads and writes. While the
// node's buffers fit in the last-level cache (`in_cache`), tiled's bytes count 2 + 1/P rather
// than the 3 + 1/P it touches: fitted to calls on input just written (the bench's --method
// fresh), where it was fastest from 4 KiB to 4 MiB at P = 2 (2-vCPU VM, 32 MiB L3) and from
// 1 KiB up at P = 8 and 16 (16-core Xeon); flat's reads of peers' fresh lines cost more than
// the count says, tiled reads each peer's line once. Beyond the cache every byte costs alike
// (flat was 1.4-1.7x faster at 16 MiB, P = 2, on the VM).
constexpr double barrier_s = 1e-6;
constexpr double byte_s = 1.0 / 4e9;

double builtin_cost(reduce_algorithm alg, int p, std::size_t bytes, bool eager, bool in_cache) {
  const double m = static_cast<double>(bytes), q = static_cast<double>(p);
  const double rounds = std::ceil(std::log2(std::max(q, 1.0)));
  switch (alg) {
    case reduce_algorithm::flat:  // (copy into the slot,) read P buffers, write one
      return eager ? barrier_s + (q + 2) * m * byte_s : 2 * barrier_s + (q + 1) * m * byte_s;
    case reduce_algorithm::tree:  // the root reads P buffers, then everyone copies its result
      return 2 * barrier_s + (q + 3) * m * byte_s;
    case reduce_algorithm::dissemination:  // 3 m per round, one more round when P is no power
      return (2 + rounds) * barrier_s + (3 * rounds + 2) * m * byte_s;
    case reduce_algorithm::tiled:  // read P tiles of m/P, write one; read and write m
      return 2 * barrier_s + ((in_cache ? 2 : 3) + 1 / q) * m * byte_s;
  }
  return INFINITY;
}

}  // namespace

void auto_policy::set_reduction_model(reduce_algorithm algorithm,
                                      std::vector<reduction_cost> pieces) {
  if (!is_code<reduce_algorithm>(static_cast<int>(algorithm)))
    throw std::invalid_argument("zcoll: unknown reduction algorithm code");
  for (const reduction_cost& c : pieces)
    if (!std::isfinite(c.a) || !std::isfinite(c.b) || c.a < 0 || c.b < 0)
      throw std::invalid_argument("zcoll: a reduction cost must be finite and non-negative");
  std::sort(pieces.begin(), pieces.end(), [](const reduction_cost& x, const reduction_cost& y) {
    return x.max_bytes < y.max_bytes;
  });
  reduction_models_[static_cast<std::size_t>(algorithm)] = std::move(pieces);
  chosen_bytes_ = SIZE_MAX;
}

double auto_policy::predicted(reduce_algorithm algorithm, std::size_t bytes) const noexcept {
  const auto& pieces = reduction_models_[static_cast<std::size_t>(algorithm)];
  if (pieces.empty()) {
    const bool in_cache = touched_bytes(bytes) <= copy_.cache_bytes() / 2;
    return builtin_cost(algorithm, node_size_, bytes, eager_fits(bytes), in_cache);
  }
  for (const reduction_cost& c : pieces)
    if (bytes <= c.max_bytes) return c.a + c.b * static_cast<double>(bytes);
  const reduction_cost& last = pieces.back();
  return last.a + last.b * static_cast<double>(bytes);
}

reduce_algorithm auto_policy::least_predicted(std::size_t bytes) const noexcept {
  auto best = reduce_algorithm::flat;
  double best_s = INFINITY;
  for (int i = 0; i < count_of<reduce_algorithm>; ++i) {
    const auto alg = static_cast<reduce_algorithm>(i);
    const double s = predicted(alg, bytes);
    if (s < best_s) best = alg, best_s = s;
  }
  return best;
}

}  // namespace zcoll
