/*
 * Node barrier over shared memory.
 *
 * Every word lives in the context's control segment, one cache line per writer, and only ever
 * grows (sequence numbers are never reset), so a late reader can always tell which barrier a
 * value belongs to. Each rank's `entered` count sits in its hot line next to the descriptor of
 * the call it makes (see exchange.hpp): with the flat barrier, one cache-line transfer per peer
 * both synchronises and tells what the peer is calling.
 *
 * Waiting is tiered: a short busy poll (skipped when the node is oversubscribed: a spinning rank
 * would steal the core of the rank it waits for), then sched_yield, then a cross-process futex
 * sleep in short slices. After each slice the ranks that have not arrived yet are checked: a dead
 * process, or one that announced its departure (depart(): its interpreter is exiting, on an
 * uncaught exception or a signal), is reported at once, a live one when the configured timeout
 * has passed. Arrivals only pay for futex_wake when somebody sleeps; a departure wakes everyone.
 *
 * Algorithms (HPDC'13 §3): flat (default; P reads per rank, best for the P <= 64 of one node),
 * a central counter, and dissemination (log2 P rounds of pairwise flags).
 */
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zcoll/options.hpp"

namespace zcoll {

namespace detail {

inline constexpr int cache_line = 64;
inline constexpr int max_dissemination_rounds = 16;  // P <= 65536

// Shared by all ranks: the central barrier's counter and the futex words.
struct alignas(cache_line) barrier_shared {
  std::atomic<std::uint64_t> arrived;  // central: arrivals since the context was created
  char pad0[cache_line - sizeof(std::uint64_t)];
  std::atomic<std::uint32_t> generation;  // central: barriers completed (mod 2^32); futex word
  std::atomic<std::uint32_t> sleepers;    // ranks asleep on `generation` or `doorbell`
  std::atomic<std::uint32_t> doorbell;    // flat: bumped by an arrival that finds sleepers
  char pad1[cache_line - 3 * sizeof(std::uint32_t)];
  // Set by the first rank that gives up waiting (dead or missing peer): a rank that arrives
  // later must fail too rather than pass a barrier its peers have left. Written once.
  std::atomic<std::int32_t> gave_up;  // 0, or 1 + communicator rank of that rank
  char pad2[cache_line - sizeof(std::int32_t)];
};

inline constexpr std::size_t departure_text_bytes = cache_line - sizeof(std::int32_t);

// Per-rank words of the dissemination barrier, and the rank's departure notice.
struct alignas(cache_line) barrier_rank_words {
  std::atomic<std::uint32_t> sleepers;  // this rank asleep on one of its round flags
  char pad0[cache_line - sizeof(std::uint32_t)];
  std::atomic<std::uint32_t> round_flag[max_dissemination_rounds];  // signals received per round
  // 0 while the rank takes part; a departure_reason once it left (written once, after `why`).
  alignas(cache_line) std::atomic<std::int32_t> departed;
  char why[departure_text_bytes];  // NUL-terminated detail, e.g. the exception's type
};

// True when `pid` no longer runs (gone, or a zombie awaiting its parent).
bool process_is_dead(std::int32_t pid) noexcept;

}  // namespace detail

// Called by every wait after each sleep slice: true abandons the wait (wait_interrupted). The
// binding checks for Python's pending signals there, so that Ctrl-C reaches a rank blocked in
// a wait. Process-wide; none by default.
using interrupt_check = bool (*)();
void set_interrupt_check(interrupt_check check) noexcept;
// Runs the interrupt check, if any: true when it asks the current wait to be abandoned (for
// waits outside a node barrier, such as on MPI requests).
bool interrupt_requested();

// Why a rank left its contexts (see node_barrier::depart).
enum class departure_reason : std::int32_t {
  exited = 1,     // its interpreter exited (end of script, sys.exit) while it held the context
  exception = 2,  // an uncaught exception; the detail names its type
  signal = 3,     // a terminating signal (SIGTERM); the detail names it
};

// Called once per wait, just before a rank stops busy-polling and starts yielding or sleeping:
// the binding uses it to release the GIL only when a call really blocks.
struct block_hook {
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
  void operator()() const {
    if (fn) fn(arg);
  }
};

class node_barrier {
 public:
  // Node rank i announces its arrival at barrier k in entered[(2 * i + k % 2) * stride_words]
  // (two hot lines per rank, alternating by barrier parity, so a line can also carry what the
  // rank publishes at that barrier while the other one is still being read);
  // `comm_ranks[i]` is the communicator rank of node rank i, used in error messages, and
  // `pids[i]` its process, checked for liveness while waiting.
  node_barrier(detail::barrier_shared* shared, std::atomic<std::uint64_t>* entered,
               std::size_t stride_words, detail::barrier_rank_words* words, int rank, int size,
               std::vector<int> comm_ranks, std::vector<std::int32_t> pids, barrier_kind kind,
               wait_options options);

  // Blocks until every node rank has called wait() as often as this one. Everything this rank
  // wrote before is visible to every rank after. Throws peer_error naming the ranks that are
  // dead, or missing after options.timeout_s. The same as arrive() then complete().
  void wait() {
    arrive();
    complete();
  }
  // Split phase (a started persistent call): announce this rank's arrival at the next barrier
  // without waiting; complete() waits for the others, poll() tells whether they are all there
  // (it never blocks, and completes the barrier when they are). Between arrive() and the end of
  // complete() no other barrier may start.
  void arrive();
  void complete();
  bool poll();
  bool arrived() const noexcept { return pending_ != 0; }

  // Announces that this rank leaves: peers waiting for it (now or later) raise peer_error naming
  // it and `reason` at once instead of after the timeout. The first call counts. Only atomic
  // stores and futex wakes: safe in a signal handler.
  void depart(departure_reason reason, const char* text) noexcept;
  // The process of this rank, as given at construction.
  std::int32_t own_pid() const noexcept { return pids_[static_cast<std::size_t>(rank_)]; }
  // (pid, "left ..." or "died") of each peer that announced its departure or whose process is
  // gone, whether or not a barrier waits for it: what a wait outside the barrier (a new
  // communicator's agreement over MPI) asks to learn of a peer that will never come.
  std::vector<std::pair<std::int32_t, std::string>> gone_peers() const;

  std::uint64_t completed() const noexcept { return count_; }
  const wait_options& options() const noexcept { return options_; }
  void set_options(const wait_options& options) noexcept { options_ = options; }
  void set_block_hook(block_hook hook) noexcept { hook_ = hook; }

 private:
  std::atomic<std::uint64_t>& entered(int r, std::uint64_t k) const noexcept {
    return entered_[(2 * static_cast<std::size_t>(r) + (k & 1)) * stride_];
  }
  std::uint64_t arrivals(int r) const noexcept;  // barriers rank r has entered
  bool all_entered(std::uint64_t target);
  // Dissemination rounds from the current one; returns false instead of blocking when `block`
  // is not set and a round's signal has not come yet.
  bool progress_dissemination(std::uint64_t target, bool block);
  template <class Ready>
  void wait_until(Ready ready, std::atomic<std::uint32_t>& word,
                  std::atomic<std::uint32_t>& sleepers, std::uint64_t target);
  [[noreturn]] void raise_for_laggards(std::uint64_t target, bool timed_out);
  [[noreturn]] void abandon_interrupted();
  void check_nobody_gave_up() const;
  bool any_laggard_gone(std::uint64_t target) const;  // dead, or departed
  void wake_everyone() noexcept;

  detail::barrier_shared* shared_;
  std::atomic<std::uint64_t>* entered_;
  std::size_t stride_;
  detail::barrier_rank_words* words_;
  int rank_;
  int size_;
  std::vector<int> comm_ranks_;
  std::vector<std::int32_t> pids_;
  barrier_kind kind_;
  wait_options options_;
  std::uint64_t count_ = 0;    // barriers completed
  std::uint64_t pending_ = 0;  // the barrier arrived at and not yet completed (0: none)
  int flat_next_ = 0;          // flat: ranks below it are known to have arrived at `pending_`
  int round_ = 0;              // dissemination: the round in progress
  bool signalled_ = false;     // dissemination: this round's partner was signalled
  block_hook hook_;
};

// Wakes every futex sleeper on `word` (a no-op when nobody sleeps).
void wake_all(std::atomic<std::uint32_t>& word, std::atomic<std::uint32_t>& sleepers) noexcept;

}  // namespace zcoll
