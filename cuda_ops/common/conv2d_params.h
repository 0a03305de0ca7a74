// Shape and options of one conv2d launch, shared by every conv kernel family
// (conv/ direct CUDA-core, conv_tc/ tensor-core, depthwise/). Plain C++ so the
// launchers can be used without XLA (e.g. by the selftest).
#pragma once

#include <cstdint>

#include "common/epilogue.cuh"

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

}  // namespace jaxcnn
