#include "zcoll/departure.hpp"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <array>
#include <atomic>

namespace zcoll {

namespace {

constexpr std::size_t max_watched = 1024;  // live contexts of one process
constexpr int max_signal = 65;

std::array<std::atomic<node_barrier*>, max_watched> watched{};
std::array<struct sigaction, max_signal> previous{};
std::array<std::atomic<bool>, max_signal> installed{};

// Writes "SIGTERM" (or "signal N") into out, without allocating.
void signal_name(int signo, char (&out)[32]) noexcept {
  const char* abbrev = ::sigabbrev_np(signo);
  if (abbrev != nullptr) {
    ::strcpy(out, "SIG");
    ::strncat(out, abbrev, sizeof(out) - 4);
    return;
  }
  ::strcpy(out, "signal ");
  char digits[12];
  int n = 0;
  for (int v = signo; v > 0 && n < 11; v /= 10) digits[n++] = static_cast<char>('0' + v % 10);
  std::size_t at = ::strlen(out);
  while (n > 0 && at + 1 < sizeof(out)) out[at++] = digits[--n];
  out[at] = '\0';
}

void on_signal(int signo, siginfo_t* info, void* context) {
  char name[32];
  signal_name(signo, name);
  depart_everywhere(departure_reason::signal, name);
  const struct sigaction& before = previous[static_cast<std::size_t>(signo)];
  if (before.sa_flags & SA_SIGINFO) {
    if (before.sa_sigaction != nullptr) before.sa_sigaction(signo, info, context);
    return;
  }
  if (before.sa_handler == SIG_IGN) return;
  if (before.sa_handler == SIG_DFL) {
    // The default action, as if this handler had never been there: delivered again on return
    // (the signal is blocked while its handler runs).
    ::signal(signo, SIG_DFL);
    ::raise(signo);
    return;
  }
  before.sa_handler(signo);
}

}  // namespace

bool watch_departure(node_barrier* barrier) noexcept {
  for (auto& slot : watched) {
    node_barrier* empty = nullptr;
    if (slot.compare_exchange_strong(empty, barrier, std::memory_order_acq_rel)) return true;
  }
  return false;
}

void unwatch_departure(node_barrier* barrier) noexcept {
  for (auto& slot : watched) {
    node_barrier* mine = barrier;
    if (slot.compare_exchange_strong(mine, nullptr, std::memory_order_acq_rel)) return;
  }
}

void depart_everywhere(departure_reason reason, const char* text) noexcept {
  // A forked child inherits its parent's registry (and mappings): it must not speak for it.
  const std::int32_t me = ::getpid();
  for (auto& slot : watched) {
    node_barrier* b = slot.load(std::memory_order_acquire);
    if (b != nullptr && b->own_pid() == me) b->depart(reason, text);
  }
}

bool install_departure_handler(int signo) noexcept {
  if (signo <= 0 || signo >= max_signal) return false;
  if (installed[static_cast<std::size_t>(signo)].exchange(true)) return true;
  struct sigaction action{};
  action.sa_sigaction = on_signal;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  ::sigemptyset(&action.sa_mask);
  if (::sigaction(signo, &action, &previous[static_cast<std::size_t>(signo)]) != 0) {
    installed[static_cast<std::size_t>(signo)] = false;
    return false;
  }
  return true;
}

}  // namespace zcoll
