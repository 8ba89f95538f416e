/*
 * Copy choice: which copy mode a collective's block copies use (see copy.hpp).
 *
 * The caller may name a mode; "auto" follows HINT (§V-E, Alg. 4): a call whose data all fits
 * in the last-level cache (what the node's ranks read and write together <= the LLC size), and blocks
 * smaller than the hybrid threshold T, are copied with ordinary stores (in cache, streaming
 * stores are slower: measured 21 GB/s against memcpy's 35-90 GB/s below 4 MiB on the
 * development VM), larger ones with the hybrid copy -- the first T bytes of each block temporal, the
 * rest streaming. T starts at L2 size / ranks per node and is refined at run time the way the
 * paper's get_runtime_threshold does: while halving T makes this rank's copies faster (per
 * byte, best of a few calls), halve it again (down to pure streaming); then keep the best. The
 * refinement is remembered per block-size class (powers of two) and is local to each rank:
 * copy modes change no result, so ranks need not agree on them.
 */
#pragma once

#include <cstddef>
#include <map>

#include "zcoll/copy.hpp"

namespace zcoll {

// Mode code meaning "auto" where modes travel as integers (copy_mode values otherwise).
inline constexpr int auto_copy = -1;

class copy_chooser {
 public:
  // T: the initial hybrid threshold in bytes (forgets what was learned).
  void set_threshold(std::size_t bytes);
  std::size_t threshold() const noexcept { return threshold_; }
  // Calls moving at most this many bytes on the node stay temporal under "auto" (the LLC).
  void set_cache_bytes(std::size_t bytes) noexcept { cache_bytes_ = bytes; }
  std::size_t cache_bytes() const noexcept { return cache_bytes_; }

  // The plan for blocks of `block_bytes` in a call that touches `node_bytes` on the node, under
  // mode code `mode` (a copy_mode value or auto_copy); `tuning` is set when the call's copy
  // time should be reported to record().
  copy_plan choose(int mode, std::size_t block_bytes, std::size_t node_bytes, bool* tuning);
  // This rank copied `bytes` under `plan` in `seconds` (a call choose() marked as tuning).
  void record(std::size_t block_bytes, const copy_plan& plan, std::size_t bytes, double seconds);
  // The threshold "auto" settled on for blocks of `block_bytes`, or the one it is trying.
  std::size_t threshold_for(std::size_t block_bytes) const;
  // What "auto" uses now for such a call (like choose(), without starting any tuning).
  copy_plan peek(std::size_t block_bytes, std::size_t node_bytes) const;

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

  std::size_t threshold_ = std::size_t{256} << 10;
  std::size_t cache_bytes_ = 0;
  std::map<int, size_class> classes_;
};

}  // namespace zcoll
