/*
 * Copy choice: which copy mode a collective's block copies use (see copy.hpp).
 *
 * The caller may name a mode; "auto" follows HINT (§V-E, Alg. 4) with one addition: ordinary
 * stores stay a candidate to the end, so "auto" never settles on a mode slower than them.
 *
 * Fixed part: a call whose data (what the node's ranks read and write together) fills at most
 * half of the last-level cache, and blocks smaller than the hybrid threshold T, are copied with
 * ordinary stores. Measured on the development VM (python -m zcoll.bench crossover; 1 MiB L2,
 * 32 MiB L3; 27-39 runs a point): at 1/2 LLC ordinary stores were the fastest mode in 35 of 39
 * runs at P = 1 (the hybrid copy 1.14x slower, median) and in 27 of 27 at P = 2 (1.43x). The
 * crossover lay near 0.6 LLC at P = 1 (a tie at 5/8; the hybrid copy 1.2x faster at 3/4) and
 * between 1 and 5/4 LLC at P = 2 (ordinary stores fastest in 25 of 39 runs at 1, 2 of 12 at
 * 5/4), and it moves with the load on the VM's shared cache and memory (hybrid / temporal
 * ranged over 0.50-1.51 at P = 2, 4 MiB blocks): beyond 1/2 LLC, measure.
 *
 * Run-time part, everywhere else, on the first calls of each size class: ordinary stores, then
 * HINT's get_runtime_threshold. Ordinary stores (T = the whole block) are timed first, over
 * more calls than the others need (their calls speed up one by one as the data settles into
 * the cache). Then the hybrid copy (the first T bytes of each block temporal, the rest
 * streaming) from T = L2 size / ranks per node, halved while that makes this rank's copies 3%
 * faster (CPU seconds per byte, best of a few calls), down to pure streaming. Its best is kept
 * only if it beats ordinary stores by 3%, and again when they are timed a second time, so in
 * the uncertain band auto settles on whichever the machine favours now. What was learned is
 * kept per size class (quarter octaves of the block size: at P = 2 ordinary stores won at 4 MiB
 * blocks and lost 1.3x at 6 MiB) and is local to each rank: copy modes change no result, so
 * ranks need not agree on them. Bounded: at most log2(T / 4 KiB) + 2 hybrid candidates of 3
 * timed calls, and 16 or 32 with ordinary stores.
 *
 * A tuning table (python -m zcoll.tune) may replace the built-in rule for ranges of block sizes,
 * per collective: a rule names a mode, and for "hybrid" either a fixed T (what the sweep found
 * fastest, no run-time refinement) or none (the run-time part above). Calls no rule covers, and
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
  // The LLC size: calls moving at most half of it on the node stay temporal under "auto".
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
  // The threshold "auto" settled on for blocks of `block_bytes`, or the one it is trying
  // (`block_bytes` for ordinary stores: T = the whole block); T for sizes it has not seen.
  std::size_t threshold_for(std::size_t block_bytes) const;
  // What "auto" uses now for such a call (like choose(), without starting any tuning).
  copy_plan peek(std::size_t block_bytes, std::size_t node_bytes, int table = no_rules) const;

 private:
  // Threshold of the all-temporal candidate: T = the whole block.
  static constexpr std::size_t whole_block = std::numeric_limits<std::size_t>::max();
  struct size_class {
    std::size_t candidate = whole_block;  // threshold being tried, or settled on
    double candidate_cost = 0;            // best seconds per byte seen with it
    int runs = 0;                         // calls timed with it
    double temporal_cost = 0;             // ordinary stores' cost (0: not timed yet)
    std::size_t hybrid = 0;               // fastest threshold of the halving sequence so far
    double hybrid_cost = 0;               // its cost (0: none yet)
    bool settled = false;
  };
  static int class_of(std::size_t block_bytes) noexcept;
  static copy_plan plan_of(std::size_t threshold) noexcept {
    return threshold == whole_block ? copy_plan{copy_mode::temporal, 0}
                                    : copy_plan{copy_mode::hybrid, threshold};
  }
  bool fits_in_cache(std::size_t node_bytes) const noexcept {
    return node_bytes <= cache_bytes_ / 2;
  }
  const copy_rule* rule_for(int table, std::size_t block_bytes) const noexcept {
    if (table < 0 || rules_[table].empty()) return nullptr;
    const copy_rule* r = find_rule(rules_[table], block_bytes);
    return r && r->mode != auto_copy ? r : nullptr;
  }
  // Takes the timing of the candidate a class has tried its number of times: the next
  // candidate, or settles.
  void advance(size_class& c) const noexcept;
  // The plan "auto" uses without refining T (a rule's fixed mode or threshold, or the built-in
  // temporal case), or nullopt when it refines T.
  std::optional<copy_plan> fixed_plan(int table, std::size_t block_bytes,
                                      std::size_t node_bytes) const noexcept;
  // The plan of blocks of `block_bytes` under the run-time refinement (starts it if new).
  copy_plan refined(std::size_t block_bytes, bool* tuning);

  std::size_t threshold_ = std::size_t{256} << 10;
  std::size_t cache_bytes_ = 0;
  std::map<int, size_class> classes_;
  std::array<std::vector<copy_rule>, rule_tables> rules_;
};

}  // namespace zcoll
