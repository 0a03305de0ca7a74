// Fused conv + bias + ReLU + max-pool launcher (NHWC activations, HWIO weights).
// Plain C++ interface so it can be used without XLA (e.g. by the selftest).
//
//   c[n, p, q, k] = round_T(relu(sum_{r,s,ci} x[n, p*sh - pt + r*dh, q*sw - pl + s*dw, ci]
//                                          * w[r, s, ci, k] + bias[k]))      (fp32 accumulate)
//   y[n, i, j, k] = max over the pool window (i*psh - ppt + a, j*psw - ppl + b) of c
//                   (positions outside [0, P) x [0, Q) are -inf padding; NaN propagates)
//
// The pre-pool tensor c never reaches global memory: each CTA computes a 2-D block of c that
// covers whole pool windows (recomputing the overlap rows/columns of overlapping pools), and
// stores only its pooled values.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/epilogue.cuh"

namespace jaxcnn {

// Which kernel runs the layer; codes match jaxcnn/ops/conv_pool_args.py ALGORITHMS.
enum class ConvPoolAlgorithm : int {
  kAuto = 0,        // tensor cores where they apply, else the CUDA-core kernel
  kTensorCore = 1,  // mma.sync (sm_80+): bf16/fp16 with K a multiple of 8, float as TF32
                    // (allow_tf32) with K a multiple of 4; w and y 16-byte aligned, x too
                    // unless it runs flat-K (see ConvPoolPlan::flat_k)
  kDirect = 2,      // CUDA-core fp32 FMA: any dtype, any shape (fp32-accurate)
  kStem = 3,        // persistent mma.sync kernel for small GEMM-K (R*S*C <= 512, e.g. an RGB
                    // stem): the input tile and im2col gathered in shared memory; same dtype,
                    // K and w/y alignment rules as kTensorCore, x any alignment; auto picks it
                    // where flat-K would run and its shared memory fits
  kWgmma = 4,       // Hopper warp-specialized TMA + wgmma kernel (conv_pool_wgmma.h): bf16/fp16
                    // 3x3 stride-1 SAME convs with a 2x2/2 pool (VGG's pooled layers), C a
                    // multiple of 32 (32 or 64 where K % 128 != 0), K of 64; auto picks it
                    // wherever it runs
};

struct ConvPoolParams {
  int64_t N, H, W, C;  // x [N, H, W, C]
  int64_t R, S, K;     // w [R, S, C, K], bias [K]
  int stride_h, stride_w;
  int pad_top, pad_left;  // conv padding before the first row/column (zeros)
  int dilation_h, dilation_w;
  int64_t P, Q;  // conv output extent (the pre-pool tensor, never stored)
  int pool_h, pool_w;                // pool window
  int pool_stride_h, pool_stride_w;  // pool stride
  int pool_pad_top, pool_pad_left;   // pool padding before the first conv row/column (-inf)
  int64_t PH, PW;                    // pooled output extent: y [N, PH, PW, K]
  // float only: TF32 tensor cores may run it (precision "default", as XLA's DEFAULT); else
  // fp32-accurate CUDA-core FMA (precision "highest").
  bool allow_tf32 = false;
  // The activation after the bias (common/epilogue.cuh). Only the stem kernel takes one other
  // than ReLU (conv2d's unpooled stem algorithm), and pooled only a monotone one, which
  // commutes with the max; plan_conv_pool refuses the rest.
  EpilogueActivation act{Activation::kRelu, 0.f};
};

// What the launcher will run for these params, dtype and pointers (no launch).
struct ConvPoolPlan {
  ConvPoolAlgorithm kernel = ConvPoolAlgorithm::kDirect;  // the kernel that runs
  const char* unsupported = nullptr;                      // non-null: cannot run, says why
  const char* why = "";                                   // why this kernel (logs, selftests)
  // Tensor-core kernel: conv block of tile_h x tile_w outputs (128) per CTA, pooled block of
  // pooled_h x pooled_w outputs it stores, output channels per CTA, CTAs, shared memory.
  // Stem kernel: the same per tile (conv tile tile_h x tile_w <= 256 outputs), grid = its
  // persistent CTAs (channel blocks times CTAs per block).
  int tile_h = 0, tile_w = 0;
  int pooled_h = 0, pooled_w = 0;
  int block_k = 0;
  int64_t grid = 0;
  int64_t smem_bytes = 0;
  // Tensor-core kernel's GEMM-K: false steps over (32-channel chunk, filter tap) with 16-byte
  // channel vectors of x (C a multiple of 8 in 16-bit, 4 in float, and x 16-byte aligned);
  // true ("flat-K") over the flattened (r, s, c) filter index, 32 at a time, gathering x
  // element by element: C that is not such a multiple or is below 16 (a C=3 stem conv).
  bool flat_k = false;
  // Stem kernel: input tiles loaded by TMA (sm_90, x 16-byte aligned, W * C a whole number of
  // 16-byte vectors), else element-wise. The wgmma kernel always loads by TMA.
  bool tma = false;
  // Conv outputs computed / conv outputs P * Q (1.0 for non-overlapping pools on whole
  // blocks; > 1 counts recomputed overlap rows/columns and edge blocks' waste).
  double recompute = 0.0;
};

// The pointers a launch reads and writes; alignment decides the kernel. bias may be null
// (zero bias).
template <typename T>
struct ConvPoolBuffers {
  const T* x;
  const T* w;
  const T* bias;
  T* y;
};

// nullptr if the params are consistent (P, Q, PH, PW agree with the rest; every pool window
// holds at least one conv output; sizes fit the kernels' 32-bit grid math), else a static
// message.
const char* conv_pool_unsupported_reason(const ConvPoolParams& params);

// Plan for `algorithm`; plan.unsupported says why a forced kernel cannot run. Queries the
// current device (cached per device).
template <typename T>
ConvPoolPlan plan_conv_pool(const ConvPoolParams& params, const ConvPoolBuffers<T>& buffers,
                            ConvPoolAlgorithm algorithm);

// cudaErrorInvalidValue when the plan is unsupported; cudaSuccess without launching when y is
// empty; else cudaGetLastError() after the launch. x and y must not alias.
template <typename T>
cudaError_t launch_conv_pool(const ConvPoolParams& params, const ConvPoolBuffers<T>& buffers,
                             ConvPoolAlgorithm algorithm, cudaStream_t stream);

#define JAXCNN_CONV_POOL_EXTERN(T)                                                         \
  extern template ConvPoolPlan plan_conv_pool<T>(const ConvPoolParams&,                    \
                                                 const ConvPoolBuffers<T>&, ConvPoolAlgorithm); \
  extern template cudaError_t launch_conv_pool<T>(const ConvPoolParams&,                   \
                                                  const ConvPoolBuffers<T>&, ConvPoolAlgorithm, \
                                                  cudaStream_t);
JAXCNN_CONV_POOL_EXTERN(float)
JAXCNN_CONV_POOL_EXTERN(__nv_bfloat16)
JAXCNN_CONV_POOL_EXTERN(__half)
#undef JAXCNN_CONV_POOL_EXTERN

}  // namespace jaxcnn
