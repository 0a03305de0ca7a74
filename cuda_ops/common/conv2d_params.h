// Shape and options of one conv2d launch, shared by every conv kernel family
// (conv/ direct CUDA-core, conv_tc/ tensor-core, depthwise/). Plain C++ so the
// launchers can be used without XLA (e.g. by the selftest).
#pragma once

#include <cstdint>

#include "common/epilogue.cuh"
#include "common/float_types.h"

namespace jaxcnn {

// Memory order of the activation tensors x [N,H,W,C] and y [N,P,Q,K].
// Weights are always HWIO [R,S,C/groups,K]; bias is [K].
enum class TensorLayout : int { kNHWC = 0, kNCHW = 1, kCHWN = 2 };

// fp32 math: kDefault may use TF32 tensor cores (XLA's DEFAULT on GPUs);
// kHighest must be fp32-accurate (rel err ~1e-6: FMA or 3xTF32).
// Half types always multiply in their own type and accumulate in fp32.
enum class MathPrecision : int { kDefault = 0, kHighest = 1 };

// Which kernel family runs a conv; kAuto lets the FFI handler pick.
enum class Conv2dAlgorithm : int {
  kAuto = 0,
  kDirect = 1,      // conv/: CUDA-core implicit GEMM, any shape, all layouts
  kTensorCore = 2,  // conv_tc/: CUTLASS tensor-core implicit GEMM
  kDepthwise = 3,   // depthwise/: groups == C
  // 4 is Python's "xla" (lax's own conv; never reaches a handler).
  kWgmma = 5,  // conv_pool/: the Hopper wgmma kernel, 3x3/1 SAME, 16-bit (no pool)
  kStem = 6,   // conv_pool/: the small-GEMM-K stem kernel (R*S*C <= 512, e.g. C=3), no residual
};

// Matches lax.conv_general_dilated(x, w, ..., feature_group_count=groups) with
// dimension numbers (layout, "HWIO", layout), then the epilogue of common/epilogue.cuh:
// activation(acc + bias + residual).
// Dimensions are logical (N,H,W,C) whatever the layout. Bottom/right padding is
// implied by P and Q, so only top/left pads are given.
struct Conv2dParams {
  int64_t N, H, W, C;  // input  (logical) [N,H,W,C]
  int64_t R, S, K;     // weight [R,S,C/groups,K]
  int64_t P, Q;        // output (logical) [N,P,Q,K]
  int stride_h, stride_w;
  int pad_h, pad_w;  // top and left padding
  int dil_h, dil_w;  // rhs (kernel) dilation
  int groups;
  EpilogueActivation epilogue;
  // y's shape, layout and type, added before the activation; null for none. Planning only looks
  // at whether it is null (the workspace query passes any non-null pointer).
  const void* residual = nullptr;
  TensorLayout layout = TensorLayout::kNHWC;
  MathPrecision precision = MathPrecision::kHighest;
  // Elements between consecutive output pixels of y; 0 = K (packed). Larger values write a
  // channel slice of a wider NHWC tensor (y then points at the slice's first channel): the
  // fire module's expands store into their halves of the concatenated output this way.
  // Tensor-core kernel only.
  int64_t y_pixel_stride = 0;
};

// The checks the CUDA-core families (direct, depthwise) make first: nullptr if no dimension is
// negative, the layout is known and y is packed (y_pixel_stride is tensor-core only), else a
// static message saying why.
inline const char* conv2d_params_unsupported_reason(const Conv2dParams& q) {
  if (q.N < 0 || q.H < 0 || q.W < 0 || q.C < 0 || q.R < 0 || q.S < 0 ||
      q.K < 0 || q.P < 0 || q.Q < 0)
    return "negative dimension";
  if (q.layout != TensorLayout::kNHWC && q.layout != TensorLayout::kNCHW &&
      q.layout != TensorLayout::kCHWN)
    return "unknown tensor layout";
  if (q.y_pixel_stride != 0) return "y_pixel_stride is supported by the tensor-core kernel only";
  return nullptr;
}

// One instantiation of a conv launcher `name` with the shared signature
// (x, w, bias, y, params, stream) for element type T: `prefix` is `extern` in the family's header,
// empty in its .cu.
#define JAXCNN_CONV2D_LAUNCHER_OF(T, prefix, name)                                          \
  prefix template cudaError_t name<T>(const T*, const T*, const T*, T*, const Conv2dParams&, \
                                      cudaStream_t);

// Declares the conv launcher template `name`: y = epilogue(conv(x, w) + bias), `bias` may be
// null; then its extern instantiations for every float type (the .cu instantiates them with
// JAXCNN_CONV2D_LAUNCHER_INSTANTIATE).
#define JAXCNN_CONV2D_LAUNCHER_DECLARE(name)                                                 \
  template <typename T>                                                                       \
  cudaError_t name(const T* x, const T* w, const T* bias, T* y, const Conv2dParams& params,  \
                   cudaStream_t stream);                                                      \
  JAXCNN_FOR_EACH_FLOAT_TYPE(JAXCNN_CONV2D_LAUNCHER_OF, extern, name)

#define JAXCNN_CONV2D_LAUNCHER_INSTANTIATE(name) \
  JAXCNN_FOR_EACH_FLOAT_TYPE(JAXCNN_CONV2D_LAUNCHER_OF, , name)

}  // namespace jaxcnn
