// Direct (implicit-GEMM, CUDA-core) conv2d launcher: x and y in params.layout
// (NHWC, NCHW or CHWN), weights HWIO.
// Plain C++ interface so it can be used without XLA (e.g. by the selftest).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/conv2d_params.h"

namespace jaxcnn {

// nullptr if the launcher accepts `params`, else a static message saying why
// (inconsistent shapes/attributes, or sizes past the kernel's int32 indexing).
const char* conv2d_direct_unsupported_reason(const Conv2dParams& params);

// Returns cudaErrorInvalidValue for inconsistent or out-of-range params,
// cudaSuccess without launching when the output is empty, otherwise the
// result of cudaGetLastError() after the launch. `bias` may be null.
template <typename T>
cudaError_t launch_conv2d_direct(const T* x, const T* w, const T* bias, T* y,
                                 const Conv2dParams& params,
                                 cudaStream_t stream);

extern template cudaError_t launch_conv2d_direct<float>(
    const float*, const float*, const float*, float*, const Conv2dParams&,
    cudaStream_t);
extern template cudaError_t launch_conv2d_direct<__nv_bfloat16>(
    const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
    __nv_bfloat16*, const Conv2dParams&, cudaStream_t);
extern template cudaError_t launch_conv2d_direct<__half>(
    const __half*, const __half*, const __half*, __half*, const Conv2dParams&,
    cudaStream_t);

}  // namespace jaxcnn
