// Layout transforms of a 4-D activation tensor (logical dims N, C, H, W)
// between NHWC, NCHW and CHWN. Plain C++ interface so the launcher can be used
// without XLA (e.g. by the selftest).
//
// H and W stay adjacent and in order in all three layouts, so with S = H*W
// every layout is an order of three axes N, C, S:
//   NHWC = [N, S, C]   NCHW = [N, C, S]   CHWN = [C, S, N]
// After dropping size-1 axes and merging axes that are adjacent in both
// layouts, each of the 6 directions is one of
//   a copy                          (e.g. NHWC -> NCHW with C == 1)
//   a 2-D transpose [I, J] -> [J, I] (NCHW <-> CHWN: [N, CS] <-> [CS, N])
//   a batched transpose, batch outermost  [B, I, J] -> [B, J, I]
//                                    (NHWC <-> NCHW: per image [S,C] <-> [C,S])
//   a batched transpose, batch in the middle [I, B, J] -> [J, B, I]
//                                    (NHWC <-> CHWN: [N, S, C] <-> [C, S, N])
// and all transposes run a shared-memory tiled kernel (layout_transform_kernel.cuh):
// the packed-word kernel when 1/2/4-byte elements take 16-byte vectors on both
// sides and both extents span >= 128 bytes, else the general scalar/vector one.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/conv2d_params.h"

namespace jaxcnn {

// Shape of a layout's tensor: dims[0..3] in that layout's order.
void layout_dims(TensorLayout layout, int64_t N, int64_t C, int64_t H,
                 int64_t W, int64_t dims[4]);

// True for the three TensorLayout values.
bool is_valid_layout(int64_t code);

// How one transform runs, derived on the host (exposed for tests and the
// benchmark's reports).
struct LayoutTransformPlan {
  // kUnsupported: a permutation no pair of these layouts produces.
  enum class Kind { kEmpty, kCopy, kTranspose, kUnsupported } kind = Kind::kEmpty;
  int64_t elements = 0;
  // Transpose view: out[b, j, i] = in[b, i, j] with element strides below
  // (input is contiguous along j, output along i).
  int64_t B = 1, I = 1, J = 1;
  int64_t in_stride_b = 0, in_stride_i = 0;
  int64_t out_stride_b = 0, out_stride_j = 0;
  bool batch_middle = false;  // [I, B, J] -> [J, B, I] rather than batch outermost
};

LayoutTransformPlan plan_layout_transform(TensorLayout src, TensorLayout dst,
                                          int64_t N, int64_t C, int64_t H,
                                          int64_t W);

// nullptr if the launcher accepts the arguments, else a static message.
const char* layout_transform_unsupported_reason(TensorLayout src,
                                                TensorLayout dst, int64_t N,
                                                int64_t C, int64_t H, int64_t W,
                                                size_t element_bytes);

// y (in dst layout) = x (in src layout). The kernel only moves bits, so any
// element type of 1, 2, 4 or 8 bytes works. Returns cudaErrorInvalidValue for
// bad arguments, cudaSuccess without launching for an empty tensor, otherwise
// the launch's status. x and y must not overlap.
cudaError_t launch_layout_transform(const void* x, void* y,
                                    size_t element_bytes, TensorLayout src,
                                    TensorLayout dst, int64_t N, int64_t C,
                                    int64_t H, int64_t W, cudaStream_t stream);

}  // namespace jaxcnn
