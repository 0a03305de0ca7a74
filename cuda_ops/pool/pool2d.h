// 2-D max/avg pooling launcher for NHWC, NCHW and CHWN tensors.
// Plain C++ interface so it can be used without XLA (e.g. by a selftest).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/conv2d_params.h"  // TensorLayout
#include "common/float_types.h"

namespace jaxcnn {

enum class PoolMode : int { kMax = 0, kAvg = 1 };

// Matches lax.reduce_window over the two spatial axes of `layout`:
//   max: init -inf (a window entirely in padding gives -inf), NaN propagates;
//   avg: fp32 sum / (count_include_pad ? R*S : in-bounds taps of the window).
// Dimensions are logical (N,H,W,C) whatever the layout; the output is [N,P,Q,C]
// in the same layout. Bottom/right padding is implied by P and Q.
struct Pool2dParams {
  int64_t N, H, W, C;  // input (logical)
  int64_t P, Q;        // output spatial dims
  int window_h, window_w;
  int stride_h, stride_w;
  int pad_top, pad_left;
  PoolMode mode = PoolMode::kMax;
  bool count_include_pad = true;  // avg only
  TensorLayout layout = TensorLayout::kNHWC;
};

// nullptr if the launcher accepts `params`, else a static message saying why.
const char* pool2d_unsupported_reason(const Pool2dParams& params);

// Returns cudaErrorInvalidValue for params pool2d_unsupported_reason rejects,
// cudaSuccess without launching when the output is empty, else the result of
// cudaGetLastError() after the launch. x and y must not alias.
// launch_pool2d<T>(x, y, params, stream) for T = float, bf16, fp16.
JAXCNN_XY_LAUNCHER_DECLARE(launch_pool2d, Pool2dParams)

}  // namespace jaxcnn
