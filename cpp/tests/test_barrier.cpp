// Node barrier (barrier.hpp) on a control area in shared memory, with threads and with forked
// processes: nobody passes barrier k before everybody arrived at it, a missing participant is
// reported after the timeout, and a killed one at once (liveness by pid).
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "test_util.hpp"
#include "zcoll/arena.hpp"
#include "zcoll/barrier.hpp"
#include "zcoll/error.hpp"

using zcoll::barrier_kind;
using zcoll::node_barrier;
using zcoll::wait_options;

namespace {

constexpr int max_ranks = 8;
constexpr int max_rounds = 1024;
constexpr std::size_t stride_words = zcoll::detail::cache_line / sizeof(std::uint64_t);
constexpr barrier_kind all_kinds[] = {barrier_kind::flat, barrier_kind::central,
                                      barrier_kind::dissemination};

const char* kind_name(barrier_kind k) {
  switch (k) {
    case barrier_kind::flat:
      return "flat";
    case barrier_kind::central:
      return "central";
    case barrier_kind::dissemination:
      return "dissemination";
  }
  return "?";
}

// The control area the way node_context lays it out: the shared words, two hot lines per rank,
// the per-rank dissemination words; then what the tests use to watch the participants.
struct control_area {
  zcoll::detail::barrier_shared shared;
  alignas(64) std::atomic<std::uint64_t> entered[2 * max_ranks * stride_words];
  zcoll::detail::barrier_rank_words words[max_ranks];
  // Test bookkeeping: arrivals per round (relaxed: only the barrier orders them), start flag and
  // the participants' pids.
  alignas(64) std::atomic<std::uint32_t> arrived[max_rounds + 2];
  std::atomic<std::int32_t> pids[max_ranks];
  std::atomic<std::uint32_t> go;
};

// A control area in a fresh shared segment, unlinked at once (forked children inherit the
// mapping; nothing can leak in /dev/shm).
struct shared_area {
  shared_area() : shm(zcoll::shm_segment::create(sizeof(control_area))) {
    shm->unlink();
    area = new (shm->data()) control_area{};
  }
  std::shared_ptr<zcoll::shm_segment> shm;
  control_area* area;
};

node_barrier make_barrier(control_area* a, int rank, int size, barrier_kind kind,
                          const wait_options& options, std::vector<std::int32_t> pids,
                          std::vector<int> comm_ranks = {}) {
  if (comm_ranks.empty())
    for (int r = 0; r < size; ++r) comm_ranks.push_back(r);
  return node_barrier(&a->shared, a->entered, stride_words, a->words, rank, size,
                      std::move(comm_ranks), std::move(pids), kind, options);
}

wait_options quick(double timeout_s, std::uint32_t spin = 64, std::uint32_t yield = 16) {
  wait_options w;
  w.timeout_s = timeout_s;
  w.spin_iterations = spin;
  w.yield_iterations = yield;
  w.sleep_slice_s = 0.01;
  return w;
}

// One participant's rounds: announce arrival at round k (relaxed), pass the barrier, then
// everybody must have arrived at k. Returns 0, or the first round that went wrong.
int run_rounds(node_barrier& b, control_area* a, int size, int rounds) {
  for (int k = 1; k <= rounds; ++k) {
    a->arrived[k].fetch_add(1, std::memory_order_relaxed);
    b.wait();
    if (a->arrived[k].load(std::memory_order_relaxed) != static_cast<std::uint32_t>(size)) return k;
    if (b.completed() != static_cast<std::uint64_t>(k)) return k;
  }
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("barrier: control area layout is cache-line padded") {
  CHECK(sizeof(zcoll::detail::barrier_shared) == 3 * zcoll::detail::cache_line);
  CHECK(alignof(zcoll::detail::barrier_shared) == zcoll::detail::cache_line);
  CHECK(sizeof(zcoll::detail::barrier_rank_words) % zcoll::detail::cache_line == 0);
  CHECK(std::atomic<std::uint64_t>::is_always_lock_free);
  CHECK(std::atomic<std::uint32_t>::is_always_lock_free);
}

TEST_CASE("barrier: one participant never waits") {
  for (barrier_kind kind : all_kinds) {
    shared_area s;
    auto b = make_barrier(s.area, 0, 1, kind, quick(0.05), {::getpid()});
    for (int k = 1; k <= 100; ++k) b.wait();
    CHECK(b.completed() == 100);
    CHECK(b.options().timeout_s == doctest::Approx(0.05));
  }
}

TEST_CASE("barrier: threads never pass a round early") {
  for (barrier_kind kind : all_kinds) {
    for (int n = 1; n <= 6; ++n) {
      // Busy-poll first, and futex only (no spinning, no yielding).
      for (std::uint32_t spin : {256u, 0u}) {
        INFO(kind_name(kind) << " N=" << n << " spin=" << spin);
        shared_area s;
        const int rounds = spin ? 300 : 100;
        std::vector<int> result(static_cast<std::size_t>(n), -1);
        std::vector<std::thread> threads;
        for (int r = 0; r < n; ++r)
          threads.emplace_back([&, r] {
            try {
              auto b =
                  make_barrier(s.area, r, n, kind, quick(2.0, spin, spin ? 16 : 0),
                               std::vector<std::int32_t>(static_cast<std::size_t>(n), ::getpid()));
              result[static_cast<std::size_t>(r)] = run_rounds(b, s.area, n, rounds);
            } catch (const std::exception&) {
              result[static_cast<std::size_t>(r)] = -2;
            }
          });
        for (auto& t : threads) t.join();
        const bool ok = std::all_of(result.begin(), result.end(), [](int v) { return v == 0; });
        CHECK(ok);
        if (!ok) return;  // one broken configuration is enough (and each costs a timeout)
      }
    }
  }
}

TEST_CASE("barrier: forked processes never pass a round early") {
  for (barrier_kind kind : all_kinds) {
    for (int n = 1; n <= 6; ++n) {
      INFO(kind_name(kind) << " N=" << n);
      shared_area s;
      control_area* a = s.area;
      constexpr int rounds = 200;
      std::vector<pid_t> kids;
      for (int r = 0; r < n; ++r)
        kids.push_back(zcoll_test::fork_child([a, r, n, kind] {
          // Wait (bounded) for the parent to publish every participant's pid.
          const auto t0 = std::chrono::steady_clock::now();
          while (a->go.load(std::memory_order_acquire) == 0)
            if (seconds_since(t0) > 5.0) return 90;
          std::vector<std::int32_t> pids;
          for (int i = 0; i < n; ++i) pids.push_back(a->pids[i].load());
          auto b = make_barrier(a, r, n, kind, quick(2.0), pids);
          const int bad = run_rounds(b, a, n, rounds);
          return bad ? 1 : 0;
        }));
      for (int r = 0; r < n; ++r) a->pids[r].store(kids[static_cast<std::size_t>(r)]);
      a->go.store(1, std::memory_order_release);
      bool ok = true;
      for (pid_t pid : kids) {
        const int code = zcoll_test::wait_child(pid, 20.0);
        CHECK(code == 0);
        ok = ok && code == 0;
      }
      if (!ok) return;
    }
  }
}

TEST_CASE("barrier: a missing participant is reported after the timeout") {
  for (barrier_kind kind : all_kinds) {
    INFO(kind_name(kind));
    shared_area s;
    constexpr int n = 3;
    const double timeout = 0.2;
    const std::vector<int> comm = {10, 11, 12};  // error messages use communicator ranks
    const std::vector<std::int32_t> pids(n, ::getpid());
    std::vector<std::string> message(n);
    std::vector<double> took(n, -1);
    auto participant = [&](int r) {
      auto b = make_barrier(s.area, r, n, kind, quick(timeout), pids, comm);
      b.wait();  // round 1: everybody
      const auto t0 = std::chrono::steady_clock::now();
      try {
        b.wait();  // round 2: rank 2 stays away
      } catch (const zcoll::peer_error& e) {
        message[static_cast<std::size_t>(r)] = e.what();
      }
      took[static_cast<std::size_t>(r)] = seconds_since(t0);
    };
    std::thread t0(participant, 0), t1(participant, 1);
    auto late = make_barrier(s.area, 2, n, kind, quick(timeout), pids, comm);
    late.wait();
    t0.join();
    t1.join();
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << ": " << message[static_cast<std::size_t>(r)]);
      CHECK(message[static_cast<std::size_t>(r)].find("12 (pid " + std::to_string(::getpid())) !=
            std::string::npos);
      CHECK(message[static_cast<std::size_t>(r)].find("did not arrive") != std::string::npos);
      CHECK(took[static_cast<std::size_t>(r)] < timeout + 1.5);
    }
    // At least the first one to give up waited the whole timeout (the other may follow it early).
    CHECK(std::max(took[0], took[1]) >= timeout * 0.9);
    // Whoever gave up is recorded: a rank arriving later fails at once instead of passing.
    const int who = s.area->shared.gave_up.load();
    CHECK((who == 11 || who == 12));
    const auto t_late = std::chrono::steady_clock::now();
    try {
      late.wait();
      FAIL_CHECK("the late rank passed a barrier its peers had left");
    } catch (const zcoll::peer_error& e) {
      CHECK(std::string(e.what()).find("gave up waiting") != std::string::npos);
    }
    CHECK(seconds_since(t_late) < 0.1);
  }
}

TEST_CASE("barrier: a killed process is detected as dead before the timeout") {
  for (barrier_kind kind : all_kinds) {
    for (bool reap_first : {false, true}) {  // a zombie, and a process gone for good
      INFO(kind_name(kind) << (reap_first ? " reaped" : " zombie"));
      shared_area s;
      control_area* a = s.area;
      constexpr int n = 3, rounds = 20;
      const double timeout = 4.0;
      // Rank 0 is this process, rank 1 gets killed, rank 2 survives and must fail too.
      a->pids[0].store(::getpid());
      auto child = [a, kind, timeout](int r) {
        const auto t0 = std::chrono::steady_clock::now();
        while (a->go.load(std::memory_order_acquire) == 0)
          if (seconds_since(t0) > 5.0) return 90;
        std::vector<std::int32_t> pids;
        for (int i = 0; i < n; ++i) pids.push_back(a->pids[i].load());
        auto b = make_barrier(a, r, n, kind, quick(timeout), pids);
        if (run_rounds(b, a, n, rounds) != 0) return 1;
        if (r == 1) {
          ::pause();  // killed here
          return 2;
        }
        const auto t1 = std::chrono::steady_clock::now();
        try {
          b.wait();
        } catch (const zcoll::peer_error&) {
          return seconds_since(t1) < timeout / 2 ? 0 : 3;
        }
        return 4;
      };
      const pid_t victim = zcoll_test::fork_child([&] { return child(1); });
      const pid_t survivor = zcoll_test::fork_child([&] { return child(2); });
      a->pids[1].store(victim);
      a->pids[2].store(survivor);
      a->go.store(1, std::memory_order_release);
      auto b = make_barrier(a, 0, n, kind, quick(timeout), {::getpid(), victim, survivor});
      const bool rounds_ok = run_rounds(b, a, n, rounds) == 0;
      CHECK(rounds_ok);
      CHECK(::kill(victim, SIGKILL) == 0);
      if (reap_first) CHECK(zcoll_test::wait_child(victim, 5.0) == -2);
      const auto t0 = std::chrono::steady_clock::now();
      std::string message;
      try {
        b.wait();
      } catch (const zcoll::peer_error& e) {
        message = e.what();
      }
      const double took = seconds_since(t0);
      INFO(message);
      // Rank 2 may meet rank 1's death first and leave: then both are named as dead,
      // "peer rank(s) 1 (pid A), 2 (pid B) died".
      const std::size_t dead_list = message.find("peer rank(s) ");
      const std::size_t victim_at = message.find("1 (pid " + std::to_string(victim) + ")");
      const bool named = dead_list != std::string::npos && victim_at != std::string::npos &&
                         victim_at > dead_list &&
                         message.find(" died", victim_at) != std::string::npos;
      CHECK(named);
      CHECK(took < 2.0);
      if (!reap_first) CHECK(zcoll_test::wait_child(victim, 5.0) == -2);
      const int survivor_code = zcoll_test::wait_child(survivor, 10.0);
      CHECK(survivor_code == 0);
      if (!(rounds_ok && named && took < 2.0 && survivor_code == 0)) return;
    }
  }
}

TEST_CASE("barrier: process_is_dead") {
  CHECK_FALSE(zcoll::detail::process_is_dead(::getpid()));
  CHECK_FALSE(zcoll::detail::process_is_dead(0));  // unknown pid: never reported dead
  CHECK_FALSE(zcoll::detail::process_is_dead(-1));
  const pid_t kid = zcoll_test::fork_child([] { return 0; });
  // Exited but not reaped: a zombie counts as dead.
  const auto t0 = std::chrono::steady_clock::now();
  while (!zcoll::detail::process_is_dead(kid) && seconds_since(t0) < 5.0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(zcoll::detail::process_is_dead(kid));
  CHECK(zcoll_test::wait_child(kid) == 0);
  CHECK(zcoll::detail::process_is_dead(kid));  // reaped: ESRCH
}

TEST_CASE("barrier: the block hook runs only when a wait really blocks") {
  for (barrier_kind kind : all_kinds) {
    INFO(kind_name(kind));
    shared_area s;
    constexpr int n = 2;
    const std::vector<std::int32_t> pids(n, ::getpid());
    int hooks = 0;
    auto b0 = make_barrier(s.area, 0, n, kind, quick(5.0, 0, 0), pids);
    b0.set_block_hook({[](void* p) { ++*static_cast<int*>(p); }, &hooks});
    std::thread other([&] {
      auto b1 = make_barrier(s.area, 1, n, kind, quick(5.0, 0, 0), pids);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      b1.wait();
    });
    b0.wait();
    other.join();
    CHECK(hooks >= 1);
    // Alone, nobody blocks.
    shared_area solo;
    int solo_hooks = 0;
    auto b = make_barrier(solo.area, 0, 1, kind, quick(5.0, 0, 0), {::getpid()});
    b.set_block_hook({[](void* p) { ++*static_cast<int*>(p); }, &solo_hooks});
    b.wait();
    CHECK(solo_hooks == 0);
  }
}

TEST_CASE("barrier: set_options changes the bound of later waits") {
  shared_area s;
  auto b = make_barrier(s.area, 0, 2, barrier_kind::central, quick(60.0), {::getpid(), ::getpid()});
  b.set_options(quick(0.1));
  CHECK(b.options().timeout_s == doctest::Approx(0.1));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(b.wait(), zcoll::peer_error);
  CHECK(seconds_since(t0) < 1.5);
}

TEST_CASE("barrier: split phase (arrive, poll, complete) never completes early") {
  for (barrier_kind kind : all_kinds) {
    for (int n : {2, 3, 5}) {
      INFO(kind_name(kind) << " N=" << n);
      shared_area s;
      std::vector<std::int32_t> pids(static_cast<std::size_t>(n), ::getpid());
      constexpr int rounds = 200;
      std::atomic<int> bad_round{0};
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r) {
        threads.emplace_back([&, r] {
          auto b = make_barrier(s.area, r, n, kind, quick(10.0), pids);
          for (int k = 1; k <= rounds; ++k) {
            s.area->arrived[k].fetch_add(1, std::memory_order_relaxed);
            b.arrive();
            if (!b.arrived()) bad_round = k;
            // Odd ranks poll until done, even ranks block in complete().
            if (r % 2) {
              while (!b.poll()) std::this_thread::yield();
            } else {
              b.complete();
            }
            if (b.arrived() || b.completed() != static_cast<std::uint64_t>(k) ||
                s.area->arrived[k].load(std::memory_order_relaxed) != static_cast<std::uint32_t>(n))
              bad_round = k;
          }
        });
      }
      for (auto& t : threads) t.join();
      CHECK(bad_round == 0);
    }
  }
}

TEST_CASE("barrier: poll before the others arrive says no, then completes") {
  for (barrier_kind kind : all_kinds) {
    INFO(kind_name(kind));
    shared_area s;
    std::vector<std::int32_t> pids{::getpid(), ::getpid()};
    auto first = make_barrier(s.area, 0, 2, kind, quick(10.0), pids);
    auto second = make_barrier(s.area, 1, 2, kind, quick(10.0), pids);
    first.arrive();
    CHECK_FALSE(first.poll());
    CHECK_FALSE(first.poll());
    CHECK(first.completed() == 0);
    second.arrive();
    CHECK(first.poll());
    CHECK(first.completed() == 1);
    CHECK(first.poll());  // nothing pending: done
    second.complete();
    CHECK(second.completed() == 1);
  }
}

TEST_CASE("barrier: a departed participant is reported at once, with how it left") {
  for (barrier_kind kind : all_kinds) {
    INFO(kind_name(kind));
    shared_area s;
    constexpr int n = 3;
    const std::vector<std::int32_t> pids(n, ::getpid());  // all alive: only depart() tells
    std::vector<std::string> message(n);
    std::vector<double> took(n, -1);
    auto participant = [&](int r) {
      auto b = make_barrier(s.area, r, n, kind, quick(30.0, 0, 0), pids);
      b.wait();
      const auto t0 = std::chrono::steady_clock::now();
      try {
        b.wait();  // rank 2 departs instead
      } catch (const zcoll::peer_error& e) {
        message[static_cast<std::size_t>(r)] = e.what();
      }
      took[static_cast<std::size_t>(r)] = seconds_since(t0);
    };
    std::thread t0(participant, 0), t1(participant, 1);
    auto leaving = make_barrier(s.area, 2, n, kind, quick(30.0, 0, 0), pids);
    leaving.wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others sleep by now
    leaving.depart(zcoll::departure_reason::exception, "ZeroDivisionError");
    leaving.depart(zcoll::departure_reason::exited, "");  // the first announcement counts
    t0.join();
    t1.join();
    for (int r = 0; r < 2; ++r) {
      const std::string& m = message[static_cast<std::size_t>(r)];
      INFO("rank " << r << ": " << m);
      CHECK(m.find("peer rank 2 (pid " + std::to_string(::getpid()) +
                   ") left on an uncaught ZeroDivisionError") != std::string::npos);
      CHECK(m.find("did not arrive") == std::string::npos);
      CHECK(took[static_cast<std::size_t>(r)] < 1.0);
    }
  }
}

TEST_CASE("barrier: gone_peers names the departed and the dead, never this rank") {
  shared_area s;
  constexpr int n = 3;
  const std::int32_t dead = 1 << 30;  // above any pid_max: no such process
  const std::vector<std::int32_t> pids{::getpid(), ::getpid(), dead};
  auto me = make_barrier(s.area, 0, n, barrier_kind::central, quick(30.0), pids);
  auto other = make_barrier(s.area, 1, n, barrier_kind::central, quick(30.0), pids);
  auto gone = me.gone_peers();
  REQUIRE(gone.size() == 1);  // only rank 2's process is gone so far
  CHECK(gone[0] == std::pair<std::int32_t, std::string>{dead, "died"});
  other.depart(zcoll::departure_reason::signal, "SIGTERM");
  gone = me.gone_peers();
  REQUIRE(gone.size() == 2);
  CHECK(gone[0] == std::pair<std::int32_t, std::string>{::getpid(), "left on SIGTERM"});
  CHECK(gone[1].second == "died");
  CHECK(other.gone_peers().size() == 1);  // its own departure is not a peer's
}

TEST_CASE("barrier: the interrupt check abandons a wait, and the peers do not pass it") {
  shared_area s;
  const std::vector<std::int32_t> pids(2, ::getpid());
  static std::atomic<bool> interrupt{false};
  zcoll::set_interrupt_check([] { return interrupt.load(); });
  auto b0 = make_barrier(s.area, 0, 2, barrier_kind::flat, quick(30.0, 0, 0), pids);
  auto b1 = make_barrier(s.area, 1, 2, barrier_kind::flat, quick(30.0, 0, 0), pids);
  std::string what;
  double took = -1;
  std::thread waiter([&] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      b0.wait();  // rank 1 never comes
    } catch (const zcoll::wait_interrupted& e) {
      what = e.what();
    }
    took = seconds_since(t0);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  interrupt = true;
  waiter.join();
  zcoll::set_interrupt_check(nullptr);
  CHECK(what.find("interrupted by a signal") != std::string::npos);
  CHECK(took < 1.0);
  CHECK_THROWS_AS(b1.wait(), zcoll::peer_error);  // rank 0 gave up this barrier
}
