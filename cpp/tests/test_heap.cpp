// The shared heap (heap.hpp) without NumPy: blocks by size class and segment, reuse within the
// cache's bounds, what peers are told (locate) and what they map back (resolve, here for this
// process's own and a forked child's segments), generations, threads, and fork privatization.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <thread>
#include <vector>

#include "zcoll/heap.hpp"

namespace heap = zcoll::heap;

namespace {

constexpr std::size_t kib = std::size_t{1} << 10;
constexpr std::size_t mib = kib << 10;

}  // namespace

TEST_CASE("small requests are left to the caller, others come back aligned and usable") {
  CHECK(heap::allocate(100, false) == nullptr);
  for (std::size_t n : {kib, 3 * kib, 200 * kib, 2 * mib}) {
    auto* p = static_cast<std::byte*>(heap::allocate(n, true));
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    CHECK(heap::owns(p));
    CHECK(heap::usable_bytes(p) >= n);
    CHECK(std::all_of(p, p + n, [](std::byte b) { return b == std::byte{0}; }));
    std::memset(p, 0x5a, n);
    CHECK(heap::release(p));
    if (n >= heap::current_limits().large_bytes) CHECK_FALSE(heap::owns(p));  // kept: not a block
  }
  int on_stack = 0;
  CHECK_FALSE(heap::release(&on_stack));
}

TEST_CASE("a freed block of a class is reused, and zeroed when asked") {
  void* a = heap::allocate(5 * kib, false);
  std::memset(a, 1, 5 * kib);
  REQUIRE(heap::release(a));
  auto* b = static_cast<unsigned char*>(heap::allocate(6 * kib, true));  // the same 8 KiB class
  CHECK(static_cast<void*>(b) == a);
  CHECK(b[0] == 0);
  CHECK(b[6 * kib - 1] == 0);
  heap::release(b);
}

TEST_CASE("freed segments are kept within bounds, the others given back") {
  const heap::stats before = heap::current_stats();
  std::vector<void*> big;
  for (int i = 0; i < 4; ++i) big.push_back(heap::allocate(24 * mib, false));
  for (void* p : big) REQUIRE(p != nullptr);
  for (void* p : big) heap::release(p);
  const heap::stats after = heap::current_stats();
  CHECK(after.kept_bytes <= heap::current_limits().keep_total_bytes);
  CHECK(after.segment_bytes - after.kept_bytes == before.segment_bytes - before.kept_bytes);
  CHECK(after.blocks == before.blocks);
}

TEST_CASE("locate names a heap buffer that resolve maps back, until it is freed") {
  auto* p = static_cast<std::byte*>(heap::allocate(3 * mib, false));
  REQUIRE(p != nullptr);
  const zcoll::buffer_ref ref = heap::locate(p + 100, 1000);
  CHECK((ref.segment & heap::heap_tag) != 0);
  CHECK(ref.offset == 100);
  CHECK(heap::resolve(ref, 1000) == p + 100);
  CHECK(heap::locate(p + 100, 4 * mib).segment == 0);  // past the segment
  int on_stack = 0;
  CHECK(heap::locate(&on_stack, sizeof on_stack).segment == 0);
  heap::limits l = heap::current_limits();
  l.keep_total_bytes = 0;  // given back at once: its descriptor is closed
  heap::set_limits(l);
  heap::release(p);
  CHECK(heap::resolve(ref, 1000) == nullptr);
  heap::set_limits(heap::limits{});
}

TEST_CASE("a lookup memo answers as locate and resolve do, and never with a mapping gone") {
  heap::limits l = heap::current_limits();
  l.keep_total_bytes = 0;  // one-block segments given back at once
  heap::set_limits(l);
  auto* p = static_cast<std::byte*>(heap::allocate(3 * mib, false));
  auto* q = static_cast<std::byte*>(heap::allocate(64 * 1024, false));  // a slab's block
  REQUIRE(p != nullptr);
  REQUIRE(q != nullptr);
  heap::lookup_memo memo;
  for (int round = 0; round < 2; ++round) {  // the second from the memo
    const zcoll::buffer_ref ref = memo.locate(p + 100, 1000);
    const zcoll::buffer_ref direct = heap::locate(p + 100, 1000);
    CHECK(ref.segment == direct.segment);
    CHECK(ref.offset == 100);
    CHECK(memo.resolve(ref, 1000) == p + 100);
    CHECK(memo.resolve(ref, 4 * mib) == nullptr);  // past the segment
    CHECK(memo.locate(p + 100, 4 * mib).segment == 0);
    CHECK(memo.locate(q, 1024).segment == heap::locate(q, 1024).segment);
  }
  int on_stack = 0;
  CHECK(memo.locate(&on_stack, sizeof on_stack).segment == 0);
  const zcoll::buffer_ref ref = memo.locate(p, 1000);
  const std::uint64_t before = heap::epoch();
  heap::release(p);
  CHECK(heap::epoch() != before);
  CHECK(memo.resolve(ref, 1000) == nullptr);  // its segment is gone: no stale address
  CHECK(memo.locate(p, 1000).segment == 0);
  const std::uint64_t slab_epoch = heap::epoch();
  heap::release(q);  // a slab block: its segment stays, so do the memo's answers
  CHECK(heap::epoch() == slab_epoch);
  heap::set_limits(heap::limits{});
}

TEST_CASE("a fork child's heap is its own, it maps its parent's through /proc") {
  auto* p = static_cast<unsigned char*>(heap::allocate(2 * mib, false));
  REQUIRE(p != nullptr);
  for (std::size_t i = 0; i < 2 * mib; ++i) p[i] = static_cast<unsigned char>(i % 251);
  const zcoll::buffer_ref ref = heap::locate(p, 2 * mib);
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  const pid_t child = ::fork();
  if (child == 0) {
    char go = 0;
    if (::read(pipefd[0], &go, 1) != 1) ::_exit(3);
    p[0] = 7;  // into the child's private copy only
    // The parent's segment, mapped through /proc/<parent>/fd: its write after the fork is
    // there, the child's is not; the child's copy kept the value from before the fork.
    const auto* parents = reinterpret_cast<const unsigned char*>(heap::resolve(ref, 2 * mib));
    if (!parents || parents == p) ::_exit(10);
    if (parents[1] != 99 || parents[0] != 0 || p[1] != 1) ::_exit(11);
    if (!heap::current_stats().forked_child) ::_exit(12);
    ::_exit(heap::allocate(2 * mib, false) == nullptr ? 0 : 13);  // the child allocates elsewhere
  }
  p[1] = 99;  // after the fork: not in the child's copy
  REQUIRE(::write(pipefd[1], "x", 1) == 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // 10: not mapped, 11: wrong data, 12/13: not a fork child
  CHECK(p[0] == 0);
  CHECK(p[1] == 99);
  ::close(pipefd[0]);
  ::close(pipefd[1]);
  heap::release(p);
}

TEST_CASE("threads allocate and free concurrently") {
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t, &failures] {
      for (int i = 0; i < 2000; ++i) {
        const std::size_t n = kib << ((i + t) % 11);
        auto* p = static_cast<unsigned char*>(heap::allocate(n, false));
        if (!p) {
          ++failures[static_cast<std::size_t>(t)];
          continue;
        }
        std::memset(p, t, n);
        if (p[n - 1] != t) ++failures[static_cast<std::size_t>(t)];
        heap::release(p);
      }
    });
  for (auto& th : threads) th.join();
  for (int f : failures) CHECK(f == 0);
}
