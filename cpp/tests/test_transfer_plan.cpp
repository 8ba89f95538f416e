// Transfer plans (transfer_plan.hpp) on a real node context of one rank, in one process: the
// node part of a transfer over three communicator ranks, of which this process is rank 1 (the
// rest would be on other nodes). The plan must copy what run_transfer copies, rebind a run's
// arrays, and refuse misuse as plan.hpp says.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "test_util.hpp"
#include "zcoll/error.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/transfer_plan.hpp"

using namespace zcoll;

namespace {

constexpr dtype_id f8{'d', 8};

std::shared_ptr<node_context> one_rank_context(int comm_rank, int comm_size) {
  auto control = shm_segment::create(node_context::control_bytes(1));
  control->unlink();
  context_config c;
  c.rank = 0;
  c.size = 1;
  c.comm_size = comm_size;
  c.comm_ranks = {comm_rank};
  c.pids = {static_cast<std::int32_t>(::getpid())};
  c.wait.timeout_s = 5;
  return std::make_shared<node_context>(std::move(control), std::move(c));
}

// A C-contiguous float64 array of `shape` over `data` (arena or not).
struct array {
  std::vector<std::int64_t> shape;
  array_view view;
  array(std::byte* data, std::vector<std::int64_t> dims) : shape(std::move(dims)) {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    view.data = data;
    view.size = n;
    view.nbytes = n * 8;
    view.ndim = static_cast<int>(shape.size());
    view.first_dim = static_cast<std::size_t>(shape[0]);
    view.shape = shape.data();
    view.dtype = f8;
  }
  double* at() const { return static_cast<double*>(const_cast<void*>(view.data)); }
  std::size_t size() const { return view.size; }
};

transfer_geometry geometry() {
  transfer_geometry g;
  g.ndim = 3;
  g.shape = {10, 7, 6};
  g.axis_a = 2;
  g.axis_b = 0;
  g.itemsize = 8;
  g.comm_size = 3;
  return g;
}

template <class Error, class Step>
std::string error_of(Step step) {
  try {
    step();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("transfer plan: the node part of a transfer, as run_transfer copies it") {
  auto ctx = one_rank_context(1, 3);
  const transfer_geometry g = geometry();
  // Rank 1 of 3: rows 4..6 of axis 0 before, columns 2..3 of axis 2 after.
  auto send_block = ctx->allocate(3 * 7 * 6 * 8);
  auto plain_block = ctx->allocate(10 * 7 * 2 * 8);
  auto plan_block = ctx->allocate(10 * 7 * 2 * 8);
  auto other_block = ctx->allocate(10 * 7 * 2 * 8);
  array send(send_block->data(), {3, 7, 6}), plain(plain_block->data(), {10, 7, 2}),
      planned(plan_block->data(), {10, 7, 2}), other(other_block->data(), {10, 7, 2});
  for (std::size_t i = 0; i < send.size(); ++i) send.at()[i] = static_cast<double>(i) + 0.5;
  for (const array* a : {&plain, &planned, &other})
    for (std::size_t i = 0; i < a->size(); ++i) a->at()[i] = -1;

  ctx->run_transfer(g, send.view, plain.view, auto_order, auto_copy);
  transfer_plan plan(ctx, g, send.view, planned.view, auto_order, auto_copy);
  CHECK(plan.id() >= 1);
  CHECK(plan.order() == block_order::row);
  CHECK(plan.block_count() == 1);               // only the block from rank 1 to itself
  CHECK(plan.copied_bytes() == 3 * 7 * 2 * 8);  // its rows 4..6 into its columns 2..3
  plan.run();
  CHECK(std::memcmp(plain.at(), planned.at(), plain.view.nbytes) == 0);
  // The block landed where the geometry says: rows 4..6, columns 2..3 of the global array.
  CHECK(planned.at()[(4 * 7 + 0) * 2 + 0] == send.at()[(0 * 7 + 0) * 6 + 2]);
  CHECK(planned.at()[(0 * 7 + 0) * 2 + 0] == -1);  // rank 0's rows come from another node

  SUBCASE("a run rebinds this rank's destination; the plan's own is left alone") {
    for (std::size_t i = 0; i < planned.size(); ++i) planned.at()[i] = -2;
    plan.start(nullptr, &other.view);
    CHECK(plan.active());
    plan.wait();
    CHECK(std::memcmp(plain.at(), other.at(), plain.view.nbytes) == 0);
    CHECK(planned.at()[(4 * 7 + 0) * 2 + 0] == -2);
    for (std::size_t i = 0; i < planned.size(); ++i) planned.at()[i] = -1;
    plan.start(nullptr, &planned.view);  // its own array again, named: no rebinding
    CHECK(plan.test());
    CHECK(std::memcmp(plain.at(), planned.at(), plain.view.nbytes) == 0);
  }

  SUBCASE("unfit arrays for a run raise, and the plan still runs after") {
    std::vector<std::byte> outside(10 * 7 * 2 * 8);
    array private_dst(outside.data(), {10, 7, 2}), wrong(other_block->data(), {10, 7, 1});
    CHECK(contains(error_of<usage_error>([&] { plan.start(nullptr, &private_dst.view); }),
                   "[rank 1] zcoll.transfer: the destination array is not in the shared arena"));
    CHECK(contains(error_of<usage_error>([&] { plan.start(nullptr, &wrong.view); }),
                   "the destination array has shape (10, 7, 1)"));
    array overlapping(send_block->data(), {10, 7, 2});
    overlapping.view.nbytes = 10 * 7 * 2 * 8;
    CHECK(contains(error_of<usage_error>([&] { plan.start(nullptr, &overlapping.view); }),
                   "overlap"));
    CHECK_FALSE(plan.active());
    plan.run();
    CHECK(std::memcmp(plain.at(), planned.at(), plain.view.nbytes) == 0);
  }

  SUBCASE("misuse: started twice, used after free") {
    plan.start();
    CHECK(contains(error_of<usage_error>([&] { plan.start(); }), "already active"));
    plan.wait();
    plan.wait();  // nothing active: returns at once
    CHECK(plan.test());
    plan.free();
    CHECK(plan.freed());
    CHECK(error_of<usage_error>([&] { plan.run(); }) == "zcoll: this plan was freed");
    CHECK(error_of<usage_error>([&] { plan.wait(); }) == "zcoll: this plan was freed");
    plan.free();  // idempotent
  }

  SUBCASE("a closed context: every run raises") {
    ctx->close();
    CHECK(contains(error_of<usage_error>([&] { plan.run(); }), "closed"));
    plan.free();
  }
}

TEST_CASE("transfer plan: creation refuses arrays outside the arena and bad arguments") {
  auto ctx = one_rank_context(0, 1);
  transfer_geometry g = geometry();
  g.comm_size = 1;
  auto block = ctx->allocate(10 * 7 * 6 * 8);
  auto dst_block = ctx->allocate(10 * 7 * 6 * 8);
  std::vector<std::byte> outside(10 * 7 * 6 * 8);
  array in_arena(block->data(), {10, 7, 6}), private_src(outside.data(), {10, 7, 6});
  array dst(dst_block->data(), {10, 7, 6});
  CHECK(contains(error_of<usage_error>([&] {
                   transfer_plan p(ctx, g, private_src.view, in_arena.view, auto_order, auto_copy);
                 }),
                 "zcoll.transfer_init: rank 0's source array is not in the shared arena"));
  array wrong(block->data(), {10, 7, 5});
  CHECK(contains(error_of<usage_error>([&] {
                   transfer_plan p(ctx, g, wrong.view, in_arena.view, auto_order, auto_copy);
                 }),
                 "[rank 0] zcoll.transfer_init: the source array has shape (10, 7, 5)"));
  CHECK(contains(error_of<usage_error>(
                     [&] { transfer_plan p(ctx, g, in_arena.view, dst.view, 7, auto_copy); }),
                 "unknown order code 7"));
  CHECK(contains(error_of<usage_error>([&] {
                   transfer_plan p(ctx, g, in_arena.view, in_arena.view, auto_order, auto_copy);
                 }),
                 "the source and destination arrays overlap"));
  // The context is still usable: a plan at P = 1 is a copy.
  for (std::size_t i = 0; i < in_arena.size(); ++i) in_arena.at()[i] = static_cast<double>(i);
  transfer_plan p(ctx, g, in_arena.view, dst.view, static_cast<int>(block_order::hilbert),
                  static_cast<int>(copy_mode::streaming));
  p.run();
  CHECK(std::memcmp(in_arena.at(), dst.at(), dst.view.nbytes) == 0);
  CHECK(p.copy().mode == copy_mode::streaming);
}

TEST_CASE("transfer plan: the reversed plan runs the inverse transfer, agreeing on nothing") {
  auto ctx = one_rank_context(1, 3);
  const transfer_geometry g = geometry();
  auto a_block = ctx->allocate(3 * 7 * 6 * 8);
  auto b_block = ctx->allocate(10 * 7 * 2 * 8);
  auto back_block = ctx->allocate(3 * 7 * 6 * 8);
  array a(a_block->data(), {3, 7, 6}), b(b_block->data(), {10, 7, 2}),
      back(back_block->data(), {3, 7, 6});
  for (std::size_t i = 0; i < a.size(); ++i) a.at()[i] = static_cast<double>(i) + 0.25;
  transfer_plan forward(ctx, g, a.view, b.view, auto_order, auto_copy);
  const std::uint64_t calls = ctx->calls();
  const auto inverse = forward.reversed(auto_copy);
  CHECK(ctx->calls() == calls);  // no agreement
  CHECK(inverse->id() == forward.id() + 1);
  CHECK(inverse->geometry().axis_a == g.axis_b);
  CHECK(inverse->geometry().axis_b == g.axis_a);
  CHECK(inverse->order() == forward.order());
  CHECK(inverse->copied_bytes() == forward.copied_bytes());  // the block from rank 1 to itself
  forward.run();
  for (std::size_t i = 0; i < a.size(); ++i) a.at()[i] = -1;
  inverse->run();  // b back into a: rank 1's own block is back where it was
  CHECK(a.at()[(0 * 7 + 0) * 6 + 2] == 2.25);
  CHECK(a.at()[(2 * 7 + 6) * 6 + 3] == static_cast<double>((2 * 7 + 6) * 6 + 3) + 0.25);
  CHECK(a.at()[(0 * 7 + 0) * 6 + 0] == -1);  // columns 0..1 come from rank 0, on another node
  // Against a plan made with its own agreement, on a third array.
  transfer_geometry ig = g;
  std::swap(ig.axis_a, ig.axis_b);
  transfer_plan agreed(ctx, ig, b.view, back.view, auto_order, auto_copy);
  for (std::size_t i = 0; i < back.size(); ++i) back.at()[i] = -1;
  agreed.run();
  CHECK(std::memcmp(a.at(), back.at(), a.view.nbytes) == 0);
  forward.free();
  CHECK(contains(error_of<usage_error>([&] { forward.reversed(auto_copy); }), "was freed"));
}
