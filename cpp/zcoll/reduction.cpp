#include "zcoll/reduction.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "zcoll/copy.hpp"
#include "zcoll/exchange.hpp"
#include "zcoll/reduce_kernels.hpp"

namespace zcoll {

std::vector<std::vector<tree_group>> make_reduction_tree(int size, const std::vector<int>& numa,
                                                         const std::vector<int>& package,
                                                         const std::vector<int>& l3) {
  const auto n = static_cast<std::size_t>(size);
  auto key = [&](const std::vector<int>& v, int r) {
    return v.size() == n ? v[static_cast<std::size_t>(r)] : -1;
  };
  std::vector<std::vector<tree_group>> levels;
  // Groups `members` (ascending ranks) by `group_of`; adds a level of the groups with more
  // than one member; returns each group's leader (its lowest rank), ascending.
  auto level = [&](const std::vector<int>& members, auto group_of) {
    std::map<std::array<int, 3>, tree_group> groups;
    for (int r : members) groups[group_of(r)].push_back(r);
    std::vector<tree_group> kept;
    std::vector<int> leaders;
    for (auto& [k, g] : groups) {
      leaders.push_back(g.front());
      if (g.size() > 1) kept.push_back(std::move(g));
    }
    std::sort(leaders.begin(), leaders.end());
    if (!kept.empty()) levels.push_back(std::move(kept));
    return leaders;
  };
  std::vector<int> all(n);
  for (int r = 0; r < size; ++r) all[static_cast<std::size_t>(r)] = r;
  using place = std::array<int, 3>;
  auto leaders =
      level(all, [&](int r) { return place{key(package, r), key(numa, r), key(l3, r)}; });
  leaders = level(leaders, [&](int r) { return place{key(package, r), key(numa, r), 0}; });
  leaders = level(leaders, [&](int r) { return place{key(package, r), 0, 0}; });
  level(leaders, [](int) { return place{0, 0, 0}; });
  return levels;
}

namespace {
// Bytes of each private peer's input a pulled tiled reduction reads per fold (measured: ...).
constexpr std::size_t pull_piece_bytes = std::size_t{64} << 10;
}  // namespace

// One rank's reduction call, checked and resolved.
struct node_context::reduction_args {
  op_code op = op_code::allreduce;
  reduce_op rop = reduce_op::sum;
  element_type type = element_type::uint8;
  int asked = auto_algorithm;  // the algorithm as asked (what the ranks agree on)
  reduce_algorithm alg = reduce_algorithm::flat;
  int root = 0;                      // communicator rank
  int root_node = -1;                // its node rank, -1 when it is on another node
  const std::byte* input = nullptr;  // this rank's input (bcast: the buffer, at the root)
  std::byte* out = nullptr;          // where this rank's result goes (nullptr: nowhere)
  std::size_t bytes = 0;             // input bytes, the same on every rank
  std::size_t count = 0;             // input elements
  dtype_id dtype;

  // Whether `want` bytes of the result at `out` overlap no byte of the input (not in place).
  bool out_apart(std::size_t want) const noexcept {
    return out && (out + want <= input || input + bytes <= out);
  }
};

node_context::reduction_args node_context::checked_reduction(const reduction_call& c) {
  const int me = config_.comm_ranks[static_cast<std::size_t>(config_.rank)];
  const local_check check = check_reduction_args(c.op, config_.comm_size, me, c.send, c.recv,
                                                 c.reduce, c.algorithm, c.root);
  if (!check.ok()) fail(check.error, public_call_prefix(c.op) + check.message);
  reduction_args a;
  a.op = c.op;
  a.root = c.root;
  for (int j = 0; j < config_.size; ++j)
    if (config_.comm_ranks[static_cast<std::size_t>(j)] == c.root) a.root_node = j;
  a.bytes = check.block_bytes;
  if (c.op == op_code::bcast) {
    a.dtype = c.recv->dtype;
    a.count = c.recv->size;
    a.out = static_cast<std::byte*>(const_cast<void*>(c.recv->data));
    a.input = a.out;
    return a;
  }
  const array_view& in = c.send ? *c.send : *c.recv;
  a.rop = static_cast<reduce_op>(c.reduce);
  a.type = *element_type_of(in.dtype);
  a.dtype = in.dtype;
  a.count = in.size;
  a.input = static_cast<const std::byte*>(in.data);
  const bool wants = c.op != op_code::reduce || a.root_node == config_.rank;
  if (wants) a.out = static_cast<std::byte*>(const_cast<void*>(c.recv->data));
  a.asked = c.algorithm;
  a.alg = c.algorithm == auto_algorithm
              ? policy_.choose_reduction(a.bytes, false, c.op == op_code::reduce)
              : static_cast<reduce_algorithm>(c.algorithm);
  return a;
}

call_record node_context::describe_reduction(const reduction_call& c) const {
  const int me = config_.comm_ranks[static_cast<std::size_t>(config_.rank)];
  const local_check check = check_reduction_args(c.op, config_.comm_size, me, c.send, c.recv,
                                                 c.reduce, c.algorithm, c.root);
  if (!check.ok()) return error_record(check.error, public_call_prefix(c.op) + check.message);
  call_record r;
  r.call.op = c.op;
  r.call.dtype = c.op == op_code::bcast ? c.recv->dtype : (c.send ? *c.send : *c.recv).dtype;
  r.call.block_bytes = check.block_bytes;
  r.call.root =
      static_cast<std::uint16_t>(c.op == op_code::reduce || c.op == op_code::bcast ? c.root : 0);
  if (c.op != op_code::bcast) {
    r.call.reduce = static_cast<std::uint8_t>(c.reduce);
    r.call.order = static_cast<std::int8_t>(c.algorithm);
  }
  return r;
}

void node_context::run_reduction(const reduction_call& call) {
  const reduction_args a = checked_reduction(call);
  if (a.op == op_code::bcast) {
    if (a.root_node < 0) throw std::invalid_argument("zcoll: bcast: the root is not on this node");
    execute_bcast(a);
  } else {
    execute_reduction(a);
  }
}

void node_context::resolve_inputs(const reduction_args& a, const std::vector<buffer_ref>& refs,
                                  std::size_t third, bool pull) {
  if (pull) {  // private inputs stay where they are: their tiles are pulled by CMA
    inputs_.assign(refs.size(), nullptr);
    for (std::size_t j = 0; j < refs.size(); ++j)
      inputs_[j] = refs[j].segment                       ? segments_.resolve(refs[j])
                   : static_cast<int>(j) == config_.rank ? a.input
                                                         : nullptr;
    return;
  }
  bool stage = false;
  for (const buffer_ref& r : refs) stage |= r.segment == 0;
  if (stage) {  // every rank sees the same lines, so every rank takes this branch
    if (third < round_up(a.bytes, 64)) segments_.reserve_staging(3 * round_up(a.bytes, 64));
    if (refs[static_cast<std::size_t>(config_.rank)].segment == 0)
      copy_bytes(segments_.staging(config_.rank), a.input, a.bytes);
    protocol_.sync();  // staged inputs are visible
  }
  inputs_.assign(refs.size(), nullptr);
  for (std::size_t j = 0; j < refs.size(); ++j)
    inputs_[j] =
        refs[j].segment ? segments_.resolve(refs[j]) : segments_.staging(static_cast<int>(j));
}

void node_context::execute_bcast(const reduction_args& a) {
  const int p = config_.size, me = config_.rank;
  auto& line = protocol_.next(op_code::bcast);
  const std::size_t parity = protocol_.parity();
  line.call.dtype = a.dtype;
  line.call.block_bytes = a.bytes;
  line.call.root = static_cast<std::uint16_t>(a.root);
  const bool eager = policy_.eager_fits(a.bytes);
  // A large private root buffer is pulled by CMA (one copy) rather than staged (two, in cache
  // below auto_policy's bcast threshold): the same decision on every rank (the size is agreed,
  // the probe's verdict is the node's).
  const bool pull =
      !eager && policy_.pulls_bcast(a.bytes) && cma_.current() == cross_memory::state::works;
  const std::size_t third = segments_.staging_third();
  // A small bcast goes through the root's eager slot, which the readers address directly (a
  // node pool's slots lie in no segment the context can name): one barrier, and the slots'
  // parity keeps the root's next call from writing what a reader still copies.
  if (me == a.root_node && a.bytes && p > 1) {
    if (eager) {
      copy_bytes(eager_slot(me, parity), a.input, a.bytes);
    } else {
      line.send = segments_.locate(a.input, a.bytes);
      if (!line.send.segment && !pull && third >= round_up(a.bytes, 64)) {
        copy_bytes(segments_.staging(me), a.input, a.bytes);
        line.send = segments_.locate(segments_.staging(me), a.bytes);
      }
    }
  }
  const auto all = protocol_.publish();
  check_calls(all, op_code::bcast);
  check_arguments(all);
  if (a.bytes == 0 || p == 1) return;
  if (eager) {
    if (me != a.root_node) copy_bytes(a.out, eager_slot(a.root_node, parity), a.bytes);
    return;
  }
  const auto root = static_cast<std::size_t>(a.root_node);
  const buffer_ref ref = all.line(a.root_node).send;
  if (!ref.segment && pull) {
    const int err = me == a.root_node ? 0 : cma_.read(a.root_node, a.out, ref.offset, a.bytes);
    publish_pull_failure({err, a.root_node});  // raised on every rank, as in execute
    protocol_.sync();                          // the root's buffer is read until here
    raise_failed_pulls();
    return;
  }
  const std::byte* from = nullptr;
  if (ref.segment) {
    from = segments_.resolve(ref);
  } else {  // the root's buffer is private and did not fit the staging partition
    segments_.reserve_staging(3 * round_up(a.bytes, 64));
    if (me == a.root_node) copy_bytes(segments_.staging(me), a.input, a.bytes);
    protocol_.sync();
    from = segments_.staging(static_cast<int>(root));
  }
  if (me != a.root_node) copy_bytes(a.out, from, a.bytes);
  protocol_.sync();  // the root's buffer (or staging) is read until here
}

void node_context::fold_pulled_tile(const reduction_args& a, std::size_t off, std::size_t len,
                                    std::byte* work) {
  const auto np = static_cast<std::size_t>(config_.size);
  const std::size_t esize = a.bytes / a.count;
  // Pieces small enough that a piece of every peer stays in cache between its read and the
  // fold; whole elements, so each piece folds on its own.
  const std::size_t piece = std::max<std::size_t>(esize, pull_piece_bytes / esize * esize);
  pull_scratch_.resize(np * piece);
  srcs_.resize(np);
  pull_failure failed;
  for (std::size_t at = off; at < off + len; at += piece) {
    const std::size_t bytes = std::min(piece, off + len - at);
    for (std::size_t j = 0; j < np; ++j) {
      if (inputs_[j]) {
        srcs_[j] = inputs_[j] + at;
        continue;
      }
      std::byte* into = pull_scratch_.data() + j * piece;
      srcs_[j] = into;
      const int err = cma_.read(static_cast<int>(j), into, refs_[j].offset + at, bytes);
      if (err && !failed.error) failed = {err, static_cast<int>(j)};
    }
    reduce_fold(a.rop, a.type, work + at, srcs_.data(), config_.size, bytes / esize);
  }
  // A failed read spoils this rank's tile, which every rank copies: every rank raises it.
  publish_pull_failure(failed);
}

void node_context::publish_pull_failure(const pull_failure& failed) noexcept {
  auto& mine = protocol_.slot(config_.rank);
  mine.pull_error = failed.error;
  mine.pull_failed_from = failed.from;
  mine.pull_pushed = failed.pushed ? 1 : 0;
}

void node_context::raise_failed_pulls() {
  for (int r = 0; r < config_.size; ++r)
    if (const auto& slot = protocol_.slot(r); slot.pull_error)
      raise_pull_failure({slot.pull_error, slot.pull_failed_from, slot.pull_pushed != 0},
                         protocol_);
}

// A reduction whose inputs every rank published: what its algorithm needs to fold them.
struct node_context::resolved_reduction {
  explicit resolved_reduction(const reduction_args& args) : a(args) {}

  const reduction_args& a;
  std::size_t esize = 0;       // bytes of an element
  std::size_t want_from = 0;   // the part of the full result this rank wants:
  std::size_t want_bytes = 0;  // [want_from, want_from + want_bytes)
  std::size_t third = 0;       // bytes of each third of a staging partition (work buffers)
  bool stream = false;         // results written with streaming stores (the barriers fence)
  bool pull = false;           // private peers' inputs are pulled by CMA (tiled, flat)
  // A tiled reduce whose root published a result in shared memory, apart from its input:
  // every rank folds its tile straight into it, so the root copies nothing after the fold.
  std::byte* root_out = nullptr;
  copy_plan out_plan;  // how the wanted part is copied out

  // Node rank j's work buffer w (0 or 1), in its staging partition.
  std::byte* work(const node_segments& segments, int j, int w) const {
    return segments.staging(j) + static_cast<std::size_t>(1 + w) * third;
  }
  // Folds `k` sources of `elems` elements into `dst`; `out`: dst is this rank's result.
  void fold(std::byte* dst, const void** from, std::size_t k, std::size_t elems,
            bool out = false) const {
    reduce_fold(a.rop, a.type, dst, from, static_cast<int>(k), elems, out && stream);
  }
  // Copies the wanted part of the full result at `result` into this rank's result.
  void finish(const std::byte* result) const {
    if (want_bytes) copy_bytes(a.out, result + want_from, want_bytes, out_plan);
    if (stream) store_fence();
  }
};

void node_context::publish_reduction_input(const reduction_args& a, detail::rank_line& line,
                                           std::size_t parity, bool eager, bool may_pull,
                                           std::size_t third) {
  const int p = config_.size, me = config_.rank;
  line.call.order = static_cast<std::int8_t>(a.asked);
  line.call.reduce = static_cast<std::uint8_t>(a.rop);
  line.call.root = static_cast<std::uint16_t>(a.op == op_code::reduce ? a.root : 0);
  line.call.dtype = a.dtype;
  line.call.block_bytes = a.bytes;
  line.recv = {};
  if (!a.bytes || p == 1) return;
  if (a.op == op_code::reduce && a.out_apart(a.bytes)) line.recv = segments_.locate(a.out, a.bytes);
  if (a.alg == reduce_algorithm::flat && eager) {  // the one-barrier path: inputs in the slots
    copy_bytes(eager_slot(me, parity), a.input, a.bytes);
    return;
  }
  line.send = segments_.locate(a.input, a.bytes);  // where peers read this rank's input
  if (!line.send.segment && !may_pull && third >= round_up(a.bytes, 64)) {
    copy_bytes(segments_.staging(me), a.input, a.bytes);
    line.send = segments_.locate(segments_.staging(me), a.bytes);
  }
}

void node_context::execute_reduction(const reduction_args& a) {
  const int p = config_.size, me = config_.rank;
  const auto np = static_cast<std::size_t>(p);
  auto& line = protocol_.next(a.op);
  const std::size_t parity = protocol_.parity();
  const std::size_t span = round_up(a.bytes, 64);  // one input, result or work buffer
  const bool eager = policy_.eager_fits(a.bytes);
  const bool eager_flat = a.alg == reduce_algorithm::flat && eager;
  // A private input may stay where it is, for the tiled algorithm to pull its peers' parts by
  // CMA: the same answer on every rank (the size is agreed, the probe's verdict is the node's).
  const bool may_pull = pulls_reduction_inputs(a.bytes, a.op);
  std::size_t third = segments_.staging_third();
  publish_reduction_input(a, line, parity, eager, may_pull, third);
  const auto all = protocol_.publish();
  check_calls(all, a.op);
  check_arguments(all);
  if (a.bytes == 0) return;

  resolved_reduction r(a);
  r.esize = a.bytes / a.count;
  r.want_bytes = a.out ? a.bytes : 0;
  if (a.op == op_code::reduce_scatter) {
    r.want_bytes = a.bytes / static_cast<std::size_t>(config_.comm_size);
    r.want_from =
        static_cast<std::size_t>(config_.comm_ranks[static_cast<std::size_t>(me)]) * r.want_bytes;
  }
  if (p == 1) {
    if (r.want_bytes && a.out != a.input + r.want_from)
      std::memmove(a.out, a.input + r.want_from, r.want_bytes);
    return;
  }
  r.stream = static_cast<std::size_t>(p) * a.bytes > policy_.copy().cache_bytes() / 2 &&
             policy_.copy().cache_bytes() > 0;
  r.out_plan = copy_plan{r.stream ? copy_mode::streaming : copy_mode::temporal};
  if (eager_flat) return reduce_eager_flat(r, parity);

  refs_.resize(np);
  bool any_private = false;
  for (int j = 0; j < p; ++j) {
    refs_[static_cast<std::size_t>(j)] = all.line(j).send;
    any_private |= refs_[static_cast<std::size_t>(j)].segment == 0;
  }
  // Known only now, from every rank's line: whether private inputs are pulled, which changes
  // what "auto" runs.
  const bool pulled = may_pull && any_private;
  // A reduce's root result in shared memory, where its peers may fold their tiles.
  const buffer_ref root_result =
      a.op == op_code::reduce && a.root_node >= 0 ? all.line(a.root_node).recv : buffer_ref{};
  const bool shared_result = root_result.segment != 0;
  const reduce_algorithm alg =
      a.asked == auto_algorithm
          ? policy_.choose_reduction(a.bytes, pulled, a.op == op_code::reduce, shared_result)
          : a.alg;
  r.pull = pulled && (alg == reduce_algorithm::tiled || alg == reduce_algorithm::flat);
  if (third < span) {  // work buffers: collective, the same decision everywhere
    segments_.reserve_staging(3 * span);
    third = segments_.staging_third();
  }
  r.third = third;
  resolve_inputs(a, refs_, third, r.pull);
  if (alg == reduce_algorithm::tiled && shared_result) r.root_out = segments_.resolve(root_result);
  switch (alg) {
    case reduce_algorithm::flat:
      return reduce_flat(r);
    case reduce_algorithm::tiled:
      return reduce_tiled(r);
    case reduce_algorithm::tree:
      return reduce_tree(r);
    case reduce_algorithm::dissemination:
      return reduce_dissemination(r);
  }
}

void node_context::reduce_eager_flat(const resolved_reduction& r, std::size_t parity) {
  // Every rank knows where the slots are: nothing to resolve.
  const int p = config_.size;
  srcs_.resize(static_cast<std::size_t>(p));
  const void** from = srcs_.data();
  for (int j = 0; j < p; ++j) from[j] = eager_slot(j, parity) + r.want_from;
  if (r.want_bytes) reduce_fold(r.a.rop, r.a.type, r.a.out, from, p, r.want_bytes / r.esize);
}

void node_context::reduce_flat(const resolved_reduction& r) {
  const reduction_args& a = r.a;
  const auto np = static_cast<std::size_t>(config_.size);
  // The result may not go into this rank's buffer while peers read it (in place).
  const bool direct = a.out_apart(r.want_bytes);
  std::byte* into = direct ? a.out : r.work(segments_, config_.rank, 0);
  if (r.pull) {  // pieces of every private peer's input pulled, folded from cache
    if (r.want_bytes)
      fold_pulled_tile(a, r.want_from, r.want_bytes, into - r.want_from);
    else
      publish_pull_failure({});
  } else if (r.want_bytes) {
    srcs_.resize(np);
    const void** from = srcs_.data();
    for (std::size_t j = 0; j < np; ++j) from[j] = inputs_[j] + r.want_from;
    r.fold(into, from, np, r.want_bytes / r.esize, direct);
  }
  protocol_.sync();  // every input read
  if (r.pull) raise_failed_pulls();
  if (r.want_bytes && !direct) r.finish(into - r.want_from);
}

void node_context::reduce_tiled(const resolved_reduction& r) {
  const reduction_args& a = r.a;
  const int p = config_.size, me = config_.rank;
  const auto np = static_cast<std::size_t>(p);
  // Tile j: elements [j * tile, (j + 1) * tile), whole cache lines; for reduce_scatter the
  // tiles are the ranks' blocks.
  const std::size_t line_elems = std::max<std::size_t>(1, 64 / r.esize);
  std::size_t tile = round_up((a.count + np - 1) / np, line_elems);
  auto tile_of = [&](int j, std::size_t* from, std::size_t* bytes) {
    std::size_t first = static_cast<std::size_t>(j) * tile, last = first + tile;
    if (a.op == op_code::reduce_scatter) {
      const std::size_t block = a.count / static_cast<std::size_t>(config_.comm_size);
      first = static_cast<std::size_t>(config_.comm_ranks[static_cast<std::size_t>(j)]) * block;
      last = first + block;
    }
    first = std::min(first, a.count);
    last = std::min(last, a.count);
    *from = first * r.esize;
    *bytes = (last - first) * r.esize;
  };
  // The root of a reduce folds its own tile straight into its result, which no peer reads:
  // one pass over the tile fewer than folding into the work buffer and copying out.
  const bool direct = a.op == op_code::reduce && r.want_bytes && a.out_apart(a.bytes);
  std::byte* mine = direct ? a.out : r.root_out ? r.root_out : r.work(segments_, me, 0);
  std::size_t off = 0, len = 0;
  tile_of(me, &off, &len);
  if (r.pull) {
    fold_pulled_tile(a, off, len, mine);
  } else if (len) {
    srcs_.resize(np);
    const void** from = srcs_.data();
    for (std::size_t j = 0; j < np; ++j) from[j] = inputs_[j] + off;
    r.fold(mine + off, from, np, len / r.esize, direct || r.root_out);
  }
  protocol_.sync();  // every tile folded; no input is read after this
  if (r.pull) raise_failed_pulls();
  if (a.op == op_code::reduce_scatter) {
    if (r.want_bytes) copy_bytes(a.out, mine + off, r.want_bytes);
    return;
  }
  if (!r.want_bytes || r.root_out) return;
  for (int step = 0; step < p; ++step) {  // own tile first, then the next ranks'
    const int j = (me + step) % p;
    if (direct && j == me) continue;
    tile_of(j, &off, &len);
    if (len) copy_bytes(a.out + off, r.work(segments_, j, 0) + off, len, r.out_plan);
  }
  if (r.stream) store_fence();
}

void node_context::reduce_tree(const resolved_reduction& r) {
  const int p = config_.size, me = config_.rank;
  if (tree_.empty())
    tree_ = make_reduction_tree(p, config_.numa_nodes, config_.packages, config_.l3_caches);
  std::vector<bool> partial(static_cast<std::size_t>(p), false);  // a rank's value is its work
  for (const auto& level : tree_) {
    for (const tree_group& g : level) {
      if (g.front() != me) continue;
      srcs_.resize(g.size());
      const void** from = srcs_.data();
      for (std::size_t k = 0; k < g.size(); ++k) {
        const auto j = static_cast<std::size_t>(g[k]);
        from[k] =
            partial[j] ? static_cast<const std::byte*>(r.work(segments_, g[k], 0)) : inputs_[j];
      }
      r.fold(r.work(segments_, me, 0), from, g.size(), r.a.count);
    }
    for (const tree_group& g : level) partial[static_cast<std::size_t>(g.front())] = true;
    protocol_.sync();
  }
  r.finish(r.work(segments_, 0, 0));
}

void node_context::reduce_dissemination(const resolved_reduction& r) {
  const int p = config_.size, me = config_.rank;
  const int q = static_cast<int>(std::bit_floor(static_cast<unsigned>(p)));
  const int rounds = std::countr_zero(static_cast<unsigned>(q));
  std::vector<const std::byte*> value(inputs_.begin(), inputs_.end());
  if (q < p) {  // ranks q.. fold into ranks 0..p-q-1 first
    if (me < p - q) {
      const void* from[2] = {inputs_[static_cast<std::size_t>(me)],
                             inputs_[static_cast<std::size_t>(me + q)]};
      r.fold(r.work(segments_, me, 0), from, 2, r.a.count);
    }
    for (int j = 0; j < p - q; ++j) value[static_cast<std::size_t>(j)] = r.work(segments_, j, 0);
    protocol_.sync();
  }
  int w = q < p ? 1 : 0;  // the work buffer the next round writes
  for (int k = 0; k < rounds; ++k) {
    if (me < q) {
      const int partner = me ^ (1 << k);
      const void* from[2] = {value[static_cast<std::size_t>(std::min(me, partner))],
                             value[static_cast<std::size_t>(std::max(me, partner))]};
      r.fold(r.work(segments_, me, w), from, 2, r.a.count);
    }
    for (int j = 0; j < q; ++j) value[static_cast<std::size_t>(j)] = r.work(segments_, j, w);
    w ^= 1;
    protocol_.sync();
  }
  r.finish(value[static_cast<std::size_t>(me < q ? me : me - q)]);
}

}  // namespace zcoll
