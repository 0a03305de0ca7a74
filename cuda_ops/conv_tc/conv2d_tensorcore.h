// Tensor-core (Hopper wgmma + TMA) implicit-GEMM conv2d launcher, NHWC x HWIO
// -> NHWC, groups == 1. Plain C++ interface, like conv/conv2d_direct.h, so it
// can be used without XLA (e.g. by the selftest).
//
//   GEMM M = N*P*Q, GEMM N = K, GEMM K = R*S*C (c fastest).
//   bf16/fp16: half inputs, fp32 accumulation, one rounding at the end.
//   fp32, MathPrecision::kDefault: TF32 tensor cores.
//   fp32, MathPrecision::kHighest: 3xTF32 (x = big + small, both exact TF32;
//     y = big_x*big_w + big_x*small_w + small_x*big_w in one fp32-accumulated
//     GEMM over 3*C channels), fp32-accurate (~1e-6 relative): the wgmma
//     partial sums are promoted into an fp32 register accumulator every 128
//     GEMM-K elements (the wgmma accumulator alone truncates, and its error
//     grows linearly with K).
//   Epilogue (common/epilogue.cuh): y = act(acc + bias + residual) in fp32, any activation
//   code; params.residual (y's shape, packed, 16-byte aligned) runs a residual variant of
//   the kernel, which exists for a few configs only (conv_tc/conv2d_tc_configs.h:
//   kResidualConfigs); the heuristic then picks among those.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/conv2d_params.h"

namespace jaxcnn {

// Element type of x, w, bias and y (all four share it).
enum class TcDType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

template <typename T>
struct TcDTypeOf;
template <>
struct TcDTypeOf<float> {
  static constexpr TcDType value = TcDType::kF32;
};
template <>
struct TcDTypeOf<__nv_bfloat16> {
  static constexpr TcDType value = TcDType::kBF16;
};
template <>
struct TcDTypeOf<__half> {
  static constexpr TcDType value = TcDType::kF16;
};

// nullptr if launch_conv2d_tensorcore accepts `params` for `dtype`, else a
// static message saying why (the caller then falls back to the direct kernel).
// Requires: NHWC, groups == 1, C and K multiples of 8 (16-bit) or 4 (fp32)
// (16-byte TMA rows), strides <= 8, pads/dilated window within the TMA im2col
// corner ranges, N*P*Q < 2^31, non-empty input and window. The device
// (compute capability 9.0; the kernels are sm_90a code) is checked at launch.
const char* conv2d_tensorcore_unsupported_reason(const Conv2dParams& params,
                                                 TcDType dtype);

// Device scratch bytes the launch needs: fp32 only, the weights HWIO -> KRSC
// (TF32 wgmma operands must be K-major) plus the 3xTF32 split of x and w for
// kHighest; bf16/fp16 read the HWIO weights directly (MN-major wgmma B), so
// they need only CUTLASS's own workspace (0 for the current configs). Enough
// for every config index. A launch whose workspace_bytes is 0 may pass null.
size_t conv2d_tensorcore_workspace_bytes(const Conv2dParams& params,
                                         TcDType dtype);

// Kernel configs (tile, cluster, schedule): the same count for every dtype.
int conv2d_tensorcore_num_configs();
// Short name of config `config`, e.g. "coop_128x256_c2"; nullptr if out of range.
// The first form names the bf16/fp16/TF32 tiles; fp32 kHighest (3xTF32) has
// its own tiles for configs 0-2, which the second form names.
const char* conv2d_tensorcore_config_name(int config);
const char* conv2d_tensorcore_config_name(int config, const Conv2dParams& params,
                                          TcDType dtype);
// The config the heuristic picks (what config = -1 runs).
int conv2d_tensorcore_pick_config(const Conv2dParams& params, TcDType dtype);

// Runs y = act(conv(x, w) + bias + residual). `bias` may be null. With a residual, a
// `config` without a residual variant returns cudaErrorInvalidValue. `config` = -1 picks by
// heuristic, otherwise 0 <= config < conv2d_tensorcore_num_configs().
// `workspace` must hold conv2d_tensorcore_workspace_bytes(params, dtype)
// bytes, 256-byte aligned (may be null when that is 0); x, w, y, bias must be
// 16-byte aligned.
// Returns cudaErrorInvalidValue for unsupported params / bad pointers / small
// workspace / bad config, cudaErrorNoKernelImageForDevice on a device other
// than compute capability 9.0, cudaSuccess without launching when y is empty,
// else the launch status. Only kernel launches on `stream`: no allocation, no
// synchronization (CUDA-graph capturable); per-device attributes are queried
// once and cached.
template <typename T>
cudaError_t launch_conv2d_tensorcore(const T* x, const T* w, const T* bias,
                                     T* y, const Conv2dParams& params,
                                     void* workspace, size_t workspace_bytes,
                                     cudaStream_t stream, int config = -1);

extern template cudaError_t launch_conv2d_tensorcore<float>(
    const float*, const float*, const float*, float*, const Conv2dParams&,
    void*, size_t, cudaStream_t, int);
extern template cudaError_t launch_conv2d_tensorcore<__nv_bfloat16>(
    const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
    __nv_bfloat16*, const Conv2dParams&, void*, size_t, cudaStream_t, int);
extern template cudaError_t launch_conv2d_tensorcore<__half>(
    const __half*, const __half*, const __half*, __half*, const Conv2dParams&,
    void*, size_t, cudaStream_t, int);

}  // namespace jaxcnn
