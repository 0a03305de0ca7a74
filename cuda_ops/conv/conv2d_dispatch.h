// Chooses the conv2d kernel family for a launch and runs it. Shared by the FFI
// handler and the workspace-size query the Python lowering makes, so both
// always agree on the family and its scratch size.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/conv2d_params.h"

namespace jaxcnn {

struct Conv2dPlan {
  Conv2dAlgorithm algorithm = Conv2dAlgorithm::kDirect;
  size_t workspace_bytes = 0;
  // Non-null when the requested family cannot run these params: why.
  const char* unsupported = nullptr;
};

// `requested` kAuto: depthwise for groups == C, the tensor-core family where it
// supports the shape, else the direct kernel (which runs everything).
template <typename T>
Conv2dPlan plan_conv2d(const Conv2dParams& params, Conv2dAlgorithm requested);

// Runs `plan` (from plan_conv2d with the same params); `workspace` holds at
// least plan.workspace_bytes device bytes.
template <typename T>
cudaError_t run_conv2d(const Conv2dPlan& plan, const T* x, const T* w,
                       const T* bias, T* y, const Conv2dParams& params,
                       void* workspace, cudaStream_t stream);

}  // namespace jaxcnn
