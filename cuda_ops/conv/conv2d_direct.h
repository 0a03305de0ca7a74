// Direct (implicit-GEMM, CUDA-core) conv2d launcher: x and y in params.layout
// (NHWC, NCHW or CHWN), weights HWIO.
// Plain C++ interface so it can be used without XLA (e.g. by the selftest).
#pragma once

#include <cuda_runtime_api.h>

#include "common/conv2d_params.h"

namespace jaxcnn {

// nullptr if the launcher accepts `params`, else a static message saying why
// (inconsistent shapes/attributes, or sizes past the kernel's int32 indexing).
const char* conv2d_direct_unsupported_reason(const Conv2dParams& params);

// launch_conv2d_direct<T>(x, w, bias, y, params, stream) for T = float, bf16, fp16.
// Returns cudaErrorInvalidValue for inconsistent or out-of-range params,
// cudaSuccess without launching when the output is empty, otherwise the
// result of cudaGetLastError() after the launch. `bias` may be null.
JAXCNN_CONV2D_LAUNCHER_DECLARE(launch_conv2d_direct)

}  // namespace jaxcnn
