// Pieces both straight-chain kernels share: the activations, shared-memory strides.
#pragma once

#include <cuda_runtime.h>

#include <limits>

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

// The activation as a clamp to [lo, hi] (-inf/inf where it has no bound): per element two
// NaN-propagating min/max instructions (sm_80+), NaN passing through as lax's max/min do,
// instead of compares and selects on the activation code. Activations that are no clamp
// (silu, hard-swish, gelu, sigmoid) run the conv epilogue's own math after an open clamp, in
// the kernels' kOther instantiation only: inlined into the clamp-only kernels, that code costs
// them registers and occupancy.
struct Clamp {
  float lo, hi;
  Activation other = Activation::kNone;
};
inline Clamp ClampOf(ChainActivation act) {
  const float inf = std::numeric_limits<float>::infinity();
  if (act == ChainActivation::kRelu || act == ChainActivation::kRelu6)
    return {0.0f, act == ChainActivation::kRelu6 ? 6.0f : inf};
  return {-inf, inf, act};
}
inline bool IsClamp(ChainActivation act) {
  return act == ChainActivation::kNone || act == ChainActivation::kRelu ||
         act == ChainActivation::kRelu6;
}
template <bool kOther = false>
__device__ __forceinline__ float Activate(float v, Clamp c) {
  float out;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(out) : "f"(v), "f"(c.lo));
  asm("min.NaN.f32 %0, %0, %1;\n" : "+f"(out) : "f"(c.hi));
  if constexpr (kOther) {
    if (c.other != Activation::kNone) out = ApplyActivation(c.other, out, 0.0f);
  }
  return out;
}

}  // namespace chain
}  // namespace jaxcnn
