// Node pools (pool.hpp) and contexts opened on their blocks (context_setup.hpp): claiming,
// opening, releasing and reusing blocks, one rank's view (no peers: node size 1 or blocks
// claimed for users that never arrive). Every case ends with nothing of this process in
// /dev/shm.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "test_util.hpp"
#include "zcoll/context_setup.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/pool.hpp"

using zcoll::node_pool;

namespace {

struct no_leak_guard {
  ~no_leak_guard() {
    const auto left = zcoll_test::shm_entries(zcoll_test::own_segment_prefix());
    CHECK(left.empty());
  }
};

std::shared_ptr<node_pool> make_pool(int size) {
  auto pool = node_pool::create({size, 4096});
  pool->segment()->unlink();
  return pool;
}

zcoll::context_setup setup_for_one_rank() {
  zcoll::context_setup s;
  s.config.comm_ranks = {0};
  s.config.pids = {0};
  s.eager_bytes = 1024;
  s.copy_threshold = 1 << 20;
  s.copy_cache = 1 << 25;
  s.cma_bytes = 1 << 16;
  return s;
}

}  // namespace

TEST_CASE("a released block is claimed again, with its user count and a cleared control part") {
  no_leak_guard guard;
  auto pool = make_pool(2);
  CHECK(pool->users(0) == 2);  // the full creation's block
  const int block = pool->claim(1);
  REQUIRE(block > 0);
  CHECK(pool->users(block) == 1);
  CHECK(pool->blocks_in_use() == 2);
  {
    auto [control, eager] = pool->open(block);
    std::memset(control->data(), 0x5a, 64);  // as a context's sequence numbers would
  }
  CHECK(pool->users(block) == 0);  // both parts gone: the one user released it
  CHECK(pool->blocks_in_use() == 1);
  const int again = pool->claim(2);
  CHECK(again == block);
  CHECK(pool->users(again) == 2);
  auto [control, eager] = pool->open(again);
  CHECK(std::to_integer<int>(control->data()[0]) == 0);
}

TEST_CASE("an abandoned block is free again, and opening a free block throws") {
  no_leak_guard guard;
  auto pool = make_pool(2);
  const int block = pool->claim(2);
  REQUIRE(block > 0);
  pool->abandon(block);
  CHECK(pool->users(block) == 0);
  CHECK_THROWS_AS(pool->open(block), std::invalid_argument);
  CHECK(pool->claim(1) == block);
  CHECK_THROWS_AS(pool->claim(3), std::invalid_argument);  // more users than node ranks
}

TEST_CASE("every block claimed: claim says -1 until one is released") {
  no_leak_guard guard;
  auto pool = make_pool(1);
  const int blocks = pool->layout().blocks();
  for (int i = 1; i < blocks; ++i) REQUIRE(pool->claim(1) == i);
  CHECK(pool->claim(1) == -1);
  pool->abandon(blocks - 1);
  CHECK(pool->claim(1) == blocks - 1);
}

TEST_CASE("open_context configures the context as its set-up says and holds the block") {
  no_leak_guard guard;
  auto pool = make_pool(1);
  const int block = pool->claim(1);
  REQUIRE(block > 0);
  auto setup = setup_for_one_rank();
  setup.cma = std::make_pair(zcoll::cross_memory::state::refused, std::string("not here"));
  {
    auto ctx = zcoll::open_context(*pool, block, setup, nullptr);
    CHECK(ctx->eager_bytes() == 1024);
    CHECK(ctx->policy().cma_bytes() == (1 << 16));
    CHECK(ctx->policy().copy().cache_bytes() == (1 << 25));
    CHECK(ctx->cma().current() == zcoll::cross_memory::state::refused);
    CHECK(ctx->cma().refusal() == "not here");
    CHECK(pool->users(block) == 1);
    ctx->barrier();  // one node rank: its own barrier on the block's control part
  }
  CHECK(pool->users(block) == 0);
  setup.eager_bytes = pool->layout().eager_partition();  // more than a partition's two slots
  CHECK_THROWS_AS(zcoll::open_context(*pool, pool->claim(1), setup, nullptr),
                  std::invalid_argument);
}
