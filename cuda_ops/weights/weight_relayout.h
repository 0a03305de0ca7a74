// Axis permutations of many small 4-D weight tensors in one kernel launch.
//
// A model written for NCHW (Equinox, PyTorch ports) keeps conv weights as OIHW; the fused
// kernels read HWIO. Transposing each weight on its own is one XLA kernel per weight per call
// (26 for SqueezeNet 1.1, ~1.5 us each at N=1); this launcher moves them all at once.
// Each tensor is cut into 32x32 tiles: 32 values of the source axis the destination is
// contiguous along, by 32 consecutive source elements of the axes after it (OIHW -> HWIO: 32
// output channels by 32 of the I*KH*KW run), so both the reads and the writes coalesce.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace jaxcnn {

struct WeightRelayout {
  const void* src = nullptr;  // row-major, dims[0..3]
  void* dst = nullptr;        // row-major, dims permuted: dst dim k = src dim perm[k]
  int64_t dims[4] = {1, 1, 1, 1};
  int perm[4] = {0, 1, 2, 3};
};

// nullptr when the launcher takes `jobs` (element width 1, 2, 4 or 8 bytes; each perm a
// permutation of 0..3), else a static message.
const char* weight_relayout_unsupported_reason(const std::vector<WeightRelayout>& jobs,
                                               size_t element_bytes);

// Launches the permutations of every job (all of one element width) on `stream`; tensors with
// no elements are skipped. A few launches when there are more jobs than one launch holds.
cudaError_t launch_weight_relayout(const std::vector<WeightRelayout>& jobs, size_t element_bytes,
                                   cudaStream_t stream);

}  // namespace jaxcnn
