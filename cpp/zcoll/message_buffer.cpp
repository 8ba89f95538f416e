#include "zcoll/message_buffer.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

#include "zcoll/arena.hpp"

namespace zcoll {

namespace {
constexpr std::size_t huge_page = std::size_t{2} << 20;
}  // namespace

message_buffer::~message_buffer() {
  std::free(data_);
}

std::byte* message_buffer::reserve(std::size_t bytes) {
  if (bytes <= capacity_) return data_;
  std::free(data_);
  data_ = nullptr;
  capacity_ = 0;
  const std::size_t size = round_up(bytes, huge_page);
  data_ = static_cast<std::byte*>(std::aligned_alloc(huge_page, size));
  if (!data_) throw std::bad_alloc();
  ::madvise(data_, size, MADV_HUGEPAGE);  // advice: ignored where huge pages are off
  capacity_ = size;
  return data_;
}

}  // namespace zcoll
