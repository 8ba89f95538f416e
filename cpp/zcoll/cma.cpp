#include "zcoll/cma.hpp"

#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

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

}  // namespace

int cma_read(std::int32_t pid, void* local, std::uint64_t remote, std::size_t bytes) noexcept {
  auto* into = static_cast<std::byte*>(local);
  while (bytes) {
    iovec to{into, bytes};
    iovec from{reinterpret_cast<void*>(static_cast<std::uintptr_t>(remote)), bytes};
    const ssize_t got = process_vm_readv(static_cast<pid_t>(pid), &to, 1, &from, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (got == 0) return EFAULT;
    into += got;
    remote += static_cast<std::uint64_t>(got);
    bytes -= static_cast<std::size_t>(got);
  }
  return 0;
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
