#include "zcoll/copy.hpp"

#include <algorithm>

namespace zcoll {

void swap_bytes(void* a, void* b, std::size_t n) noexcept {
  alignas(64) unsigned char tmp[4096];
  auto* pa = static_cast<unsigned char*>(a);
  auto* pb = static_cast<unsigned char*>(b);
  while (n) {
    const std::size_t k = std::min(n, sizeof tmp);
    std::memcpy(tmp, pa, k);
    std::memcpy(pa, pb, k);
    std::memcpy(pb, tmp, k);
    pa += k, pb += k, n -= k;
  }
}

}  // namespace zcoll
