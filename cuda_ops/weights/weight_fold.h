// Many conv weights scaled per output channel, cast and permuted, in one kernel launch.
//
// Folding inference BatchNorm into a conv multiplies its weights by a per-output-channel
// factor every call (the factors are runtime arguments); done per conv, that is one XLA kernel
// per weight (and another per bias) on every call, and XLA's cuDNN convs add a transpose of
// each weight on top. This launcher folds, casts and lays out every weight of a program at
// once (the tiling of weight_tiles.cuh), and casts the biases in the same launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace jaxcnn {

// Element types of a fold job, by the codes of jaxcnn/_native/codes.py's DTYPE_CODES.
enum class FoldElement : int32_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

struct WeightFold {
  const void* src = nullptr;  // row-major, dims[0..3], of src_type
  void* dst = nullptr;        // row-major, dims permuted (dst dim k = src dim perm[k]), of dst_type
  int64_t dims[4] = {1, 1, 1, 1};
  int perm[4] = {0, 1, 2, 3};
  FoldElement src_type = FoldElement::kF32;
  FoldElement dst_type = FoldElement::kF32;
  const float* scale = nullptr;  // dims[scale_axis] factors (fp32), or nullptr: no scaling
  int scale_axis = -1;           // the src axis the factors run along
};

// nullptr when the launcher takes `jobs`, else a static message.
const char* weight_fold_unsupported_reason(const std::vector<WeightFold>& jobs);

// dst = permute(cast(src * scale)), the product in fp32 and one rounding to dst_type, for
// every job on `stream`; jobs with no elements are skipped. A few launches when there are more
// jobs than one launch holds.
cudaError_t launch_weight_fold(const std::vector<WeightFold>& jobs, cudaStream_t stream);

}  // namespace jaxcnn
