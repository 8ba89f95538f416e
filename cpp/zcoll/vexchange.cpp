#include "zcoll/vexchange.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>

#include "zcoll/copy.hpp"
#include "zcoll/error.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/schedule.hpp"

namespace zcoll {

namespace {

// Per metadata slot: the send and receive extents (bytes from the buffer's start to the end of
// its last block), then the blocks.
constexpr std::size_t line_bytes = 64;  // a cache line
constexpr std::size_t slot_header_bytes = line_bytes;

std::uint64_t ordered_key(int pattern, block_order order, v_in_place in_place) {
  return (static_cast<std::uint64_t>(pattern) << 16) | (static_cast<std::uint64_t>(order) << 8) |
         static_cast<std::uint64_t>(in_place);
}

// The blocks of one side of a call, in bytes, checked against the buffer they address.
local_check spans_of(std::span<const std::int64_t> counts, std::span<const std::int64_t> displs,
                     std::size_t expected, std::size_t itemsize, std::size_t buffer_bytes,
                     const char* side, std::vector<v_span>& out, std::uint64_t& extent) {
  if (counts.size() != expected || displs.size() != expected)
    return value_error(std::string(side) + " has " + std::to_string(counts.size()) +
                       " counts and " + std::to_string(displs.size()) +
                       " displacements, expected " + std::to_string(expected) +
                       " (one per entry of the rank's list)");
  const std::size_t elements = itemsize ? buffer_bytes / itemsize : 0;
  out.resize(expected);
  extent = 0;
  for (std::size_t i = 0; i < expected; ++i) {
    const std::int64_t count = counts[i], displ = displs[i];
    if (count < 0 || displ < 0)
      return value_error(std::string(side) + ": block " + std::to_string(i) + " has a negative " +
                         (count < 0 ? "count (" + std::to_string(count)
                                    : "displacement (" + std::to_string(displ)) +
                         ")");
    const auto c = static_cast<std::uint64_t>(count), d = static_cast<std::uint64_t>(displ);
    if (c > elements || (c && d > elements - c))
      return value_error(std::string(side) + ": block " + std::to_string(i) + " (displacement " +
                         std::to_string(d) + ", count " + std::to_string(c) +
                         ") ends past the end of the buffer (" + std::to_string(elements) +
                         " elements)");
    out[i] = {d * itemsize, c * itemsize};
    if (c) extent = std::max<std::uint64_t>(extent, (d + c) * itemsize);
  }
  return {};
}

// An error when two receive blocks that receive data overlap (MPI leaves that undefined).
// Blocks laid out in increasing order (the usual displacements) are checked in one pass; others
// are sorted first.
local_check disjoint(const std::vector<v_span>& blocks, std::size_t itemsize) {
  std::uint64_t end = 0;
  bool in_order = true;
  for (const v_span& b : blocks) {
    if (!b.bytes) continue;
    if (b.offset < end) {
      in_order = false;
      break;
    }
    end = b.offset + b.bytes;
  }
  if (in_order) return {};
  std::vector<std::pair<std::uint64_t, std::size_t>> starts;
  for (std::size_t i = 0; i < blocks.size(); ++i)
    if (blocks[i].bytes) starts.emplace_back(blocks[i].offset, i);
  std::sort(starts.begin(), starts.end());
  for (std::size_t k = 1; k < starts.size(); ++k) {
    const v_span& prev = blocks[starts[k - 1].second];
    if (prev.offset + prev.bytes > starts[k].first)
      return value_error("recvbuf: blocks " + std::to_string(starts[k - 1].second) + " and " +
                         std::to_string(starts[k].second) + " overlap (elements " +
                         std::to_string(starts[k].first / itemsize) + " to " +
                         std::to_string((prev.offset + prev.bytes) / itemsize - 1) + ")");
  }
  return {};
}

}  // namespace

v_pattern match_edges(std::span<const std::vector<v_edge>> sends,
                      std::span<const std::vector<v_edge>> recvs, std::span<const int> comm_ranks) {
  const std::size_t n = comm_ranks.size();
  if (sends.size() != n || recvs.size() != n)
    throw std::invalid_argument("zcoll: one send and one receive list per node rank expected");
  std::unordered_map<int, int> node_rank;
  for (std::size_t j = 0; j < n; ++j) node_rank[comm_ranks[j]] = static_cast<int>(j);
  auto on_node = [&](std::int32_t peer) {
    const auto it = peer < 0 ? node_rank.end() : node_rank.find(peer);
    return it == node_rank.end() ? -1 : it->second;
  };
  v_pattern p;
  p.send_blocks.resize(n);
  p.recv_blocks.resize(n);
  using pair_key = std::tuple<int, int, std::int32_t>;  // (src, dst, tag) in node ranks
  std::map<pair_key, std::vector<std::uint32_t>> receives;
  for (std::size_t d = 0; d < n; ++d) {
    p.recv_blocks[d] = static_cast<std::uint32_t>(recvs[d].size());
    for (std::size_t b = 0; b < recvs[d].size(); ++b)
      if (const int s = on_node(recvs[d][b].peer); s >= 0)
        receives[{s, static_cast<int>(d), recvs[d][b].tag}].push_back(
            static_cast<std::uint32_t>(b));
  }
  std::map<pair_key, std::size_t> matched;
  for (std::size_t s = 0; s < n; ++s) {
    p.send_blocks[s] = static_cast<std::uint32_t>(sends[s].size());
    for (std::size_t b = 0; b < sends[s].size(); ++b) {
      const int d = on_node(sends[s][b].peer);
      if (d < 0) continue;
      const pair_key key{static_cast<int>(s), d, sends[s][b].tag};
      const auto& queue = receives[key];
      std::size_t& k = matched[key];
      if (k >= queue.size())
        throw usage_error("zcoll: rank " + std::to_string(comm_ranks[s]) + " sends to rank " +
                          std::to_string(comm_ranks[static_cast<std::size_t>(d)]) +
                          ", which does not list it as a source that often");
      p.tuples.push_back(
          {static_cast<std::int32_t>(s), d, static_cast<std::uint32_t>(b), queue[k++]});
    }
  }
  for (const auto& [key, queue] : receives)
    if (matched[key] != queue.size())
      throw usage_error("zcoll: rank " +
                        std::to_string(comm_ranks[static_cast<std::size_t>(std::get<1>(key))]) +
                        " receives from rank " +
                        std::to_string(comm_ranks[static_cast<std::size_t>(std::get<0>(key))]) +
                        ", which does not list it as a destination that often");
  return p;
}

std::vector<v_tuple> ordered_tuples(const v_pattern& p, int node_size, block_order order,
                                    v_in_place in_place) {
  const auto n = static_cast<std::size_t>(node_size);
  std::vector<std::uint32_t> position(n * n);
  // numa is Morton here (vexchange.hpp): block_curve gives Morton's curve for it.
  const auto curve = block_curve(node_size, order);
  for (std::size_t i = 0; i < curve.size(); ++i)
    position[static_cast<std::size_t>(curve[i].dst) * n + static_cast<std::size_t>(curve[i].src)] =
        static_cast<std::uint32_t>(i);
  std::vector<v_tuple> out;
  out.reserve(p.tuples.size());
  for (const v_tuple& t : p.tuples) {
    if (in_place == v_in_place::gather && t.src == t.dst) continue;
    if (in_place == v_in_place::swap && t.src >= t.dst) continue;
    out.push_back(t);
  }
  auto key = [&](const v_tuple& t) {
    if (order == block_order::row)  // each receiver's blocks in its own (neighbour) order
      return std::tuple(static_cast<std::uint32_t>(t.dst), t.recv_block, t.send_block);
    return std::tuple(
        position[static_cast<std::size_t>(t.dst) * n + static_cast<std::size_t>(t.src)],
        t.send_block, t.recv_block);
  };
  std::sort(out.begin(), out.end(),
            [&](const v_tuple& a, const v_tuple& b) { return key(a) < key(b); });
  return out;
}

std::pair<std::uint64_t, std::uint64_t> v_exchange::my_piece(const v_pattern& p,
                                                             const std::vector<v_tuple>& tuples,
                                                             std::size_t parity,
                                                             std::uint64_t total, block_order order,
                                                             v_in_place in_place) const {
  const int me = ctx_.config().rank;
  if (order != block_order::row || in_place == v_in_place::swap)
    return v_piece(total, ctx_.config().size, me);
  // Row order is the naive baseline: each rank copies its own receive blocks (the tuples are
  // sorted by receiver, so they are one run of the stream).
  std::uint64_t first = 0, last = 0;
  for (const v_tuple& t : tuples) {
    const std::uint64_t bytes = received(p, t, parity).bytes;
    if (t.dst < me) first += bytes;
    if (t.dst <= me) last += bytes;
  }
  return {first, last};
}

std::pair<std::uint64_t, std::uint64_t> v_piece(std::uint64_t total, int parts, int rank) noexcept {
  auto cut = [&](int i) -> std::uint64_t {
    if (i <= 0) return 0;
    if (i >= parts) return total;
    const auto k = static_cast<std::uint64_t>(i), n = static_cast<std::uint64_t>(parts);
    const std::uint64_t c = total / n * k + total % n * k / n;  // total * k / n, no overflow
    return std::min<std::uint64_t>(round_up(c, line_bytes), total);
  };
  return {cut(rank), cut(rank + 1)};
}

int v_exchange::add_pattern(v_pattern pattern, int role) {
  if (role < no_role || role > topology_role) throw std::invalid_argument("zcoll: unknown role");
  const auto n = static_cast<std::size_t>(ctx_.config().size);
  if (pattern.send_blocks.size() != n || pattern.recv_blocks.size() != n)
    throw std::invalid_argument("zcoll: a pattern needs the lists of every node rank");
  std::size_t need = 1;
  for (std::size_t j = 0; j < n; ++j)
    need = std::max<std::size_t>(need, pattern.send_blocks[j] + pattern.recv_blocks[j]);
  if (need > capacity_) {
    const std::size_t capacity = std::max(need, 2 * capacity_);
    const std::size_t slot = round_up(slot_header_bytes + capacity * sizeof(v_span), line_bytes);
    ctx_.segments().renew(meta_, round_up(2 * slot, page_size()));
    capacity_ = capacity;
  }
  auto& incoming = incoming_.emplace_back();
  for (const v_tuple& t : pattern.tuples)
    if (t.dst == ctx_.config().rank) incoming.push_back(t);
  patterns_.push_back(std::move(pattern));
  const int id = static_cast<int>(patterns_.size()) - 1;
  if (role != no_role) roles_[static_cast<std::size_t>(role)] = id;
  return id;
}

std::uint64_t* v_exchange::extents(int node_rank, std::size_t parity) const noexcept {
  const std::size_t slot = round_up(slot_header_bytes + capacity_ * sizeof(v_span), line_bytes);
  return reinterpret_cast<std::uint64_t*>(meta_->partition(node_rank) + parity * slot);
}

std::span<v_span> v_exchange::slot(int node_rank, std::size_t parity) const noexcept {
  auto* first = reinterpret_cast<std::byte*>(extents(node_rank, parity)) + slot_header_bytes;
  return {reinterpret_cast<v_span*>(first), capacity_};
}

local_check v_exchange::check(const v_call& c, checked_call& out) const {
  if (c.pattern < 0 || c.pattern >= pattern_count() || !c.recv)
    throw std::invalid_argument("zcoll: unknown communication pattern");
  const v_pattern& pat = pattern(c.pattern);
  const auto me = static_cast<std::size_t>(ctx_.config().rank);
  const array_view& recv = *c.recv;
  if (recv.has_objects || (c.send && c.send->has_objects))
    return type_error("arrays of Python objects cannot be exchanged through shared memory");
  if (c.send && !(c.send->dtype == recv.dtype))
    return type_error("sendbuf and recvbuf dtypes differ (" + dtype_text(c.send->dtype) + " and " +
                      dtype_text(recv.dtype) + ")");
  if (!recv.c_contiguous) return value_error("recvbuf must be C-contiguous");
  if (!recv.writeable) return value_error("recvbuf is read-only");
  if (c.send && !c.send->c_contiguous) return value_error("sendbuf must be C-contiguous");
  if (c.in_place == v_in_place::none && !c.send)
    return value_error("sendbuf is missing (use zcoll.IN_PLACE)");
  const std::size_t itemsize = recv.dtype.itemsize;
  local_check v = spans_of(c.recv_counts, c.recv_displs, pat.recv_blocks[me], itemsize, recv.nbytes,
                           "recvbuf", out.recv, out.recv_extent);
  if (!v.ok()) return v;
  if (v = disjoint(out.recv, itemsize); !v.ok()) return v;
  if (c.in_place == v_in_place::swap) {
    out.send = out.recv;
  } else {
    const std::size_t send_bytes = c.send ? c.send->nbytes : recv.nbytes;
    v = spans_of(c.send_counts, c.send_displs, pat.send_blocks[me], itemsize, send_bytes,
                 c.send ? "sendbuf" : "recvbuf (in place)", out.send, out.send_extent);
    if (!v.ok()) return v;
  }
  if (!c.send) out.send_extent = 0;  // in place: the data is in the receive buffer
  local_check codes;
  if (!check_codes(codes, c.order, c.copy, false)) return codes;
  out.order =
      c.order == auto_order ? auto_policy::irregular_order() : static_cast<block_order>(c.order);
  return {};
}

call_record v_exchange::describe(const v_call& c) const {
  checked_call mine;
  const local_check v = check(c, mine);
  if (!v.ok()) return error_record(v.error, call_prefix(c.op) + v.message);
  call_record r;
  r.call.op = c.op;
  r.call.order = static_cast<std::int8_t>(mine.order);
  r.call.flag = static_cast<std::uint8_t>(c.in_place);
  r.call.dtype = c.recv->dtype;
  r.call.block_bytes = static_cast<std::uint64_t>(c.pattern) + 1;
  return r;
}

void v_exchange::write_metadata(const checked_call& mine, std::size_t parity, bool eager) {
  const int me = ctx_.config().rank;
  const auto blocks = slot(me, parity);
  std::copy(mine.send.begin(), mine.send.end(), blocks.begin());
  std::copy(mine.recv.begin(), mine.recv.end(),
            blocks.begin() + static_cast<std::ptrdiff_t>(mine.send.size()));
  std::uint64_t* header = extents(me, parity);
  header[0] = mine.send_extent;
  header[1] = mine.recv_extent;
  header[2] = eager ? 1 : 0;
}

void v_exchange::describe_line(const v_call& c, const checked_call& mine, detail::rank_line& line) {
  line.call.order = static_cast<std::int8_t>(mine.order);
  line.call.flag = static_cast<std::uint8_t>(c.in_place);
  line.call.dtype = c.recv->dtype;
  line.call.block_bytes = static_cast<std::uint64_t>(c.pattern) + 1;
}

void v_exchange::run(const v_call& c) {
  checked_call& mine = mine_;
  const local_check v = check(c, mine);
  if (!v.ok()) ctx_.fail(v.error, call_prefix(c.op) + v.message);
  call_protocol& proto = ctx_.protocol();
  auto& line = proto.next(c.op);
  const std::size_t parity = proto.parity();
  if (c.send) line.send = ctx_.segments().locate(c.send->data, c.send->nbytes);
  line.recv = ctx_.segments().locate(c.recv->data, c.recv->nbytes);
  const bool private_buffers = (c.send && line.send.segment == 0) || line.recv.segment == 0;
  write_metadata(mine, parity,
                 c.order == auto_order && fill_eager_slot(c, mine, parity, private_buffers));
  describe_line(c, mine, line);
  const auto all = proto.publish();
  check_calls(all, c.op);
  check_arguments(all);
  check_counts(c, parity);
  bool eager = true;
  for (int j = 0; j < ctx_.config().size && eager; ++j) eager = extents(j, parity)[2] == 1;
  if (eager)
    execute_eager(c, parity);
  else
    execute(c, mine, all, parity);
}

bool v_exchange::fill_eager_slot(const v_call& c, const checked_call& mine, std::size_t parity,
                                 bool private_buffers) {
  const bool in_place = c.in_place != v_in_place::none;
  const std::uint64_t extent = in_place ? mine.recv_extent : mine.send_extent;
  // Both what this rank puts in its slot and what it pulls must fit, as for alltoall's rule on
  // the bytes received (a neighbour allgather of 16 KiB receives 4 x 16 KiB: eager lost 2.6x);
  // private buffers also up to the slots' capacity, where they would be staged.
  if (!ctx_.policy().eager_takes(std::max(extent, mine.recv_extent), private_buffers)) return false;
  std::byte* slot = ctx_.eager_slot(ctx_.config().rank, parity);
  if (in_place)
    copy_spans(slot, static_cast<const std::byte*>(c.recv->data), mine.in_place_data(c.in_place));
  else
    copy_bytes(slot, c.send->data, extent);
  return true;
}

void v_exchange::execute_eager(const v_call& c, std::size_t parity) {
  const v_pattern& pat = pattern(c.pattern);
  auto* recv = static_cast<std::byte*>(const_cast<void*>(c.recv->data));
  const bool in_place = c.in_place != v_in_place::none;
  for (const v_tuple& t : incoming_[static_cast<std::size_t>(c.pattern)]) {
    if (in_place && t.src == t.dst) continue;  // already in place
    const v_span& to = received(pat, t, parity);
    copy_bytes(recv + to.offset, ctx_.eager_slot(t.src, parity) + sent(t, parity).offset, to.bytes);
  }
}

const v_span& v_exchange::sent(const v_tuple& t, std::size_t parity) const noexcept {
  return slot(t.src, parity)[t.send_block];
}

const v_span& v_exchange::received(const v_pattern& p, const v_tuple& t,
                                   std::size_t parity) const noexcept {
  return slot(t.dst, parity)[p.send_blocks[static_cast<std::size_t>(t.dst)] + t.recv_block];
}

void v_exchange::check_counts(const v_call& c, std::size_t parity) const {
  const v_pattern& pat = pattern(c.pattern);
  const auto& cr = ctx_.config().comm_ranks;
  const std::size_t itemsize = std::max<std::size_t>(c.recv->dtype.itemsize, 1);
  for (const v_tuple& t : pat.tuples) {
    const std::uint64_t out = sent(t, parity).bytes, in = received(pat, t, parity).bytes;
    if (out == in) continue;
    throw usage_error(
        call_prefix(c.op) + "counts differ between ranks: " + "rank " +
        std::to_string(cr[static_cast<std::size_t>(t.src)]) + " sends " +
        std::to_string(out / itemsize) + " elements (its block " + std::to_string(t.send_block) +
        ") to rank " + std::to_string(cr[static_cast<std::size_t>(t.dst)]) + ", which expects " +
        std::to_string(in / itemsize) + " (its block " + std::to_string(t.recv_block) + ")");
  }
}

const std::vector<v_tuple>& v_exchange::tuples_for(int pattern, block_order order,
                                                   v_in_place in_place) {
  const std::uint64_t key = ordered_key(pattern, order, in_place);
  auto it = ordered_.find(key);
  if (it == ordered_.end())
    it = ordered_
             .emplace(key,
                      ordered_tuples(this->pattern(pattern), ctx_.config().size, order, in_place))
             .first;
  return it->second;
}

void v_exchange::execute(const v_call& c, const checked_call& mine,
                         const call_protocol::published& all, std::size_t parity) {
  const v_pattern& pat = pattern(c.pattern);
  const auto& tuples = tuples_for(c.pattern, mine.order, c.in_place);
  const int n = ctx_.config().size, me = ctx_.config().rank;
  starts_.resize(tuples.size() + 1);  // where each tuple's bytes start in the stream
  starts_[0] = 0;
  loads_.assign(static_cast<std::size_t>(n), 0);
  for (std::size_t i = 0; i < tuples.size(); ++i) {
    const std::uint64_t bytes = received(pat, tuples[i], parity).bytes;
    starts_[i + 1] = starts_[i] + bytes;
    loads_[static_cast<std::size_t>(tuples[i].dst)] += bytes;
  }
  const std::uint64_t total = starts_.back();
  if (total == 0) return;  // nothing moves on this node: no second barrier (see the header)
  const bool in_place = c.in_place != v_in_place::none;
  node_segments& segs = ctx_.segments();
  bool staged = false;
  for (int j = 0; j < n; ++j)
    staged |= (!in_place && all.line(j).send.segment == 0) || all.line(j).recv.segment == 0;
  // The busiest receiver decides: staging costs it two more copies of its bytes.
  if (staged && !in_place && ctx_.pulls_private(*std::max_element(loads_.begin(), loads_.end())))
    return execute_pulls(c, all, parity, tuples);
  auto send_part = [&](int j) { return round_up(extents(j, parity)[0], line_bytes); };
  if (staged) {
    std::uint64_t need = 0;
    for (int j = 0; j < n; ++j) need = std::max(need, send_part(j) + extents(j, parity)[1]);
    segs.reserve_staging(need);
    stage_in(c, mine, all.line(me), send_part(me));
    ctx_.protocol().sync();  // staged data is visible
  }
  send_bases_.assign(static_cast<std::size_t>(n), nullptr);
  recv_bases_.assign(static_cast<std::size_t>(n), nullptr);
  sent_.assign(static_cast<std::size_t>(n), nullptr);
  received_.assign(static_cast<std::size_t>(n), nullptr);
  for (int j = 0; j < n; ++j) {
    const auto& line = all.line(j);
    const auto k = static_cast<std::size_t>(j);
    sent_[k] = slot(j, parity).data();  // as sent() and received() read them
    received_[k] = sent_[k] + pat.send_blocks[k];
    recv_bases_[k] = line.recv.segment ? segs.resolve(line.recv) : segs.staging(j) + send_part(j);
    if (in_place)
      send_bases_[k] = recv_bases_[k];
    else
      send_bases_[k] = line.send.segment ? segs.resolve(line.send) : segs.staging(j);
  }
  const auto [first, last] = my_piece(pat, tuples, parity, total, mine.order, c.in_place);
  // The piece starts in the first tuple that ends after `first`: the walk starts there.
  const auto at = static_cast<std::size_t>(
      std::upper_bound(starts_.begin() + 1, starts_.end(), first) - (starts_.begin() + 1));
  const std::uint64_t base = starts_[at];
  const auto piece = std::span<const v_tuple>(tuples).subspan(std::min(at, tuples.size()));
  ctx_.policy().timed_copies(c.op, total / tuples.size(), c.copy, mine.recv_extent, last - first,
                             [&](const copy_plan& how) {
                               copy_tuples(piece, sent_.data(), received_.data(),
                                           send_bases_.data(), recv_bases_.data(), first - base,
                                           last - base, c.in_place == v_in_place::swap, how);
                             });
  ctx_.protocol().sync();
  if (staged && all.line(me).recv.segment == 0) stage_out(c, pat, tuples, parity, send_part(me));
}

void v_exchange::execute_pulls(const v_call& c, const call_protocol::published& all,
                               std::size_t parity, const std::vector<v_tuple>& tuples) {
  const v_pattern& pat = pattern(c.pattern);
  const int me = ctx_.config().rank;
  split_pulls(tuples, starts_, ctx_.policy().cma_push_bytes(), pushed_, loads_, busy_);
  auto* recv = static_cast<std::byte*>(const_cast<void*>(c.recv->data));
  const auto* send = static_cast<const std::byte*>(c.send->data);
  landed_.assign(static_cast<std::size_t>(ctx_.config().size), pull_landing{});
  pull_failure failed;
  auto note = [&failed](int err, int peer, bool pushed) {
    if (err && !failed.error) failed = {err, peer, pushed};
  };
  for (std::size_t i = 0; i < tuples.size(); ++i) {
    const v_tuple& t = tuples[i];
    if (t.dst != me && t.src != me) continue;
    const v_span& to = received(pat, t, parity);
    const std::uint64_t at = sent(t, parity).offset;
    const std::uint64_t pulled = to.bytes - pushed_[i];
    if (t.src == me && t.dst == me) {
      copy_bytes(recv + to.offset, send + at, to.bytes);
    } else if (t.dst == me) {
      const buffer_ref& from = all.line(t.src).send;
      if (from.segment) {
        copy_bytes(recv + to.offset, ctx_.segments().resolve(from) + at, pulled);
      } else if (pulled) {
        // A source repeated in the lists (a periodic dimension of 2, a graph's repeated edge)
        // sends the same bytes again: they are copied from where they landed (receive blocks
        // are disjoint, and pushes fill only the tails), not read across processes twice.
        pull_landing& was = landed_[static_cast<std::size_t>(t.src)];
        if (was.bytes >= pulled && was.from == at) {
          copy_bytes(recv + to.offset, recv + was.offset, pulled);
        } else {
          note(ctx_.cma().read(t.src, recv + to.offset, from.offset + at, pulled), t.src, false);
          was = {at, pulled, to.offset};
        }
      }
    } else if (pushed_[i]) {
      const buffer_ref& into = all.line(t.dst).recv;
      const std::uint64_t offset = to.offset + pulled;
      if (into.segment)
        copy_bytes(ctx_.segments().resolve(into) + offset, send + at + pulled, pushed_[i]);
      else
        note(ctx_.cma().write(t.dst, into.offset + offset, send + at + pulled, pushed_[i]), t.dst,
             true);
    }
  }
  // A failed push spoils its receiver's result, which only the pusher knows of: every rank
  // raises the first failure.
  ctx_.publish_pull_failure(failed);
  ctx_.protocol().sync();  // every copy is done: the senders may change their buffers
  ctx_.raise_failed_pulls();
}

void split_pulls(std::span<const v_tuple> tuples, std::span<const std::uint64_t> starts,
                 std::uint64_t min_push, std::vector<std::uint64_t>& pushed,
                 std::vector<std::uint64_t>& load, std::vector<bool>& busy) {
  pushed.assign(tuples.size(), 0);
  const auto n = static_cast<std::uint64_t>(load.size());
  const std::uint64_t total = starts.empty() ? 0 : starts.back();
  const std::uint64_t mean = (total + n - 1) / n;
  busy.resize(load.size());
  for (std::size_t r = 0; r < load.size(); ++r)
    busy[r] = load[r] * n >= cma_push_load_factor * total;
  for (std::size_t i = 0; i < tuples.size(); ++i) {
    const auto src = static_cast<std::size_t>(tuples[i].src);
    const auto dst = static_cast<std::size_t>(tuples[i].dst);
    if (src == dst || !busy[dst] || load[dst] <= mean || load[src] >= mean) continue;
    const std::uint64_t bytes = starts[i + 1] - starts[i];
    const std::uint64_t part = std::min({bytes, load[dst] - mean, mean - load[src]});
    if (part == 0 || part < min_push) continue;
    pushed[i] = part;
    load[dst] -= part;
    load[src] += part;
  }
}

void copy_tuples(std::span<const v_tuple> tuples, const v_span* const* sent,
                 const v_span* const* received, std::byte* const* send, std::byte* const* recv,
                 std::uint64_t first, std::uint64_t last, bool swap,
                 const copy_plan& how) noexcept {
  auto bytes = [&](const v_tuple& t) {
    return received[static_cast<std::size_t>(t.dst)][t.recv_block].bytes;
  };
  for_each_piece(
      tuples, first, last, bytes, [&](const v_tuple& t, std::uint64_t lo, std::uint64_t hi) {
        const auto s = static_cast<std::size_t>(t.src), d = static_cast<std::size_t>(t.dst);
        std::byte* dst = recv[d] + received[d][t.recv_block].offset + lo;
        const std::uint64_t from = sent[s][t.send_block].offset + lo;
        if (swap)
          swap_bytes(dst, recv[s] + from, hi - lo);
        else
          copy_bytes(dst, send[s] + from, hi - lo, how);
      });
}

void v_exchange::stage_in(const v_call& c, const checked_call& mine, const detail::rank_line& line,
                          std::uint64_t send_part) {
  std::byte* stage = ctx_.segments().staging(ctx_.config().rank);
  if (c.in_place == v_in_place::none) {
    if (line.send.segment == 0) copy_bytes(stage, c.send->data, mine.send_extent);
    return;
  }
  if (line.recv.segment != 0) return;
  // In place, the data to send is in the receive buffer; the holes between blocks are never read.
  copy_spans(stage + send_part, static_cast<const std::byte*>(c.recv->data),
             mine.in_place_data(c.in_place));
}

void v_exchange::stage_out(const v_call& c, const v_pattern& pat,
                           const std::vector<v_tuple>& tuples, std::size_t parity,
                           std::uint64_t send_part) const {
  const std::byte* stage = ctx_.segments().staging(ctx_.config().rank) + send_part;
  copy_spans(static_cast<std::byte*>(const_cast<void*>(c.recv->data)), stage,
             written_blocks(pat, tuples, parity, c.in_place));
}

std::vector<v_span> v_exchange::written_blocks(const v_pattern& p,
                                               const std::vector<v_tuple>& tuples,
                                               std::size_t parity, v_in_place in_place) const {
  // Only these: the others (holes, blocks from other nodes, an in-place rank's own block) keep
  // what the user's buffer holds.
  const int me = ctx_.config().rank;
  std::vector<v_span> out;
  for (const v_tuple& t : tuples) {
    if (t.dst == me) out.push_back(received(p, t, parity));
    if (in_place == v_in_place::swap && t.src == me) out.push_back(sent(t, parity));
  }
  return out;
}

}  // namespace zcoll
