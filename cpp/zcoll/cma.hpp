/*
 * Cross-memory attach (CMA): one copy between two processes' private memory, made by the
 * kernel (process_vm_readv), for buffers in no segment the node's ranks share -- the arrays
 * users allocate with NumPy.
 *
 * Without it such a buffer is staged: copied into the sender's staging partition, copied by
 * the schedule, copied out of the receiver's, with one more barrier -- three copies where MPI
 * makes one. With it each rank pulls its incoming blocks straight from the senders' buffers
 * into its own receive buffer: one copy, and the call's two barriers (publication and
 * completion, the senders' buffers must stay untouched until every reader is done).
 *
 * A rank that receives most of a call's bytes (an alltoallv's uneven counts) would copy them
 * while the others wait at the completion barrier: the senders below the mean then push the
 * tails of its blocks into its buffer (process_vm_writev) while it pulls the rest, so the
 * ranks copy about the same bytes (vexchange.hpp: split_pulls).
 *
 * Trade-offs. Each pull is a system call that pins the remote pages (about a microsecond plus
 * the page walk), and the copy runs with ordinary stores in the kernel (no streaming kernel,
 * no block order across ranks: each rank fills only its own receive buffer). So small blocks
 * stay staged; auto_policy holds the measured threshold. A rank can only pull into its own
 * memory, so in-place calls (where a rank's buffer is also its peers' input) stay staged.
 *
 * The kernel may refuse: Yama's ptrace_scope >= 1 lets a process read only its descendants,
 * and processes of different users never read each other. A context probes once, collectively,
 * before its first pull (each rank reads a known word of every peer) and every rank reaches
 * the same verdict; refused, the context stages, and says why (zcoll.settings() shows what the
 * kernel allows this process).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zcoll {

class call_protocol;
struct box_shape;

// Reads `bytes` at address `remote` of process `pid` into `local`. Returns 0 or the errno of
// the failure (a partial read is continued; a read that stops making progress is EFAULT).
int cma_read(std::int32_t pid, void* local, std::uint64_t remote, std::size_t bytes) noexcept;

// Writes `bytes` from `local` at address `remote` of process `pid` (as cma_read, the other way).
int cma_write(std::int32_t pid, std::uint64_t remote, const void* local,
              std::size_t bytes) noexcept;

// Reads the box `box` (copy.hpp: its src side at address `remote` of process `pid`, its dst
// side at `local`) run by run, up to a thousand runs per system call. Returns 0 or the errno of
// the first failure.
int cma_read_box(std::int32_t pid, std::byte* local, std::uint64_t remote,
                 const box_shape& box) noexcept;

// What the kernel allows this process, in words ("available", or why not), without a peer:
// whether the system call exists and Yama's ptrace_scope.
std::string cma_kernel_status();

// Whether the ranks of one node context can read each other's memory.
class cross_memory {
 public:
  enum class state : std::uint8_t { untested, works, refused };

  cross_memory(std::vector<std::int32_t> pids, int rank) : pids_(std::move(pids)), rank_(rank) {}

  // Collective (two barriers of `protocol`): each rank reads a known word of every peer;
  // current() then holds the verdict, the same on every rank. `publish_unmapped` (tests): this rank
  // publishes an address nobody can read, so its peers' reads fail as a refusing kernel's would.
  bool probe(call_protocol& protocol, bool publish_unmapped = false);
  // Reads `bytes` at `remote` of node rank `node_rank` into `local`; 0 or the errno.
  int read(int node_rank, void* local, std::uint64_t remote, std::size_t bytes) const noexcept {
    ++moves_;
    return cma_read(pids_[static_cast<std::size_t>(node_rank)], local, remote, bytes);
  }
  // Writes `bytes` from `local` at `remote` of node rank `node_rank`; 0 or the errno. The
  // kernel checks a write as it checks a read, so the probe's verdict holds for both.
  int write(int node_rank, std::uint64_t remote, const void* local,
            std::size_t bytes) const noexcept {
    ++moves_;
    return cma_write(pids_[static_cast<std::size_t>(node_rank)], remote, local, bytes);
  }
  // cma_read_box from node rank `node_rank`.
  int read_box(int node_rank, std::byte* local, std::uint64_t remote,
               const box_shape& box) const noexcept {
    ++moves_;
    return cma_read_box(pids_[static_cast<std::size_t>(node_rank)], local, remote, box);
  }
  // How many reads and writes (boxes counted once) this rank has made through this object:
  // which path a call took, for tests and the bench. A context's calls run on one thread at
  // a time, so a plain count is enough.
  std::uint64_t moves() const noexcept { return moves_; }
  state current() const noexcept { return state_; }
  // Local: takes the verdict of a probe among ranks that include these (a node pool's,
  // pool.hpp): what all of them could read, a subset can.
  void adopt(state verdict, std::string refusal) {
    state_ = verdict;
    refusal_ = std::move(refusal);
  }
  // Why the probe failed ("" unless refused).
  const std::string& refusal() const noexcept { return refusal_; }

 private:
  std::vector<std::int32_t> pids_;
  int rank_;
  state state_ = state::untested;
  std::string refusal_;
  mutable std::uint64_t moves_ = 0;
};

}  // namespace zcoll
