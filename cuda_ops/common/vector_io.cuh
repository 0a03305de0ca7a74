// Wide (up to 16-byte) global accesses as one instruction, and XLA's NaN-propagating max,
// shared by the memory-bound kernels (pooling, softmax).
#pragma once

#include <cuda_runtime.h>

namespace jaxcnn {

// The integer type moving `Bytes` bytes in one load/store; its bits are reinterpreted as
// an array of the element type in registers.
template <int Bytes>
struct RawVec;
template <>
struct RawVec<16> {
  using type = uint4;
};
template <>
struct RawVec<8> {
  using type = uint2;
};
template <>
struct RawVec<4> {
  using type = unsigned int;
};
template <>
struct RawVec<2> {
  using type = unsigned short;
};

template <typename T, int VEC>
using RawVecOf = typename RawVec<static_cast<int>(sizeof(T)) * VEC>::type;

// XLA's max propagates NaN (fmaxf would drop it): once acc is NaN it stays NaN, and a NaN
// operand wins.
__device__ __forceinline__ float max_nan(float acc, float v) {
  return (v > acc || v != v) ? v : acc;
}

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

}  // namespace jaxcnn
