// Kernel-family choice for conv2d (see conv2d_dispatch.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "conv/conv2d_direct.h"
#include "conv/conv2d_dispatch.h"
#include "conv_tc/conv2d_tensorcore.h"
#include "depthwise/conv2d_depthwise.h"

namespace jaxcnn {

namespace {

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
    default:
      plan.unsupported = "unknown algorithm";
  }
  return plan;
}

}  // namespace

template <typename T>
Conv2dPlan plan_conv2d(const Conv2dParams& params, Conv2dAlgorithm requested) {
  if (requested != Conv2dAlgorithm::kAuto) return PlanFamily<T>(params, requested);
  // Depthwise is memory-bound: its own kernel beats any GEMM view of it. Then tensor cores
  // wherever that family takes the shape; the direct kernel runs the rest (grouped,
  // NCHW/CHWN, K not a multiple of the TMA row).
  for (Conv2dAlgorithm family : {Conv2dAlgorithm::kDepthwise, Conv2dAlgorithm::kTensorCore}) {
    Conv2dPlan plan = PlanFamily<T>(params, family);
    if (plan.unsupported == nullptr) return plan;
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
