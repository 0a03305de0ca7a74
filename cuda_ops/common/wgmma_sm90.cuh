// Hopper wgmma building blocks shared by the TMA + wgmma kernels (conv_pool/, fusion/): shared-
// memory matrix descriptors, the MMA atoms they use, and accumulator packing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "cute/arch/mma_sm90_gmma.hpp"
#include "cute/arch/mma_sm90_gmma_ext.hpp"

namespace jaxcnn {
namespace wgmma_sm90 {

using cute::SM90::GMMA::Major;
using cute::SM90::GMMA::ScaleOut;

// Descriptor layout types (bits 62-63).
constexpr uint32_t kSwizzle128B = 1, kSwizzle64B = 2, kSwizzle32B = 3;

// A wgmma shared-memory matrix descriptor: start, LBO and SBO in 16-byte units, base offset 0,
// layout type (kSwizzle*).
__device__ __forceinline__ uint64_t Desc(uint32_t addr, uint32_t lbo, uint32_t sbo,
                                         uint32_t layout) {
  return uint64_t((addr >> 4) & 0x3FFF) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(layout) << 62);
}

// The m64nNk16 atom with 16-bit inputs T, fp32 accumulators, both operands in shared memory,
// A of major-ness kA and B of kB.
template <typename T, int kN, Major kA, Major kB>
struct WgmmaOp;
#define JAXCNN_WGMMA_OP(T, N, A, B, NAME)      \
  template <>                                  \
  struct WgmmaOp<T, N, Major::A, Major::B> {   \
    using type = cute::SM90::GMMA::NAME<Major::A, Major::B>; \
  };
#define JAXCNN_WGMMA_OPS(N, A, B)                                            \
  JAXCNN_WGMMA_OP(__nv_bfloat16, N, A, B, MMA_64x##N##x16_F32BF16BF16_SS) \
  JAXCNN_WGMMA_OP(__half, N, A, B, MMA_64x##N##x16_F32F16F16_SS)
JAXCNN_WGMMA_OPS(128, K, MN)
JAXCNN_WGMMA_OPS(32, K, MN)
JAXCNN_WGMMA_OPS(256, MN, K)
JAXCNN_WGMMA_OPS(224, MN, K)
JAXCNN_WGMMA_OPS(112, MN, K)
#undef JAXCNN_WGMMA_OPS
#undef JAXCNN_WGMMA_OP

// d[I]... += A * B (or = with ScaleOut::Zero); d holds the atom's N / 2 accumulators.
template <class Op, int... I>
__device__ __forceinline__ void Fma(uint64_t da, uint64_t db, float* d, ScaleOut scale,
                                    std::integer_sequence<int, I...>) {
  Op::fma(da, db, d[I]..., scale);
}

// Two floats rounded to T, packed as one 32-bit word (lo first in memory).
template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

}  // namespace wgmma_sm90
}  // namespace jaxcnn
