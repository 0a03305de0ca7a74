// Depthwise conv2d launcher (groups == C, K == C * multiplier) for the NHWC,
// NCHW and CHWN layouts. Plain C++ interface so it can be used without XLA
// (e.g. by the selftest).
//
// Semantics: lax.conv_general_dilated(x, w, stride, ((pad_h, *), (pad_w, *)),
// rhs_dilation=dil, feature_group_count=C) with weights HWIO [R,S,1,K] (output
// channel k reads input channel k / multiplier), + bias (fp32), optional ReLU
// (NaN stays NaN), fp32 accumulation and one rounding to T.
#pragma once

#include <cuda_runtime_api.h>

#include "common/conv2d_params.h"

namespace jaxcnn {

// nullptr if the launcher accepts `params`, else a static message saying why
// (not depthwise, inconsistent attributes, sizes past int32 indexing, or a
// receptive field too large for the shared-memory tile).
const char* conv2d_depthwise_unsupported_reason(const Conv2dParams& params);

// launch_conv2d_depthwise<T>(x, w, bias, y, params, stream) for T = float, bf16, fp16.
// Returns cudaErrorInvalidValue for unsupported params or missing pointers,
// cudaSuccess without launching when the output is empty, otherwise the result
// of cudaGetLastError() after the launch. `bias` may be null. Only kernel
// launches on `stream`: no allocation, synchronization or device query, so it
// can be captured into a CUDA graph.
JAXCNN_CONV2D_LAUNCHER_DECLARE(launch_conv2d_depthwise)

}  // namespace jaxcnn
