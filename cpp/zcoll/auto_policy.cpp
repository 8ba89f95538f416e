#include "zcoll/auto_policy.hpp"

#include <time.h>

#include <stdexcept>

#include "zcoll/checks.hpp"

namespace zcoll {

double thread_cpu_seconds() noexcept {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

block_order default_order(int p, std::size_t block_bytes) noexcept {
  (void)block_bytes;
  return p <= 2 ? block_order::row : block_order::morton;
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
  auto_choice c{default_order(node_size_, block_bytes), eager_fits(recv_bytes), false};
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

}  // namespace zcoll
