// The tiling shared by the batched weight kernels (weight_relayout.cu, weight_fold.cu): each
// 4-D tensor permuted by cutting it into 64x64 tiles, one block per tile, many tensors per
// launch.
//
// A tile is 64 values of the source axis `a` by 64 consecutive source elements of the axes
// after it (flattened to one index q, contiguous in the source): the reads coalesce, and the
// write runs along whichever of the two the destination is contiguous in. Axes before `a` index
// the tiles' batch. Offsets are 32-bit (a weight holds < 2^31 elements) and divisions multiply
// by host-made reciprocals (cutlass::FastDivmod): with 64-bit division the index arithmetic,
// not memory, was the kernel's time (ncu: 52% SM issue, 7% memory).
#pragma once

#include <cstdint>

#include "cutlass/fast_math.h"

namespace jaxcnn {
namespace weight_tiles {

// Each block finds its job and decomposes its tile's position before moving anything: 64x64
// tiles (16 values a thread) spread that fixed cost over 4096 values.
constexpr int kTile = 64;
constexpr int kRows = 4;  // threads per block: kTile x kRows, each moving kTile/kRows rows

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

inline bool IsPermutation(const int perm[4]) {
  bool seen[4] = {false, false, false, false};
  for (int k = 0; k < 4; ++k) {
    if (perm[k] < 0 || perm[k] > 3 || seen[perm[k]]) return false;
    seen[perm[k]] = true;
  }
  return true;
}

// The tiles of a row-major src of `dims`, written to dst with dst dim k = src dim perm[k];
// *blocks gets its tile count.
inline TiledJob Plan(const void* src, void* dst, const int64_t dims[4], const int perm[4], int64_t first_block,
                     int64_t* blocks) {
  TiledJob t{};
  t.src = src;
  t.dst = dst;
  t.first_block = static_cast<int32_t>(first_block);
  int32_t stride = 1;
  for (int d = 3; d >= 0; --d) {
    t.dims[d] = cutlass::FastDivmod(static_cast<int>(dims[d]));
    t.src_stride[d] = stride;
    stride *= static_cast<int32_t>(dims[d]);
  }
  stride = 1;
  for (int k = 3; k >= 0; --k) {  // dst dim k is src axis perm[k]
    t.dst_stride[perm[k]] = stride;
    stride *= static_cast<int32_t>(dims[perm[k]]);
  }
  t.write_along_q = perm[3] == 3;
  // The tile's rows: the src axis dst is contiguous along, or (that being axis 3, inside q)
  // the src axis dst holds next.
  t.a = t.write_along_q ? perm[2] : perm[3];
  t.nq = t.src_stride[t.a];
  const int tiles_a = static_cast<int>((dims[t.a] + kTile - 1) / kTile), tiles_q = (t.nq + kTile - 1) / kTile;
  t.tiles_a = cutlass::FastDivmod(tiles_a);
  t.tiles_q = cutlass::FastDivmod(tiles_q);
  int64_t batch = 1;
  for (int d = 0; d < t.a; ++d) batch *= dims[d];
  *blocks = int64_t{tiles_a} * tiles_q * batch;
  return t;
}

// Why a job cannot be tiled (nullptr when it can); *blocks gets its tile count.
inline const char* TileError(const int64_t dims[4], const int perm[4], int64_t* blocks) {
  *blocks = 0;
  if (!IsPermutation(perm)) return "each perm must be a permutation of 0..3";
  for (int d = 0; d < 4; ++d)
    if (dims[d] < 0) return "dims must be >= 0";
  const int64_t elements = dims[0] * dims[1] * dims[2] * dims[3];
  if (elements > INT32_MAX) return "a weight must hold < 2^31 elements";
  if (elements == 0) return nullptr;  // skipped by the launchers (and no divisor may be 0)
  Plan(nullptr, nullptr, dims, perm, 0, blocks);
  return nullptr;
}

#ifdef __CUDACC__
// The last job of `jobs[0..count)` whose first block is <= blockIdx.x.
template <typename Job>
__device__ __forceinline__ int FindJob(const Job* jobs, int count) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (static_cast<int32_t>(blockIdx.x) >= jobs[mid].tiles.first_block) lo = mid; else hi = mid - 1;
  }
  return lo;
}

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

// A block's shared memory, declared once by the kernel: a kernel that instantiates MoveTile
// for several element types would otherwise hold one copy per instantiation.
template <typename Value>
struct TileStage {
  Value tile[kTile][kTile + 1];  // +1: column reads hit distinct banks
  int32_t tail[kTile];           // dst offsets of the tile's kTile q values: kTile decompositions, not kTile^2
};

// Moves this block's tile of `job` through `stage`: load(src_offset) gives a Value,
// store(dst_offset, value) writes it (a converting job does its arithmetic in them).
template <typename Value, typename Load, typename Store>
__device__ __forceinline__ void MoveTile(const TiledJob& job, TileStage<Value>& stage, Load load, Store store) {
  auto& tile = stage.tile;
  auto& tail = stage.tail;
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
  // The per-element fields in registers: `job` lives in the kernel's parameter space and is
  // indexed by the block's job, so each use would be a constant-cache load.
  const int na = job.dims[job.a].divisor;
  const int32_t nq = job.nq, src_step = job.src_stride[job.a], dst_step = job.dst_stride[job.a];
  const bool write_along_q = job.write_along_q;

  // Loads first, into registers: warp 0's tail table is computed while they are in flight.
  Value v[kTile / kRows];
  const int32_t iq = q0 + static_cast<int32_t>(threadIdx.x);
#pragma unroll
  for (int i = 0; i < kTile / kRows; ++i) {
    const int ia = a0 + threadIdx.y + i * kRows;
    if (ia < na && iq < nq) v[i] = load(src_base + ia * src_step + iq);
  }
  if (threadIdx.y == 0) tail[threadIdx.x] = iq < nq ? TailOffset(job, iq) : 0;
#pragma unroll
  for (int i = 0; i < kTile / kRows; ++i) tile[threadIdx.y + i * kRows][threadIdx.x] = v[i];
  __syncthreads();
#pragma unroll
  for (int r = threadIdx.y; r < kTile; r += kRows) {
    const int ra = write_along_q ? r : threadIdx.x, rq = write_along_q ? threadIdx.x : r;
    if (a0 + ra < na && q0 + rq < nq) store(dst_base + (a0 + ra) * dst_step + tail[rq], tile[ra][rq]);
  }
}
#endif  // __CUDACC__

}  // namespace weight_tiles
}  // namespace jaxcnn
