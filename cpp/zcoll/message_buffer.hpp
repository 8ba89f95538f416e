/*
 * A private buffer that messages between nodes are received into: anonymous memory, 2 MiB
 * aligned, with MADV_HUGEPAGE.
 *
 * Why not a std::vector: an MPI's single-copy transfers (Open MPI's CMA within a machine, an
 * RDMA NIC's registration across machines) pin and walk the receiver's pages, and on a kernel
 * whose transparent huge pages are "madvise" (the Debian default) plain heap memory gets 4 KiB
 * pages: 512 times more of them. Measured (2-vCPU VM, Open MPI 4.1 over vader/CMA, 16 MiB
 * messages): into NumPy's memory (which asks for huge pages) 1155 us, into 4 KiB pages 1825 us.
 * Where huge pages are off the advice is ignored and this is plain memory.
 */
#pragma once

#include <cstddef>

namespace zcoll {

class message_buffer {
 public:
  message_buffer() = default;
  ~message_buffer();
  message_buffer(const message_buffer&) = delete;
  message_buffer& operator=(const message_buffer&) = delete;

  // At least `bytes` (its contents are not kept when it grows); throws std::bad_alloc.
  std::byte* reserve(std::size_t bytes);
  std::byte* data() const noexcept { return data_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace zcoll
