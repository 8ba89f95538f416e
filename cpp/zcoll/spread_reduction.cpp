#include "zcoll/spread_reduction.hpp"

#include <algorithm>
#include <stdexcept>

#include "zcoll/aggregate.hpp"
#include "zcoll/copy.hpp"
#include "zcoll/exchange.hpp"

namespace zcoll {

std::vector<int> spread_owners(const node_map& nodes, op_code op, int root) {
  if (op == op_code::reduce && nodes.nodes() <= reduce_to_root_node_nodes)
    return nodes.members[static_cast<std::size_t>(nodes.node_of[static_cast<std::size_t>(root)])];
  std::vector<int> all(nodes.node_of.size());
  for (std::size_t r = 0; r < all.size(); ++r) all[r] = static_cast<int>(r);
  return all;
}

std::vector<result_piece> spread_pieces(op_code op, std::size_t count, std::size_t esize,
                                        int comm_size, std::span<const int> owners) {
  const auto p = static_cast<std::size_t>(comm_size);
  std::vector<result_piece> pieces(p);
  if (op == op_code::reduce_scatter) {
    const std::size_t block = count / p * esize;
    for (std::size_t r = 0; r < p; ++r) pieces[r] = {r * block, block};
    return pieces;
  }
  const std::size_t k = owners.size();
  const std::size_t line_elems = std::max<std::size_t>(1, 64 / esize);
  const std::size_t each = round_up((count + k - 1) / k, line_elems);
  for (std::size_t i = 0; i < k; ++i) {
    const std::size_t first = std::min(i * each, count), last = std::min(first + each, count);
    pieces[static_cast<std::size_t>(owners[i])] = {first * esize, (last - first) * esize};
  }
  return pieces;
}

void check_spread_segment(std::size_t bytes) {
  if (bytes % 64)
    throw std::invalid_argument("zcoll: the spread's segment must be a multiple of 64 bytes");
}

namespace {

// The segment of this communicator's spread messages: the forced one, else the default.
std::size_t segment_of(node_context& ctx) {
  const node_messages* rounds = ctx.rounds();
  const std::size_t forced = rounds ? rounds->overrides().spread_segment : 0;
  return forced ? forced : spread_segment_bytes;
}

}  // namespace

int spread_server(const node_map& nodes, int node, int owner) {
  // The owner among the ranks of the other nodes, in communicator order: the ranks below it
  // less those of `node` (its members ascend).
  const auto& members = nodes.members[static_cast<std::size_t>(node)];
  const auto below = std::lower_bound(members.begin(), members.end(), owner) - members.begin();
  return static_cast<int>((owner - below) % nodes.ranks_on(node));
}

std::byte* spread_reduction::work(int node_rank, int which) const {
  return ctx_.segments().staging(node_rank) + static_cast<std::size_t>(1 + which) * third_;
}

int spread_reduction::comm_rank(int j) const {
  return ctx_.config().comm_ranks[static_cast<std::size_t>(j)];
}

bool spread_reduction::serves(int owner) const {
  const auto r = static_cast<std::size_t>(owner);
  return nodes_.node_of[r] != node_ && spread_server(nodes_, node_, owner) == ctx_.config().rank;
}

int spread_reduction::folder(int owner) const {
  const auto r = static_cast<std::size_t>(owner);
  return nodes_.node_of[r] == node_ ? nodes_.node_rank[r] : spread_server(nodes_, node_, owner);
}

std::byte* spread_reduction::partial(const result_piece& piece) const {
  if (alone_) return const_cast<std::byte*>(inputs_[0]) + piece.from;
  return work(ctx_.config().rank, 1) + piece.from;
}

void spread_reduction::fold_partial(const result_piece& piece, std::size_t off, std::size_t bytes) {
  const std::size_t from = piece.from + off;
  sources_.resize(inputs_.size());
  for (std::size_t j = 0; j < inputs_.size(); ++j) sources_[j] = inputs_[j] + from;
  reduce_fold(rop_, type_, work(ctx_.config().rank, 1) + from, sources_.data(),
              static_cast<int>(inputs_.size()), bytes / element_bytes(type_));
}

call_protocol::published spread_reduction::publish(std::size_t bytes) {
  const auto all = ctx_.protocol().publish();
  check_calls(all, op_);
  check_arguments(all);
  node_segments& segments = ctx_.segments();
  const std::size_t span = round_up(bytes, 64);
  if (segments.staging_third() < span) segments.reserve_staging(3 * span);
  third_ = segments.staging_third();
  return all;
}

void spread_reduction::begin(const reduction_call& call, bool as_flow) {
  const context_config& cfg = ctx_.config();
  call_protocol& protocol = ctx_.protocol();
  node_segments& segments = ctx_.segments();
  const int me = cfg.rank, q = cfg.size;
  if (!is_reduction(call.op))
    throw std::invalid_argument("zcoll: spread_reduction: not a reduction");
  flow_ = stream_ = false;
  sends_.clear();
  recvs_.clear();
  folds_.clear();
  next_partial_ = own_partials_ = 0;
  if (call.op == op_code::bcast) return begin_bcast(call, as_flow);
  const array_view& in = call.send ? *call.send : *call.recv;
  op_ = call.op;
  rop_ = static_cast<reduce_op>(call.reduce);
  type_ = *element_type_of(in.dtype);
  self_ = comm_rank(me);
  node_ = nodes_.node_of[static_cast<std::size_t>(self_)];
  root_ = call.root;
  const bool wants = op_ != op_code::reduce || self_ == root_;
  out_ = wants ? static_cast<std::byte*>(const_cast<void*>(call.recv->data)) : nullptr;
  const auto* input = static_cast<const std::byte*>(in.data);
  const std::size_t bytes = in.nbytes;

  auto& line = protocol.next(op_);
  line.call.order = static_cast<std::int8_t>(call.algorithm);
  line.call.reduce = static_cast<std::uint8_t>(call.reduce);
  line.call.root = static_cast<std::uint16_t>(op_ == op_code::reduce ? root_ : 0);
  line.call.dtype = in.dtype;
  line.call.block_bytes = bytes;
  // In place, a reduce_scatter writes its block over its input while peers may still read it:
  // such an input is staged.
  if (call.send || op_ != op_code::reduce_scatter) line.send = segments.locate(input, bytes);
  if (op_ == op_code::allreduce && q > 1) line.recv = segments.locate(out_, bytes);
  const auto all = publish(bytes);
  pieces_ = spread_pieces(op_, bytes / element_bytes(type_), element_bytes(type_), cfg.comm_size,
                          spread_owners(nodes_, op_, root_));
  alone_ = q == 1;
  bool stage = false;
  for (int j = 0; j < q; ++j) stage |= all.line(j).send.segment == 0;
  if (stage) {  // every rank sees the same lines, so every rank takes this branch
    if (all.line(me).send.segment == 0)  // the parts of its input that peers fold
      for (int owner = 0; owner < cfg.comm_size; ++owner) {
        const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
        if (piece.bytes && folder(owner) != me)
          copy_bytes(segments.staging(me) + piece.from, input + piece.from, piece.bytes);
      }
    protocol.sync();  // staged inputs are visible
  }
  find_holders(all);
  inputs_.assign(static_cast<std::size_t>(q), nullptr);
  for (int j = 0; j < q; ++j) {
    const buffer_ref& ref = all.line(j).send;
    inputs_[static_cast<std::size_t>(j)] = j == me       ? input
                                           : ref.segment ? segments.resolve(ref)
                                                         : segments.staging(j);
  }

  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  segment_ = segment_of(ctx_);
  result_ = result_place();
  // A result far larger than the cache that is not sent on (a reduce's root, reduce_scatter)
  // is written with streaming stores, as the node's reductions write theirs.
  const std::size_t cache = ctx_.policy().copy().cache_bytes();
  stream_ = (op_ == op_code::reduce_scatter || (op_ == op_code::reduce && self_ == root_)) &&
            cache > 0 && mine.bytes > cache / 2;
  // In place on a node of one rank, a reduce_scatter's block (the start of its input) is a
  // partial it sends: its fold waits for all of phase 2, so it runs the phases.
  const bool in_place_alone = alone_ && out_ == input;
  flow_ = as_flow && !(in_place_alone && op_ == op_code::reduce_scatter);
  // Phase 1: this node's partials of this rank's piece and of the pieces it serves (a node of
  // one rank: its input). A flow folds them segment by segment (step()) -- but for an in-place
  // reduce_scatter, whose result (its first block) may be a piece it serves.
  const bool fold_first = !flow_ || (op_ == op_code::reduce_scatter && out_ == input);
  if (!alone_ && fold_first)
    for (int owner = 0; owner < cfg.comm_size; ++owner) {
      const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
      if (piece.bytes && (owner == self_ || serves(owner))) fold_partial(piece, 0, piece.bytes);
    }
  if (flow_)
    start_flow(in_place_alone, alone_ || fold_first);
  else
    list_partials();
}

void spread_reduction::list_partials() {
  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  partial_sends([&](int peer, std::byte* data, std::size_t length) {
    sends_.push_back({peer, data, length});
  });
  std::byte* next = scratch_.reserve(static_cast<std::size_t>(nodes_.nodes() - 1) * mine.bytes);
  for (int node = 0; node < nodes_.nodes(); ++node) {
    if (node == node_) continue;
    for_segments(mine.bytes, [&](std::size_t off, std::size_t length) {
      recvs_.push_back({member(node, self_), next + off, length});
    });
    next += mine.bytes;
  }
}

void spread_reduction::start_flow(bool in_place_alone, bool folded) {
  to_recv_.clear();
  to_send_.clear();
  handed_.clear();
  partials_left_.assign(pieces_.size(), 0);
  defer_results_ = in_place_alone;
  if (folded) {  // all sent at once
    partial_sends([&](int peer, std::byte* data, std::size_t length) {
      hand({peer, data, length}, spread_partial_tag, false, handed_kind::partial,
           static_cast<std::size_t>(peer));
      ++partials_left_[static_cast<std::size_t>(peer)];
    });
  } else {  // folded and sent by step(), the served pieces' segments round robin
    std::vector<int> served;
    std::size_t most = 0;
    for (int owner = 0; owner < ctx_.config().comm_size; ++owner) {
      const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
      if (!piece.bytes || !serves(owner)) continue;
      served.push_back(owner);
      most = std::max(most, segment_count(piece.bytes));
    }
    for (std::size_t k = 0; k < most; ++k)
      for (const int owner : served)
        if (k < segment_count(pieces_[static_cast<std::size_t>(owner)].bytes))
          folds_.push_back({owner, k});
  }
  for (std::size_t owner = 0; owner < pieces_.size(); ++owner)
    if (!defer_results_ || !partials_left_[owner]) post_result_recvs(static_cast<int>(owner));
  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  const auto others = static_cast<std::size_t>(nodes_.nodes() - 1);
  segments_ = segment_count(mine.bytes);
  own_partials_ = folded ? segments_ : 0;
  slots_ = std::min(spread_ring_segments, segments_);
  ring_slot_ = std::min(segment_, mine.bytes);
  scratch_.reserve(slots_ * others * ring_slot_);
  ring_count_.assign(slots_, 0);
  next_ring_ = next_fold_ = 0;
  post_rings();
}

template <class Each>
void spread_reduction::for_segments(std::size_t bytes, Each&& each) const {
  for (std::size_t off = 0; off < bytes; off += segment_)
    each(off, std::min(segment_, bytes - off));
}

std::size_t spread_reduction::segment_count(std::size_t bytes) const {
  return (bytes + segment_ - 1) / segment_;
}

std::size_t spread_reduction::segment_length(std::size_t k, std::size_t bytes) const {
  return std::min(segment_, bytes - k * segment_);
}

template <class Each>
void spread_reduction::partial_sends(Each&& each) const {
  for (int owner = 0; owner < ctx_.config().comm_size; ++owner) {
    const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
    if (!piece.bytes || !serves(owner)) continue;
    std::byte* from = partial(piece);
    for_segments(piece.bytes,
                 [&](std::size_t off, std::size_t bytes) { each(owner, from + off, bytes); });
  }
}

template <class Each>
void spread_reduction::result_sends(std::size_t off, std::size_t bytes, Each&& each) const {
  if (op_ == op_code::allreduce) {
    for (int node = 0; node < nodes_.nodes(); ++node)
      if (node != node_) each(member(node, self_), result_ + off, bytes);
  } else if (op_ == op_code::reduce && node_ != nodes_.node_of[static_cast<std::size_t>(root_)]) {
    each(root_, result_ + off, bytes);
  }
}

template <class Each>
void spread_reduction::result_recvs(int owner, Each&& each) const {
  const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
  if (nodes_.node_of[static_cast<std::size_t>(owner)] == node_ || !piece.bytes) return;
  std::byte* into = nullptr;
  if (op_ == op_code::allreduce && serves(owner))
    into = landing(piece);
  else if (op_ == op_code::reduce && self_ == root_)
    into = out_ + piece.from;
  if (into)
    for_segments(piece.bytes,
                 [&](std::size_t off, std::size_t bytes) { each(owner, into + off, bytes); });
}

std::byte* spread_reduction::result_place() {
  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  if (op_ == op_code::reduce_scatter) return out_;
  if (op_ == op_code::reduce && self_ == root_) return out_ + mine.from;
  if (op_ == op_code::allreduce) return landing(mine);
  return work(ctx_.config().rank, 0) + mine.from;
}

void spread_reduction::fold_segment(std::size_t off, std::size_t bytes,
                                    const std::byte* const* others) {
  const int n = nodes_.nodes();
  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  sources_.resize(static_cast<std::size_t>(n));
  for (int node = 0, other = 0; node < n; ++node)
    sources_[static_cast<std::size_t>(node)] =
        node == node_ ? partial(mine) + off : others[other++];
  reduce_fold(rop_, type_, result_ + off, sources_.data(), n, bytes / element_bytes(type_),
              stream_);
}

void spread_reduction::combine() {
  if (op_ == op_code::bcast) return combine_bcast();
  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  sends_.clear();
  recvs_.clear();
  if (mine.bytes) {
    others_.resize(static_cast<std::size_t>(nodes_.nodes() - 1));
    for (std::size_t i = 0; i < others_.size(); ++i) others_[i] = scratch_.data() + i * mine.bytes;
    fold_segment(0, mine.bytes, others_.data());
  }
  // Phase 3: this rank's piece out, the pieces it serves (allreduce) or all others (the root
  // of a reduce) in.
  const auto push = [](std::vector<peer_block>& to) {
    return
        [&to](int peer, std::byte* data, std::size_t bytes) { to.push_back({peer, data, bytes}); };
  };
  for_segments(mine.bytes,
               [&](std::size_t off, std::size_t bytes) { result_sends(off, bytes, push(sends_)); });
  for (int owner = 0; owner < ctx_.config().comm_size; ++owner) result_recvs(owner, push(recvs_));
}

void spread_reduction::hand(const peer_block& b, int tag, bool receive, handed_kind kind,
                            std::size_t index) {
  (receive ? to_recv_ : to_send_).push_back({{b.peer, tag, b.data, b.bytes}, {kind, index}});
}

void spread_reduction::take(std::vector<peer_buffer>& recvs, std::vector<peer_buffer>& sends) {
  for (auto* list : {&to_recv_, &to_send_}) {
    for (const pending& p : *list) {
      (list == &to_recv_ ? recvs : sends).push_back(p.message);
      handed_.push_back(p.what);
    }
    list->clear();
  }
}

std::byte* spread_reduction::ring(std::size_t slot, std::size_t other) const {
  const std::size_t others = static_cast<std::size_t>(nodes_.nodes() - 1);
  return scratch_.data() + (slot * others + other) * ring_slot_;
}

void spread_reduction::post_rings() {
  // In segment order (the k-th message from a peer matches the k-th receive posted for it),
  // each into the slot the segment slots_ before it left when it was folded.
  for (; next_ring_ < segments_ && next_ring_ < next_fold_ + slots_; ++next_ring_)
    post_ring(next_ring_);
}

void spread_reduction::post_ring(std::size_t k) {
  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  const std::size_t bytes = segment_length(k, mine.bytes);
  std::size_t other = 0;
  for (int node = 0; node < nodes_.nodes(); ++node)
    if (node != node_)
      hand({member(node, self_), ring(k % slots_, other++), bytes}, spread_partial_tag, true,
           handed_kind::ring, k);
}

void spread_reduction::post_result_recvs(int owner) {
  result_recvs(owner, [&](int peer, std::byte* data, std::size_t bytes) {
    hand({peer, data, bytes}, spread_result_tag, true, handed_kind::other, 0);
  });
}

void spread_reduction::completed(std::size_t id) {
  const handed what = handed_[id];
  if (what.kind == handed_kind::own) return forward_arrived(what.index);
  if (what.kind == handed_kind::partial) {
    if (--partials_left_[what.index] == 0 && defer_results_)
      post_result_recvs(static_cast<int>(what.index));
    return;
  }
  if (what.kind != handed_kind::ring) return;
  ++ring_count_[what.index % slots_];
  // In segment order (a peer's k-th result message must be segment k): each segment whose
  // partials all arrived.
  const auto others = static_cast<int>(nodes_.nodes() - 1);
  for (; next_fold_ < segments_ && ring_count_[next_fold_ % slots_] == others; ++next_fold_)
    fold_ring(next_fold_);
  post_rings();
}

bool spread_reduction::step() {
  if (next_partial_ < folds_.size()) {  // a served piece's segment: folded, then sent
    const auto [owner, k] = folds_[next_partial_++];
    const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
    const std::size_t off = k * segment_, bytes = segment_length(k, piece.bytes);
    fold_partial(piece, off, bytes);
    hand({owner, partial(piece) + off, bytes}, spread_partial_tag, false, handed_kind::other, 0);
    return true;
  }
  if (own_partials_ < segments_) {  // this rank's own piece's partial, ahead of its fold
    fold_own_partial(own_partials_);
    return true;
  }
  return false;
}

void spread_reduction::fold_own_partial(std::size_t k) {
  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  fold_partial(mine, k * segment_, segment_length(k, mine.bytes));
  own_partials_ = k + 1;
}

void spread_reduction::fold_ring(std::size_t k) {
  while (own_partials_ <= k) fold_own_partial(own_partials_);
  const std::size_t slot = k % slots_, others = static_cast<std::size_t>(nodes_.nodes() - 1);
  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  const std::size_t off = k * segment_, bytes = segment_length(k, mine.bytes);
  others_.resize(others);
  for (std::size_t i = 0; i < others; ++i) others_[i] = ring(slot, i);
  fold_segment(off, bytes, others_.data());
  result_sends(off, bytes, [&](int peer, std::byte* data, std::size_t length) {
    hand({peer, data, length}, spread_result_tag, false, handed_kind::other, 0);
  });
  ring_count_[slot] = 0;
}

void spread_reduction::finish() {
  if (op_ == op_code::bcast) return finish_bcast();
  const context_config& cfg = ctx_.config();
  sends_.clear();
  recvs_.clear();
  if (stream_) store_fence();
  ctx_.protocol().sync();  // every piece of the node in its result area; no input read after
  if (!out_ || op_ == op_code::reduce_scatter || alone_) return;  // alone: out_ holds it all
  for (int owner = 0; owner < cfg.comm_size; ++owner) {
    const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
    const bool here = nodes_.node_of[static_cast<std::size_t>(owner)] == node_;
    // The root of a reduce folded its own piece and received the other nodes' in place.
    if (!piece.bytes || (op_ == op_code::reduce && (owner == self_ || !here))) continue;
    copy_piece(owner);
  }
  if (holders_read_) ctx_.protocol().sync();  // peers' receive buffers are read until here
}

void spread_reduction::find_holders(const call_protocol::published& all) {
  const int q = ctx_.config().size;
  holders_.assign(static_cast<std::size_t>(q), nullptr);
  holders_read_ = false;
  if (alone_ || (op_ != op_code::allreduce && op_ != op_code::bcast)) return;
  for (int j = 0; j < q; ++j) {
    const buffer_ref& ref = all.line(j).recv;
    if (!ref.segment) continue;
    holders_[static_cast<std::size_t>(j)] =
        j == ctx_.config().rank ? out_ : ctx_.segments().resolve(ref);
    holders_read_ = true;
  }
}

std::byte* spread_reduction::holder(int node_rank) const {
  std::byte* out = holders_[static_cast<std::size_t>(node_rank)];
  return out ? out : work(node_rank, 0);
}

void spread_reduction::copy_piece(int owner) {
  const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
  const int from = folder(owner);
  if (from == ctx_.config().rank && holders_[static_cast<std::size_t>(from)]) return;  // landed
  copy_bytes(out_ + piece.from, holder(from) + piece.from, piece.bytes);
}

void spread_reduction::begin_bcast(const reduction_call& call, bool as_flow) {
  const context_config& cfg = ctx_.config();
  call_protocol& protocol = ctx_.protocol();
  node_segments& segments = ctx_.segments();
  const int me = cfg.rank, q = cfg.size;
  const array_view& buf = *call.recv;
  op_ = op_code::bcast;
  self_ = comm_rank(me);
  node_ = nodes_.node_of[static_cast<std::size_t>(self_)];
  root_ = call.root;
  root_node_ = nodes_.node_of[static_cast<std::size_t>(root_)];
  out_ = self_ == root_ ? nullptr : static_cast<std::byte*>(const_cast<void*>(buf.data));
  const std::size_t bytes = bytes_ = buf.nbytes;
  auto& line = protocol.next(op_);
  line.call.dtype = buf.dtype;
  line.call.block_bytes = bytes;
  line.call.root = static_cast<std::uint16_t>(root_);
  if (self_ == root_) line.send = segments.locate(buf.data, bytes);
  if (node_ != root_node_ && q > 1) line.recv = segments.locate(buf.data, bytes);
  const auto all = publish(bytes);
  alone_ = q == 1;
  find_holders(all);
  segment_ = segment_of(ctx_);
  // Pieces of bytes (any dtype), one per rank.
  pieces_ =
      spread_pieces(op_code::allreduce, bytes, 1, cfg.comm_size, spread_owners(nodes_, op_, root_));
  source_ = nullptr;
  root_in_place_ = false;
  if (node_ == root_node_) {  // the root's buffer, where the node's ranks can read it
    const int root_rank = nodes_.node_rank[static_cast<std::size_t>(root_)];
    const buffer_ref& ref = all.line(root_rank).send;
    if (ref.segment) {  // in the arena: read in place
      source_ = self_ == root_ ? static_cast<const std::byte*>(buf.data) : segments.resolve(ref);
      root_in_place_ = !alone_;
    } else if (alone_) {  // only the root reads it
      source_ = static_cast<const std::byte*>(buf.data);
    } else {  // private: a copy in the root's staging partition
      if (self_ == root_) copy_bytes(segments.staging(me), buf.data, bytes);
      protocol.sync();  // the staged copy is visible
      source_ = segments.staging(root_rank);
    }
  }
  flow_ = as_flow;
  if (!flow_) {
    bcast_sends([&](int peer, std::byte* data, std::size_t length) {
      sends_.push_back({peer, data, length});
    });
    bcast_recvs([&](int peer, std::byte* data, std::size_t length, bool) {
      recvs_.push_back({peer, data, length});
    });
    return;
  }
  to_recv_.clear();
  to_send_.clear();
  handed_.clear();
  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  segments_ = node_ == root_node_ ? 0 : segment_count(mine.bytes);
  own_partials_ = segments_;  // a bcast folds nothing: step() has no work
  arrived_.assign(segments_, 0);
  next_fold_ = 0;
  std::size_t k = 0;
  bcast_recvs([&](int peer, std::byte* data, std::size_t length, bool own) {
    hand({peer, data, length}, spread_partial_tag, true,
         own ? handed_kind::own : handed_kind::other, own ? k++ : 0);
  });
  bcast_forwarded_recvs([&](int peer, std::byte* data, std::size_t length) {
    hand({peer, data, length}, spread_result_tag, true, handed_kind::other, 0);
  });
  bcast_sends([&](int peer, std::byte* data, std::size_t length) {
    hand({peer, data, length}, spread_partial_tag, false, handed_kind::other, 0);
  });
}

template <class Each>
void spread_reduction::bcast_sends(Each&& each) const {
  if (node_ != root_node_) return;
  // Each piece to the other nodes: the root's node's own ranks' pieces by their owners to their
  // servers on every other node, the other nodes' by their servers here to their owners.
  for (int owner = 0; owner < ctx_.config().comm_size; ++owner) {
    const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
    if (!piece.bytes) continue;
    std::byte* from = const_cast<std::byte*>(source_) + piece.from;
    const auto send = [&](int peer) {
      for_segments(piece.bytes,
                   [&](std::size_t off, std::size_t bytes) { each(peer, from + off, bytes); });
    };
    if (owner == self_) {
      for (int other = 0; other < nodes_.nodes(); ++other)
        if (other != node_) send(member(other, owner));
    } else if (serves(owner)) {
      send(owner);
    }
  }
}

template <class Each>
void spread_reduction::bcast_recvs(Each&& each) const {
  if (node_ == root_node_) return;
  // Another node: this rank's piece from its server on the root's node (`own`), and the root's
  // node's pieces this rank serves from their owners, into this node's result area.
  for (int owner = 0; owner < ctx_.config().comm_size; ++owner) {
    const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
    if (!piece.bytes) continue;
    const bool own = owner == self_;
    int from = -1;
    if (own)
      from = member(root_node_, owner);
    else if (nodes_.node_of[static_cast<std::size_t>(owner)] == root_node_ && serves(owner))
      from = owner;
    if (from < 0) continue;
    std::byte* into = landing(piece);
    for_segments(piece.bytes,
                 [&](std::size_t off, std::size_t bytes) { each(from, into + off, bytes, own); });
  }
}

template <class Each>
void spread_reduction::bcast_forwards(std::size_t off, std::size_t bytes, Each&& each) const {
  std::byte* from = landing(pieces_[static_cast<std::size_t>(self_)]) + off;
  for (int other = 0; other < nodes_.nodes(); ++other)
    if (other != node_ && other != root_node_) each(member(other, self_), from, bytes);
}

template <class Each>
void spread_reduction::bcast_forwarded_recvs(Each&& each) const {
  if (node_ == root_node_) return;
  for (int owner = 0; owner < ctx_.config().comm_size; ++owner) {
    const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
    const int node = nodes_.node_of[static_cast<std::size_t>(owner)];
    if (!piece.bytes || node == root_node_ || node == node_ || !serves(owner)) continue;
    std::byte* into = landing(piece);
    for_segments(piece.bytes,
                 [&](std::size_t off, std::size_t bytes) { each(owner, into + off, bytes); });
  }
}

void spread_reduction::forward_arrived(std::size_t k) {
  arrived_[k] = 1;
  // In segment order (a peer's k-th message must be segment k).
  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  for (; next_fold_ < segments_ && arrived_[next_fold_]; ++next_fold_)
    bcast_forwards(next_fold_ * segment_, segment_length(next_fold_, mine.bytes),
                   [&](int peer, std::byte* data, std::size_t length) {
                     hand({peer, data, length}, spread_result_tag, false, handed_kind::other, 0);
                   });
}

void spread_reduction::combine_bcast() {
  sends_.clear();
  recvs_.clear();
  if (node_ == root_node_) return;
  // Phase 3, between the other nodes: each owner's piece to its servers there.
  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  for_segments(mine.bytes, [&](std::size_t off, std::size_t bytes) {
    bcast_forwards(off, bytes, [&](int peer, std::byte* data, std::size_t length) {
      sends_.push_back({peer, data, length});
    });
  });
  bcast_forwarded_recvs([&](int peer, std::byte* data, std::size_t length) {
    recvs_.push_back({peer, data, length});
  });
}

void spread_reduction::finish_bcast() {
  sends_.clear();
  recvs_.clear();
  call_protocol& protocol = ctx_.protocol();
  protocol.sync();  // every piece in the node's result area
  if (node_ == root_node_) {
    if (out_) copy_bytes(out_, source_, bytes_);
    if (root_in_place_) protocol.sync();  // the root's own buffer is read until here
    return;
  }
  if (alone_) return;  // the pieces came straight into the buffer
  for (int owner = 0; owner < ctx_.config().comm_size; ++owner)
    if (pieces_[static_cast<std::size_t>(owner)].bytes) copy_piece(owner);
  if (holders_read_) protocol.sync();  // peers' buffers are read until here
}

std::byte* spread_reduction::landing(const result_piece& piece) const {
  return (alone_ ? out_ : holder(ctx_.config().rank)) + piece.from;
}

int spread_reduction::member(int node, int owner) const {
  return nodes_.members[static_cast<std::size_t>(node)]
                       [static_cast<std::size_t>(spread_server(nodes_, node, owner))];
}

}  // namespace zcoll
