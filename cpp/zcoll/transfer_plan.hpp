/*
 * Transfer plans: a global transpose (transfer.hpp) as a persistent plan (plan.hpp).
 *
 * Creation is collective and does once everything node_context::run_transfer does before data
 * moves: the local checks, order "auto" resolved, the ranks' agreement (a plan of a transfer,
 * with the signature of its geometry, dtype and order), the address of every node rank's two
 * arrays (arena arrays on every rank, else the same error on every rank), this rank's segment of
 * the schedule with each block's box resolved (offsets into the arrays and the box's simplified
 * strides, see make_box), and the copy plan. A run is plan_base's ordered path: the entry
 * barrier with the plan id published and checked, this rank's box copies, arrival at the
 * completion barrier; wait() completes it. No geometry arithmetic and no argument check is left
 * for a run.
 *
 * Rebinding: one run may name other arrays on any rank for that rank's side (start(send, recv)):
 * arena arrays of the plan's dtype and of this rank's local shapes, checked locally by the rank
 * that passes them (an error there raises on every rank, as for a plain call). The rank
 * publishes their (segment, offset) in its start line, which the entry barrier carries anyway,
 * and every rank copies from and into them for that run only. So a caller whose arrays already
 * live in the arena needs no staging copy, and each rank decides that alone, without an extra
 * barrier. A rebound run resolves the published addresses (a lookup per rebound array); the
 * blocks are offsets, so nothing else changes.
 *
 * Private arrays (plain NumPy arrays, in no shared segment) may be bound too when the plan
 * pulls (its ranks receive at least the CMA threshold on average and the node's ranks can read
 * each other's memory, cma.hpp): a run where any rank's array is private is pulled -- each
 * rank fills its own destination, box by box, reading private sources with process_vm_readv
 * (a batch of runs per system call) and shared ones in place -- one copy instead of staging's
 * three. Every rank sees the same published lines, so every rank takes the same path.
 */
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "zcoll/copy.hpp"
#include "zcoll/plan.hpp"
#include "zcoll/transfer.hpp"

namespace zcoll {

class transfer_plan final : public plan_base {
 public:
  // Collective over the context's node ranks: checks and agrees on a transfer of geometry `g`
  // from `send` (aligned in axis a) into `recv` (aligned in axis b) as run_transfer does (same
  // errors, named zcoll.transfer_init), then resolves it. `order`: a block_order value or
  // auto_order; `copy`: a copy_mode value or auto_copy.
  transfer_plan(std::shared_ptr<node_context> ctx, const transfer_geometry& g,
                const array_view& send, const array_view& recv, int order, int copy);
  // Local, at the same point on every node rank (its creation is numbered): the plan of the
  // inverse transfer -- from this plan's destination into its source, axes swapped -- made
  // from what this plan's agreement already resolved (every rank's arrays, the order), so it
  // agrees on nothing. `copy`: a copy_mode value or auto_copy. Throws when this plan is freed.
  std::unique_ptr<transfer_plan> reversed(int copy) const;
  // Finishes a started run (a peer's failure is swallowed: a destructor cannot report it).
  ~transfer_plan() { finish_quietly(); }
  transfer_plan(const transfer_plan&) = delete;
  transfer_plan& operator=(const transfer_plan&) = delete;

  using plan_base::start;
  // Collective: start() with this rank's arrays replaced, for this run only, by `send` and / or
  // `recv` (nullptr: the plan's own). When they are unfit, every rank raises (nothing copied).
  void start(const array_view* send, const array_view* recv);
  // Local: the record of start(send, recv) that ranks on other nodes compare (agree() in
  // protocol.hpp): this rank's verdict on the arrays, or the run of this plan.
  call_record describe_start(const array_view* send, const array_view* recv);

  // Whether a C-contiguous array at `data` can replace this rank's for a run without
  // staging: it is in a shared segment, or the plan pulls private arrays (false once freed:
  // the run then raises the plan's error).
  bool accepts(const void* data, std::size_t nbytes) const {
    if (freed()) return false;
    return pulls_ || ctx_->segments().locate(data, nbytes).segment != 0;
  }
  bool pulls() const noexcept { return pulls_; }
  const transfer_geometry& geometry() const noexcept { return g_; }
  block_order order() const noexcept { return order_; }
  // Blocks this rank copies in a run (empty boxes left out) and their bytes.
  std::size_t block_count() const noexcept { return blocks_.size(); }
  std::size_t copied_bytes() const noexcept { return copied_; }

 private:
  // One block of this rank's schedule segment, resolved: node ranks and offsets into their
  // arrays, and the box with its axes simplified.
  struct block {
    int src = 0, dst = 0;
    std::size_t src_offset = 0, dst_offset = 0;
    box_shape box;
  };

  struct reverse_tag {};
  transfer_plan(const transfer_plan& forward, reverse_tag, int copy);
  // Once every rank's arrays are resolved: this rank's blocks, whether runs may pull private
  // arrays, the copy mode; then the plan is numbered.
  void resolve_blocks(int copy);
  // The local verdict on arrays that replace this rank's for one run; fills where they are
  // ({0, 0}: the plan's own array, also when `send` / `recv` is it).
  local_check check_run(const array_view* send, const array_view* recv, buffer_ref* send_ref,
                        buffer_ref* recv_ref);
  void run_part(detail::rank_line& line) override;
  void bind(const call_protocol::published& all) override;
  void copy_blocks(const copy_plan& how) noexcept override;
  bool pulls_this_run() const noexcept override { return pull_run_; }
  void release() noexcept override;
  // Pulled run: this rank's destination blocks from every node rank's source.
  void pull_blocks(const copy_plan& how) noexcept;

  transfer_geometry g_;
  dtype_id dtype_;
  block_order order_ = block_order::row;
  const std::byte* own_send_ = nullptr;  // this rank's arrays in the plan
  const std::byte* own_recv_ = nullptr;
  std::size_t send_bytes_ = 0, recv_bytes_ = 0;  // of this rank's arrays (any run's)
  std::vector<block> blocks_;
  std::size_t copied_ = 0;
  std::vector<std::byte*> send_bases_, recv_bases_;  // every node rank's arrays in the plan
  std::vector<std::byte*> send_now_, recv_now_;      // those of the current run
  buffer_ref run_send_, run_recv_;     // this rank's arrays for the next run ({0, 0}: its own)
  bool rebound_ = false;               // the current run's arrays differ from the plan's
  bool pulls_ = false;                 // private arrays may be bound (and are then pulled)
  bool pull_run_ = false;              // the current run pulls: some rank's array is private
  std::vector<block> into_me_;         // pulled runs: the blocks of this rank's destination
  std::vector<std::uint64_t> remote_;  // pulled runs: private sources' addresses (else 0)
};

}  // namespace zcoll
