#include "zcoll/barrier.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "zcoll/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ZCOLL_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define ZCOLL_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define ZCOLL_CPU_RELAX() ((void)0)
#endif

namespace zcoll {

namespace detail {

bool process_is_dead(std::int32_t pid) noexcept {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  // A killed rank stays a zombie until its launcher reaps it; kill(pid, 0) still succeeds.
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  std::FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char line[512] = {};
  const bool got = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  if (!got) return false;
  const char* close_paren = std::strrchr(line, ')');
  return close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

}  // namespace detail

namespace {

using clock_type = std::chrono::steady_clock;

inline bool reached(std::uint32_t value, std::uint32_t target) noexcept {
  return static_cast<std::int32_t>(value - target) >= 0;
}

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, double seconds) noexcept {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(seconds);
  ts.tv_nsec = static_cast<long>((seconds - static_cast<double>(ts.tv_sec)) * 1e9);
  // Not FUTEX_PRIVATE: the word is shared between processes.
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr,
            0);
}

}  // namespace

void wake_all(std::atomic<std::uint32_t>& word, std::atomic<std::uint32_t>& sleepers) noexcept {
  if (sleepers.load(std::memory_order_seq_cst) != 0)
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr,
              nullptr, 0);
}

node_barrier::node_barrier(detail::barrier_shared* shared, std::atomic<std::uint64_t>* entered,
                           std::size_t stride_words, detail::barrier_rank_words* words, int rank,
                           int size, std::vector<int> comm_ranks, std::vector<std::int32_t> pids,
                           barrier_kind kind, wait_options options)
    : shared_(shared),
      entered_(entered),
      stride_(stride_words),
      words_(words),
      rank_(rank),
      size_(size),
      comm_ranks_(std::move(comm_ranks)),
      pids_(std::move(pids)),
      kind_(kind),
      options_(options) {
  if (kind_ == barrier_kind::dissemination && size_ > (1 << detail::max_dissemination_rounds))
    kind_ = barrier_kind::flat;
}

namespace {

std::atomic<interrupt_check> interrupt_check_{nullptr};

// "left (uncaught ZeroDivisionError)" and the like, for peer_error messages.
std::string departure_text(const detail::barrier_rank_words& w) {
  const auto reason = static_cast<departure_reason>(w.departed.load(std::memory_order_acquire));
  std::string text(w.why, ::strnlen(w.why, detail::departure_text_bytes));
  switch (reason) {
    case departure_reason::exception:
      return "left on an uncaught " + (text.empty() ? std::string("exception") : text);
    case departure_reason::signal:
      return "left on " + (text.empty() ? std::string("a signal") : text);
    case departure_reason::exited:
      break;
  }
  return "left (its Python interpreter exited" + (text.empty() ? "" : ": " + text) + ")";
}

}  // namespace

void node_barrier::check_nobody_gave_up() const {
  const std::int32_t who = shared_->gave_up.load(std::memory_order_acquire);
  if (who == 0) return;
  // Name the dead, if any: the rank that gave up saw them, and this one should say so too.
  std::ostringstream dead;
  int n_dead = 0;
  for (int r = 0; r < size_; ++r) {
    const auto pid = pids_[static_cast<std::size_t>(r)];
    if (r != rank_ && detail::process_is_dead(pid))
      dead << (n_dead++ ? ", " : "") << comm_ranks_[static_cast<std::size_t>(r)] << " (pid " << pid
           << ")";
  }
  std::string msg = "zcoll: rank " + std::to_string(comm_ranks_[static_cast<std::size_t>(rank_)]) +
                    ": peer rank " + std::to_string(who - 1) +
                    " gave up waiting on this communicator earlier (a rank died, left or did "
                    "not arrive in time); its zcoll context is unusable";
  if (n_dead) msg += "; peer rank(s) " + dead.str() + " died";
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && words_[r].departed.load(std::memory_order_acquire) != 0)
      msg += "; peer rank " + std::to_string(comm_ranks_[static_cast<std::size_t>(r)]) + " " +
             departure_text(words_[r]);
  throw peer_error(msg);
}

void node_barrier::arrive() {
  check_nobody_gave_up();
  const std::uint64_t target = count_ + 1;
  pending_ = target;
  flat_next_ = 0;
  round_ = 0;
  signalled_ = false;
  entered(rank_, target).store(target, std::memory_order_seq_cst);
  if (size_ == 1) return;
  switch (kind_) {
    case barrier_kind::flat:
      if (shared_->sleepers.load(std::memory_order_seq_cst) != 0) {
        shared_->doorbell.fetch_add(1, std::memory_order_seq_cst);
        wake_all(shared_->doorbell, shared_->sleepers);
      }
      break;
    case barrier_kind::central: {
      const std::uint64_t before = shared_->arrived.fetch_add(1, std::memory_order_acq_rel);
      if (before + 1 == target * static_cast<std::uint64_t>(size_)) {
        shared_->generation.store(static_cast<std::uint32_t>(target), std::memory_order_seq_cst);
        wake_all(shared_->generation, shared_->sleepers);
      }
      break;
    }
    case barrier_kind::dissemination:
      progress_dissemination(target, false);
      break;
  }
}

bool node_barrier::all_entered(std::uint64_t target) {
  for (; flat_next_ < size_; ++flat_next_)
    if (entered(flat_next_, target).load(std::memory_order_acquire) < target) return false;
  return true;
}

bool node_barrier::poll() {
  const std::uint64_t target = pending_;
  if (target == 0) return true;
  bool done = size_ == 1;
  if (!done) {
    switch (kind_) {
      case barrier_kind::flat:
        done = all_entered(target);
        break;
      case barrier_kind::central:
        done = reached(shared_->generation.load(std::memory_order_acquire),
                       static_cast<std::uint32_t>(target));
        break;
      case barrier_kind::dissemination:
        done = progress_dissemination(target, false);
        break;
    }
  }
  if (!done) {  // as wait_until does after each sleep, without the deadline
    if (shared_->gave_up.load(std::memory_order_acquire) != 0) raise_for_laggards(target, true);
    if (any_laggard_gone(target)) raise_for_laggards(target, false);
    return false;
  }
  count_ = target;
  pending_ = 0;
  return true;
}

void node_barrier::complete() {
  const std::uint64_t target = pending_;
  if (target == 0) return;
  if (size_ > 1) {
    switch (kind_) {
      case barrier_kind::flat:
        wait_until([&] { return all_entered(target); }, shared_->doorbell, shared_->sleepers,
                   target);
        break;
      case barrier_kind::central: {
        auto& word = shared_->generation;
        const auto gen = static_cast<std::uint32_t>(target);
        wait_until([&] { return reached(word.load(std::memory_order_acquire), gen); }, word,
                   shared_->sleepers, target);
        break;
      }
      case barrier_kind::dissemination:
        progress_dissemination(target, true);
        break;
    }
  }
  count_ = target;
  pending_ = 0;
}

bool node_barrier::progress_dissemination(std::uint64_t target, bool block) {
  const auto gen = static_cast<std::uint32_t>(target);
  auto& mine = words_[rank_];
  for (; (1 << round_) < size_; ++round_, signalled_ = false) {
    if (!signalled_) {
      auto& partner = words_[(rank_ + (1 << round_)) % size_];
      partner.round_flag[round_].fetch_add(1, std::memory_order_seq_cst);
      wake_all(partner.round_flag[round_], partner.sleepers);
      signalled_ = true;
    }
    auto& flag = mine.round_flag[round_];
    auto ready = [&] { return reached(flag.load(std::memory_order_acquire), gen); };
    if (ready()) continue;
    if (!block) return false;
    wait_until(ready, flag, mine.sleepers, target);
  }
  return true;
}

template <class Ready>
void node_barrier::wait_until(Ready ready, std::atomic<std::uint32_t>& word,
                              std::atomic<std::uint32_t>& sleepers, std::uint64_t target) {
  for (std::uint32_t i = 0; i < options_.spin_iterations; ++i) {
    if (ready()) return;
    ZCOLL_CPU_RELAX();
  }
  hook_();
  for (std::uint32_t i = 0; i < options_.yield_iterations; ++i) {
    if (ready()) return;
    ::sched_yield();
  }
  const auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                std::chrono::duration<double>(options_.timeout_s));
  for (;;) {
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t seen = word.load(std::memory_order_seq_cst);
    if (!ready()) futex_wait(word, seen, options_.sleep_slice_s);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (ready()) return;
    if (const auto check = interrupt_check_.load(std::memory_order_relaxed); check && check())
      abandon_interrupted();
    // A peer already gave up on the same laggards: report them now rather than wait it out.
    if (shared_->gave_up.load(std::memory_order_acquire) != 0) raise_for_laggards(target, true);
    if (any_laggard_gone(target)) raise_for_laggards(target, false);
    if (clock_type::now() >= deadline) raise_for_laggards(target, true);
  }
}

std::uint64_t node_barrier::arrivals(int r) const noexcept {
  return std::max(entered(r, 0).load(std::memory_order_acquire),
                  entered(r, 1).load(std::memory_order_acquire));
}

std::vector<std::pair<std::int32_t, std::string>> node_barrier::gone_peers() const {
  std::vector<std::pair<std::int32_t, std::string>> gone;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const auto pid = pids_[static_cast<std::size_t>(r)];
    if (words_[r].departed.load(std::memory_order_acquire) != 0)
      gone.emplace_back(pid, departure_text(words_[r]));
    else if (detail::process_is_dead(pid))
      gone.emplace_back(pid, "died");
  }
  return gone;
}

bool node_barrier::any_laggard_gone(std::uint64_t target) const {
  for (int r = 0; r < size_; ++r) {
    if (arrivals(r) >= target) continue;
    const bool gone = words_[r].departed.load(std::memory_order_acquire) != 0 ||
                      detail::process_is_dead(pids_[static_cast<std::size_t>(r)]);
    // A peer that arrived, left the barrier and exited between the two looks is no laggard:
    // its arrival counts, and the next barrier finds it gone.
    if (gone && arrivals(r) < target) return true;
  }
  return false;
}

void set_interrupt_check(interrupt_check check) noexcept {
  interrupt_check_.store(check, std::memory_order_relaxed);
}

bool interrupt_requested() {
  const auto check = interrupt_check_.load(std::memory_order_relaxed);
  return check && check();
}

void node_barrier::abandon_interrupted() {
  // This rank leaves a barrier it may already have entered: its peers must not go on past it.
  std::int32_t none = 0;
  shared_->gave_up.compare_exchange_strong(none, comm_ranks_[static_cast<std::size_t>(rank_)] + 1,
                                           std::memory_order_acq_rel);
  wake_everyone();
  throw wait_interrupted("zcoll: rank " +
                         std::to_string(comm_ranks_[static_cast<std::size_t>(rank_)]) +
                         ": a wait was interrupted by a signal; this communicator's zcoll "
                         "context is unusable");
}

void node_barrier::depart(departure_reason reason, const char* text) noexcept {
  auto& mine = words_[rank_];
  if (mine.departed.load(std::memory_order_acquire) != 0) return;
  std::size_t n = 0;
  for (; text != nullptr && text[n] != '\0' && n + 1 < detail::departure_text_bytes; ++n)
    mine.why[n] = text[n];
  mine.why[n] = '\0';
  mine.departed.store(static_cast<std::int32_t>(reason), std::memory_order_seq_cst);
  wake_everyone();
}

void node_barrier::wake_everyone() noexcept {
  shared_->doorbell.fetch_add(1, std::memory_order_seq_cst);
  wake_all(shared_->doorbell, shared_->sleepers);
  wake_all(shared_->generation, shared_->sleepers);
  for (int r = 0; r < size_; ++r)
    for (auto& flag : words_[r].round_flag) wake_all(flag, words_[r].sleepers);
}

void node_barrier::raise_for_laggards(std::uint64_t target, bool timed_out) {
  std::int32_t none = 0;
  shared_->gave_up.compare_exchange_strong(none, comm_ranks_[static_cast<std::size_t>(rank_)] + 1,
                                           std::memory_order_acq_rel);
  wake_everyone();  // sleepers must fail too
  std::ostringstream dead, missing, left;
  int n_dead = 0, n_missing = 0;
  for (int r = 0; r < size_; ++r) {
    if (arrivals(r) >= target) continue;
    const auto pid = pids_[static_cast<std::size_t>(r)];
    const auto who = comm_ranks_[static_cast<std::size_t>(r)];
    if (words_[r].departed.load(std::memory_order_acquire) != 0) {
      left << (left.tellp() > 0 ? "; " : "") << "peer rank " << who << " (pid " << pid << ") "
           << departure_text(words_[r]);
      continue;
    }
    const bool is_dead = detail::process_is_dead(pid);
    auto& out = is_dead ? dead : missing;
    int& n = is_dead ? n_dead : n_missing;
    out << (n++ ? ", " : "") << who << " (pid " << pid << ")";
  }
  std::ostringstream msg;
  msg << "zcoll: rank " << comm_ranks_[static_cast<std::size_t>(rank_)] << ": ";
  const bool any_left = left.tellp() > 0;
  if (any_left) msg << left.str();
  if (any_left && n_dead) msg << "; ";
  if (n_dead) msg << "peer rank(s) " << dead.str() << " died";
  if ((any_left || n_dead) && n_missing) msg << "; ";
  if (n_missing)
    msg << "peer rank(s) " << missing.str() << " did not arrive"
        << (timed_out ? " within the timeout" : "");
  if (!any_left && !n_dead && !n_missing) msg << "a peer stopped participating";
  if (n_missing || !(any_left || n_dead))
    msg << " (waited up to " << options_.timeout_s
        << " s; set ZCOLL_TIMEOUT or zcoll.set_timeout to change the bound)";
  throw peer_error(msg.str());
}

}  // namespace zcoll
