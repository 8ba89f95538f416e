// Node segments (segments.hpp) on forked processes that stand in for the ranks of a node, each
// with its own call protocol on one control segment: a created segment is one shared mapping
// (what one rank writes in its partition every rank reads), named by its creator and unlinked
// once every rank mapped it; arena buffers and staging partitions are published so that every
// rank reaches them; private memory is published by address; a segment of another context is
// used in place only when every rank of this one has it mapped, and only while its allocating
// context is open.
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "zcoll/error.hpp"
#include "zcoll/heap.hpp"
#include "zcoll/protocol.hpp"
#include "zcoll/segments.hpp"

using namespace zcoll;

namespace {

constexpr int max_ranks = 4;

// Shared between the parent and its forked ranks (an anonymous shared mapping).
struct shared_state {
  std::atomic<int> go;
  std::int32_t pids[max_ranks];
  std::uint64_t ids[max_ranks];    // per rank: a segment id it saw
  buffer_ref refs[max_ranks];      // per rank: where its buffer is
  std::uint64_t sizes[max_ranks];  // per rank: that buffer's bytes
};

shared_state* new_state() {
  void* p = ::mmap(nullptr, sizeof(shared_state), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(p != MAP_FAILED);
  return new (p) shared_state{};
}

// A failed expectation in a forked rank: said on stderr, and the rank exits non-zero.
#define EXPECT(cond)                                                                 \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank, __FILE__, __LINE__, #cond); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

// One node context's shared memory as a rank sees it: its protocol and segments.
struct rank_view {
  call_protocol protocol;
  node_segments segments;
  rank_view(std::shared_ptr<shm_segment> control, const context_config& c)
      : protocol(std::move(control), c), segments(protocol, c.rank, c.size, c.pids) {}
};

context_config config_for(int rank, int n, const shared_state* state) {
  context_config c;
  c.rank = rank;
  c.size = n;
  c.comm_size = n;
  for (int j = 0; j < n; ++j) {
    c.comm_ranks.push_back(j);
    c.pids.push_back(state->pids[j]);
  }
  c.barrier = barrier_kind::central;
  c.wait.timeout_s = 20;
  return c;
}

// A control segment for `n` ranks, inherited by forked children (unlinked at once).
std::shared_ptr<shm_segment> control_for(int n) {
  auto control = shm_segment::create(call_protocol::control_bytes(n));
  control->unlink();
  return control;
}

// Runs body(rank, state) on `n` forked ranks once every rank's pid is known; returns their exit
// codes (0: every expectation held).
template <class Body>
std::vector<int> run_ranks(int n, shared_state* state, Body body) {
  state->go = 0;
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r)
    kids.push_back(zcoll_test::fork_child([&, r] {
      while (state->go.load() == 0) ::usleep(100);
      return body(r, state);
    }));
  for (int r = 0; r < n; ++r) state->pids[r] = kids[static_cast<std::size_t>(r)];
  state->go = 1;
  std::vector<int> codes;
  for (pid_t k : kids) codes.push_back(zcoll_test::wait_child(k, 60));
  return codes;
}

// The byte rank `rank` writes at `i` of its buffers: differs between ranks and offsets.
std::byte pattern(int rank, std::size_t i) {
  return static_cast<std::byte>((rank * 89 + static_cast<int>(i % 251) + 1) & 0xff);
}

bool holds_pattern(const std::byte* p, std::size_t bytes, int rank) {
  for (std::size_t i = 0; i < bytes; ++i)
    if (p[i] != pattern(rank, i)) return false;
  return true;
}

void fill_pattern(std::byte* p, std::size_t bytes, int rank) {
  for (std::size_t i = 0; i < bytes; ++i) p[i] = pattern(rank, i);
}

}  // namespace

TEST_CASE("segments: a created segment is one mapping, named by its creator, unlinked") {
  constexpr int n = 3;
  constexpr std::size_t partition = 64 * 1024;
  shared_state* state = new_state();
  auto control = control_for(n);
  const auto codes = run_ranks(n, state, [&](int rank, shared_state* s) {
    rank_view v(control, config_for(rank, n, s));
    const auto seg = v.segments.create(partition);
    EXPECT(seg->partition_bytes == partition);
    EXPECT(seg->shm->size() >= n * partition);
    EXPECT(v.segments.count() == 1);
    // Node-unique ids: the creator's (rank 0's) pid in the high word.
    EXPECT(seg->id >> 32 == static_cast<std::uint64_t>(s->pids[0]));
    s->ids[rank] = seg->id;
    // Every rank mapped it before the leader unlinked its name: nothing is left behind.
    if (rank == 0) EXPECT(zcoll_test::shm_entries(zcoll_test::own_segment_prefix()).empty());
    fill_pattern(seg->partition(rank), partition, rank);
    v.protocol.sync();
    for (int j = 0; j < n; ++j) EXPECT(holds_pattern(seg->partition(j), partition, j));
    v.protocol.sync();  // no rank unmaps while another still reads
    return 0;
  });
  CHECK(codes == std::vector<int>(n, 0));
  CHECK(state->ids[1] == state->ids[0]);
  CHECK(state->ids[2] == state->ids[0]);
  ::munmap(state, sizeof(shared_state));
}

TEST_CASE("segments: arena buffers of any size on each rank are reached by every rank") {
  constexpr int n = 3;
  shared_state* state = new_state();
  auto control = control_for(n);
  const auto codes = run_ranks(n, state, [&](int rank, shared_state* s) {
    rank_view v(control, config_for(rank, n, s));
    // Sizes differ by rank; the last round outgrows the first partitions, so the arena grows.
    for (const std::size_t base : {std::size_t{1000}, std::size_t{3} << 20}) {
      const std::size_t bytes = base + 64 * static_cast<std::size_t>(rank);
      const auto block = v.segments.allocate(bytes);
      EXPECT(block->size() == bytes);
      EXPECT(in_arena(block->data(), bytes));
      fill_pattern(block->data(), bytes, rank);
      const buffer_ref ref = v.segments.locate(block->data(), bytes);
      EXPECT(ref.segment != 0);
      s->refs[rank] = ref;
      s->sizes[rank] = bytes;
      v.protocol.sync();
      for (int j = 0; j < n; ++j) {
        const std::byte* p = v.segments.resolve(s->refs[j]);
        EXPECT(holds_pattern(p, s->sizes[j], j));
        const auto view = v.segments.view(s->refs[j], s->sizes[j]);
        EXPECT(view->data() == p);
        EXPECT(view->size() == s->sizes[j]);
      }
      EXPECT(v.segments.bytes_in_use() >= bytes);
      v.protocol.sync();  // every peer read before the blocks go
    }
    EXPECT(v.segments.count() >= 2);  // a second segment for the larger buffers
    return 0;
  });
  CHECK(codes == std::vector<int>(n, 0));
  ::munmap(state, sizeof(shared_state));
}

TEST_CASE("segments: staging partitions are shared and grow only when asked for more") {
  constexpr int n = 2;
  shared_state* state = new_state();
  auto control = control_for(n);
  const auto codes = run_ranks(n, state, [&](int rank, shared_state* s) {
    rank_view v(control, config_for(rank, n, s));
    EXPECT(v.segments.staging_bytes() == 0);
    EXPECT(v.segments.staging_third() == 0);
    v.segments.reserve_staging(10000);
    const std::size_t first = v.segments.staging_bytes();
    EXPECT(first >= 10000);
    EXPECT(first % page_size() == 0);
    // A third: whole cache lines, three of them fit.
    const std::size_t third = v.segments.staging_third();
    EXPECT(third % 64 == 0);
    EXPECT(3 * third <= first);
    EXPECT(3 * (third + 64) > first);
    fill_pattern(v.segments.staging(rank), first, rank);
    v.protocol.sync();
    EXPECT(holds_pattern(v.segments.staging(1 - rank), first, 1 - rank));
    std::byte* mine = v.segments.staging(rank);
    v.protocol.sync();
    v.segments.reserve_staging(first);  // already enough: the same partitions, the same data
    EXPECT(v.segments.staging(rank) == mine);
    EXPECT(v.segments.staging_bytes() == first);
    EXPECT(holds_pattern(mine, first, rank));
    v.segments.reserve_staging(first + 1);
    // Grown at least twofold, so that growing a little at a time costs few new segments.
    EXPECT(v.segments.staging_bytes() >= 2 * first);
    EXPECT(v.segments.staging_bytes() % page_size() == 0);
    fill_pattern(v.segments.staging(rank), first + 1, rank + 2);
    v.protocol.sync();
    EXPECT(holds_pattern(v.segments.staging(1 - rank), first + 1, 3 - rank));
    v.protocol.sync();
    return 0;
  });
  CHECK(codes == std::vector<int>(n, 0));
  ::munmap(state, sizeof(shared_state));
}

TEST_CASE("segments: private memory goes by address, unknown or bad references raise") {
  shared_state* state = new_state();
  auto control = control_for(1);
  const auto codes = run_ranks(1, state, [&](int rank, shared_state* s) {
    rank_view v(control, config_for(rank, 1, s));
    std::vector<std::byte> own(100);
    for (int call = 0; call < 2; ++call) {  // the second from the answer the context kept
      const buffer_ref ref = v.segments.locate(own.data(), own.size());
      EXPECT(ref.segment == 0);
      EXPECT(ref.offset == reinterpret_cast<std::uintptr_t>(own.data()));
    }
    auto& registry = detail::segment_registry::instance();
    const std::uint64_t additions = registry.additions();
    const auto block = v.segments.allocate(256);  // the context's first segment: asked again
    EXPECT(registry.additions() > additions);
    EXPECT(v.segments.locate(own.data(), own.size()).segment == 0);
    const buffer_ref in_arena_ref = v.segments.locate(block->data(), 256);
    EXPECT(in_arena_ref.segment != 0);
    EXPECT(v.segments.locate(block->data() + 64, 64).segment != 0);  // a part of it too
    // A view may not reach past its segment; a heap buffer is no arena array.
    bool past_end = false, heap = false;
    try {
      v.segments.view(in_arena_ref, std::size_t{1} << 40);
    } catch (const usage_error&) {
      past_end = true;
    }
    try {
      v.segments.view(buffer_ref{heap::heap_tag | 1, 0}, 8);
    } catch (const usage_error&) {
      heap = true;
    }
    EXPECT(past_end);
    EXPECT(heap);
    EXPECT(!v.protocol.broken());
    // A segment nobody here has mapped: the peers' calls cannot go on, now or later.
    bool unknown = false;
    try {
      v.segments.resolve(buffer_ref{0x12345, 0});
    } catch (const peer_error&) {
      unknown = true;
    }
    EXPECT(unknown);
    EXPECT(v.protocol.broken());
    return 0;
  });
  CHECK(codes == std::vector<int>{0});
  ::munmap(state, sizeof(shared_state));
}

TEST_CASE("segments: another context's segment is used in place only where every rank has it") {
  // Context A spans ranks 0, 1, 2; context B (a split of A's communicator) ranks 0 and 1.
  constexpr int n = 3;
  shared_state* state = new_state();
  auto control_a = control_for(n), control_b = control_for(2);
  const auto codes = run_ranks(n, state, [&](int rank, shared_state* s) {
    rank_view a(control_a, config_for(rank, n, s));
    const auto block_a = a.segments.allocate(4096);
    std::unique_ptr<rank_view> b;
    std::shared_ptr<arena_block> block_b;
    if (rank < 2) {
      b = std::make_unique<rank_view>(control_b, config_for(rank, 2, s));
      block_b = b->segments.allocate(4096);
      // A's segment is mapped by every rank of B: B publishes it as it is.
      const buffer_ref ref = b->segments.locate(block_a->data(), 4096);
      EXPECT(ref.segment == a.segments.locate(block_a->data(), 4096).segment);
      EXPECT(ref.segment != 0);
      // B's segment is not mapped by rank 2: A publishes it as private memory.
      const buffer_ref other = a.segments.locate(block_b->data(), 4096);
      EXPECT(other.segment == 0);
      EXPECT(other.offset == reinterpret_cast<std::uintptr_t>(block_b->data()));
    }
    a.protocol.sync();
    if (rank < 2) {
      // Once A is closed its segments are no longer published by B (arrays stay valid).
      a.segments.close();
      fill_pattern(block_a->data(), 4096, rank);
      EXPECT(holds_pattern(block_a->data(), 4096, rank));
      EXPECT(b->segments.locate(block_a->data(), 4096).segment == 0);
      EXPECT(b->segments.locate(block_b->data(), 4096).segment != 0);
      b->protocol.sync();
    }
    return 0;
  });
  CHECK(codes == std::vector<int>(n, 0));
  ::munmap(state, sizeof(shared_state));
}
