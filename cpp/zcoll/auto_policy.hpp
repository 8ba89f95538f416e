/*
 * Auto policy: what order="auto" and copy="auto" resolve to for one call.
 *
 * Order: calls in which each rank receives at most the eager size take the eager path (two
 * copies, one barrier: what dominates small calls, far more so when ranks outnumber cores);
 * larger ones the built-in default_order (row for P <= 2, Morton otherwise). A tuning-table
 * rule (python -m zcoll.tune, set_rules) for the call's block size overrides this: its order,
 * or the eager path where the call fits it. Every rank of a node holds the same rules
 * (broadcast at context creation) and the same eager size, so they all resolve "auto" alike --
 * they must, since the order is part of what the ranks agree on.
 *
 * Copy: delegated to copy_chooser (copy_choice.hpp), which may differ between ranks (copy modes
 * change no result). timed_copies() runs a call's copies and feeds the chooser's run-time
 * threshold refinement when it asks for timings.
 */
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "zcoll/copy_choice.hpp"
#include "zcoll/registry.hpp"

namespace zcoll {

// A tuning-table rule for order="auto" on blocks in `range`.
struct order_rule {
  block_range range;
  int order = auto_order;  // block_order value, eager_order, or auto_order (built-in)
};

// What order="auto" resolves to for one call.
struct auto_choice {
  block_order order = block_order::row;  // the ordered schedule, also when `eager` is set
  bool eager = false;                    // take the eager path
  bool from_rule = false;                // a tuning rule decided (not the built-in rule)
};

// This thread's CPU time in seconds. The refinement times copies with it rather than the wall
// clock: a rank descheduled mid-copy (other processes on the node's cores) would otherwise
// decide the choice more than the copies do.
double thread_cpu_seconds() noexcept;

// Order used for order="auto" when no tuning table says otherwise.
block_order default_order(int p, std::size_t block_bytes) noexcept;

class auto_policy {
 public:
  explicit auto_policy(int node_size) noexcept : node_size_(node_size) {}

  // Calls receiving at most `bytes` per rank may take the eager path (0: never).
  void set_eager_bytes(std::size_t bytes) noexcept { eager_bytes_ = bytes; }
  std::size_t eager_bytes() const noexcept { return eager_bytes_; }
  bool eager_fits(std::size_t recv_bytes) const noexcept {
    return eager_bytes_ && recv_bytes <= eager_bytes_;
  }

  // The tuning rules of `op` (a tuned collective); throws std::invalid_argument for unknown
  // codes or overlapping ranges.
  void set_rules(op_code op, std::vector<order_rule> orders, std::vector<copy_rule> copies);
  // What order="auto" does for an `op` call with blocks of `block_bytes`, each rank receiving
  // `recv_bytes`.
  auto_choice resolve(op_code op, std::size_t block_bytes, std::size_t recv_bytes) const;

  // How this rank picks copy modes (threshold, what "auto" learned).
  copy_chooser& copy() noexcept { return copy_; }
  // What a call where each rank receives `received` bytes reads and writes on the node: the
  // receive buffers and as much source.
  std::size_t touched_bytes(std::size_t received) const noexcept {
    return 2 * received * static_cast<std::size_t>(node_size_);
  }

  // Runs `copies(plan)` with the plan the chooser picks for blocks of `block` bytes under mode
  // code `copy` in an `op` call where each rank receives `received` bytes, timed when "auto" is
  // still refining (`bytes`: what this rank copies; CPU time). `op`'s rules apply when it
  // is a tuned collective.
  template <class Copies>
  void timed_copies(op_code op, std::size_t block, int copy, std::size_t received,
                    std::size_t bytes, Copies&& copies) {
    bool tuning = false;
    const copy_plan how =
        copy_.choose(copy, block, touched_bytes(received), &tuning, tuned_index(op));
    if (!tuning) {
      copies(how);
      return;
    }
    const double start = thread_cpu_seconds();
    copies(how);
    store_fence();
    copy_.record(block, how, bytes, thread_cpu_seconds() - start);
  }

 private:
  int node_size_;
  std::size_t eager_bytes_ = 0;
  std::array<std::vector<order_rule>, rule_tables> order_rules_;  // by tuned_index
  copy_chooser copy_;
};

}  // namespace zcoll
