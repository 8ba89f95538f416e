#include "zcoll/exchange.hpp"

#include <chrono>
#include <stdexcept>
#include <string>
#include <system_error>

#include "zcoll/aggregate.hpp"
#include "zcoll/copy.hpp"
#include "zcoll/departure.hpp"
#include "zcoll/vexchange.hpp"

namespace zcoll {

namespace {

const context_config& checked(const context_config& c) {
  const auto n = static_cast<std::size_t>(c.size);
  if (c.size < 1 || c.rank < 0 || c.rank >= c.size || c.comm_ranks.size() != n ||
      c.pids.size() != n || c.comm_size < c.size ||
      (!c.numa_nodes.empty() && c.numa_nodes.size() != n))
    throw std::invalid_argument("zcoll: inconsistent node context configuration");
  return c;
}

}  // namespace

node_context::node_context(std::shared_ptr<shm_segment> control, context_config config)
    : config_(std::move(config)),
      protocol_(std::move(control), checked(config_)),
      segments_(protocol_, config_.rank, config_.size, config_.pids),
      policy_(config_.size, numa_domain_count(config_.size, config_.numa_nodes)),
      cma_(config_.pids, config_.rank) {
  watch_departure(&protocol_.barrier());
}

node_context::~node_context() {
  close();
}

void node_context::close() noexcept {
  if (protocol_.closed()) return;
  unwatch_departure(&protocol_.barrier());
  segments_.close();
  eager_.reset();
  irregular_.reset();
  between_nodes_.reset();
  schedules_.clear();
  protocol_.close();
}

v_exchange& node_context::irregular() {
  protocol_.check_usable();
  if (!irregular_) irregular_ = std::make_unique<v_exchange>(*this);
  return *irregular_;
}

node_messages& node_context::between_nodes(const node_map& nodes) {
  protocol_.check_usable();
  if (!between_nodes_) between_nodes_ = std::make_unique<node_messages>(*this, nodes);
  return *between_nodes_;
}

void node_context::barrier() {
  protocol_.next(op_code::barrier);
  check_calls(protocol_.publish(), op_code::barrier);
}

void node_context::fail(arg_error kind, std::string_view message) {
  protocol_.fail(kind, message);
}

void node_context::setup_eager(std::size_t bytes) {
  protocol_.check_usable();
  const std::size_t slot = round_up(bytes, detail::partition_allocator::alignment);
  if (slot) eager_ = segments_.create(round_up(2 * slot, page_size()));
  policy_.set_eager_bytes(slot, slot);
}

void node_context::use_eager(std::shared_ptr<shm_segment> area, std::size_t partition,
                             std::size_t bytes) {
  protocol_.check_usable();
  const std::size_t slot = round_up(bytes, detail::partition_allocator::alignment);
  if (2 * slot > partition || static_cast<std::size_t>(config_.size) * partition > area->size())
    throw std::invalid_argument("zcoll: the eager slots do not fit the pool block");
  if (slot) {
    auto seg = std::make_shared<data_segment>();
    seg->shm = std::move(area);
    seg->partition_bytes = partition;
    eager_ = std::move(seg);
  }
  // Each parity's slot takes half the partition: the pool's largest eager size, or more.
  constexpr std::size_t align = detail::partition_allocator::alignment;
  policy_.set_eager_bytes(slot, partition / 2 / align * align);
}

void node_context::run_online(op_code op, const array_view* send, const array_view& recv,
                              int copy) {
  online_tuner& tuner = policy_.online();
  const std::size_t received = recv.nbytes;
  if (!tuner.knows(op, received)) {
    const std::size_t block = received / static_cast<std::size_t>(config_.comm_size);
    const bool from_rule = policy_.resolve(op, block, received).from_rule;
    tuner.start(op, received, !from_rule && block > 0 && config_.size > 1,
                policy_.eager_fits(received));
  }
  const online_tuner::step step = tuner.next(op, received);
  if (!step.timed) return run_resolved(op, send, recv, step.code, copy);
  const auto start = std::chrono::steady_clock::now();
  run_resolved(op, send, recv, step.code, copy);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  if (!tuner.record(op, received, took.count())) return;
  // The trial is complete on every rank at this call: agree on each candidate's worst time.
  const std::span<const double> mine = tuner.best(op, received);
  std::vector<double> worst(mine.size());
  const auto extent = static_cast<std::int64_t>(mine.size());
  auto view = [&](const double* data) {
    array_view v;
    v.data = data;
    v.size = mine.size();
    v.nbytes = mine.size() * sizeof(double);
    v.ndim = 1;
    v.first_dim = mine.size();
    v.shape = &extent;
    v.dtype = dtype_id{'d', sizeof(double)};
    return v;
  };
  const array_view in = view(mine.data()), out = view(worst.data());
  run_reduction({op_code::allreduce, &in, &out, static_cast<int>(reduce_op::max)});
  tuner.settle(op, received, worst);
}

void node_context::prepare(op_code op, const array_view* send, const array_view& recv, int order,
                           int copy, local_check& check, collective_args& args) const {
  if (order == auto_order) {
    const auto_choice c = policy_.resolve(op, check.block_bytes, recv.nbytes);
    args.order = c.order;
    args.eager = c.eager;
    args.slots_if_private = !c.eager && policy_.eager_takes(recv.nbytes, true);
  } else if (order == eager_order) {
    if (!policy_.eager_fits(recv.nbytes)) {
      check = value_error("the eager path takes at most " + std::to_string(eager_bytes()) +
                          " bytes per rank, this call receives " + std::to_string(recv.nbytes));
      return;
    }
    args.eager = true;
  } else {
    args.order = static_cast<block_order>(order);
  }
  args.op = op;
  args.copy = copy;
  args.send = send ? send->data : nullptr;
  args.send_bytes = send ? send->nbytes : 0;
  args.recv = const_cast<void*>(recv.data);
  args.recv_bytes = recv.nbytes;
  args.block_bytes = check.block_bytes;
  args.dtype = recv.dtype;
}

collective_args node_context::checked_args(op_code op, const array_view* send,
                                           const array_view& recv, int order, int copy) {
  local_check check = check_local_args(op, config_.comm_size, send, recv);
  collective_args args;
  if (check_codes(check, order, copy, true)) prepare(op, send, recv, order, copy, check, args);
  if (!check.ok()) fail(check.error, call_prefix(op) + check.message);
  return args;
}

call_record node_context::describe(op_code op, const array_view* send, const array_view& recv,
                                   int order, int copy) const {
  local_check check = check_local_args(op, config_.comm_size, send, recv);
  if (!check_codes(check, order, copy, false))
    return error_record(check.error, call_prefix(op) + check.message);
  call_record r;
  r.call.op = op;
  r.call.order = static_cast<std::int8_t>(order);
  r.call.flag = send == nullptr ? 1 : 0;
  r.call.dtype = recv.dtype;
  r.call.block_bytes = check.block_bytes;
  return r;
}

void node_context::execute_eager(const collective_args& args) {
  auto& line = protocol_.next(args.op);
  const std::size_t parity = protocol_.parity();
  fill_eager_slot(args, parity);
  line.call.order = static_cast<std::int8_t>(eager_order);
  line.call.block_bytes = args.block_bytes;
  line.call.dtype = args.dtype;
  line.call.flag = args.send == nullptr ? in_place_flag : 0;
  const auto all = protocol_.publish();
  check_calls(all, args.op);
  check_arguments(all);
  read_eager_slots(args, parity);
}

void node_context::fill_eager_slot(const collective_args& args, std::size_t parity) {
  const bool in_place = args.send == nullptr;
  const auto me =
      static_cast<std::size_t>(config_.comm_ranks[static_cast<std::size_t>(config_.rank)]);
  const auto* data = static_cast<const std::byte*>(in_place ? args.recv : args.send);
  if (args.op == op_code::alltoall)
    copy_bytes(eager_slot(config_.rank, parity), data, args.recv_bytes);
  else
    copy_bytes(eager_slot(config_.rank, parity), in_place ? data + me * args.block_bytes : data,
               args.block_bytes);
}

void node_context::read_eager_slots(const collective_args& args, std::size_t parity) {
  const std::size_t block = args.block_bytes;
  const auto& cr = config_.comm_ranks;
  const auto me = static_cast<std::size_t>(cr[static_cast<std::size_t>(config_.rank)]);
  auto* recv = static_cast<std::byte*>(args.recv);
  for (int s = 0; s < config_.size; ++s) {
    const std::byte* from = eager_slot(s, parity);
    const auto src = static_cast<std::size_t>(cr[static_cast<std::size_t>(s)]);
    copy_bytes(recv + src * block, args.op == op_code::alltoall ? from + me * block : from, block);
  }
}

void node_context::execute(const collective_args& args) {
  auto& line = protocol_.next(args.op);
  const bool in_place = args.send == nullptr;
  line.call.order = static_cast<std::int8_t>(args.order);
  line.call.block_bytes = args.block_bytes;
  line.call.dtype = args.dtype;
  line.call.flag = in_place ? in_place_flag : 0;
  if (!in_place) line.send = segments_.locate(args.send, args.send_bytes);
  line.recv = segments_.locate(args.recv, args.recv_bytes);
  const std::size_t parity = protocol_.parity();
  if (args.slots_if_private && args.block_bytes &&
      ((!in_place && line.send.segment == 0) || line.recv.segment == 0)) {
    fill_eager_slot(args, parity);  // wasted when a peer's buffers are shared: it declines
    line.call.flag |= eager_slot_flag;
  }
  const auto all = protocol_.publish();
  check_calls(all, args.op);
  check_arguments(all);
  const std::size_t block = args.block_bytes;
  if (block == 0) return;
  bool slots = true;
  for (int j = 0; j < config_.size && slots; ++j) slots = all.call(j).flag & eager_slot_flag;
  if (slots) return read_eager_slots(args, parity);
  const auto p = static_cast<std::size_t>(config_.size);
  bool staged = false;
  for (int j = 0; j < config_.size; ++j)
    staged |= (!in_place && all.line(j).send.segment == 0) || all.line(j).recv.segment == 0;
  if (staged && pulls(args)) return execute_pulls(args, all);
  auto& send = send_bases_;
  auto& recv = recv_bases_;
  send.assign(p, nullptr);
  recv.assign(p, nullptr);
  const std::size_t send_part = in_place ? 0 : round_up(args.send_bytes, 64);
  if (staged) stage_in(args, send_part, line.send, line.recv);
  for (int j = 0; j < config_.size; ++j) {
    const auto& published = all.line(j);
    std::byte* stage = staged ? segments_.staging(j) : nullptr;
    const auto k = static_cast<std::size_t>(j);
    if (!in_place) send[k] = published.send.segment ? segments_.resolve(published.send) : stage;
    recv[k] = published.recv.segment ? segments_.resolve(published.recv) : stage + send_part;
  }
  const bool my_recv_staged = line.recv.segment == 0;
  const schedule& sched = schedule_for(args.op, in_place, args.order);
  const auto mine = sched.segment(config_.rank);
  policy_.timed_copies(args.op, block, args.copy, args.recv_bytes, mine.size() * block,
                       [&](const copy_plan& how) {
                         copy_segment(mine, args.op, in_place, block, send.data(), recv.data(),
                                      config_.comm_ranks.data(), how);
                       });
  protocol_.sync();
  if (staged && my_recv_staged)
    copy_bytes(args.recv, segments_.staging(config_.rank) + send_part, args.recv_bytes);
}

void node_context::execute_pulls(const collective_args& args, const call_protocol::published& all) {
  const auto p = static_cast<std::size_t>(config_.size);
  send_bases_.assign(p, nullptr);
  pull_from_.assign(p, 0);
  for (int j = 0; j < config_.size; ++j) {
    const buffer_ref& ref = all.line(j).send;
    if (ref.segment)
      send_bases_[static_cast<std::size_t>(j)] = segments_.resolve(ref);
    else
      pull_from_[static_cast<std::size_t>(j)] = ref.offset;
  }
  const row_source from{send_bases_.data(), pull_from_.data(),
                        static_cast<const std::byte*>(args.send)};
  // A failed read spoils its reader's result, which the others' programs go on from: every
  // rank raises the first failure.
  publish_pull_failure(
      pull_row(cma_, config_, args.op, args.block_bytes, from, static_cast<std::byte*>(args.recv)));
  protocol_.sync();  // every reader is done: the senders may change their buffers
  raise_failed_pulls();
}

pull_failure pull_row(const cross_memory& cma, const context_config& config, op_code op,
                      std::size_t block, const row_source& from, std::byte* recv) noexcept {
  const auto& cr = config.comm_ranks;
  const int me = config.rank;
  const std::size_t at = op == op_code::alltoall
                             ? static_cast<std::size_t>(cr[static_cast<std::size_t>(me)]) * block
                             : 0;
  pull_failure failed;
  for (int k = 0; k < config.size; ++k) {  // from the next rank on: senders read in turn
    const int s = (me + k) % config.size;
    const auto j = static_cast<std::size_t>(s);
    std::byte* into = recv + static_cast<std::size_t>(cr[j]) * block;
    if (s == me) {
      copy_bytes(into, from.own + at, block);
    } else if (from.mapped[j]) {
      copy_bytes(into, from.mapped[j] + at, block);
    } else if (const int err = cma.read(s, into, from.remote[j] + at, block);
               err && !failed.error) {
      failed = {err, s};
    }
  }
  return failed;
}

void raise_pull_failure(const pull_failure& failed, const call_protocol& protocol) {
  const char* what =
      failed.pushed ? "zcoll: process_vm_writev to " : "zcoll: process_vm_readv from ";
  throw std::system_error(failed.error, std::generic_category(),
                          what + protocol.rank_name(failed.from));
}

void node_context::stage_in(const collective_args& args, std::size_t send_part,
                            const buffer_ref& my_send, const buffer_ref& my_recv) {
  const bool in_place = args.send == nullptr;
  segments_.reserve_staging(send_part + args.recv_bytes);
  std::byte* mine = segments_.staging(config_.rank);
  if (!in_place && my_send.segment == 0) copy_bytes(mine, args.send, args.send_bytes);
  if (in_place && my_recv.segment == 0) {
    if (args.op == op_code::alltoall) {
      copy_bytes(mine, args.recv, args.recv_bytes);
    } else {  // in-place allgather: only this rank's own block is input
      const std::size_t own =
          static_cast<std::size_t>(config_.comm_ranks[static_cast<std::size_t>(config_.rank)]) *
          args.block_bytes;
      copy_bytes(mine + own, static_cast<const std::byte*>(args.recv) + own, args.block_bytes);
    }
  }
  protocol_.sync();  // staged data is visible
}

const schedule& node_context::schedule_for(op_code op, bool in_place, block_order order) {
  schedule_spec spec{schedule_kind_of(op, in_place), config_.size, order, {}};
  if (order == block_order::numa) spec.domains = config_.numa_nodes;
  auto it = schedules_.find(spec);
  if (it != schedules_.end()) return it->second;
  schedule made = make_schedule(spec);
  return schedules_.emplace(std::move(spec), std::move(made)).first->second;
}

schedule_kind schedule_kind_of(op_code op, bool in_place) noexcept {
  if (!in_place) return schedule_kind::full;
  return op == op_code::alltoall ? schedule_kind::swap : schedule_kind::offdiagonal;
}

void copy_segment(std::span<const block_coord> segment, op_code op, bool in_place,
                  std::size_t block, std::byte* const* send, std::byte* const* recv,
                  const int* comm_ranks, const copy_plan& how) noexcept {
  const int* cr = comm_ranks;
  for (const block_coord& b : segment) {
    const auto d = static_cast<std::size_t>(b.dst);
    const auto s = static_cast<std::size_t>(b.src);
    std::byte* into = recv[d] + static_cast<std::size_t>(cr[s]) * block;
    if (op == op_code::alltoall) {
      if (in_place)
        swap_bytes(into, recv[s] + static_cast<std::size_t>(cr[d]) * block, block);
      else
        copy_bytes(into, send[s] + static_cast<std::size_t>(cr[d]) * block, block, how);
    } else {
      copy_bytes(into, in_place ? recv[s] + static_cast<std::size_t>(cr[s]) * block : send[s],
                 block, how);
    }
  }
}

}  // namespace zcoll
