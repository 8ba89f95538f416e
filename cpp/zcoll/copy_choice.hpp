/*
 * Copy choice: which copy mode a collective's block copies use (see copy.hpp).
 *
 * The caller may name a mode; "auto" follows HINT (§V-E, Alg. 4): a call whose data fits
 * in the last-level cache (what the node's ranks read and write together <= 3/4 of the LLC: the
 * rest holds code, other data and, on a VM, other tenants' lines; measured at P=2 on the
 * development VM, streaming already wins 1.2-1.4x when the data fills the whole 32 MiB), and blocks
 * smaller than the hybrid threshold T, are copied with ordinary stores (in cache, streaming
 * stores are slower: measured 21 GB/s against memcpy's 35-90 GB/s below 4 MiB on the
 * development VM), larger ones with the hybrid copy -- the first T bytes of each block temporal,
 * the rest streaming. T starts at L2 size / ranks per node and is refined at run time the way the
 * paper's get_runtime_threshold does: while halving T makes this rank's copies faster (per
 * byte, best of a few calls), halve it again (down to pure streaming); then keep the best. The
 * refinement is remembered per block-size class (powers of two) and is local to each rank:
 * copy modes change no result, so ranks need not agree on them.
 *
 * A tuning table (python -m zcoll.tune) may replace the built-in rule for ranges of block sizes,
 * per collective: a rule names a mode, and for "hybrid" either a fixed T (what the sweep found
 * fastest, no run-time refinement) or none (refine from T as above). Calls no rule covers, and
 * transfers, keep the built-in rule. Rules are a short sorted vector, searched only under "auto".
 */
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <vector>

#include "zcoll/copy.hpp"

namespace zcoll {

// Block sizes [min_block, max_block] (bytes per block, both ends included) a tuning rule covers.
struct block_range {
  std::size_t min_block = 0;
  std::size_t max_block = std::numeric_limits<std::size_t>::max();
  bool contains(std::size_t block) const noexcept {
    return min_block <= block && block <= max_block;
  }
};

// The rule of `rules` (sorted by min_block, disjoint) whose range holds `block`, or nullptr.
template <class Rule>
const Rule* find_rule(const std::vector<Rule>& rules, std::size_t block) noexcept {
  auto after = std::upper_bound(rules.begin(), rules.end(), block,
                                [](std::size_t b, const Rule& r) { return b < r.range.min_block; });
  if (after == rules.begin()) return nullptr;
  const Rule& r = *(after - 1);
  return r.range.contains(block) ? &r : nullptr;
}

// Sorts `rules` by range; throws std::invalid_argument when two ranges overlap or one is empty.
template <class Rule>
void sort_rules(std::vector<Rule>& rules) {
  std::sort(rules.begin(), rules.end(),
            [](const Rule& a, const Rule& b) { return a.range.min_block < b.range.min_block; });
  for (std::size_t i = 0; i < rules.size(); ++i) {
    if (rules[i].range.max_block < rules[i].range.min_block)
      throw std::invalid_argument("zcoll: a tuning rule has max_block < min_block");
    if (i && rules[i].range.min_block <= rules[i - 1].range.max_block)
      throw std::invalid_argument("zcoll: tuning rules overlap");
  }
}

// Rule tables: one per tuned collective (see tuned_index in registry.hpp).
inline constexpr int rule_tables = static_cast<int>(tuned_collectives.size());

// A tuning-table rule for copy="auto" on blocks in `range`.
struct copy_rule {
  block_range range;
  int mode = auto_copy;       // copy_mode value, or auto_copy for the built-in rule
  std::size_t threshold = 0;  // hybrid: T, when `fixed`
  bool fixed = false;         // hybrid: use `threshold` as is rather than refining from T
};

class copy_chooser {
 public:
  // T: the initial hybrid threshold in bytes (forgets what was learned).
  void set_threshold(std::size_t bytes);
  // The LLC size: calls moving at most 3/4 of it on the node stay temporal under "auto".
  void set_cache_bytes(std::size_t bytes) noexcept { cache_bytes_ = bytes; }
  std::size_t cache_bytes() const noexcept { return cache_bytes_; }

  // Replaces the rules of rule table `table` (sorted here; throws when they overlap).
  void set_rules(int table, std::vector<copy_rule> rules);

  // The plan for blocks of `block_bytes` in a call that touches `node_bytes` on the node, under
  // mode code `mode` (a copy_mode value or auto_copy) and the rules of `table` (or no_rules);
  // `tuning` is set when the call's copy time should be reported to record().
  copy_plan choose(int mode, std::size_t block_bytes, std::size_t node_bytes, bool* tuning,
                   int table = no_rules);
  // This rank copied `bytes` under `plan` in `seconds` (a call choose() marked as tuning).
  void record(std::size_t block_bytes, const copy_plan& plan, std::size_t bytes, double seconds);
  // The threshold "auto" settled on for blocks of `block_bytes`, or the one it is trying.
  std::size_t threshold_for(std::size_t block_bytes) const;
  // What "auto" uses now for such a call (like choose(), without starting any tuning).
  copy_plan peek(std::size_t block_bytes, std::size_t node_bytes, int table = no_rules) const;

 private:
  struct size_class {
    std::size_t candidate = 0;  // threshold being tried
    double candidate_cost = 0;  // best seconds per byte seen with it (0: none yet)
    int runs = 0;               // calls timed with it
    std::size_t best = 0;       // best threshold so far
    double best_cost = 0;       // its cost (0: none yet)
    bool settled = false;
  };
  static int class_of(std::size_t block_bytes) noexcept;
  bool fits_in_cache(std::size_t node_bytes) const noexcept {
    return node_bytes / 3 <= cache_bytes_ / 4;
  }
  const copy_rule* rule_for(int table, std::size_t block_bytes) const noexcept {
    if (table < 0 || rules_[table].empty()) return nullptr;
    const copy_rule* r = find_rule(rules_[table], block_bytes);
    return r && r->mode != auto_copy ? r : nullptr;
  }
  // The plan "auto" uses without refining T (a rule's fixed mode or threshold, or the built-in
  // temporal case), or nullopt when it refines T.
  std::optional<copy_plan> fixed_plan(int table, std::size_t block_bytes,
                                      std::size_t node_bytes) const noexcept;
  // The hybrid plan of blocks of `block_bytes` while refining T (starts refining if new).
  copy_plan refining(std::size_t block_bytes, bool* tuning);

  std::size_t threshold_ = std::size_t{256} << 10;
  std::size_t cache_bytes_ = 0;
  std::map<int, size_class> classes_;
  std::array<std::vector<copy_rule>, rule_tables> rules_;
};

}  // namespace zcoll
