#include "zcoll/leaders_exchange.hpp"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "zcoll/aggregate.hpp"

namespace zcoll {

namespace {

// `count` groups of consecutive node indices, sizes differing by at most one.
std::vector<std::vector<int>> groups_of(int nodes, int count) {
  const int base = nodes / count, extra = nodes % count;
  std::vector<std::vector<int>> out;
  int start = 0;
  for (int g = 0; g < count; ++g) {
    const int size = base + (g < extra ? 1 : 0);
    std::vector<int> group(static_cast<std::size_t>(size));
    for (int i = 0; i < size; ++i) group[static_cast<std::size_t>(i)] = start + i;
    out.push_back(std::move(group));
    start += size;
  }
  return out;
}

int steps_of(int m) noexcept {  // ceil(log2 m), 0 for m = 1
  int steps = 0;
  while ((1 << steps) < m) ++steps;
  return steps;
}

// One part's messages (mirrored: every group's members numbered from the other end).
void add_part(std::vector<leader_message>& out, std::vector<std::vector<int>> groups, int part,
              bool mirrored) {
  if (mirrored)
    for (auto& g : groups) std::reverse(g.begin(), g.end());
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const auto& group = groups[gi];
    const int m = static_cast<int>(group.size());
    for (std::size_t gj = 0; gj < groups.size(); ++gj) {
      for (std::size_t k = 0; k < groups[gj].size(); ++k) {
        const int dest = groups[gj][k];
        const int a = static_cast<int>(k) % m;
        const int anchor = group[static_cast<std::size_t>(a)];
        if (gi != gj) out.push_back({anchor, dest, 0, {anchor}, part, true});
        for (int s = 0; s < steps_of(m); ++s) {
          const int d = 1 << s;
          const int j = (a + d) % m;
          leader_message msg{group[static_cast<std::size_t>(j)], dest, s, {}, part, false};
          for (int t = 0; t < std::min(d, m - d); ++t)
            msg.content.push_back(group[static_cast<std::size_t>((j + t) % m)]);
          out.push_back(std::move(msg));
        }
      }
    }
  }
}

// The receive buffer's byte ranges of `content`'s blocks (or of their `part` half when
// `split`), adjacent ones merged.
std::vector<std::pair<std::uint64_t, std::uint64_t>> runs_of(const node_map& nodes,
                                                             const std::vector<int>& content,
                                                             std::uint64_t block, int part,
                                                             bool split) {
  const std::uint64_t first = split ? block / 2 : block;
  const std::uint64_t offset = part == 0 ? 0 : first;
  const std::uint64_t length = part == 0 ? first : block - first;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;
  for (int node : content)
    for (int r : nodes.members[static_cast<std::size_t>(node)]) {
      const std::uint64_t start = static_cast<std::uint64_t>(r) * block + offset;
      if (!runs.empty() && runs.back().second == start)
        runs.back().second += length;
      else
        runs.emplace_back(start, start + length);
    }
  return runs;
}

}  // namespace

std::vector<leader_message> leaders_schedule(int nodes, int concurrency, bool split) {
  const int wanted = split ? concurrency / 2 : concurrency;
  const int count = std::max(1, std::min(wanted, nodes));
  const auto groups = groups_of(nodes, count);
  std::vector<leader_message> out;
  add_part(out, groups, 0, false);
  if (split) add_part(out, groups, 1, true);
  return out;
}

std::vector<leader_round> leader_rounds(const node_map& nodes, int me, int concurrency,
                                        std::uint64_t block) {
  const bool split = concurrency >= 2 && block >= leaders_split_bytes;
  const auto messages = leaders_schedule(nodes.nodes(), concurrency, split);
  int rounds = 0;
  for (const auto& m : messages) rounds = std::max(rounds, m.round + 1);
  std::vector<leader_round> out(static_cast<std::size_t>(rounds));
  for (const auto& m : messages) {
    if (m.source != me && m.dest != me) continue;
    const bool receive = m.dest == me;
    const int peer = receive ? m.source : m.dest;
    auto& list = receive ? out[static_cast<std::size_t>(m.round)].receives
                         : out[static_cast<std::size_t>(m.round)].sends;
    for (const auto& [start, stop] : runs_of(nodes, m.content, block, m.part, split))
      list.push_back({peer, m.tag(), start, stop});
  }
  std::erase_if(out, [](const leader_round& r) { return r.receives.empty() && r.sends.empty(); });
  return out;
}

}  // namespace zcoll
