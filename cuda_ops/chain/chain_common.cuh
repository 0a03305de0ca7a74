// Pieces both straight-chain kernels share: the activations, shared-memory strides.
#pragma once

#include <cuda_runtime.h>

#include "chain/chain.h"

namespace jaxcnn {
namespace chain {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kBlockN = 64;  // output channels per GEMM block (8 n8 MMA tiles per warp)

// Row stride (16-bit elements) for `cols` columns: rows 16-byte aligned with an odd number of
// 16-byte vectors, so ldmatrix over 8 consecutive rows hits 8 different bank groups.
__host__ __device__ constexpr int OddVecStride(int cols) {
  const int vecs = (cols + 7) / 8;
  return (vecs % 2 == 1 ? vecs : vecs + 1) * 8;
}
__host__ __device__ constexpr int RoundUp(int v, int m) { return (v + m - 1) / m * m; }

// Comparisons are false for NaN, so NaN passes through every activation (as lax's max/min).
__device__ __forceinline__ float Activate(float v, int act) {
  if (act != static_cast<int>(ChainActivation::kNone) && v < 0.0f) v = 0.0f;
  if (act == static_cast<int>(ChainActivation::kRelu6) && v > 6.0f) v = 6.0f;
  return v;
}

}  // namespace chain
}  // namespace jaxcnn
