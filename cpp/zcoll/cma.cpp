#include "zcoll/cma.hpp"

#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "zcoll/copy.hpp"
#include "zcoll/protocol.hpp"

namespace zcoll {

namespace {

// The word each rank's peers read in the probe: its address is published, its value known.
constexpr std::uint64_t probe_value = 0x7a636f6c6c2d636dULL;
const volatile std::uint64_t probe_word = probe_value;

std::string yama_scope() {
  std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
  std::string scope;
  if (in >> scope) return scope;
  return "";
}

std::string refusal_text(int err, int peer_comm_rank) {
  std::string text =
      "process_vm_readv from rank " + std::to_string(peer_comm_rank) + ": " + std::strerror(err);
  const std::string scope = yama_scope();
  if (err == EPERM && !scope.empty() && scope != "0")
    text += " (kernel.yama.ptrace_scope = " + scope + ": only a process's ancestors may read it)";
  return text;
}

// One body for both directions: `move` is process_vm_readv or process_vm_writev, which take
// the same arguments (the local side first) and move `bytes` between `local` and `remote`.
template <class Move>
int cma_move(Move move, std::int32_t pid, std::byte* local, std::uint64_t remote,
             std::size_t bytes) noexcept {
  while (bytes) {
    iovec here{local, bytes};
    iovec there{reinterpret_cast<void*>(static_cast<std::uintptr_t>(remote)), bytes};
    const ssize_t moved = move(static_cast<pid_t>(pid), &here, 1, &there, 1, 0);
    if (moved < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (moved == 0) return EFAULT;
    local += moved;
    remote += static_cast<std::uint64_t>(moved);
    bytes -= static_cast<std::size_t>(moved);
  }
  return 0;
}

}  // namespace

int cma_read(std::int32_t pid, void* local, std::uint64_t remote, std::size_t bytes) noexcept {
  return cma_move(process_vm_readv, pid, static_cast<std::byte*>(local), remote, bytes);
}

int cma_write(std::int32_t pid, std::uint64_t remote, const void* local,
              std::size_t bytes) noexcept {
  // The kernel only reads the local side of a write: the cast drops nothing it needs.
  auto* from = const_cast<std::byte*>(static_cast<const std::byte*>(local));
  return cma_move(process_vm_writev, pid, from, remote, bytes);
}

namespace {

// Runs of a box read gathered into one process_vm_readv (the kernel's UIO_MAXIOV is 1024).
class run_batch {
 public:
  explicit run_batch(std::int32_t pid) : pid_(pid) {}
  // Adds one run; reads the batch when it is full. Returns 0 or the errno of a failure.
  int add(std::byte* local, std::uint64_t remote, std::size_t bytes) noexcept {
    to_[n_] = {local, bytes};
    from_[n_] = {reinterpret_cast<void*>(static_cast<std::uintptr_t>(remote)), bytes};
    total_ += bytes;
    return ++n_ == max_runs ? flush() : 0;
  }
  int flush() noexcept {
    if (n_ == 0) return 0;
    ssize_t got = -1;
    do {
      got = process_vm_readv(static_cast<pid_t>(pid_), to_, n_, from_, n_, 0);
    } while (got < 0 && errno == EINTR);
    int err = got < 0 ? errno : 0;
    // A short read stopped at some run: each run again on its own, which says which fails.
    if (!err && static_cast<std::size_t>(got) != total_)
      for (unsigned long k = 0; k < n_ && !err; ++k)
        err = cma_read(pid_, to_[k].iov_base, reinterpret_cast<std::uintptr_t>(from_[k].iov_base),
                       to_[k].iov_len);
    n_ = 0;
    total_ = 0;
    return err;
  }

 private:
  static constexpr unsigned long max_runs = 1024;
  std::int32_t pid_;
  iovec to_[max_runs], from_[max_runs];
  unsigned long n_ = 0;
  std::size_t total_ = 0;
};

}  // namespace

int cma_read_box(std::int32_t pid, std::byte* local, std::uint64_t remote,
                 const box_shape& box) noexcept {
  if (box.rank < 0) return 0;
  if (box.rank == 0) return cma_read(pid, local, remote, box.itemsize);
  const int n = box.rank;
  const box_axis& inner = box.axes[static_cast<std::size_t>(n - 1)];
  const auto item = static_cast<std::int64_t>(box.itemsize);
  // An inner axis contiguous on both sides is one run; otherwise each element is.
  const bool runs = inner.dst_stride == item && inner.src_stride == item;
  const std::size_t run_bytes = runs ? inner.count * box.itemsize : box.itemsize;
  const std::uint64_t per_line = runs ? 1 : inner.count;
  run_batch batch(pid);
  std::array<std::uint64_t, max_box_dims> index{};
  auto from = static_cast<std::int64_t>(remote);
  for (;;) {
    for (std::uint64_t e = 0; e < per_line; ++e)
      if (const int err = batch.add(
              local + static_cast<std::int64_t>(e) * inner.dst_stride,
              static_cast<std::uint64_t>(from + static_cast<std::int64_t>(e) * inner.src_stride),
              run_bytes))
        return err;
    int k = n - 2;  // odometer over the outer axes, as copy_box
    for (; k >= 0; --k) {
      const box_axis& ax = box.axes[static_cast<std::size_t>(k)];
      local += ax.dst_stride, from += ax.src_stride;
      if (++index[static_cast<std::size_t>(k)] < ax.count) break;
      index[static_cast<std::size_t>(k)] = 0;
      local -= ax.dst_stride * static_cast<std::int64_t>(ax.count);
      from -= ax.src_stride * static_cast<std::int64_t>(ax.count);
    }
    if (k < 0) return batch.flush();
  }
}

std::string cma_kernel_status() {
  std::uint64_t copy = 0;
  const int err = cma_read(static_cast<std::int32_t>(getpid()), &copy,
                           reinterpret_cast<std::uintptr_t>(&probe_word), sizeof copy);
  if (err) return std::string("unavailable: process_vm_readv: ") + std::strerror(err);
  const std::string scope = yama_scope();
  if (scope.empty() || scope == "0") return "available";
  return "refused between sibling ranks (kernel.yama.ptrace_scope = " + scope + ")";
}

bool cross_memory::probe(call_protocol& protocol, bool publish_unmapped) {
  const int size = static_cast<int>(pids_.size());
  auto& mine = protocol.slot(rank_);
  mine.cma_address = publish_unmapped ? 0 : reinterpret_cast<std::uintptr_t>(&probe_word);
  protocol.sync();  // every rank's word address is published
  std::int32_t failure = 0;
  for (int r = 0; r < size && !failure; ++r) {
    if (r == rank_) continue;
    std::uint64_t value = 0;
    const int err = read(r, &value, protocol.slot(r).cma_address, sizeof value);
    if (err == 0 && value != probe_value)
      failure = EFAULT;
    else if (err)
      failure = err;
    if (failure) mine.cma_failed_from = r;
  }
  mine.cma_error = failure;
  protocol.sync();  // every rank's verdict is published; rewritten only after the next sync
  state_ = state::works;
  refusal_.clear();
  for (int r = 0; r < size && state_ == state::works; ++r) {
    const auto& slot = protocol.slot(r);
    if (slot.cma_error) {
      state_ = state::refused;
      refusal_ = refusal_text(slot.cma_error, protocol.comm_rank(slot.cma_failed_from));
    }
  }
  return state_ == state::works;
}

}  // namespace zcoll
