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

int spread_reduction::folder(int owner) const {
  const auto r = static_cast<std::size_t>(owner);
  return nodes_.node_of[r] == node_ ? nodes_.node_rank[r] : spread_server(nodes_, node_, owner);
}

std::byte* spread_reduction::partial(const result_piece& piece) const {
  if (alone_) return const_cast<std::byte*>(inputs_[0]) + piece.from;
  return work(ctx_.config().rank, 1) + piece.from;
}

void spread_reduction::fold_partial(std::byte* dst, const result_piece& piece) {
  sources_.resize(inputs_.size());
  for (std::size_t j = 0; j < inputs_.size(); ++j) sources_[j] = inputs_[j] + piece.from;
  reduce_fold(rop_, type_, dst, sources_.data(), static_cast<int>(inputs_.size()),
              piece.bytes / element_bytes(type_));
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

void spread_reduction::begin(const reduction_call& call) {
  const context_config& cfg = ctx_.config();
  call_protocol& protocol = ctx_.protocol();
  node_segments& segments = ctx_.segments();
  const int me = cfg.rank, q = cfg.size;
  if (!is_reduction(call.op))
    throw std::invalid_argument("zcoll: spread_reduction: not a reduction");
  if (call.op == op_code::bcast) return begin_bcast(call);
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
  inputs_.assign(static_cast<std::size_t>(q), nullptr);
  for (int j = 0; j < q; ++j) {
    const buffer_ref& ref = all.line(j).send;
    inputs_[static_cast<std::size_t>(j)] = j == me       ? input
                                           : ref.segment ? segments.resolve(ref)
                                                         : segments.staging(j);
  }

  // Phase 1: this node's partials of this rank's piece and of the pieces it serves (a node of
  // one rank: its input).
  sends_.clear();
  recvs_.clear();
  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  if (mine.bytes && !alone_) fold_partial(work(me, 1) + mine.from, mine);
  for (int owner = 0; owner < cfg.comm_size; ++owner) {
    const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
    if (nodes_.node_of[static_cast<std::size_t>(owner)] == node_ || !piece.bytes ||
        folder(owner) != me)
      continue;
    if (!alone_) fold_partial(work(me, 1) + piece.from, piece);
    sends_.push_back({owner, partial(piece), piece.bytes});
  }
  // The other nodes' partials of this rank's piece, in node order.
  const int n = nodes_.nodes();
  scratch_.resize(static_cast<std::size_t>(n - 1) * mine.bytes);
  if (!mine.bytes) return;
  std::byte* next = scratch_.data();
  for (int node = 0; node < n; ++node) {
    if (node == node_) continue;
    recvs_.push_back({member(node, self_), next, mine.bytes});
    next += mine.bytes;
  }
}

void spread_reduction::combine() {
  if (op_ == op_code::bcast) return combine_bcast();
  const int me = ctx_.config().rank, n = nodes_.nodes();
  const result_piece& mine = pieces_[static_cast<std::size_t>(self_)];
  // Where this rank's piece of the result goes: its block (reduce_scatter), the root's buffer
  // (reduce), where an allreduce's pieces land, else the node's result area (sent from there).
  std::byte* result = work(me, 0) + mine.from;
  if (op_ == op_code::reduce_scatter)
    result = out_;
  else if (op_ == op_code::reduce && self_ == root_)
    result = out_ + mine.from;
  else if (op_ == op_code::allreduce)
    result = landing(mine);
  sends_.clear();
  recvs_.clear();
  if (mine.bytes) {
    sources_.resize(static_cast<std::size_t>(n));
    const std::byte* other = scratch_.data();
    for (int node = 0; node < n; ++node) {
      if (node == node_) {
        sources_[static_cast<std::size_t>(node)] = partial(mine);
      } else {
        sources_[static_cast<std::size_t>(node)] = other;
        other += mine.bytes;
      }
    }
    reduce_fold(rop_, type_, result, sources_.data(), n, mine.bytes / element_bytes(type_));
  }
  if (op_ == op_code::reduce_scatter) return;
  const int root_node = nodes_.node_of[static_cast<std::size_t>(root_)];
  // Phase 3: this rank's piece out, the pieces it serves (allreduce) or all others (the root
  // of a reduce) in.
  if (mine.bytes) {
    if (op_ == op_code::allreduce) {
      for (int node = 0; node < n; ++node)
        if (node != node_) sends_.push_back({member(node, self_), result, mine.bytes});
    } else if (node_ != root_node) {
      sends_.push_back({root_, result, mine.bytes});
    }
  }
  for (int owner = 0; owner < ctx_.config().comm_size; ++owner) {
    const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
    if (nodes_.node_of[static_cast<std::size_t>(owner)] == node_ || !piece.bytes) continue;
    if (op_ == op_code::allreduce && folder(owner) == me)
      recvs_.push_back({owner, landing(piece), piece.bytes});
    else if (op_ == op_code::reduce && self_ == root_)
      recvs_.push_back({owner, out_ + piece.from, piece.bytes});
  }
}

void spread_reduction::finish() {
  if (op_ == op_code::bcast) return finish_bcast();
  const context_config& cfg = ctx_.config();
  sends_.clear();
  recvs_.clear();
  ctx_.protocol().sync();  // every piece of the node in its result area; no input read after
  if (!out_ || op_ == op_code::reduce_scatter || alone_) return;  // alone: out_ holds it all
  for (int owner = 0; owner < cfg.comm_size; ++owner) {
    const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
    const bool here = nodes_.node_of[static_cast<std::size_t>(owner)] == node_;
    // The root of a reduce folded its own piece and received the other nodes' in place.
    if (!piece.bytes || (op_ == op_code::reduce && (owner == self_ || !here))) continue;
    copy_bytes(out_ + piece.from, work(folder(owner), 0) + piece.from, piece.bytes);
  }
}

void spread_reduction::begin_bcast(const reduction_call& call) {
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
  const auto all = publish(bytes);
  alone_ = q == 1;
  // Pieces of bytes (any dtype), one per rank.
  pieces_ =
      spread_pieces(op_code::allreduce, bytes, 1, cfg.comm_size, spread_owners(nodes_, op_, root_));
  sends_.clear();
  recvs_.clear();
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
    // Phase 2: each piece to the other nodes: the root's node's own ranks' pieces by their
    // owners to their servers on every other node, the other nodes' by their servers here to
    // their owners.
    for (int owner = 0; owner < cfg.comm_size; ++owner) {
      const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
      const int node = nodes_.node_of[static_cast<std::size_t>(owner)];
      if (!piece.bytes) continue;
      std::byte* from = const_cast<std::byte*>(source_) + piece.from;
      if (owner == self_) {
        for (int other = 0; other < nodes_.nodes(); ++other)
          if (other != node_) sends_.push_back({member(other, owner), from, piece.bytes});
      } else if (node != node_ && folder(owner) == me) {
        sends_.push_back({owner, from, piece.bytes});
      }
    }
    return;
  }
  // Another node: this rank's piece from its server on the root's node, and the root's node's
  // pieces this rank serves from their owners, into this node's result area.
  for (int owner = 0; owner < cfg.comm_size; ++owner) {
    const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
    const int node = nodes_.node_of[static_cast<std::size_t>(owner)];
    if (!piece.bytes) continue;
    if (owner == self_)
      recvs_.push_back({member(root_node_, owner), landing(piece), piece.bytes});
    else if (node == root_node_ && folder(owner) == me)
      recvs_.push_back({owner, landing(piece), piece.bytes});
  }
}

void spread_reduction::combine_bcast() {
  const int me = ctx_.config().rank;
  sends_.clear();
  recvs_.clear();
  if (node_ == root_node_) return;
  // Phase 3, between the other nodes: each owner's piece to its servers there.
  for (int owner = 0; owner < ctx_.config().comm_size; ++owner) {
    const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
    const int node = nodes_.node_of[static_cast<std::size_t>(owner)];
    if (!piece.bytes || node == root_node_) continue;
    if (owner == self_) {
      for (int other = 0; other < nodes_.nodes(); ++other)
        if (other != node_ && other != root_node_)
          sends_.push_back({member(other, owner), landing(piece), piece.bytes});
    } else if (node != node_ && folder(owner) == me) {
      recvs_.push_back({owner, landing(piece), piece.bytes});
    }
  }
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
  for (int owner = 0; owner < ctx_.config().comm_size; ++owner) {
    const result_piece& piece = pieces_[static_cast<std::size_t>(owner)];
    if (piece.bytes)
      copy_bytes(out_ + piece.from, work(folder(owner), 0) + piece.from, piece.bytes);
  }
}

std::byte* spread_reduction::landing(const result_piece& piece) const {
  return (alone_ ? out_ : work(ctx_.config().rank, 0)) + piece.from;
}

int spread_reduction::member(int node, int owner) const {
  return nodes_.members[static_cast<std::size_t>(node)]
                       [static_cast<std::size_t>(spread_server(nodes_, node, owner))];
}

}  // namespace zcoll
