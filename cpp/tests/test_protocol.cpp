// The call protocol (protocol.hpp). The verdict over the ranks' calls where test_checks.cpp
// (the collectives' verdicts) leaves off: which failure wins, and what reductions, irregular
// calls and plans must agree on, each message written out as the user reads it. Then the
// descriptor lines on a control segment, with threads as the ranks of a node: after publish()
// every rank reads every rank's call, a fast rank's next call leaves the line a slow one still
// reads, a rank's argument error raises the same error on every rank, a pending call finishes
// before the next, and a closed or broken protocol refuses calls.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "zcoll/arena.hpp"
#include "zcoll/error.hpp"
#include "zcoll/protocol.hpp"

using namespace zcoll;

namespace {

constexpr dtype_id f8{'d', 8};
constexpr dtype_id i4{'i', 4};

call_record record(op_code op, std::uint64_t block_bytes = 8, dtype_id dtype = f8) {
  call_record r;
  r.call.op = op;
  r.call.block_bytes = block_bytes;
  r.call.dtype = dtype;
  return r;
}

// What agree() raises over `records` as Python shows it ("TypeError: ..." or "ValueError:
// ..."), or "" when the calls agree.
std::string verdict(const std::vector<call_record>& records, op_code expected) {
  try {
    agree(records, expected);
  } catch (const type_mismatch& e) {
    return std::string("TypeError: ") + e.what();
  } catch (const usage_error& e) {
    return std::string("ValueError: ") + e.what();
  }
  return "";
}

// A control segment for `n` ranks that threads share (unlinked at once: nothing can leak).
std::shared_ptr<shm_segment> control_for(int n) {
  auto control = shm_segment::create(call_protocol::control_bytes(n));
  control->unlink();
  return control;
}

context_config config_for(int rank, int n, std::vector<int> comm_ranks, double timeout_s = 10) {
  context_config c;
  c.rank = rank;
  c.size = n;
  c.comm_ranks = std::move(comm_ranks);
  c.comm_size = 0;
  for (int r : c.comm_ranks) c.comm_size = std::max(c.comm_size, r + 1);
  c.pids.assign(static_cast<std::size_t>(n), ::getpid());
  c.barrier = barrier_kind::central;
  c.wait.timeout_s = timeout_s;
  return c;
}

// Runs body(rank, protocol) on `n` threads, each with its own call_protocol on one control
// segment (node rank r is communicator rank comm_ranks[r]); returns what each body returned,
// or "exception: <what>" when it threw.
std::vector<std::string> run_ranks(int n, const std::vector<int>& comm_ranks,
                                   const std::function<std::string(int, call_protocol&)>& body) {
  auto control = control_for(n);
  std::vector<std::string> out(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        call_protocol protocol(control, config_for(r, n, comm_ranks));
        out[static_cast<std::size_t>(r)] = body(r, protocol);
      } catch (const std::exception& e) {
        out[static_cast<std::size_t>(r)] = std::string("exception: ") + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace

TEST_CASE("protocol: set_text and error_record cut the message to fit, NUL-terminated") {
  char small[6];
  std::memset(small, 'x', sizeof small);
  set_text(small, sizeof small, "abcdefgh");
  CHECK(std::string(small) == "abcde");
  set_text(small, sizeof small, "ab");
  CHECK(std::string(small) == "ab");

  const call_record r = error_record(arg_error::type, "bad dtype");
  CHECK(r.call.op == op_code::error);
  CHECK(r.call.error == arg_error::type);
  CHECK(std::string(r.message) == "bad dtype");
  // An error without a kind is a value error: something must be raised.
  CHECK(error_record(arg_error::none, "x").call.error == arg_error::value);
  const std::string long_text(1000, 'm');
  const call_record cut = error_record(arg_error::value, long_text);
  CHECK(std::strlen(cut.message) == message_bytes - 1);
}

TEST_CASE("protocol: a rank's own argument error wins over calls that differ") {
  // test_checks.cpp has the verdicts of the collectives; these are the protocol's order.
  std::vector<call_record> records(4, record(op_code::alltoall));
  records[1] = record(op_code::allgather);
  records[2] = error_record(arg_error::type, "zcoll.alltoall: sendbuf is None");
  records[3] = error_record(arg_error::value, "zcoll.alltoall: later");
  CHECK(verdict(records, op_code::alltoall) ==
        "TypeError: [rank 2] zcoll.alltoall: sendbuf is None");
  records[2] = record(op_code::alltoall, 16);  // then the next error, before ops or sizes
  CHECK(verdict(records, op_code::alltoall) == "ValueError: [rank 3] zcoll.alltoall: later");
  records[3] = record(op_code::alltoall);
  CHECK(verdict(records, op_code::alltoall) ==
        "ValueError: zcoll: ranks called different operations at once: rank 0 called alltoall, "
        "rank 1 called allgather");
  CHECK(verdict({record(op_code::barrier, 0), record(op_code::barrier, 9)}, op_code::barrier)
            .empty());  // a barrier moves no data: its sizes are not compared
}

TEST_CASE("protocol: irregular calls must share a pattern, plans their collective") {
  CHECK(
      verdict({record(op_code::alltoallv, 1), record(op_code::alltoallv, 2)}, op_code::alltoallv) ==
      "ValueError: zcoll.alltoallv: ranks use different communication patterns (rank 0 and "
      "rank 1): a neighbourhood call on a communicator without a topology, or topologies that "
      "differ");
  call_record a = record(op_code::plan), b = record(op_code::plan);
  a.call.target = op_code::alltoall;
  b.call.target = op_code::allgather;
  CHECK(verdict({a, b}, op_code::plan) ==
        "ValueError: zcoll: ranks planned different collectives at once: rank 0 planned "
        "alltoall, rank 1 planned allgather");
  b.call.target = op_code::alltoall;
  b.call.block_bytes = 16;
  CHECK(verdict({a, b}, op_code::plan) ==
        "ValueError: zcoll.alltoall_init: block sizes differ between ranks: rank 0 has 8 bytes "
        "per block, rank 1 has 16");
}

TEST_CASE("protocol: reductions must agree on size, dtype, root, op and algorithm") {
  auto reduction = [](std::uint64_t bytes, dtype_id dt, int root, int op, int algorithm) {
    call_record r = record(op_code::reduce, bytes, dt);
    r.call.root = static_cast<std::uint16_t>(root);
    r.call.reduce = static_cast<std::uint8_t>(op);
    r.call.order = static_cast<std::int8_t>(algorithm);
    return r;
  };
  const call_record base = reduction(80, f8, 1, 0, auto_algorithm);
  CHECK(verdict({base, base, base}, op_code::reduce).empty());
  CHECK(verdict({base, reduction(72, f8, 1, 0, auto_algorithm)}, op_code::reduce) ==
        "ValueError: zcoll.reduce: buffer sizes differ between ranks: rank 0 has 80 bytes, rank 1 "
        "has 72");
  CHECK(verdict({base, reduction(80, i4, 1, 0, auto_algorithm)}, op_code::reduce) ==
        "TypeError: zcoll.reduce: dtypes differ between ranks: rank 0 has 'd' (8 bytes), rank 1 "
        "has 'i' "
        "(4 bytes)");
  CHECK(verdict({base, reduction(80, f8, 2, 0, auto_algorithm)}, op_code::reduce) ==
        "ValueError: zcoll.reduce: roots differ between ranks: rank 0 uses root 1, rank 1 uses "
        "root 2");
  CHECK(verdict({base, reduction(80, f8, 1, 3, auto_algorithm)}, op_code::reduce) ==
        "ValueError: zcoll.reduce: ops differ between ranks: rank 0 uses 'sum', rank 1 uses 'max'");
  CHECK(verdict({base, reduction(80, f8, 1, 0, 3)}, op_code::reduce) ==
        "ValueError: zcoll.reduce: algorithms differ between ranks: rank 0 uses 'auto', rank 1 "
        "uses 'tiled'");
  // In-place use is each rank's own for reductions (the flag is not compared).
  call_record flagged = base;
  flagged.call.flag = 1;
  CHECK(verdict({base, flagged}, op_code::reduce).empty());
}

TEST_CASE("protocol: the control segment fits the ranks, in whole pages") {
  for (int n : {1, 2, 7, 64}) {
    const std::size_t bytes = call_protocol::control_bytes(n);
    CHECK(bytes % page_size() == 0);
    CHECK(bytes >= static_cast<std::size_t>(n) *
                       (2 * sizeof(detail::rank_line) + sizeof(detail::rank_slot)));
  }
  CHECK(call_protocol::control_bytes(64) > call_protocol::control_bytes(1));
  auto small = shm_segment::create(call_protocol::control_bytes(2));
  small->unlink();
  const auto too_small = [&] { call_protocol protocol(small, config_for(0, 64, {})); };
  CHECK_THROWS_AS(too_small(), std::invalid_argument);
}

TEST_CASE("protocol: after publish every rank reads every rank's call, at every step") {
  constexpr int n = 4, steps = 50;
  const std::vector<int> comm_ranks{3, 0, 7, 5};
  const auto out = run_ranks(n, comm_ranks, [&](int r, call_protocol& protocol) -> std::string {
    for (int step = 0; step < steps; ++step) {
      auto& line = protocol.next(op_code::alltoall);
      line.call.block_bytes = static_cast<std::uint64_t>(1000 * step + r);
      line.send = {static_cast<std::uint64_t>(r + 1), static_cast<std::uint64_t>(step)};
      const auto all = protocol.publish();
      if (all.size() != n) return "size";
      for (int j = 0; j < n; ++j) {
        if (all.call(j).op != op_code::alltoall) return "op at step " + std::to_string(step);
        if (all.call(j).block_bytes != static_cast<std::uint64_t>(1000 * step + j))
          return "rank " + std::to_string(j) + "'s call at step " + std::to_string(step);
        if (all.line(j).send.segment != static_cast<std::uint64_t>(j + 1) ||
            all.line(j).send.offset != static_cast<std::uint64_t>(step))
          return "rank " + std::to_string(j) + "'s buffer at step " + std::to_string(step);
        if (all.rank(j) != comm_ranks[static_cast<std::size_t>(j)]) return "comm rank";
      }
    }
    if (protocol.calls() != steps) return "calls " + std::to_string(protocol.calls());
    return protocol.rank_name(r);
  });
  for (int r = 0; r < n; ++r)
    CHECK(out[static_cast<std::size_t>(r)] ==
          "rank " + std::to_string(comm_ranks[static_cast<std::size_t>(r)]));
}

TEST_CASE("protocol: a fast rank's next call leaves the line a slow rank still reads") {
  // Rank 1 reads rank 0's call of step k only once rank 0 has written its call of step k + 1.
  // Lines alternate by barrier parity, so it must still read step k's.
  constexpr int steps = 40;
  std::atomic<int> written{-1};  // the last step whose next line rank 0 has written
  const auto out = run_ranks(2, {0, 1}, [&](int r, call_protocol& protocol) -> std::string {
    for (int step = 0; step <= steps; ++step) {
      auto& line = protocol.next(op_code::barrier);
      line.call.block_bytes = static_cast<std::uint64_t>(step);
      if (r == 0) written.store(step - 1);
      if (step == steps) break;  // rank 0's last line is never published
      const auto all = protocol.publish();
      if (r == 0) continue;
      const auto t0 = std::chrono::steady_clock::now();
      while (written.load() < step)
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(5)) return "stuck";
      if (all.call(0).block_bytes != static_cast<std::uint64_t>(step))
        return "read rank 0's next call at step " + std::to_string(step);
    }
    return "ok";
  });
  CHECK(out[0] == "ok");
  CHECK(out[1] == "ok");
}

TEST_CASE("protocol: one rank's argument error raises the same error on every rank") {
  for (arg_error kind : {arg_error::type, arg_error::value}) {
    const auto out = run_ranks(3, {4, 5, 6}, [&](int r, call_protocol& protocol) -> std::string {
      if (r == 1) protocol.fail(kind, "zcoll.alltoall: recvbuf is too small");
      auto& line = protocol.next(op_code::alltoall);
      line.call.block_bytes = 8;
      const auto all = protocol.publish();
      try {
        check_calls(all, op_code::alltoall);
      } catch (const type_mismatch& e) {
        return std::string("TypeError ") + e.what();
      } catch (const usage_error& e) {
        return std::string("ValueError ") + e.what();
      }
      return "nothing raised";
    });
    const std::string want = std::string(kind == arg_error::type ? "TypeError" : "ValueError") +
                             " [rank 5] zcoll.alltoall: recvbuf is too small";
    CHECK(out[0] == want);
    CHECK(out[2] == want);
    // The failing rank raises from fail() itself.
    CHECK(out[1] == "exception: [rank 5] zcoll.alltoall: recvbuf is too small");
  }
}

TEST_CASE("protocol: a pending call is finished before the next call") {
  struct counting final : pending_call {
    int finished = 0;
    void finish() override { ++finished; }
  };
  const auto out = run_ranks(1, {0}, [](int, call_protocol& protocol) -> std::string {
    counting pending;
    protocol.set_pending(&pending);
    if (protocol.pending() != &pending) return "not pending";
    protocol.next(op_code::barrier);
    if (pending.finished != 1 || protocol.pending() != nullptr) return "not finished by next";
    protocol.publish();
    protocol.next(op_code::barrier);
    return pending.finished == 1 ? "ok" : "finished twice";
  });
  CHECK(out[0] == "ok");
}

TEST_CASE("protocol: a closed protocol refuses calls, a broken one says why") {
  const auto out = run_ranks(1, {0}, [](int, call_protocol& protocol) -> std::string {
    protocol.mark_broken("rank 3 died");
    std::string said;
    try {
      protocol.next(op_code::barrier);
    } catch (const peer_error& e) {
      said = e.what();
    }
    if (!protocol.broken()) return "not broken";
    protocol.close();
    protocol.close();  // twice is harmless
    try {
      protocol.sync();
    } catch (const usage_error& e) {
      return said + " | " + e.what() + (protocol.closed() ? " | closed" : "");
    }
    return "closed protocol ran a barrier";
  });
  CHECK(out[0] ==
        "zcoll: this communicator's zcoll context is unusable after an earlier failure: rank 3 "
        "died | zcoll: this communicator's zcoll context is closed (was it freed?) | closed");
}

TEST_CASE("protocol: a barrier that times out breaks the protocol for good") {
  auto control = control_for(2);
  call_protocol alone(control, config_for(0, 2, {0, 1}, 0.2));  // rank 1 never comes
  alone.next(op_code::barrier);
  CHECK_THROWS_AS(alone.publish(), peer_error);
  CHECK(alone.broken());
  CHECK_THROWS_AS(alone.next(op_code::barrier), peer_error);
}
