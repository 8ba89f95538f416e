// Shared arena (arena.hpp): shm_segment create/attach/unlink, segment names, the partition
// allocator, the segment registry. Every case ends with nothing of this process in /dev/shm.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "test_util.hpp"
#include "zcoll/arena.hpp"

using zcoll::shm_segment;
using zcoll::detail::partition_allocator;

namespace {

// Checks, when a case ends, that it left no segment of this process in /dev/shm.
struct no_leak_guard {
  ~no_leak_guard() {
    const auto left = zcoll_test::shm_entries(zcoll_test::own_segment_prefix());
    std::string names;
    for (const auto& n : left) names += n + " ";
    INFO("left in /dev/shm: " << names);
    CHECK(left.empty());
  }
};

// A data segment of `ranks` partitions of `partition_bytes`, registered like node_context does.
std::shared_ptr<zcoll::data_segment> make_data_segment(int ranks, std::size_t partition_bytes,
                                                       std::uint64_t id) {
  auto seg = std::make_shared<zcoll::data_segment>();
  seg->shm = shm_segment::create(static_cast<std::size_t>(ranks) * partition_bytes);
  seg->shm->unlink();
  seg->id = id;
  seg->partition_bytes = partition_bytes;
  return seg;
}

std::size_t aligned(std::size_t n) {
  return (std::max<std::size_t>(n, 1) + 63) / 64 * 64;
}

}  // namespace

TEST_CASE("arena: page_size and round_up") {
  CHECK(zcoll::page_size() == static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
  CHECK(zcoll::round_up(0, 64) == 0);
  CHECK(zcoll::round_up(1, 64) == 64);
  CHECK(zcoll::round_up(64, 64) == 64);
  CHECK(zcoll::round_up(65, 4096) == 4096);
  CHECK(zcoll::round_up(8193, 4096) == 12288);
  static_assert(zcoll::round_up(100, 10) == 100);
}

TEST_CASE("arena: segment names carry prefix uid pid counter and a random part") {
  no_leak_guard guard;
  std::set<std::string> names;
  std::vector<std::shared_ptr<shm_segment>> segs;
  for (int i = 0; i < 16; ++i) {
    segs.push_back(shm_segment::create(4096));
    names.insert(segs.back()->name());
  }
  CHECK(names.size() == segs.size());  // unique
  const std::string prefix = zcoll_test::own_segment_prefix('/');
  for (const auto& name : names) {
    INFO(name);
    REQUIRE(name.rfind(prefix, 0) == 0);
    // After "<prefix>": "<counter>-<random>", both decimal.
    const std::string rest = name.substr(prefix.size());
    const auto dash = rest.find('-');
    REQUIRE(dash != std::string::npos);
    CHECK(dash > 0);
    CHECK(rest.size() > dash + 1);
    CHECK(std::all_of(rest.begin(), rest.end(),
                      [](char c) { return (c >= '0' && c <= '9') || c == '-'; }));
    CHECK(name.find('/', 1) == std::string::npos);  // one path component
    CHECK(zcoll_test::shm_exists(name));
  }
  CHECK(std::string(zcoll::segment_prefix) == "zcoll");
  segs.clear();  // the owners unlink on destruction
  for (const auto& name : names) CHECK_FALSE(zcoll_test::shm_exists(name));
}

TEST_CASE("arena: create attach unlink round trip") {
  no_leak_guard guard;
  const std::size_t bytes = 3 * zcoll::page_size() + 100;
  auto owner = shm_segment::create(bytes);
  REQUIRE(owner->data() != nullptr);
  CHECK(owner->size() == bytes);
  CHECK(std::all_of(owner->data(), owner->data() + bytes,
                    [](std::byte b) { return b == std::byte{0}; }));
  CHECK(zcoll_test::shm_exists(owner->name()));

  auto peer = shm_segment::attach(owner->name(), bytes);
  CHECK(peer->name() == owner->name());
  CHECK(peer->size() == bytes);
  CHECK(peer->data() != owner->data());  // a second mapping of the same memory
  std::memcpy(owner->data() + 10, "hello", 5);
  CHECK(std::memcmp(peer->data() + 10, "hello", 5) == 0);
  peer->data()[bytes - 1] = std::byte{0x42};
  CHECK(owner->data()[bytes - 1] == std::byte{0x42});

  // A smaller view is fine; a larger one than the object is refused with EINVAL.
  CHECK(shm_segment::attach(owner->name(), 16)->size() == 16);
  try {
    shm_segment::attach(owner->name(), bytes + zcoll::page_size());
    FAIL_CHECK("attach beyond the object's size succeeded");
  } catch (const std::system_error& e) {
    CHECK(e.code().value() == EINVAL);
    CHECK(std::string(e.what()).find("smaller than announced") != std::string::npos);
  }

  // An attached mapping never unlinks the name.
  peer->unlink();
  peer.reset();
  CHECK(zcoll_test::shm_exists(owner->name()));

  // Unlink: the name goes away, the mapping stays valid, unlink is idempotent.
  const std::string name = owner->name();
  owner->unlink();
  CHECK_FALSE(zcoll_test::shm_exists(name));
  owner->unlink();
  owner->data()[0] = std::byte{1};
  CHECK(owner->data()[0] == std::byte{1});
  try {
    shm_segment::attach(name, bytes);
    FAIL_CHECK("attach after unlink succeeded");
  } catch (const std::system_error& e) {
    CHECK(e.code().value() == ENOENT);
    CHECK(std::string(e.what()).find("for attach failed") != std::string::npos);
  }
}

TEST_CASE("arena: attach to a name that never existed") {
  no_leak_guard guard;
  CHECK_THROWS_AS(shm_segment::attach("/zcoll-test-no-such-segment", 64), std::system_error);
}

TEST_CASE("arena: an empty segment maps nothing") {
  no_leak_guard guard;
  auto seg = shm_segment::create(0);
  CHECK(seg->size() == 0);
  CHECK(seg->data() == nullptr);
  CHECK(zcoll_test::shm_exists(seg->name()));
  seg.reset();
}

TEST_CASE("arena: reserve backs a range without growing the object") {
  no_leak_guard guard;
  const std::size_t bytes = 4 * zcoll::page_size();
  auto seg = shm_segment::create(bytes);
  seg->reserve(0, 0);
  seg->reserve(zcoll::page_size(), 2 * zcoll::page_size());
  seg->reserve(0, bytes);
  auto again = shm_segment::attach(seg->name(), bytes);  // still exactly `bytes` long
  CHECK(again->size() == bytes);
  CHECK_THROWS_AS(shm_segment::attach(seg->name(), bytes + 1), std::system_error);
  // A range past the end is refused (posix_fallocate would silently grow the object).
  CHECK_THROWS_AS(seg->reserve(bytes - 1, 2), std::out_of_range);
  CHECK_THROWS_AS(seg->reserve(bytes + 1, 1), std::out_of_range);
  CHECK(shm_segment::attach(seg->name(), bytes)->size() == bytes);
}

TEST_CASE("arena: a forked process sees the parent's writes and vice versa") {
  no_leak_guard guard;
  const std::size_t bytes = 2 * zcoll::page_size();
  auto seg = shm_segment::create(bytes);
  std::memset(seg->data(), 7, bytes);
  const std::string name = seg->name();
  const pid_t kid = zcoll_test::fork_child([name, bytes] {
    auto peer = shm_segment::attach(name, bytes);  // by name, as another rank would
    for (std::size_t i = 0; i < bytes; ++i)
      if (peer->data()[i] != std::byte{7}) return 1;
    std::memset(peer->data(), 9, bytes);
    return 0;
  });
  CHECK(zcoll_test::wait_child(kid) == 0);
  CHECK(
      std::all_of(seg->data(), seg->data() + bytes, [](std::byte b) { return b == std::byte{9}; }));
  seg->unlink();
  CHECK_FALSE(zcoll_test::shm_exists(name));
}

TEST_CASE("arena: colouring walks every line of a page") {
  std::set<std::size_t> lines;
  for (int r = 0; r < 64; ++r) {
    const std::size_t c = partition_allocator::colour_of(r);
    CHECK(c % partition_allocator::alignment == 0);
    CHECK(c < partition_allocator::colour_span);
    lines.insert(c / 64);
  }
  CHECK(lines.size() == 64);
  CHECK(partition_allocator::colour_of(0) == 0);
  CHECK(partition_allocator::colour_of(1) == 9 * 64);
  CHECK(partition_allocator::colour_of(64) == 0);  // period 64
}

TEST_CASE("arena: partition allocator first fit with colouring") {
  no_leak_guard guard;
  constexpr int ranks = 4, me = 2;
  const std::size_t part = 16 * zcoll::page_size();
  auto seg = make_data_segment(ranks, part, 0x1234);
  partition_allocator alloc;
  CHECK_FALSE(alloc.fits(1));
  CHECK_FALSE(alloc.allocate(1).has_value());
  alloc.add_partition(seg, me);
  const std::size_t begin = me * part + partition_allocator::colour_of(me);
  const std::size_t end = (me + 1) * part;

  auto a = alloc.allocate(100);
  REQUIRE(a.has_value());
  CHECK(a->first == seg);
  CHECK(a->second == begin);  // rank 2's partition, after its colour
  CHECK(alloc.bytes_in_use() == aligned(100));
  auto b = alloc.allocate(0);  // zero bytes still take one aligned unit
  REQUIRE(b.has_value());
  CHECK(b->second == begin + 128);
  CHECK(alloc.bytes_in_use() == 128 + 64);
  auto c = alloc.allocate(4096 + 1);
  REQUIRE(c.has_value());
  CHECK(c->second == begin + 192);
  CHECK(c->second % 64 == 0);
  CHECK(alloc.bytes_in_use() == 192 + aligned(4097));

  // The rest of the partition, exactly, then nothing.
  const std::size_t rest = end - (begin + 192 + aligned(4097));
  CHECK(alloc.fits(rest));
  CHECK_FALSE(alloc.fits(rest + 1));
  auto d = alloc.allocate(rest);
  REQUIRE(d.has_value());
  CHECK(d->second + rest == end);  // never beyond rank 2's partition
  CHECK_FALSE(alloc.allocate(1).has_value());
  CHECK_FALSE(alloc.fits(1));

  // Free b and a: they coalesce, so a block of both fits where a was.
  alloc.release(seg->id, b->second, 0);
  alloc.release(seg->id, a->second, 100);
  CHECK(alloc.bytes_in_use() == aligned(4097) + rest);
  CHECK_FALSE(alloc.fits(193));
  auto ab = alloc.allocate(192);
  REQUIRE(ab.has_value());
  CHECK(ab->second == begin);

  // Release everything: one free range again, the whole partition after the colour.
  alloc.release(seg->id, ab->second, 192);
  alloc.release(seg->id, d->second, rest);
  alloc.release(seg->id, c->second, 4097);
  CHECK(alloc.bytes_in_use() == 0);
  CHECK(alloc.fits(end - begin));
  auto all = alloc.allocate(end - begin);
  REQUIRE(all.has_value());
  CHECK(all->second == begin);
  alloc.release(seg->id, all->second, end - begin);

  // Releasing the same block twice is ignored (no negative use, no duplicate free range).
  auto e = alloc.allocate(64);
  auto f = alloc.allocate(64);
  REQUIRE((e && f));
  alloc.release(seg->id, e->second, 64);
  alloc.release(seg->id, e->second, 64);
  CHECK(alloc.bytes_in_use() == 64);
  // ... also when the block was merged into a neighbouring free range in between (y freed,
  // then x, which absorbs y's range; freeing y again must change nothing).
  {
    auto hole = alloc.allocate(64);  // fills e's range, so x, y, z come out adjacent
    auto x = alloc.allocate(64);
    auto y = alloc.allocate(64);
    auto z = alloc.allocate(64);
    REQUIRE((hole && x && y && z));
    REQUIRE(y->second == x->second + 64);
    const std::size_t before = alloc.bytes_in_use();
    alloc.release(seg->id, y->second, 64);
    alloc.release(seg->id, x->second, 64);  // merges with y's free range
    alloc.release(seg->id, y->second, 64);  // y is inside that range now: a double free
    CHECK(alloc.bytes_in_use() == before - 128);
    auto p1 = alloc.allocate(64);
    auto p2 = alloc.allocate(64);
    REQUIRE((p1 && p2));
    CHECK(p1->second != p2->second);  // no two live allocations share memory
    CHECK(p1->second != z->second);
    CHECK(p2->second != z->second);
    alloc.release(seg->id, p1->second, 64);
    alloc.release(seg->id, p2->second, 64);
    alloc.release(seg->id, z->second, 64);
    CHECK(alloc.bytes_in_use() == before - 192);
    alloc.release(seg->id, hole->second, 64);
  }
  // Releasing into a segment this allocator does not own changes nothing.
  alloc.release(0x9999, f->second, 64);
  CHECK(alloc.bytes_in_use() == 64);
  alloc.release(seg->id, f->second, 64);
  CHECK(alloc.bytes_in_use() == 0);
}

TEST_CASE("arena: allocation moves on to the next partition when one is full") {
  no_leak_guard guard;
  const std::size_t part = zcoll::page_size();
  auto s1 = make_data_segment(2, part, 1);
  auto s2 = make_data_segment(2, part, 2);
  partition_allocator alloc;
  alloc.add_partition(s1, 0);  // colour 0: the whole page
  alloc.add_partition(s2, 1);  // colour 576: the page after it
  auto a = alloc.allocate(part);
  REQUIRE(a.has_value());
  CHECK(a->first == s1);
  CHECK(a->second == 0);
  auto b = alloc.allocate(64);
  REQUIRE(b.has_value());
  CHECK(b->first == s2);
  CHECK(b->second == part + partition_allocator::colour_of(1));
  CHECK_FALSE(alloc.fits(part - partition_allocator::colour_of(1)));  // 64 bytes are taken
  alloc.release(1, a->second, part);
  CHECK(alloc.fits(part));
  alloc.release(2, b->second, 64);
  CHECK(alloc.bytes_in_use() == 0);
}

TEST_CASE("arena: a partition smaller than its colour has no free space") {
  no_leak_guard guard;
  auto seg = make_data_segment(8, 512, 3);  // not page-aligned on purpose: colour_of(1) = 576
  partition_allocator alloc;
  alloc.add_partition(seg, 1);
  CHECK_FALSE(alloc.fits(1));
  CHECK_FALSE(alloc.allocate(1).has_value());
}

TEST_CASE("arena: registry finds segments by address and id while they live") {
  no_leak_guard guard;
  auto& reg = zcoll::detail::segment_registry::instance();
  const std::size_t part = zcoll::page_size();
  auto seg = make_data_segment(2, part, 0xABCDEF);
  reg.add(seg);
  std::byte* base = seg->shm->data();
  std::size_t offset = 12345;
  CHECK(reg.find(base + 100, 50, &offset) == seg);
  CHECK(offset == 100);
  CHECK(reg.find(base, 2 * part, nullptr) == seg);
  CHECK(reg.find(base + 1, 2 * part, nullptr) == nullptr);  // runs past the end
  CHECK(reg.find(0xABCDEF) == seg);
  CHECK(reg.find(0xABCDEE) == nullptr);
  CHECK(zcoll::in_arena(base + part, part));
  int on_stack = 0;
  CHECK_FALSE(zcoll::in_arena(&on_stack, sizeof on_stack));
  CHECK(seg->partition(1) == base + part);

  // The registry holds weak references: a dead segment is not found any more.
  std::weak_ptr<zcoll::data_segment> weak = seg;
  seg.reset();
  CHECK(weak.expired());
  CHECK(reg.find(0xABCDEF) == nullptr);
  CHECK_FALSE(zcoll::in_arena(base + 100, 1));
}

TEST_CASE("arena: mapped_by_all") {
  no_leak_guard guard;
  auto seg = make_data_segment(1, zcoll::page_size(), 5);
  seg->member_pids = {10, 20, 30};
  CHECK(seg->mapped_by_all({10, 30}));
  CHECK(seg->mapped_by_all({10, 20, 30}));
  CHECK(seg->mapped_by_all({}));
  CHECK_FALSE(seg->mapped_by_all({10, 25}));
  CHECK_FALSE(seg->mapped_by_all({40}));
  seg->owner_alive = false;
  CHECK_FALSE(seg->mapped_by_all({10}));
}

TEST_CASE("arena: arena_block returns its range to the allocator") {
  no_leak_guard guard;
  auto seg = make_data_segment(1, 4 * zcoll::page_size(), 6);
  auto alloc = std::make_shared<partition_allocator>();
  alloc->add_partition(seg, 0);
  {
    auto got = alloc->allocate(1000);
    REQUIRE(got.has_value());
    zcoll::arena_block block(got->first, alloc, got->second, 1000);
    CHECK(block.size() == 1000);
    CHECK(block.data() == seg->shm->data() + got->second);
    std::memset(block.data(), 3, block.size());
    CHECK(alloc->bytes_in_use() == aligned(1000));
    // A view of a peer's allocation (no allocator) releases nothing.
    zcoll::arena_block view(seg, {}, got->second, 1000);
    CHECK(view.data() == block.data());
  }
  CHECK(alloc->bytes_in_use() == 0);
  // The block keeps the mapping alive after the allocator and the caller dropped theirs.
  auto got = alloc->allocate(64);
  REQUIRE(got.has_value());
  auto block = std::make_unique<zcoll::arena_block>(got->first, alloc, got->second, 64);
  std::weak_ptr<zcoll::data_segment> weak = seg;
  got.reset();
  seg.reset();
  alloc.reset();  // the allocator's partition list held the last other reference
  CHECK_FALSE(weak.expired());
  block->data()[0] = std::byte{1};
  block.reset();  // allocator gone: nothing to release into
  CHECK(weak.expired());
}
