// Softmax / log-softmax over the last axis of a [rows, cols] tensor: one fused kernel
// (row max, sum of exp, normalize). Plain C++ interface, usable without XLA.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/float_types.h"

namespace jaxcnn {

// Matches jax.nn.softmax / jax.nn.log_softmax computed in fp32 and rounded once:
// y = exp(x - max) / sum(exp(x - max)), or (x - max) - log(sum(exp(x - max))).
// NaN anywhere in a row makes the whole row NaN (NaN-propagating max); a row holding
// +inf, or only -inf, is NaN as in jax.
struct SoftmaxParams {
  int64_t rows = 0;
  int64_t cols = 0;
  bool log = false;
};

// Which kernel a launch uses (for tests and benchmarks): a warp (or part of one) per
// row with the row in registers; a CTA per row with the row in registers; a CTA per row
// with two passes over x (online max/sum, then normalize) for rows that do not fit.
enum class SoftmaxKernel : int { kWarp = 0, kBlock = 1, kOnline = 2 };

// nullptr if the launcher accepts `params`, else a static message saying why.
const char* softmax_unsupported_reason(const SoftmaxParams& params);

// The kernel launch_softmax picks for `params` and element size (aligned pointers).
SoftmaxKernel softmax_kernel_for(const SoftmaxParams& params, int elem_bytes);

// Returns cudaErrorInvalidValue for params softmax_unsupported_reason rejects,
// cudaSuccess without launching when there is nothing to write, else the result of
// cudaGetLastError() after the launch. x and y must not alias.
// launch_softmax<T>(x, y, params, stream) for T = float, bf16, fp16.
JAXCNN_XY_LAUNCHER_DECLARE(launch_softmax, SoftmaxParams)

}  // namespace jaxcnn
