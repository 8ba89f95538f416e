/*
 * Persistent irregular collectives (alltoallv_init, allgatherv_init, neighbor_*_init): one
 * irregular call (vexchange.hpp) checked, agreed on and resolved once, run many times through
 * plan_base's start/wait (plan.hpp).
 *
 * Creation does what a call does before data moves -- the local checks, the ranks' agreement,
 * every pair's counts checked -- and then what a call would redo every time: the ordered
 * tuples cut into this rank's piece, turned into a list of copies between (node rank, offset)
 * pairs, every node rank's buffer addresses, and arena shadows for private buffers. A run is
 * the start barrier, this rank's copies, the completion barrier: no metadata, no count checks,
 * no staging barrier. Counts and displacements are fixed at creation (MPI's rule).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "zcoll/plan.hpp"
#include "zcoll/vexchange.hpp"

namespace zcoll {

class v_plan final : public plan_base {
 public:
  // Collective over the context's node ranks: checks and agrees on `call` as
  // v_exchange::run does (same errors), then resolves it.
  v_plan(std::shared_ptr<node_context> ctx, const v_call& call);
  ~v_plan() { finish_quietly(); }
  v_plan(const v_plan&) = delete;
  v_plan& operator=(const v_plan&) = delete;

  op_code op() const noexcept { return op_; }
  v_in_place in_place() const noexcept { return in_place_; }
  block_order order() const noexcept { return order_; }
  // Bytes this rank copies per run.
  std::uint64_t copied_bytes() const noexcept { return copied_; }
  // Whether this rank's send / receive buffer is private and runs through an arena shadow.
  bool send_shadowed() const noexcept { return send_shadow_ != nullptr; }
  bool recv_shadowed() const noexcept { return recv_shadow_ != nullptr; }

 private:
  // One copy of this rank's piece: `bytes` from node rank `src`'s buffer at `src_offset` to
  // node rank `dst`'s receive buffer at `dst_offset`.
  struct piece {
    std::int32_t src, dst;
    std::uint64_t src_offset, dst_offset, bytes;
  };
  void run_part(detail::rank_line& line) override;
  void copy_blocks(const copy_plan& how) noexcept override;
  void after_barrier() override;
  void release() noexcept override;
  void plan_pieces(const v_exchange::checked_call& mine, const v_call& call, std::size_t parity);
  void resolve_buffers(const v_call& call, const v_exchange::checked_call& mine,
                       call_protocol::published all);

  op_code op_;
  block_order order_ = block_order::row;
  v_in_place in_place_ = v_in_place::none;
  const std::byte* send_ = nullptr;  // the user's buffers
  std::byte* recv_ = nullptr;
  std::uint64_t send_extent_ = 0, copied_ = 0;
  std::vector<piece> pieces_;
  std::vector<v_span> stage_blocks_;  // in place: the blocks a shadow needs before a run
  std::vector<v_span> written_;       // this rank's receive blocks that the node's copies write
  std::vector<std::byte*> send_bases_, recv_bases_;
  std::shared_ptr<arena_block> shadow_;
  std::byte* send_shadow_ = nullptr;
  std::byte* recv_shadow_ = nullptr;
};

}  // namespace zcoll
