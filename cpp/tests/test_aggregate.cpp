// Rounds between nodes (aggregate.hpp): the node map, who sends and receives each message, and
// the pack and unpack copy lists. Expected values are derived here from the header's
// definitions (message from node a to node b: q_a * q_b blocks, receiver-major).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "zcoll/aggregate.hpp"
#include "zcoll/vexchange.hpp"

using zcoll::aggregate_copies;
using zcoll::node_map;

namespace {

// Node leader of each rank for nodes of the given sizes, ranks dealt out in the given order.
std::vector<int> leaders_for(const std::vector<std::vector<int>>& nodes, int p) {
  std::vector<int> leader(static_cast<std::size_t>(p), -1);
  for (const auto& ranks : nodes) {
    int low = p;
    for (int r : ranks) low = std::min(low, r);
    for (int r : ranks) leader[static_cast<std::size_t>(r)] = low;
  }
  return leader;
}

// The node map of a layout (ranks 0..P-1 dealt into the given nodes).
node_map map_of(const std::vector<std::vector<int>>& layout) {
  int p = 0;
  for (const auto& n : layout) p += static_cast<int>(n.size());
  return node_map::from_leaders(leaders_for(layout, p));
}

const std::vector<std::vector<std::vector<int>>> layouts = {
    {{0, 1}, {2, 3}},                          // 2 nodes of 2
    {{0, 1}, {2, 3}, {4}},                     // uneven: P = 5, nodes of 2
    {{0, 1, 2}, {3, 4, 5}, {6, 7}},            // nodes of 3, 3, 2
    {{0}, {1}, {2}, {3}},                      // one rank per node
    {{0, 4}, {1, 5}, {2, 6}, {3, 7}},          // interleaved (a split with reordered keys)
    {{0, 1, 2, 3, 4}, {5}, {6, 7, 8, 9, 10}},  // a lone rank between two large nodes
};

}  // namespace

TEST_CASE("node_map orders nodes by their lowest rank and ranks within a node ascending") {
  const node_map m = node_map::from_leaders(leaders_for({{3, 7}, {0, 5, 2}, {1, 4, 6}}, 8));
  REQUIRE(m.nodes() == 3);
  CHECK(m.members[0] == std::vector<int>{0, 2, 5});
  CHECK(m.members[1] == std::vector<int>{1, 4, 6});
  CHECK(m.members[2] == std::vector<int>{3, 7});
  CHECK(m.node_of == std::vector<int>{0, 1, 0, 2, 1, 0, 1, 2});
  CHECK(m.node_rank == std::vector<int>{0, 0, 1, 0, 1, 2, 2, 1});
}

TEST_CASE("each message has one sender and one receiver, spread over the node's ranks") {
  for (const auto& layout : layouts) {
    const node_map m = map_of(layout);
    const int n = m.nodes();
    std::map<std::pair<int, int>, int> sends, receives;  // (node, node rank) -> messages
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        if (a == b) continue;
        const int s = m.sender(a, b), r = m.receiver(a, b);
        REQUIRE(s >= 0);
        REQUIRE(s < m.ranks_on(a));
        REQUIRE(r >= 0);
        REQUIRE(r < m.ranks_on(b));
        ++sends[{a, s}];
        ++receives[{b, r}];
      }
    // Node a sends N - 1 messages over its q ranks: no rank sends more than ceil((N-1)/q).
    for (int a = 0; a < n; ++a) {
      const int q = m.ranks_on(a);
      const int most = (n - 1 + q - 1) / q;
      for (int j = 0; j < q; ++j) {
        CHECK(sends[{a, j}] <= most);
        CHECK(receives[{a, j}] <= most);
      }
    }
  }
}

TEST_CASE("pack and unpack lists move every block between nodes exactly once, to its place") {
  for (const auto& layout : layouts) {
    const node_map m = map_of(layout);
    const int p = static_cast<int>(m.node_of.size());
    const int n = m.nodes();
    // Block (s -> d) packed by node(s) into message (node(s) -> node(d)) at slot
    // ld * q_s + ls; unpacked by node(d) from the same message and slot into d's buffer at s.
    std::set<std::tuple<int, int, int>> packed;    // (src node, dst node, slot)
    std::set<std::tuple<int, int, int>> unpacked;  // same key
    std::set<std::pair<int, int>> pairs_packed, pairs_unpacked;
    for (int node = 0; node < n; ++node) {
      const auto& here = m.members[static_cast<std::size_t>(node)];
      for (const auto& c : aggregate_copies(m, node, true)) {
        const int src = here[static_cast<std::size_t>(c.rank)];
        const int dst = c.peer;
        const int other = (node + c.message + 1) % n;  // staggered: message k goes k+1 steps
        REQUIRE(m.node_of[static_cast<std::size_t>(dst)] == other);
        const int slot = m.node_rank[static_cast<std::size_t>(dst)] * m.ranks_on(node) + c.rank;
        CHECK(static_cast<int>(c.slot) == slot);
        CHECK(packed.emplace(node, other, slot).second);
        CHECK(pairs_packed.emplace(src, dst).second);
      }
      for (const auto& c : aggregate_copies(m, node, false)) {
        const int dst = here[static_cast<std::size_t>(c.rank)];
        const int src = c.peer;
        const int other = (node - c.message - 1 + n) % n;
        REQUIRE(m.node_of[static_cast<std::size_t>(src)] == other);
        const int slot = c.rank * m.ranks_on(other) + m.node_rank[static_cast<std::size_t>(src)];
        CHECK(static_cast<int>(c.slot) == slot);
        CHECK(unpacked.emplace(other, node, slot).second);
        CHECK(pairs_unpacked.emplace(src, dst).second);
      }
    }
    CHECK(packed == unpacked);
    std::set<std::pair<int, int>> expected;  // every pair of ranks on different nodes
    for (int s = 0; s < p; ++s)
      for (int d = 0; d < p; ++d)
        if (m.node_of[static_cast<std::size_t>(s)] != m.node_of[static_cast<std::size_t>(d)])
          expected.emplace(s, d);
    CHECK(pairs_packed == expected);
    CHECK(pairs_unpacked == expected);
  }
}

TEST_CASE("message heads hold one call record per sending rank, cache-line padded") {
  CHECK(zcoll::message_head_bytes(1) % 64 == 0);
  CHECK(zcoll::message_head_bytes(1) >= sizeof(zcoll::call_record));
  CHECK(zcoll::message_head_bytes(3) >= 3 * sizeof(zcoll::call_record));
  CHECK(zcoll::message_head_bytes(3) < 3 * sizeof(zcoll::call_record) + 64);
}

TEST_CASE("irregular messages carry every pair between nodes once, receiver-major") {
  // Lists with a repeated edge, an empty list and PROC_NULL, on nodes of uneven size.
  const std::vector<int> leaders = {0, 0, 2, 2, 2, 5};
  const zcoll::node_map m = zcoll::node_map::from_leaders(leaders);
  const int p = static_cast<int>(leaders.size());
  std::vector<std::vector<zcoll::v_edge>> sends(static_cast<std::size_t>(p)), recvs(sends.size());
  for (int s = 0; s < p; ++s)
    for (int d = 0; d < p; ++d)
      if ((s + d) % 3 != 0 || s == 1) {
        sends[static_cast<std::size_t>(s)].push_back({d, 0});
        recvs[static_cast<std::size_t>(d)].push_back({s, 0});
      }
  sends[4].push_back({0, 0});  // a second block 4 -> 0
  recvs[0].push_back({4, 0});
  sends[3].push_back({-1, 0});  // PROC_NULL
  std::vector<int> everyone(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) everyone[static_cast<std::size_t>(r)] = r;
  zcoll::v_pattern pattern = zcoll::match_edges(sends, recvs, everyone);
  pattern.all_send_blocks = pattern.send_blocks;
  pattern.all_recv_blocks = pattern.recv_blocks;
  pattern.all_tuples = pattern.tuples;
  std::multiset<std::tuple<int, int, std::uint32_t, std::uint32_t>> out, in, expected;
  for (const auto& t : pattern.all_tuples)
    if (m.node_of[static_cast<std::size_t>(t.src)] != m.node_of[static_cast<std::size_t>(t.dst)])
      expected.emplace(t.src, t.dst, t.send_block, t.recv_block);
  for (int node = 0; node < m.nodes(); ++node) {
    const zcoll::irregular_layout l = zcoll::make_irregular_layout(m, pattern, node);
    // Counts: each node's ranks' words back to back, send list then receive list.
    for (int k = 0; k < m.nodes(); ++k) {
      std::size_t words = 0;
      for (int r : m.members[static_cast<std::size_t>(k)]) {
        CHECK(l.counts_at[static_cast<std::size_t>(r)] == words);
        words +=
            sends[static_cast<std::size_t>(r)].size() + recvs[static_cast<std::size_t>(r)].size();
      }
      CHECK(l.counts_words[static_cast<std::size_t>(k)] == words);
    }
    for (std::size_t step = 1; step <= l.out.size(); ++step) {
      const int to = (node + static_cast<int>(step)) % m.nodes();
      const int from = (node - static_cast<int>(step) + m.nodes()) % m.nodes();
      for (const auto& t : l.out[step - 1]) {
        CHECK(m.node_of[static_cast<std::size_t>(t.src)] == node);
        CHECK(m.node_of[static_cast<std::size_t>(t.dst)] == to);
        out.emplace(t.src, t.dst, t.send_block, t.recv_block);
      }
      for (const auto& t : l.in[step - 1]) {
        CHECK(m.node_of[static_cast<std::size_t>(t.src)] == from);
        CHECK(m.node_of[static_cast<std::size_t>(t.dst)] == node);
        in.emplace(t.src, t.dst, t.send_block, t.recv_block);
      }
      const auto& msg = l.out[step - 1];
      CHECK(std::is_sorted(msg.begin(), msg.end(), [](const auto& a, const auto& b) {
        return std::tie(a.dst, a.src, a.send_block) < std::tie(b.dst, b.src, b.send_block);
      }));
    }
  }
  CHECK(out == expected);
  CHECK(in == expected);
  CHECK(expected.count({4, 0, static_cast<std::uint32_t>(sends[4].size() - 1),
                        static_cast<std::uint32_t>(recvs[0].size() - 1)}) == 1);
}

TEST_CASE("the size rule grows with the smallest node, up to its cap") {
  using zcoll::node_map;
  const auto rule = [](std::vector<int> leaders) {
    return zcoll::max_aggregated_block(node_map::from_leaders(leaders));
  };
  CHECK(rule({0, 1}) == 4096);                        // nodes of one rank
  CHECK(rule({0, 0, 2, 2}) == 2 * 4096);              // nodes of 2
  CHECK(rule({0, 0, 0, 3, 3}) == 2 * 4096);           // uneven: the smallest node counts
  CHECK(rule({0, 0, 0, 0, 4, 4, 4, 4}) == 4 * 4096);  // nodes of 4
  CHECK(rule({0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8}) == 8 * 4096);
  std::vector<int> wide(64, 0);  // nodes of 32: the cap
  for (int r = 32; r < 64; ++r) wide[static_cast<std::size_t>(r)] = 32;
  CHECK(rule(wide) == 64 * 1024);
}

TEST_CASE("an allgather's size rule is four times an alltoall's, with the same cap") {
  using zcoll::node_map;
  using zcoll::op_code;
  const auto rule = [](std::vector<int> leaders) {
    return zcoll::max_aggregated_block(node_map::from_leaders(leaders), op_code::allgather);
  };
  CHECK(rule({0, 1}) == 16 * 1024);
  CHECK(rule({0, 0, 2, 2}) == 32 * 1024);
  CHECK(rule({0, 0, 0, 3, 3}) == 32 * 1024);  // uneven: the smallest node counts
  CHECK(rule({0, 0, 0, 0, 4, 4, 4, 4}) == 64 * 1024);
  CHECK(rule({0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8}) == 64 * 1024);  // the cap
}

TEST_CASE("a reduction's size rule grows with the smallest node, bounded per rank and in all") {
  using zcoll::node_map;
  using zcoll::op_code;
  const auto rule = [](std::vector<int> leaders, op_code op) {
    return zcoll::max_aggregated_block(node_map::from_leaders(leaders), op);
  };
  CHECK(rule({0, 1}, op_code::allreduce) == 32 * 1024);           // 2 nodes of 1
  CHECK(rule({0, 0, 2, 2}, op_code::allreduce) == 64 * 1024);     // 2 nodes of 2
  CHECK(rule({0, 0, 0, 3, 3}, op_code::allreduce) == 64 * 1024);  // the smallest node: 2
  CHECK(rule({0, 1, 2, 3}, op_code::reduce) == 32 * 1024);        // 4 nodes of 1
  CHECK(rule({0, 0, 2, 2, 4, 4, 6, 6}, op_code::reduce_scatter) == 64 * 1024);
  std::vector<int> sixteen_of_one(16), two_of_sixteen(32);
  for (int r = 0; r < 16; ++r) sixteen_of_one[static_cast<std::size_t>(r)] = r;
  for (int r = 0; r < 32; ++r) two_of_sixteen[static_cast<std::size_t>(r)] = r / 16 * 16;
  CHECK(rule(sixteen_of_one, op_code::allreduce) == 256 * 1024 / 15);    // bounded per rank
  CHECK(rule(two_of_sixteen, op_code::allreduce) == 256 * 1024);         // the cap
  CHECK(rule({0, 0, 2, 2, 4, 4, 6, 6}, op_code::alltoall) == 8 * 1024);  // unchanged
  CHECK(rule({0, 1}, op_code::bcast) == 16 * 1024);  // a bcast: allgather's rule
  CHECK(rule({0, 0, 2, 2}, op_code::bcast) == 32 * 1024);
}

TEST_CASE("a spread reduction's pieces cover the result in whole lines, or are the blocks") {
  using zcoll::op_code;
  const std::vector<int> all{0, 1, 2, 3};
  const auto pieces = zcoll::spread_pieces(op_code::allreduce, 1000, 8, 3, {all.data(), 3});
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[0].from == 0);
  CHECK(pieces[0].bytes == 336 * 8);  // 334 elements rounded up to whole 64-byte lines
  CHECK(pieces[1].from == 336 * 8);
  CHECK(pieces[2].from == 672 * 8);
  CHECK(pieces[2].bytes == 328 * 8);  // the rest
  const auto short_result = zcoll::spread_pieces(op_code::reduce, 5, 8, 4, all);
  CHECK(short_result[0].bytes == 40);
  for (std::size_t r = 1; r < 4; ++r) CHECK(short_result[r].bytes == 0);
  const auto blocks = zcoll::spread_pieces(op_code::reduce_scatter, 12, 4, 3, all);
  for (std::size_t r = 0; r < 3; ++r) {
    CHECK(blocks[r].from == r * 16);
    CHECK(blocks[r].bytes == 16);
  }
}

TEST_CASE("a reduce on two nodes gives the pieces to the root's node only") {
  using zcoll::node_map;
  using zcoll::op_code;
  const node_map two = node_map::from_leaders(std::vector<int>{0, 0, 2, 2});
  CHECK(zcoll::spread_owners(two, op_code::reduce, 3) == std::vector<int>{2, 3});
  CHECK(zcoll::spread_owners(two, op_code::allreduce, 3) == std::vector<int>{0, 1, 2, 3});
  const node_map three = node_map::from_leaders(std::vector<int>{0, 0, 2, 2, 4});
  CHECK(zcoll::spread_owners(three, op_code::reduce, 4).size() == 5);
  const auto owners = zcoll::spread_owners(two, op_code::reduce, 3);
  const auto pieces = zcoll::spread_pieces(op_code::reduce, 100, 8, 4, owners);
  CHECK(pieces[0].bytes == 0);
  CHECK(pieces[1].bytes == 0);
  CHECK(pieces[2].from == 0);
  CHECK(pieces[2].bytes == 56 * 8);  // 50 elements rounded up to whole lines
  CHECK(pieces[3].from == 56 * 8);
  CHECK(pieces[3].bytes == 44 * 8);
}

TEST_CASE("a spread reduction deals the other nodes' pieces round robin to a node's ranks") {
  using zcoll::node_map;
  const node_map nodes = node_map::from_leaders(std::vector<int>{0, 0, 2, 2, 4});  // 2, 2, 1
  CHECK(zcoll::spread_server(nodes, 0, 2) == 0);
  CHECK(zcoll::spread_server(nodes, 0, 3) == 1);
  CHECK(zcoll::spread_server(nodes, 0, 4) == 0);
  CHECK(zcoll::spread_server(nodes, 1, 0) == 0);
  CHECK(zcoll::spread_server(nodes, 1, 1) == 1);
  CHECK(zcoll::spread_server(nodes, 1, 4) == 0);
  for (int owner = 0; owner < 4; ++owner) CHECK(zcoll::spread_server(nodes, 2, owner) == 0);
  // Every node's ranks serve the other nodes' ranks within one of each other.
  std::vector<int> leaders(12);
  for (int r = 0; r < 12; ++r) leaders[static_cast<std::size_t>(r)] = r < 5 ? 0 : r < 8 ? 5 : 8;
  const node_map uneven = node_map::from_leaders(leaders);  // 5, 3, 4
  for (int node = 0; node < uneven.nodes(); ++node) {
    std::vector<int> served(static_cast<std::size_t>(uneven.ranks_on(node)));
    for (int owner = 0; owner < 12; ++owner)
      if (uneven.node_of[static_cast<std::size_t>(owner)] != node)
        ++served[static_cast<std::size_t>(zcoll::spread_server(uneven, node, owner))];
    const auto [low, high] = std::minmax_element(served.begin(), served.end());
    CHECK(*high - *low <= 1);
  }
}
