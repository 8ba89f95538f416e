// Reductions spread across nodes (spread_reduction.hpp), without MPI: forked processes stand in
// for the ranks of a communicator cut into nodes, each node with its own control segment and
// node contexts, and a message transport of this file's (per sender, receiver and tag a FIFO in
// shared memory, matched as MPI matches point-to-point messages) carries the messages between
// nodes -- phase by phase as the Python path sends them, or as a flow as the C++ sender runs
// it. Every result is checked against its closed form: allreduce, reduce to several roots,
// reduce_scatter_block and bcast, in place or not, inputs in the arena or private, pieces of
// one segment or of many, on nodes of one rank, of several, of uneven sizes, interleaved.
// Also the pieces, owners and servers the header defines.
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test_util.hpp"
#include "zcoll/aggregate.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/spread_reduction.hpp"

using namespace zcoll;

namespace {

constexpr int max_ranks = 5;
constexpr int max_checks = 1024;
constexpr std::size_t channel_bytes = std::size_t{1} << 20;

// One direction of one (sender, receiver, tag): a ring with one writer and one reader. A
// message is its length, then its bytes; the writer publishes it whole.
struct channel {
  std::atomic<std::uint64_t> written;   // bytes appended, ever
  std::atomic<std::uint64_t> consumed;  // bytes read, ever
  std::byte ring[channel_bytes];
};

// Shared between the parent and its forked ranks (an anonymous shared mapping).
struct shared_state {
  std::atomic<int> go;
  std::int32_t pids[max_ranks];
  std::uint64_t digest[max_ranks][max_checks];  // per rank: a hash of each full result
  channel channels[max_ranks][max_ranks][2];    // [sender][receiver][tag: partial, result]
};

shared_state* new_state() {
  void* p = ::mmap(nullptr, sizeof(shared_state), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  REQUIRE(p != MAP_FAILED);
  return new (p) shared_state;  // the mapping is zero; the rings are touched only as used
}

std::uint64_t hash_bytes(const void* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// Waits (bounded) until `ready()`; a wait that never ends fails the rank.
template <class Ready>
void wait_until(Ready&& ready, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!ready()) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60))
      throw std::runtime_error(std::string("transport: timed out waiting for ") + what);
    std::this_thread::yield();
  }
}

// Messages between this rank and the ranks of other nodes.
class transport {
 public:
  transport(shared_state* state, int self) : state_(state), self_(self) {}

  void send(const peer_buffer& b) {
    channel& c = state_->channels[self_][b.peer][tag_index(b.tag)];
    const std::uint64_t need = sizeof(std::uint64_t) + b.bytes;
    if (need > channel_bytes) throw std::runtime_error("transport: message larger than a ring");
    const std::uint64_t at = c.written.load(std::memory_order_relaxed);
    wait_until(
        [&] { return at + need - c.consumed.load(std::memory_order_acquire) <= channel_bytes; },
        "room in a ring");
    const std::uint64_t length = b.bytes;
    copy_in(c, at, &length, sizeof length);
    copy_in(c, at + sizeof length, b.data, b.bytes);
    c.written.store(at + need, std::memory_order_release);
  }

  // Receives the next message from b.peer with b.tag into `b` if it arrived.
  bool try_receive(const peer_buffer& b) {
    channel& c = state_->channels[b.peer][self_][tag_index(b.tag)];
    const std::uint64_t at = c.consumed.load(std::memory_order_relaxed);
    if (c.written.load(std::memory_order_acquire) == at) return false;
    std::uint64_t length = 0;
    copy_out(c, at, &length, sizeof length);
    if (length != b.bytes)
      throw std::runtime_error("transport: a message of " + std::to_string(length) +
                               " bytes for a receive of " + std::to_string(b.bytes));
    copy_out(c, at + sizeof length, b.data, b.bytes);
    c.consumed.store(at + sizeof length + length, std::memory_order_release);
    return true;
  }

  // A phase as the Python path runs it: every send posted, then every receive completed.
  void exchange(std::span<const peer_block> recvs, std::span<const peer_block> sends, int tag) {
    for (const peer_block& b : sends) send({b.peer, tag, b.data, b.bytes});
    for (const peer_block& b : recvs)
      wait_until([&] { return try_receive({b.peer, tag, b.data, b.bytes}); }, "a phase's message");
  }

  // A flow as the C++ sender runs it (mpi_messages.cpp's exchange_flow): post what the flow
  // hands out, tell it each message completed, let it work while nothing completes. A send
  // completes at the next test; a receive when its message arrived, each (peer, tag) in the
  // order its receives were posted.
  void run_flow(message_flow& flow) {
    struct posted {
      std::size_t id;
      peer_buffer b;
    };
    std::vector<posted> receives;
    std::vector<std::size_t> sent, done;
    std::vector<peer_buffer> recvs, sends;
    std::size_t next_id = 0;
    const auto post = [&] {
      recvs.clear();
      sends.clear();
      flow.take(recvs, sends);
      for (const peer_buffer& b : recvs) receives.push_back({next_id++, b});
      for (const peer_buffer& b : sends) {
        send(b);
        sent.push_back(next_id++);
      }
    };
    post();
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      done.swap(sent);
      std::set<std::pair<int, int>> waiting;  // (peer, tag) whose first receive has no message
      for (auto it = receives.begin(); it != receives.end();) {
        const std::pair<int, int> key{it->b.peer, it->b.tag};
        if (!waiting.count(key) && try_receive(it->b)) {
          done.push_back(it->id);
          it = receives.erase(it);
        } else {
          waiting.insert(key);
          ++it;
        }
      }
      if (done.empty()) {
        if (flow.step()) {
          post();
        } else if (receives.empty()) {
          return;
        } else {
          if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60))
            throw std::runtime_error("transport: a flow's messages never arrived");
          std::this_thread::yield();
        }
        continue;
      }
      for (const std::size_t id : done) flow.completed(id);
      done.clear();
      post();
    }
  }

 private:
  static int tag_index(int tag) {
    if (tag == spread_partial_tag) return 0;
    if (tag == spread_result_tag) return 1;
    throw std::runtime_error("transport: unknown tag " + std::to_string(tag));
  }
  static void copy_in(channel& c, std::uint64_t at, const void* p, std::size_t n) {
    const auto* from = static_cast<const std::byte*>(p);
    while (n) {
      const std::size_t pos = at % channel_bytes, len = std::min(n, channel_bytes - pos);
      std::memcpy(c.ring + pos, from, len);
      at += len, from += len, n -= len;
    }
  }
  static void copy_out(const channel& c, std::uint64_t at, void* p, std::size_t n) {
    auto* into = static_cast<std::byte*>(p);
    while (n) {
      const std::size_t pos = at % channel_bytes, len = std::min(n, channel_bytes - pos);
      std::memcpy(into, c.ring + pos, len);
      at += len, into += len, n -= len;
    }
  }

  shared_state* state_;
  int self_;
};

constexpr dtype_id i8{'l', 8};
constexpr dtype_id f8{'d', 8};
constexpr dtype_id u1{'B', 1};

array_view view_of(void* data, std::size_t n, dtype_id dt, std::int64_t* shape) {
  array_view v;
  v.data = data;
  v.size = n;
  v.nbytes = n * dt.itemsize;
  v.ndim = 1;
  shape[0] = static_cast<std::int64_t>(n);
  v.first_dim = n;
  v.shape = shape;
  v.dtype = dt;
  return v;
}

// Communicator rank r's input at element i, and the sum over the `p` ranks (closed form).
std::int64_t input(int r, std::size_t i) {
  return (r + 1) * 1000003 + static_cast<std::int64_t>(i % 4099);
}
std::int64_t sum_at(int p, std::size_t i) {
  return 1000003 * static_cast<std::int64_t>(p) * (p + 1) / 2 +
         p * static_cast<std::int64_t>(i % 4099);
}
double real_input(int r, std::size_t i) {
  return 0.1 * (r + 1) + 1e-3 * static_cast<double>(i);
}

// Buffers for one call: placement 0 private; 1 in the arena; 2 in the arena on even ranks,
// private on odd ones. Arena blocks are allocated by every rank of the node alike (a collective
// call), whether this rank uses them or not.
class buffers {
 public:
  buffers(node_context& ctx, int placement, int self)
      : ctx_(ctx),
        placement_(placement),
        private_(placement == 0 || (placement == 2 && self % 2)) {}
  template <class T>
  T* make(std::size_t n) {
    const std::size_t bytes = std::max<std::size_t>(n, 1) * sizeof(T);
    if (placement_) blocks_.push_back(ctx_.allocate(bytes));
    if (!private_) return reinterpret_cast<T*>(blocks_.back()->data());
    own_.emplace_back(bytes);
    return reinterpret_cast<T*>(own_.back().data());
  }

 private:
  node_context& ctx_;
  int placement_;
  bool private_;
  std::vector<std::shared_ptr<arena_block>> blocks_;
  std::vector<std::vector<std::byte>> own_;
};

// Runs the spread checks of one rank; returns 0 when every result was right.
class spread_checks {
 public:
  spread_checks(node_context& ctx, const node_map& nodes, transport& t, shared_state* state,
                int self)
      : ctx_(ctx),
        nodes_(nodes),
        spread_(ctx, nodes),
        t_(t),
        state_(state),
        self_(self),
        p_(static_cast<int>(nodes.node_of.size())) {}

  int run_all() {
    for (const std::size_t segment : {std::size_t{128}, std::size_t{0}})
      for (const bool flow : {false, true})
        for (int placement = 0; placement < 3; ++placement) {
          ctx_.between_nodes(nodes_).overrides().spread_segment = segment;
          flow_ = flow;
          std::vector<std::size_t> counts{1, 37, 1000};
          if (segment == 0) counts.push_back(20000);
          for (const std::size_t n : counts) {
            allreduce(n, placement, false);
            allreduce(n, placement, true);
            real_allreduce(n, placement);
            for (const int root : {0, p_ - 1}) {
              reduce(n, placement, root, false);
              bcast(n * 8 + 3, placement, root);
            }
            reduce(n, placement, p_ / 2, true);
            reduce_scatter(n / 8 + 1, placement, false);
            reduce_scatter(n / 8 + 1, placement, true);
          }
        }
    return failures_;
  }

 private:
  void run(const reduction_call& call) {
    spread_.begin(call, flow_);
    if (spread_.flowing()) {
      t_.run_flow(spread_);
    } else {
      t_.exchange(spread_.recvs(), spread_.sends(), spread_partial_tag);
      spread_.combine();
      t_.exchange(spread_.recvs(), spread_.sends(), spread_result_tag);
    }
    spread_.finish();
  }
  void expect(bool ok, const char* what, std::size_t n) {
    if (ok) return;
    ++failures_;
    std::fprintf(stderr, "rank %d: %s wrong (n=%zu, flow=%d, segment=%zu)\n", self_, what, n,
                 static_cast<int>(flow_), ctx_.between_nodes(nodes_).overrides().spread_segment);
  }
  void digest(const void* p, std::size_t bytes) {
    if (check_ < max_checks) state_->digest[self_][check_] = hash_bytes(p, bytes);
    ++check_;
  }

  void allreduce(std::size_t n, int placement, bool in_place) {
    buffers b(ctx_, placement, self_);
    auto* in = b.make<std::int64_t>(n);
    auto* out = b.make<std::int64_t>(n);
    std::int64_t s1[1], s2[1];
    for (std::size_t i = 0; i < n; ++i) (in_place ? out : in)[i] = input(self_, i);
    const array_view sv = view_of(in, n, i8, s1), rv = view_of(out, n, i8, s2);
    run({op_code::allreduce, in_place ? nullptr : &sv, &rv, 0, auto_algorithm, 0});
    bool ok = true;
    for (std::size_t i = 0; i < n; ++i) ok &= out[i] == sum_at(p_, i);
    expect(ok, in_place ? "allreduce in place" : "allreduce", n);
    digest(out, n * 8);
  }

  // Floating point: close to the closed form, and the same bits on every rank (parent checks).
  void real_allreduce(std::size_t n, int placement) {
    buffers b(ctx_, placement, self_);
    auto* in = b.make<double>(n);
    auto* out = b.make<double>(n);
    std::int64_t s1[1], s2[1];
    for (std::size_t i = 0; i < n; ++i) in[i] = real_input(self_, i);
    const array_view sv = view_of(in, n, f8, s1), rv = view_of(out, n, f8, s2);
    run({op_code::allreduce, &sv, &rv, 0, auto_algorithm, 0});
    bool ok = true;
    for (std::size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int r = 0; r < p_; ++r) want += real_input(r, i);
      ok &= std::abs(out[i] - want) <= 1e-12 * p_ * (1 + std::abs(want));
    }
    expect(ok, "allreduce of float64", n);
    digest(out, n * 8);
  }

  // A reduce's result only at the root; elsewhere the receive buffer is left as it was.
  void reduce(std::size_t n, int placement, int root, bool in_place) {
    buffers b(ctx_, placement, self_);
    auto* in = b.make<std::int64_t>(n);
    auto* out = b.make<std::int64_t>(n);
    const bool root_in_place = in_place && self_ == root;
    std::int64_t s1[1], s2[1];
    for (std::size_t i = 0; i < n; ++i) {
      (root_in_place ? out : in)[i] = input(self_, i);
      if (!root_in_place) out[i] = -7;
    }
    const array_view sv = view_of(in, n, i8, s1), rv = view_of(out, n, i8, s2);
    run({op_code::reduce, root_in_place ? nullptr : &sv, &rv, 0, auto_algorithm, root});
    bool ok = true;
    for (std::size_t i = 0; i < n; ++i) ok &= out[i] == (self_ == root ? sum_at(p_, i) : -7);
    expect(ok, in_place ? "reduce in place" : "reduce", n);
  }

  // reduce_scatter_block: block r of the sum, `block` elements, on rank r.
  void reduce_scatter(std::size_t block, int placement, bool in_place) {
    const std::size_t n = block * static_cast<std::size_t>(p_);
    buffers b(ctx_, placement, self_);
    auto* in = b.make<std::int64_t>(n);
    auto* out = b.make<std::int64_t>(in_place ? n : block);
    std::int64_t s1[1], s2[1];
    for (std::size_t i = 0; i < n; ++i) (in_place ? out : in)[i] = input(self_, i);
    const array_view sv = view_of(in, n, i8, s1);
    const array_view rv = view_of(out, in_place ? n : block, i8, s2);
    run({op_code::reduce_scatter, in_place ? nullptr : &sv, &rv, 0, auto_algorithm, 0});
    bool ok = true;
    const std::size_t first = static_cast<std::size_t>(self_) * block;
    for (std::size_t k = 0; k < block; ++k) ok &= out[k] == sum_at(p_, first + k);
    expect(ok, in_place ? "reduce_scatter in place" : "reduce_scatter", block);
  }

  void bcast(std::size_t bytes, int placement, int root) {
    buffers b(ctx_, placement, self_);
    auto* buf = b.make<std::uint8_t>(bytes);
    const auto at = [&](std::size_t i) { return static_cast<std::uint8_t>((i * 7 + root) & 0xff); };
    for (std::size_t i = 0; i < bytes; ++i) buf[i] = self_ == root ? at(i) : 0xEE;
    std::int64_t s1[1];
    const array_view bv = view_of(buf, bytes, u1, s1);
    run({op_code::bcast, nullptr, &bv, 0, auto_algorithm, root});
    bool ok = true;
    for (std::size_t i = 0; i < bytes; ++i) ok &= buf[i] == at(i);
    expect(ok, "bcast", bytes);
    digest(buf, bytes);
  }

  node_context& ctx_;
  const node_map& nodes_;
  spread_reduction spread_;
  transport& t_;
  shared_state* state_;
  int self_, p_;
  bool flow_ = false;
  int failures_ = 0;
  int check_ = 0;
};

// Runs the checks on forked ranks laid out in `layout` (each node's communicator ranks);
// returns their exit codes.
std::vector<int> run_layout(const std::vector<std::vector<int>>& layout, shared_state* state) {
  int p = 0;
  for (const auto& node : layout) p += static_cast<int>(node.size());
  std::vector<int> leader(static_cast<std::size_t>(p));
  std::vector<std::shared_ptr<shm_segment>> controls;
  for (const auto& node : layout) {
    for (const int r : node) leader[static_cast<std::size_t>(r)] = node.front();
    controls.push_back(
        shm_segment::create(node_context::control_bytes(static_cast<int>(node.size()))));
    controls.back()->unlink();
  }
  state->go = 0;
  std::vector<pid_t> kids(static_cast<std::size_t>(p));
  for (int self = 0; self < p; ++self)
    kids[static_cast<std::size_t>(self)] = zcoll_test::fork_child([&, self] {
      while (state->go.load() == 0) ::usleep(100);
      const node_map nodes = node_map::from_leaders(leader);
      const int node = nodes.node_of[static_cast<std::size_t>(self)];
      const auto& members = nodes.members[static_cast<std::size_t>(node)];
      context_config c;
      c.rank = nodes.node_rank[static_cast<std::size_t>(self)];
      c.size = static_cast<int>(members.size());
      c.comm_size = p;
      c.comm_ranks = members;
      for (const int r : members) c.pids.push_back(state->pids[r]);
      c.barrier = barrier_kind::central;
      c.wait.timeout_s = 60;
      node_context ctx(controls[static_cast<std::size_t>(node)], std::move(c));
      transport t(state, self);
      spread_checks checks(ctx, nodes, t, state, self);
      return checks.run_all() ? 1 : 0;
    });
  for (int r = 0; r < p; ++r) state->pids[r] = kids[static_cast<std::size_t>(r)];
  state->go = 1;
  std::vector<int> codes;
  for (const pid_t k : kids) codes.push_back(zcoll_test::wait_child(k, 240));
  return codes;
}

node_map map_of(const std::vector<std::vector<int>>& layout) {
  int p = 0;
  for (const auto& node : layout) p += static_cast<int>(node.size());
  std::vector<int> leader(static_cast<std::size_t>(p));
  for (const auto& node : layout)
    for (const int r : node) leader[static_cast<std::size_t>(r)] = node.front();
  return node_map::from_leaders(leader);
}

}  // namespace

TEST_CASE("spread: pieces cover the result once, in whole lines, one per owner") {
  const std::vector<int> owners{0, 1, 2, 3};
  for (const std::size_t esize : {std::size_t{1}, std::size_t{8}, std::size_t{16}})
    for (const std::size_t count :
         {std::size_t{0}, std::size_t{1}, std::size_t{37}, std::size_t{1000}, std::size_t{4096}}) {
      const auto pieces = spread_pieces(op_code::allreduce, count, esize, 4, owners);
      REQUIRE(pieces.size() == 4);
      std::size_t at = 0;
      for (const result_piece& piece : pieces) {  // in owner order, back to back
        CHECK(piece.from == std::min(at, count * esize));
        at = piece.from + piece.bytes;
        if (piece.from + piece.bytes < count * esize) CHECK(piece.bytes % 64 == 0);
      }
      CHECK(at == count * esize);
      // Balanced: no piece more than a line larger than an equal share.
      for (const result_piece& piece : pieces) CHECK(piece.bytes <= (count * esize + 3) / 4 + 64);
    }
  // reduce_scatter: rank r's block.
  const auto blocks = spread_pieces(op_code::reduce_scatter, 12, 8, 3, std::vector<int>{0, 1, 2});
  REQUIRE(blocks.size() == 3);
  for (std::size_t r = 0; r < 3; ++r) {
    CHECK(blocks[r].from == r * 32);
    CHECK(blocks[r].bytes == 32);
  }
  // Owners a subset (a reduce to one node): the others own nothing.
  const auto some = spread_pieces(op_code::reduce, 100, 8, 5, std::vector<int>{3, 4});
  CHECK(some[0].bytes == 0);
  CHECK(some[1].bytes == 0);
  CHECK(some[2].bytes == 0);
  CHECK(some[3].from == 0);
  CHECK(some[3].bytes + some[4].bytes == 800);
  CHECK(some[4].from == some[3].bytes);
}

TEST_CASE("spread: a reduce on two nodes is owned by the root's node, else by every rank") {
  const node_map two = map_of({{0, 2}, {1, 3, 4}});
  CHECK(spread_owners(two, op_code::reduce, 3) == std::vector<int>{1, 3, 4});
  CHECK(spread_owners(two, op_code::reduce, 0) == std::vector<int>{0, 2});
  CHECK(spread_owners(two, op_code::allreduce, 3) == std::vector<int>{0, 1, 2, 3, 4});
  const node_map three = map_of({{0, 1}, {2}, {3, 4}});
  CHECK(spread_owners(three, op_code::reduce, 2) == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("spread: each node deals the other nodes' pieces round robin to its ranks") {
  // Node 0 = {0, 3, 5}, node 1 = {1, 2}, node 2 = {4}.
  const node_map m = map_of({{0, 3, 5}, {1, 2}, {4}});
  // Node 0 serves owners 1, 2, 4 (the other nodes' ranks, ascending) with node ranks 0, 1, 2.
  CHECK(spread_server(m, 0, 1) == 0);
  CHECK(spread_server(m, 0, 2) == 1);
  CHECK(spread_server(m, 0, 4) == 2);
  // Node 1 serves 0, 3, 4, 5 with node ranks 0, 1, 0, 1.
  CHECK(spread_server(m, 1, 0) == 0);
  CHECK(spread_server(m, 1, 3) == 1);
  CHECK(spread_server(m, 1, 4) == 0);
  CHECK(spread_server(m, 1, 5) == 1);
  // A node of one rank serves everything itself.
  for (const int owner : {0, 1, 2, 3, 5}) CHECK(spread_server(m, 2, owner) == 0);
}

TEST_CASE("spread: a forced segment is a multiple of 64, or 0 for the default") {
  CHECK(spread_segment_bytes % 64 == 0);
  CHECK_NOTHROW(check_spread_segment(0));
  CHECK_NOTHROW(check_spread_segment(128));
  CHECK_THROWS_AS(check_spread_segment(100), std::invalid_argument);
}

TEST_CASE("spread: every call's result on forked ranks of several nodes, by phases and flows") {
  shared_state* state = new_state();
  const std::vector<std::vector<std::vector<int>>> layouts = {
      {{0, 1}, {2, 3}},       // two nodes of two
      {{0}, {1}, {2}},        // nodes of one rank
      {{0, 2}, {1, 3, 4}},    // uneven and interleaved: a reduce owned by one node
      {{0, 1}, {2}, {3, 4}},  // three nodes, one of one rank
  };
  for (const auto& layout : layouts) {
    const int p = static_cast<int>(map_of(layout).node_of.size());
    std::memset(state->digest, 0, sizeof state->digest);
    const auto codes = run_layout(layout, state);
    CHECK_MESSAGE(codes == std::vector<int>(static_cast<std::size_t>(p), 0),
                  "nodes: ", layout.size(), ", ranks: ", p);
    for (int r = 1; r < p; ++r)  // every full result: the same bits on every rank
      CHECK(std::memcmp(state->digest[r], state->digest[0], sizeof state->digest[0]) == 0);
  }
  ::munmap(state, sizeof(shared_state));
}
