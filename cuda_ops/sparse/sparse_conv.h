// Zero-skipping 2-D convolution (NHWC activations, HWIO weights), optionally with a fused
// ReLU + max-pool epilogue. Stride-1 layers without a pool run the tile kernel
// (sparse_tile_kernel.cuh, see SparseKernel below); the rest run two kernels per call:
//  1. encode: one warp per (input pixel, 32-channel group) ballots the group's nonzeros into a
//     uint32 bitmask (the "encoding", built on the GPU from the dense input every call);
//  2. conv: output-stationary; a CTA owns a block of output pixels x a block of up to 128
//     output channels; lanes own output channels, each warp walks its pixels' receptive fields
//     and, for each (input pixel, group) with a nonzero mask, only the set bits: the value is
//     broadcast by shuffle and FMA'd with the weight row W[r, s, c, k-block] staged in shared
//     memory. Masks are warp-uniform, so the walk never diverges and its length is the number
//     of nonzeros: the work shrinks with the zeros.
// Accumulation is fp32 FMA for every storage type; one rounding to the storage type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>

namespace jaxcnn {

// Static parameters of one call. Pool fields are all 0 for the plain conv; with a pool the
// result is maxpool(relu(conv + bias)) over the conv output [N, P, Q, K] (the pooled output
// is [N, PP, PQ, K]) and `activation` is ignored (the ReLU is part of the op).
struct SparseConvParams {
  int64_t N = 0, H = 0, W = 0, C = 0;  // x: [N, H, W, C]
  int64_t R = 0, S = 0, K = 0;         // w: [R, S, C, K]
  int64_t P = 0, Q = 0;                // conv output spatial size
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  int64_t activation = 0;  // 0 none, 1 relu (plain conv only)
  int64_t pool_h = 0, pool_w = 0, pool_stride_h = 0, pool_stride_w = 0, pool_pad_h = 0,
          pool_pad_w = 0;    // window 0: no pool; pads are the low (top/left) pads
  int64_t PP = 0, PQ = 0;    // pooled output spatial size (pool only)
  int64_t elem_bytes = 4;    // storage type size (4 or 2): the tile kernel's staging depends on it

  bool pooled() const { return pool_h > 0; }
  int64_t groups32() const { return (C + 31) / 32; }
};

// Bytes of the nonzero bitmasks (uint32 per input pixel per 32-channel group): the scratch a
// launch needs.
inline int64_t sparse_conv_mask_bytes(const SparseConvParams& p) {
  return p.N * p.H * p.W * p.groups32() * 4;
}

// What the launch will run (for logs and benchmarks). Two kernels:
//  - kTile (stride 1, dilation 1, R = S in {1, 3, 5}, no pool): input-stationary scatter into a
//    tile_h x tile_w output tile in each warp's registers, region_h x region_w pixels a CTA whose
//    warps share the staged weights (sparse_tile_kernel.cuh); its nonzero masks are ballots.
//    Small layers split the input channels over `splits` CTAs, whose fp32 partial sums take
//    `scratch_bytes` of the scratch. Used where a CTA's shared memory fits the GPU.
//  - kWalk (everything else, and every pool): the encode kernel's masks in the scratch, then
//    the output-stationary walk above.
enum class SparseKernel { kWalk = 0, kTile = 1 };

struct SparseConvPlan {
  const char* unsupported = nullptr;  // non-null: cannot run, says why
  SparseKernel kernel = SparseKernel::kWalk;
  int k_per_lane = 0;                 // output channels per lane (block = 32 * k_per_lane)
  int pixels_per_warp = 0;            // walk: conv output pixels (pool: window slots) per warp
  int taps_per_stage = 0;             // walk: filter taps staged in shared memory at once
  int tile_h = 0, tile_w = 0;         // tile: output tile of a warp
  int warps_y = 0, warps_x = 0;       // tile: warp tiles of a CTA's region
  int region_h = 0, region_w = 0;     // tile: output pixels of a CTA's region
  int chunk_channels = 0;             // tile: input channels staged per step
  int warps = 0;                      // warps per CTA
  int splits = 1;                     // tile: input-channel splits (grid z)
  int64_t grid_x = 0, grid_y = 0;     // pixel blocks (tiles) x channel blocks
  int64_t smem_bytes = 0;
  int64_t scratch_bytes = 0;          // device scratch the launch uses
};

// nullptr if the params can run, else a static message.
const char* sparse_conv_unsupported_reason(const SparseConvParams& p);

// The plan for these params on the current device (SM count cached per device), given
// `scratch_bytes` of device scratch (the tile kernel splits channels only as far as it fits).
SparseConvPlan plan_sparse_conv(const SparseConvParams& p,
                                int64_t scratch_bytes = std::numeric_limits<int64_t>::max());

// Scratch bytes the launch uses at best (the size to allocate): the walk kernel's masks or the
// tile kernel's split partial sums.
inline int64_t sparse_conv_scratch_bytes(const SparseConvParams& p) {
  return plan_sparse_conv(p).scratch_bytes;
}

// Runs the plan for `scratch_bytes` of scratch (16-byte aligned); bias may be null (zero).
// Returns cudaErrorInvalidValue for unsupported params, p.elem_bytes != sizeof(T) or too little
// scratch, cudaSuccess
// without a launch for an empty output, else cudaGetLastError().
template <typename T>
cudaError_t launch_sparse_conv(const SparseConvParams& p, const T* x, const T* w, const T* bias,
                               T* y, void* scratch, int64_t scratch_bytes, cudaStream_t stream);

extern template cudaError_t launch_sparse_conv<float>(const SparseConvParams&, const float*,
                                                      const float*, const float*, float*,
                                                      void*, int64_t, cudaStream_t);
extern template cudaError_t launch_sparse_conv<__nv_bfloat16>(
    const SparseConvParams&, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
    __nv_bfloat16*, void*, int64_t, cudaStream_t);
extern template cudaError_t launch_sparse_conv<__half>(const SparseConvParams&, const __half*,
                                                       const __half*, const __half*, __half*,
                                                       void*, int64_t, cudaStream_t);

}  // namespace jaxcnn
