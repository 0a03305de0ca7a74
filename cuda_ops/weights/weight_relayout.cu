// Batched 4-D weight permutation (weight_relayout.h): one launch over the tiles of all jobs.
#include <cuda_runtime.h>

#include <algorithm>

#include "cutlass/fast_math.h"
#include "weights/weight_relayout.h"

namespace jaxcnn {
namespace {

constexpr int kTile = 32;
constexpr int kRows = 8;       // threads per block: kTile x kRows, each moving kTile/kRows rows
constexpr int kMaxJobs = 26;   // per launch: the batch is a __grid_constant__ kernel parameter (<= 4 KB)

// One job as the kernel walks it. Source axes after `a` are contiguous in the source: they
// flatten to one index q, so a tile is 32 values of axis a by 32 consecutive source elements
// (reads coalesce) and the write runs along whichever of the two dst is contiguous in. Axes
// before `a` index the tiles' batch. Offsets are 32-bit (a weight holds < 2^31 elements) and
// divisions multiply by host-made reciprocals (cutlass::FastDivmod): with 64-bit division the
// index arithmetic, not memory, was the kernel's time (ncu: 52% SM issue, 7% memory).
struct TiledJob {
  const void* src;
  void* dst;
  int32_t first_block;    // blocks of earlier jobs in this launch
  int32_t src_stride[4];  // row-major strides of src, in elements
  int32_t dst_stride[4];  // stride in dst of each *src* axis
  int32_t nq;             // elements of the flattened axes after a
  cutlass::FastDivmod tiles_q, tiles_a;
  cutlass::FastDivmod dims[4];
  int32_t a;              // the tile's row axis
  int32_t write_along_q;  // 1: dst is contiguous along src axis 3 too (perm[3] == 3)
};

struct RelayoutBatch {
  TiledJob jobs[kMaxJobs];
  int32_t count;
};

// dst offset of the flattened index q over src axes a+1..3.
__device__ __forceinline__ int32_t TailOffset(const TiledJob& job, int q) {
  int32_t off = 0;
  for (int d = 3; d > job.a; --d) {
    int c;
    job.dims[d](q, c, q);
    off += c * job.dst_stride[d];
  }
  return off;
}

template <typename Word>
__global__ void __launch_bounds__(kTile * kRows)
    weight_relayout_kernel(const __grid_constant__ RelayoutBatch batch) {
  __shared__ Word tile[kTile][kTile + 1];  // +1: column reads hit distinct banks
  __shared__ int32_t tail[kTile];  // dst offsets of the tile's 32 q values: 32 decompositions, not 1024
  int lo = 0, hi = batch.count - 1;  // the last job whose first block is <= this block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (static_cast<int32_t>(blockIdx.x) >= batch.jobs[mid].first_block) lo = mid; else hi = mid - 1;
  }
  const TiledJob& job = batch.jobs[lo];
  int blk = static_cast<int>(blockIdx.x) - job.first_block, tq, ta;
  job.tiles_q(blk, tq, blk);
  job.tiles_a(blk, ta, blk);
  int32_t src_base = 0, dst_base = 0;  // blk: the batch index over axes a-1..0
  for (int d = job.a - 1; d >= 0; --d) {
    int c;
    job.dims[d](blk, c, blk);
    src_base += c * job.src_stride[d];
    dst_base += c * job.dst_stride[d];
  }
  const int a0 = ta * kTile;
  const int32_t q0 = tq * kTile;
  const int na = job.dims[job.a].divisor;
  const Word* src = static_cast<const Word*>(job.src);
  Word* dst = static_cast<Word*>(job.dst);

  // Loads first, into registers: warp 0's tail table is computed while they are in flight.
  Word v[kTile / kRows];
  const int32_t iq = q0 + static_cast<int32_t>(threadIdx.x);
#pragma unroll
  for (int i = 0; i < kTile / kRows; ++i) {
    const int ia = a0 + threadIdx.y + i * kRows;
    if (ia < na && iq < job.nq) v[i] = src[src_base + ia * job.src_stride[job.a] + iq];
  }
  if (threadIdx.y == 0) tail[threadIdx.x] = iq < job.nq ? TailOffset(job, iq) : 0;
#pragma unroll
  for (int i = 0; i < kTile / kRows; ++i) tile[threadIdx.y + i * kRows][threadIdx.x] = v[i];
  __syncthreads();
  for (int r = threadIdx.y; r < kTile; r += kRows) {
    const int ra = job.write_along_q ? r : threadIdx.x, rq = job.write_along_q ? threadIdx.x : r;
    if (a0 + ra < na && q0 + rq < job.nq) {
      dst[dst_base + (a0 + ra) * job.dst_stride[job.a] + tail[rq]] = tile[ra][rq];
    }
  }
}

bool IsPermutation(const int perm[4]) {
  bool seen[4] = {false, false, false, false};
  for (int k = 0; k < 4; ++k) {
    if (perm[k] < 0 || perm[k] > 3 || seen[perm[k]]) return false;
    seen[perm[k]] = true;
  }
  return true;
}

TiledJob Plan(const WeightRelayout& w, int64_t first_block, int64_t* blocks) {
  TiledJob t{};
  t.src = w.src;
  t.dst = w.dst;
  t.first_block = static_cast<int32_t>(first_block);
  int32_t stride = 1;
  for (int d = 3; d >= 0; --d) {
    t.dims[d] = cutlass::FastDivmod(static_cast<int>(w.dims[d]));
    t.src_stride[d] = stride;
    stride *= static_cast<int32_t>(w.dims[d]);
  }
  stride = 1;
  for (int k = 3; k >= 0; --k) {  // dst dim k is src axis perm[k]
    t.dst_stride[w.perm[k]] = stride;
    stride *= static_cast<int32_t>(w.dims[w.perm[k]]);
  }
  t.write_along_q = w.perm[3] == 3;
  // The tile's rows: the src axis dst is contiguous along, or (that being axis 3, inside q)
  // the src axis dst holds next.
  t.a = t.write_along_q ? w.perm[2] : w.perm[3];
  t.nq = t.src_stride[t.a];
  const int tiles_a = static_cast<int>((w.dims[t.a] + kTile - 1) / kTile), tiles_q = (t.nq + kTile - 1) / kTile;
  t.tiles_a = cutlass::FastDivmod(tiles_a);
  t.tiles_q = cutlass::FastDivmod(tiles_q);
  int64_t batch = 1;
  for (int d = 0; d < t.a; ++d) batch *= w.dims[d];
  *blocks = int64_t{tiles_a} * tiles_q * batch;
  return t;
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
    batch.jobs[batch.count++] = Plan(w, blocks, &n);
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
    if (!IsPermutation(w.perm)) return "each perm must be a permutation of 0..3";
    for (int d = 0; d < 4; ++d)
      if (w.dims[d] < 0) return "dims must be >= 0";
    const int64_t elements = w.dims[0] * w.dims[1] * w.dims[2] * w.dims[3];
    if (elements > INT32_MAX) return "a weight must hold < 2^31 elements";
    if (elements == 0) continue;  // skipped by the launcher (and no divisor may be 0)
    int64_t blocks = 0;
    Plan(w, 0, &blocks);
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
