// Host-side integer helpers of the launchers' validation and planning: int32 range checks,
// overflow-checked products, ceil-division and pointer alignment. Host code only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>

namespace jaxcnn {

// The kernels index coordinates in int32; sizes past it are refused on the host.
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

inline bool FitsInt32(int64_t v) { return v >= 0 && v <= kInt32Max; }

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// Product of non-negative values; false on int64 overflow.
inline bool CheckedProduct(std::initializer_list<int64_t> factors, int64_t* product) {
  int64_t acc = 1;
  for (int64_t f : factors) {
    if (__builtin_mul_overflow(acc, f, &acc)) return false;
  }
  *product = acc;
  return true;
}

// Whether `ptr` is a multiple of `bytes` (vectorized loads and stores need it).
inline bool IsAligned(const void* ptr, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

}  // namespace jaxcnn
