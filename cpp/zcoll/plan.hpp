/*
 * Persistent plans: one collective call, checked and resolved once, run many times (MPI-4's
 * persistent collectives: MPI_Alltoall_init, MPI_Start, MPI_Wait).
 *
 * Creating a plan is collective and does everything a call does before data moves: the local
 * argument checks, "auto" resolved, the ranks' agreement on the call (an error anywhere raises
 * the same error on every rank), the schedule segment this rank copies, the copy mode, and the
 * address of every node rank's buffers. A buffer that is not in the arena gets an arena shadow
 * owned by the plan, so a run never stages through the context's shared staging area.
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
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "zcoll/exchange.hpp"

namespace zcoll {

class persistent_plan final : public pending_call {
 public:
  // Collective over the context's node ranks: checks and agrees on an alltoall or allgather
  // call as node_context::run does (same errors), then resolves it. `send` is nullptr in place.
  persistent_plan(std::shared_ptr<node_context> ctx, op_code op, const array_view* send,
                  const array_view& recv, int order, int copy);
  // Finishes a started run (a peer's failure is swallowed: a destructor cannot report it).
  ~persistent_plan();
  persistent_plan(const persistent_plan&) = delete;
  persistent_plan& operator=(const persistent_plan&) = delete;

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
  // Local: finishes an active run, then drops the shadows and the context. Later calls raise.
  void free();

  bool active() const noexcept { return state_ == state::started; }
  bool freed() const noexcept { return state_ == state::freed; }
  std::uint64_t id() const noexcept { return id_; }
  const collective_args& args() const noexcept { return args_; }
  // The copy plan of the ordered path's block copies (what copy="auto" resolved to now).
  copy_plan copy() const;
  const std::shared_ptr<node_context>& context() const noexcept { return ctx_; }

 private:
  enum class state : std::uint8_t { idle, started, freed };

  void finish() override;
  void end_run() noexcept;  // the started run is over (done or failed)
  void after_barrier();
  void check_not_freed() const;
  // Publishes the call, agrees on it, and resolves every rank's buffers (with shadows).
  void agree_on_call();
  void publish_start();
  void stage_in() noexcept;
  void copy_blocks();
  void copy_out() noexcept;
  void pull_eager();

  std::shared_ptr<node_context> ctx_;
  call_protocol* protocol_ = nullptr;
  collective_args args_;
  std::uint64_t id_ = 0;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> comm_ranks_;
  std::vector<block_coord> mine_;                    // ordered path: this rank's schedule segment
  std::vector<std::byte*> send_bases_, recv_bases_;  // every node rank's buffers
  std::shared_ptr<arena_block> shadow_;              // arena copies of private buffers
  std::byte* send_shadow_ = nullptr;                 // null when the buffer is in the arena
  std::byte* recv_shadow_ = nullptr;
  copy_plan how_;
  bool refine_copy_ = false;  // copy="auto" still times its threshold: ask the policy each run
  std::size_t parity_ = 0;    // of the barrier a started run arrived at
  state state_ = state::idle;
};

}  // namespace zcoll
