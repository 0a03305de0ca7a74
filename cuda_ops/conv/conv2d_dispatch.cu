// Kernel-family choice for conv2d (see conv2d_dispatch.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "conv/conv2d_direct.h"
#include "conv/conv2d_dispatch.h"
#include "conv_tc/conv2d_tensorcore.h"
#include "depthwise/conv2d_depthwise.h"

namespace jaxcnn {

template <typename T>
Conv2dPlan plan_conv2d(const Conv2dParams& params, Conv2dAlgorithm requested) {
  Conv2dPlan plan;
  switch (requested) {
    case Conv2dAlgorithm::kAuto:
      // Depthwise is memory-bound: its own kernel beats any GEMM view of it.
      if (conv2d_depthwise_unsupported_reason(params) == nullptr) {
        plan.algorithm = Conv2dAlgorithm::kDepthwise;
        return plan;
      }
      // Tensor cores wherever the family takes the shape; the direct kernel for the rest
      // (grouped, NCHW/CHWN, channels not a multiple of the TMA row).
      if (conv2d_tensorcore_unsupported_reason(params, TcDTypeOf<T>::value) == nullptr) {
        plan.algorithm = Conv2dAlgorithm::kTensorCore;
        plan.workspace_bytes =
            conv2d_tensorcore_workspace_bytes(params, TcDTypeOf<T>::value);
        return plan;
      }
      plan.algorithm = Conv2dAlgorithm::kDirect;
      plan.unsupported = conv2d_direct_unsupported_reason(params);
      return plan;
    case Conv2dAlgorithm::kDirect:
      plan.algorithm = Conv2dAlgorithm::kDirect;
      plan.unsupported = conv2d_direct_unsupported_reason(params);
      return plan;
    case Conv2dAlgorithm::kDepthwise:
      plan.algorithm = Conv2dAlgorithm::kDepthwise;
      plan.unsupported = conv2d_depthwise_unsupported_reason(params);
      return plan;
    case Conv2dAlgorithm::kTensorCore:
      plan.algorithm = Conv2dAlgorithm::kTensorCore;
      plan.unsupported =
          conv2d_tensorcore_unsupported_reason(params, TcDTypeOf<T>::value);
      if (plan.unsupported == nullptr)
        plan.workspace_bytes =
            conv2d_tensorcore_workspace_bytes(params, TcDTypeOf<T>::value);
      return plan;
  }
  plan.unsupported = "unknown algorithm";
  return plan;
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
