// Kernel-family choice for conv2d (see conv2d_dispatch.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "conv/conv2d_direct.h"
#include "conv/conv2d_dispatch.h"
#include "conv_pool/conv_pool.h"
#include "conv_pool/conv_pool_wgmma.h"
#include "conv_tc/conv2d_tensorcore.h"
#include "depthwise/conv2d_depthwise.h"

namespace jaxcnn {
namespace {

// The conv as the wgmma conv+pool kernel's layer with a 1x1/1 pool (none).
ConvPoolParams AsUnpooled(const Conv2dParams& c) {
  ConvPoolParams p{};
  p.N = c.N, p.H = c.H, p.W = c.W, p.C = c.C, p.R = c.R, p.S = c.S, p.K = c.K;
  p.stride_h = c.stride_h, p.stride_w = c.stride_w, p.pad_top = c.pad_h, p.pad_left = c.pad_w;
  p.dilation_h = c.dil_h, p.dilation_w = c.dil_w;
  p.P = c.P, p.Q = c.Q;
  p.pool_h = p.pool_w = p.pool_stride_h = p.pool_stride_w = 1;
  p.PH = c.P, p.PW = c.Q;
  p.act = c.epilogue;
  return p;
}

// Why the wgmma kernel cannot run this conv (pointers: where known, else any 16-byte aligned).
template <typename T>
const char* WgmmaUnsupportedReason(const Conv2dParams& params, const void* x, const void* w,
                                   const void* y) {
  if (params.layout != TensorLayout::kNHWC) return "wgmma kernel: NHWC only";
  if (params.groups != 1) return "wgmma kernel: groups must be 1";
  if (params.residual != nullptr) return "wgmma kernel: no residual";
  if (params.y_pixel_stride != 0 && params.y_pixel_stride != params.K)
    return "wgmma kernel: a packed y only";
  return conv_pool_wgmma::UnsupportedReason(AsUnpooled(params), sizeof(T),
                                            std::is_same_v<T, float>, x, w, y);
}

// Why the conv_pool stem kernel cannot run this conv as an unpooled layer.
template <typename T>
const char* StemUnsupportedReason(const Conv2dParams& params, const T* x, const T* w, T* y) {
  if (params.layout != TensorLayout::kNHWC) return "stem kernel: NHWC only";
  if (params.groups != 1) return "stem kernel: groups must be 1";
  if (params.residual != nullptr) return "stem kernel: no residual";
  if (params.y_pixel_stride != 0 && params.y_pixel_stride != params.K)
    return "stem kernel: a packed y only";
  ConvPoolParams p = AsUnpooled(params);
  p.allow_tf32 = params.precision == MathPrecision::kDefault;
  return plan_conv_pool<T>(p, ConvPoolBuffers<T>{x, w, nullptr, y}, ConvPoolAlgorithm::kStem)
      .unsupported;
}

// Whether the wgmma kernel's tiles cover the output with no padding rows or columns.
bool WgmmaTilesCoverImage(const Conv2dParams& params) {
  int tile_h = 0, tile_w = 0;
  conv_pool_wgmma::TileShape(AsUnpooled(params), &tile_h, &tile_w);
  return params.P % tile_h == 0 && params.Q % tile_w == 0;
}

// The plan for one family: why it cannot run, else its scratch size.
template <typename T>
Conv2dPlan PlanFamily(const Conv2dParams& params, Conv2dAlgorithm family) {
  Conv2dPlan plan;
  plan.algorithm = family;
  switch (family) {
    case Conv2dAlgorithm::kDirect:
      plan.unsupported = conv2d_direct_unsupported_reason(params);
      break;
    case Conv2dAlgorithm::kDepthwise:
      plan.unsupported = conv2d_depthwise_unsupported_reason(params);
      break;
    case Conv2dAlgorithm::kTensorCore:
      plan.unsupported =
          conv2d_tensorcore_unsupported_reason(params, TcDTypeOf<T>::value);
      if (plan.unsupported == nullptr)
        plan.workspace_bytes =
            conv2d_tensorcore_workspace_bytes(params, TcDTypeOf<T>::value);
      break;
    case Conv2dAlgorithm::kWgmma: {
      alignas(16) static const int16_t kAligned[8] = {};  // XLA's buffers: checked at launch
      plan.unsupported = WgmmaUnsupportedReason<T>(params, kAligned, kAligned, kAligned);
      break;
    }
    case Conv2dAlgorithm::kStem: {
      alignas(16) static T kAligned[8] = {};  // XLA's buffers: checked at launch
      plan.unsupported = StemUnsupportedReason<T>(params, kAligned, kAligned, kAligned);
      break;
    }
    default:
      plan.unsupported = "unknown algorithm";
  }
  return plan;
}

}  // namespace

template <typename T>
Conv2dPlan plan_conv2d(const Conv2dParams& params, Conv2dAlgorithm requested) {
  if (requested != Conv2dAlgorithm::kAuto) return PlanFamily<T>(params, requested);
  // Depthwise is memory-bound: its own kernel beats any GEMM view of it. Then the Hopper wgmma
  // kernel where it takes the shape (3x3/1 SAME, 16-bit) and its tiles cover the image
  // exactly (where they pad a 28- or 14-pixel image it loses to cuDNN), tensor cores wherever
  // that family takes the shape; the direct kernel runs the rest (grouped, NCHW/CHWN, K not a
  // multiple of the TMA row). The stem kernel (convs with C off the tensor-core family's
  // multiple of 8, e.g. an RGB input) before the direct one. Measurements: scripts/bench_layers.py
  // and scripts/bench_conv_pool.py reports in benchmarks/results/.
  for (Conv2dAlgorithm family : {Conv2dAlgorithm::kDepthwise, Conv2dAlgorithm::kWgmma,
                                 Conv2dAlgorithm::kTensorCore, Conv2dAlgorithm::kStem}) {
    Conv2dPlan plan = PlanFamily<T>(params, family);
    if (plan.unsupported == nullptr &&
        (family != Conv2dAlgorithm::kWgmma || WgmmaTilesCoverImage(params)))
      return plan;
  }
  return PlanFamily<T>(params, Conv2dAlgorithm::kDirect);
}

template <typename T>
cudaError_t run_conv2d(const Conv2dPlan& plan, const T* x, const T* w,
                       const T* bias, T* y, const Conv2dParams& params,
                       void* workspace, cudaStream_t stream) {
  if (plan.unsupported != nullptr) return cudaErrorInvalidValue;
  switch (plan.algorithm) {
    case Conv2dAlgorithm::kDirect:
      return launch_conv2d_direct<T>(x, w, bias, y, params, stream);
    case Conv2dAlgorithm::kDepthwise:
      return launch_conv2d_depthwise<T>(x, w, bias, y, params, stream);
    case Conv2dAlgorithm::kTensorCore:
      return launch_conv2d_tensorcore<T>(x, w, bias, y, params, workspace,
                                         plan.workspace_bytes, stream);
    case Conv2dAlgorithm::kWgmma:
      if constexpr (sizeof(T) == 2) {
        if (WgmmaUnsupportedReason<T>(params, x, w, y) != nullptr) return cudaErrorInvalidValue;
        return conv_pool_wgmma::Launch<T>(AsUnpooled(params), ConvPoolBuffers<T>{x, w, bias, y},
                                          stream, params.epilogue);
      }
      return cudaErrorInvalidValue;
    case Conv2dAlgorithm::kStem: {
      if (StemUnsupportedReason<T>(params, x, w, y) != nullptr) return cudaErrorInvalidValue;
      ConvPoolParams p = AsUnpooled(params);
      p.allow_tf32 = params.precision == MathPrecision::kDefault;
      return launch_conv_pool<T>(p, ConvPoolBuffers<T>{x, w, bias, y}, ConvPoolAlgorithm::kStem,
                                 stream);
    }
    default:
      return cudaErrorInvalidValue;
  }
}

#define JAXCNN_INSTANTIATE_DISPATCH(T)                                        \
  template Conv2dPlan plan_conv2d<T>(const Conv2dParams&, Conv2dAlgorithm);  \
  template cudaError_t run_conv2d<T>(const Conv2dPlan&, const T*, const T*,  \
                                     const T*, T*, const Conv2dParams&,      \
                                     void*, cudaStream_t);
JAXCNN_INSTANTIATE_DISPATCH(float)
JAXCNN_INSTANTIATE_DISPATCH(__nv_bfloat16)
JAXCNN_INSTANTIATE_DISPATCH(__half)
#undef JAXCNN_INSTANTIATE_DISPATCH

}  // namespace jaxcnn
