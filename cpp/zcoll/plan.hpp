/*
 * Persistent plans: one collective call, checked and resolved once, run many times (MPI-4's
 * persistent collectives: MPI_Alltoall_init, MPI_Start, MPI_Wait).
 *
 * Creating a plan is collective and does everything a call does before data moves: the local
 * argument checks, "auto" resolved, the ranks' agreement on the call (an error anywhere raises
 * the same error on every rank), the schedule segment this rank copies, the copy mode, and the
 * address of every node rank's buffers. Private buffers (plain NumPy arrays) of a call the
 * policy pulls by CMA (cma.hpp: not in place, enough bytes received) stay where they are: each
 * run, every rank pulls its receive blocks from the senders' buffers. Otherwise a buffer that
 * is not in shared memory gets an arena shadow owned by the plan (one extra copy per run), so a
 * run never stages through the context's shared staging area.
 *
 * A run is start() then wait():
 *  - ordered path: start() publishes "plan #id", barrier, checks that every rank runs the same
 *    plan, copies this rank's schedule segment, arrives at the completion barrier; wait()
 *    completes that barrier (and copies a shadowed receive buffer out). So start() blocks until
 *    every rank has started, and test() tells, without blocking, whether the peers are done.
 *  - eager path (small calls): start() copies this rank's data into its eager slot and arrives;
 *    wait() completes the barrier, checks the plan ids and pulls this rank's blocks. start()
 *    never blocks.
 * Between start() and wait() the send buffer must not change and the receive buffer must not be
 * read (MPI's rule). Any other call on the same context first finishes a started plan
 * (pending_call), so calls complete in the order they were started.
 *
 * The plan ids published at every start make a mismatch (ranks running different plans, or a
 * plan against a plain call) an error on every rank instead of a corrupted buffer. After the
 * context is closed or broken (peer died) every use raises, as for plain calls.
 *
 * plan_base is that machinery (the run's states, the start line with the plan id, the split
 * completion barrier, pending-call finishing, test, free, the copy plan and its refinement);
 * persistent_plan (alltoall, allgather) and transfer_plan (transfer_plan.hpp: a global
 * transpose) supply only this rank's part of a run and what follows the completion barrier.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "zcoll/exchange.hpp"

namespace zcoll {

// What every persistent plan shares: see the header comment. Not copyable; a derived class
// resolves its call in its constructor, then calls numbered().
class plan_base : public pending_call {
 public:
  plan_base(const plan_base&) = delete;
  plan_base& operator=(const plan_base&) = delete;

  // Collective: this rank's part of one run (see above). Throws when the plan is active.
  void start();
  // Finishes the run this rank started; returns at once when none is active.
  void wait();
  // Whether the run is finished (finishing it when the peers are done); never blocks.
  bool test();
  // Collective: one whole run.
  void run() {
    start();
    wait();
  }
  // Local: finishes an active run, then drops what the plan holds (buffers' addresses,
  // shadows, the context). Later calls raise.
  void free();

  bool active() const noexcept { return state_ == state::started; }
  bool freed() const noexcept { return state_ == state::freed; }
  std::uint64_t id() const noexcept { return id_; }
  // The copy plan of the ordered path's block copies (what copy="auto" resolved to now).
  copy_plan copy() const noexcept { return how_; }
  const std::shared_ptr<node_context>& context() const noexcept { return ctx_; }

 protected:
  // `target`: the operation planned (alltoall, allgather, transfer), published at each start.
  plan_base(std::shared_ptr<node_context> ctx, op_code target);
  // Derived destructors call finish_quietly(): a base destructor cannot reach their hooks.
  ~plan_base() = default;

  // The plan is agreed on and resolved: it gets its id (the same on every rank).
  void numbered() { id_ = ctx_->next_plan_id(); }
  // Throws when the plan is freed or already active (local errors, before any publication).
  void check_startable() const;
  // Finishes a started run; a peer's failure is swallowed (for destructors).
  void finish_quietly() noexcept;

  // The copy plan for blocks of (mean) `block` bytes under mode code `copy`, in a run where
  // each rank receives `received` bytes and this rank copies `copied`; `op` names the rule
  // table (alltoall, allgather) or none (transfer).
  void choose_copy(op_code op, int copy, std::size_t block, std::size_t received,
                   std::size_t copied);
  // The ordered path after the start line is written: the entry barrier, every rank's start
  // checked (the same plan), bind(all), this rank's copies, arrival at the completion barrier.
  void ordered_part();

  // This rank's part of a run, its start line written (target and plan id): ends with this
  // rank's arrival at the completion barrier.
  virtual void run_part(detail::rank_line& line) = 0;
  // Ordered path: every rank's start line is published and checked; the copies come next.
  virtual void bind(const call_protocol::published& /*all*/) {}
  // Ordered path: this rank's copies with `how` (no fence).
  virtual void copy_blocks(const copy_plan& how) noexcept = 0;
  // Whether this run pulls private buffers by CMA (the same on every rank): its first failed
  // read (pull_failed_) is published before the completion barrier and, since it spoils a
  // result that every rank's program goes on from, raised on every rank after it.
  virtual bool pulls_this_run() const noexcept { return false; }
  // After the completion barrier (of parity parity()), unless a pull failed.
  virtual void after_barrier() {}
  // free(): drops what the derived plan holds; the context goes after it.
  virtual void release() noexcept {}

  std::size_t parity() const noexcept { return parity_; }

  std::shared_ptr<node_context> ctx_;
  call_protocol* protocol_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> comm_ranks_;
  pull_failure pull_failed_;  // pulled runs: this rank's first failed read

 private:
  enum class state : std::uint8_t { idle, started, freed };

  void finish() override;
  void end_run() noexcept;  // the started run is over (done or failed)
  void after_completion();  // every rank's failed pull raised, then after_barrier()
  void check_not_freed() const;
  void copy_part();

  op_code target_;
  std::uint64_t id_ = 0;
  copy_plan how_;
  bool refine_copy_ = false;  // copy="auto" still times its threshold: ask the policy each run
  op_code copy_op_ = op_code::none;  // the rule table of the copy choice (see choose_copy)
  std::size_t copy_block_ = 0, copy_received_ = 0, copy_bytes_ = 0;
  std::size_t parity_ = 0;  // of the barrier a started run arrived at
  state state_ = state::idle;
};

// A persistent alltoall or allgather.
class persistent_plan final : public plan_base {
 public:
  // Collective over the context's node ranks: checks and agrees on an alltoall or allgather
  // call as node_context::run does (same errors), then resolves it. `send` is nullptr in place.
  persistent_plan(std::shared_ptr<node_context> ctx, op_code op, const array_view* send,
                  const array_view& recv, int order, int copy);
  // Finishes a started run (a peer's failure is swallowed: a destructor cannot report it).
  ~persistent_plan() { finish_quietly(); }
  persistent_plan(const persistent_plan&) = delete;
  persistent_plan& operator=(const persistent_plan&) = delete;

  const collective_args& args() const noexcept { return args_; }
  // How a run moves the blocks, as decided at creation (explain()): nothing (empty blocks),
  // through the eager slots, by ordered copies between two barriers, or pulled by CMA.
  enum class run_path : std::uint8_t { empty, eager, ordered, pulled };
  run_path path() const noexcept {
    if (args_.block_bytes == 0) return run_path::empty;
    if (args_.eager) return run_path::eager;
    return pulls_ ? run_path::pulled : run_path::ordered;
  }
  // Whether a private buffer has an arena shadow (one more copy per run).
  bool send_shadowed() const noexcept { return send_shadow_ != nullptr; }
  bool recv_shadowed() const noexcept { return recv_shadow_ != nullptr; }

 private:
  void run_part(detail::rank_line& line) override;
  void copy_blocks(const copy_plan& how) noexcept override;
  bool pulls_this_run() const noexcept override { return pulls_; }
  void after_barrier() override;
  void release() noexcept override;
  // Publishes the call, agrees on it, and resolves every rank's buffers (with shadows).
  void agree_on_call();
  void stage_in() noexcept;
  void copy_out() noexcept;
  void pull_eager();
  // CMA path: this rank's receive blocks from every node rank's send buffer.
  void pull_blocks() noexcept;

  collective_args args_;
  std::vector<block_coord> mine_;                    // ordered path: this rank's schedule segment
  std::vector<std::byte*> send_bases_, recv_bases_;  // every node rank's buffers
  std::shared_ptr<arena_block> shadow_;              // arena copies of private buffers
  std::byte* send_shadow_ = nullptr;                 // null when the buffer is in the arena
  std::byte* recv_shadow_ = nullptr;
  bool pulls_ = false;                 // the CMA path (send_bases_ null where private)
  std::vector<std::uint64_t> remote_;  // CMA path: private send buffers' addresses
};

// What a plan on a communicator spanning several nodes runs on every run besides its node part:
// its blocks between nodes (across_nodes.hpp makes them, with MPI). start() goes before the node
// part starts, wait() after it finished.
class plan_between_nodes {
 public:
  virtual ~plan_between_nodes() = default;
  virtual void start() = 0;
  virtual void wait() = 0;  // blocks, within the context's bound
  virtual bool test() = 0;
  // The context failed (a peer died or never came): messages in flight may never finish.
  virtual bool failed() const = 0;
};

}  // namespace zcoll
