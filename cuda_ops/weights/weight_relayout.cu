// Batched 4-D weight permutation (weight_relayout.h): one launch over the tiles of all jobs
// (weight_tiles.cuh).
#include <cuda_runtime.h>

#include <algorithm>

#include "weights/weight_relayout.h"
#include "weights/weight_tiles.cuh"

namespace jaxcnn {
namespace {

using weight_tiles::kRows;
using weight_tiles::kTile;
using weight_tiles::TiledJob;

constexpr int kMaxJobs = 26;  // per launch: the batch is a __grid_constant__ kernel parameter (<= 4 KB)

struct RelayoutJob {
  TiledJob tiles;
};

struct RelayoutBatch {
  RelayoutJob jobs[kMaxJobs];
  int32_t count;
};

template <typename Word>
__global__ void __launch_bounds__(kTile * kRows)
    weight_relayout_kernel(const __grid_constant__ RelayoutBatch batch) {
  const TiledJob& job = batch.jobs[weight_tiles::FindJob(batch.jobs, batch.count)].tiles;
  const Word* src = static_cast<const Word*>(job.src);
  Word* dst = static_cast<Word*>(job.dst);
  __shared__ weight_tiles::TileStage<Word> stage;
  weight_tiles::MoveTile<Word>(
      job, stage, [&](int32_t i) { return src[i]; }, [&](int32_t i, Word v) { dst[i] = v; });
}

template <typename Word>
cudaError_t LaunchAll(const std::vector<WeightRelayout>& jobs, cudaStream_t stream) {
  RelayoutBatch batch{};
  int64_t blocks = 0;
  auto flush = [&]() -> cudaError_t {
    if (batch.count == 0) return cudaSuccess;
    weight_relayout_kernel<Word><<<static_cast<unsigned>(blocks), dim3(kTile, kRows), 0, stream>>>(batch);
    batch.count = 0;
    blocks = 0;
    return cudaGetLastError();
  };
  for (const WeightRelayout& w : jobs) {
    if (w.dims[0] * w.dims[1] * w.dims[2] * w.dims[3] == 0) continue;
    if (batch.count == kMaxJobs) {
      if (cudaError_t e = flush(); e != cudaSuccess) return e;
    }
    int64_t n = 0;
    batch.jobs[batch.count++].tiles = weight_tiles::Plan(w.src, w.dst, w.dims, w.perm, blocks, &n);
    blocks += n;
  }
  return flush();
}

}  // namespace

const char* weight_relayout_unsupported_reason(const std::vector<WeightRelayout>& jobs,
                                               size_t element_bytes) {
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4 && element_bytes != 8)
    return "element width must be 1, 2, 4 or 8 bytes";
  int64_t total_blocks = 0;
  for (const WeightRelayout& w : jobs) {
    int64_t blocks = 0;
    if (const char* reason = weight_tiles::TileError(w.dims, w.perm, &blocks)) return reason;
    total_blocks += blocks;
  }
  if (total_blocks > INT32_MAX) return "too many tiles for one launch";
  return nullptr;
}

cudaError_t launch_weight_relayout(const std::vector<WeightRelayout>& jobs, size_t element_bytes,
                                   cudaStream_t stream) {
  switch (element_bytes) {
    case 1: return LaunchAll<uint8_t>(jobs, stream);
    case 2: return LaunchAll<uint16_t>(jobs, stream);
    case 4: return LaunchAll<uint32_t>(jobs, stream);
    case 8: return LaunchAll<uint64_t>(jobs, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace jaxcnn
