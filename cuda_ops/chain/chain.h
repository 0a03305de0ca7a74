// Straight-fusion conv chains (NHWC activations, HWIO weights): two convs computed tile by
// tile with the intermediate tile kept in shared memory, so it never reaches DRAM.
// Plain C++ interface so it can be used without XLA (e.g. by the selftest).
//
//   conv3x3 -> conv1x1 (ResNet bottleneck's conv2 -> conv3, VGG-style 3x3 then a projection):
//     t = act1(conv3x3_pad1(x, w3) + b3)        rounded to T, as the unfused layers would
//     y = act2(conv1x1(t, w1) + b1)
//     x [N,H,W,C], w3 [3,3,C,M], b3 [M], w1 [1,1,M,K], b1 [K], y [N,H,W,K]
//
//   conv1x1 -> depthwise3x3 (MobileNetV2's expand -> depthwise):
//     t = act1(conv1x1(x, w1) + b1)             rounded to T
//     y = act2(depthwise3x3(t, wd, stride, padding) + bd)
//     x [N,H,W,C], w1 [1,1,C,M], b1 [M], wd [3,3,1,M], bd [M], y [N,P,Q,M] with
//     P = (pad_top + H + pad_bottom - 3) / stride + 1 (Q likewise): padding 1 on every side
//     ("same" at stride 1), or e.g. (0, 1) as Keras pads before a stride-2 "valid" depthwise
//
// Both run bf16/fp16 mma.sync kernels (sm_80+) accumulating in fp32; the depthwise runs on
// CUDA cores in fp32 from the shared-memory tile. Other dtypes and shapes are not fused (the
// Python op lowers them to XLA's unfused convs).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/epilogue.cuh"

namespace jaxcnn {

// Per-stage activation: any of the conv epilogue's (common/epilogue.cuh) but leaky_relu, which
// would need its slope; NaN stays NaN.
using ChainActivation = Activation;
// The chains' activation codes: every epilogue code (common/epilogue.cuh) but leaky_relu's.
inline bool ValidChainActivationCode(int64_t code) {
  return ValidActivationCode(code) && code != static_cast<int64_t>(Activation::kLeakyRelu);
}

struct Conv3x3Conv1x1Params {
  int64_t N, H, W, C, M, K;  // activations: none, relu or relu6 only
  ChainActivation act1 = ChainActivation::kRelu, act2 = ChainActivation::kRelu;
};

struct Conv1x1DepthwiseParams {
  int64_t N, H, W, C, M;
  int stride = 1;  // of the depthwise conv: 1 or 2
  ChainActivation act1 = ChainActivation::kRelu, act2 = ChainActivation::kRelu;
  // The depthwise conv's zero padding of t, each side 0 to kConv1x1DepthwiseMaxPad.
  int pad_top = 1, pad_bottom = 1, pad_left = 1, pad_right = 1;
};

// nullptr if the fused kernel runs these params (any 16-bit T), else a static message:
// channel counts must be multiples of 8, 3x3->1x1 needs M <= kConv3x3Conv1x1MaxMid (its whole
// intermediate tile is resident), 1x1->depthwise needs C <= kConv1x1DepthwiseMaxIn (its input
// halo tile is resident), sizes must index in int32.
constexpr int64_t kConv3x3Conv1x1MaxMid = 384;
constexpr int64_t kConv1x1DepthwiseMaxIn = 256;
constexpr int kConv1x1DepthwiseMaxPad = 2;
// The depthwise's output rows for `size` input rows (columns likewise); < 1 means none fit.
inline int64_t Conv1x1DepthwiseOutSize(int64_t size, int pad_lo, int pad_hi, int stride) {
  return size + pad_lo + pad_hi < 3 ? 0 : (size + pad_lo + pad_hi - 3) / stride + 1;
}
const char* conv3x3_conv1x1_unsupported_reason(const Conv3x3Conv1x1Params& params);
const char* conv1x1_depthwise_unsupported_reason(const Conv1x1DepthwiseParams& params);

// cudaErrorInvalidValue when unsupported or a pointer is missing, cudaSuccess without
// launching when y is empty, else cudaGetLastError() after the launch. Biases are required
// (pass zeros for none). Only kernel launches on `stream`: CUDA-graph safe. x and y must not
// alias.
template <typename T>
cudaError_t launch_conv3x3_conv1x1(const Conv3x3Conv1x1Params& params, const T* x, const T* w3,
                                   const T* b3, const T* w1, const T* b1, T* y,
                                   cudaStream_t stream);
template <typename T>
cudaError_t launch_conv1x1_depthwise(const Conv1x1DepthwiseParams& params, const T* x,
                                     const T* w1, const T* b1, const T* wd, const T* bd, T* y,
                                     cudaStream_t stream);

#define JAXCNN_CHAIN_EXTERN(T)                                                              \
  extern template cudaError_t launch_conv3x3_conv1x1<T>(const Conv3x3Conv1x1Params&,        \
                                                         const T*, const T*, const T*,       \
                                                         const T*, const T*, T*,             \
                                                         cudaStream_t);                      \
  extern template cudaError_t launch_conv1x1_depthwise<T>(const Conv1x1DepthwiseParams&,    \
                                                           const T*, const T*, const T*,     \
                                                           const T*, const T*, T*,           \
                                                           cudaStream_t);
JAXCNN_CHAIN_EXTERN(__nv_bfloat16)
JAXCNN_CHAIN_EXTERN(__half)
#undef JAXCNN_CHAIN_EXTERN

}  // namespace jaxcnn
