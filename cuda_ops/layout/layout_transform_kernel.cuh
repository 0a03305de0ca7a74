// Shared-memory tiled batched transpose: out[b, j, i] = in[b, i, j].
//
// A block moves one tile of TB x TI x TJ elements (powers of two chosen by the
// launcher) per iteration: coalesced loads along j (16-byte vectors when the
// j extent and strides allow) into shared memory, then coalesced stores along
// i (16-byte vectors when the i extent allows) gathered from shared memory.
// Small I or J grow the other tile dims (and TB), so skinny transposes such as
// [S, 3] -> [3, S] still move long contiguous runs.
#pragma once

#include <cstdint>

namespace jaxcnn {
namespace layout_transform {

constexpr int kThreads = 256;
constexpr int kMaxTileDim = 64;      // TI, TJ when both extents are large
constexpr int kTileBytes = 16384;    // cap on a tile's payload
constexpr int kMaxTileElems = 4096;  // cap on elements per tile (registers)
// 4 x 256 threads per SM keep >= 64 KB of loads in flight per SM, far above
// what HBM needs (~20 KB); capping registers at 64 keeps the scalar-load
// variants (16 staged loads per thread) from halving occupancy.
constexpr int kMinBlocksPerSm = 4;

// Elements per tile. Scalar loads stage one element per register, so their
// tiles are halved to keep 16-byte loads' register budget (no spills at 64).
template <typename E, bool kVecLoad>
__host__ __device__ constexpr int TileElems() {
  return (kTileBytes / static_cast<int>(sizeof(E)) < kMaxTileElems
              ? kTileBytes / static_cast<int>(sizeof(E))
              : kMaxTileElems) /
         (kVecLoad ? 1 : 2);
}

// 16-byte vector width in elements.
template <typename E>
__host__ __device__ constexpr int VecWidth() {
  return 16 / static_cast<int>(sizeof(E));
}

// Row padding of the shared tile: one 4-byte bank word, so a column walk
// (the store phase) moves to the next bank on each row.
template <typename E>
__host__ __device__ constexpr int SmemPad() {
  return sizeof(E) >= 4 ? 1 : 4 / static_cast<int>(sizeof(E));
}

struct TransposeParams {
  int64_t B, I, J;
  int64_t in_stride_b, in_stride_i;    // input stride along j is 1
  int64_t out_stride_b, out_stride_j;  // output stride along i is 1
  int64_t tiles_i, tiles_j;
  int64_t num_tiles;
  int log_tb, log_ti, log_tj;
  // Batch between i and j in memory: the fastest non-contiguous axis of the
  // input and the output is then b, not i / j.
  bool batch_middle;
};

template <typename E, int W>
struct alignas(W * sizeof(E)) Pack {
  E v[W];
};

template <typename E, bool kVecLoad, bool kVecStore>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    transpose_kernel(const E* __restrict__ in, E* __restrict__ out,
                     const TransposeParams p) {
  constexpr int kLoadW = kVecLoad ? VecWidth<E>() : 1;
  constexpr int kStoreW = kVecStore ? VecWidth<E>() : 1;
  constexpr int kLoadIters = TileElems<E, kVecLoad>() / kLoadW / kThreads;
  static_assert(kLoadIters >= 1, "a tile must give every thread a load");
  using LoadPack = Pack<E, kLoadW>;
  using StorePack = Pack<E, kStoreW>;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  E* tile = reinterpret_cast<E*>(smem_raw);

  const int tid = static_cast<int>(threadIdx.x);
  const int tb_mask = (1 << p.log_tb) - 1;
  const int ti_mask = (1 << p.log_ti) - 1;
  const int tj_mask = (1 << p.log_tj) - 1;
  const int row_stride = (1 << p.log_tj) + SmemPad<E>();  // elements
  const int tile_log = p.log_tb + p.log_ti + p.log_tj;
  // Vectors per tile row on each side (TJ >= kLoadW and TI >= kStoreW: the
  // launcher vectorizes only extents that are multiples of the width).
  const int log_load_w = __ffs(kLoadW) - 1;
  const int log_store_w = __ffs(kStoreW) - 1;
  const int load_count = 1 << (tile_log - log_load_w);
  const int store_count = 1 << (tile_log - log_store_w);

  for (int64_t tile_index = blockIdx.x; tile_index < p.num_tiles;
       tile_index += gridDim.x) {
    const int64_t tile_j = tile_index % p.tiles_j;
    const int64_t rest = tile_index / p.tiles_j;
    const int64_t tile_i = rest % p.tiles_i;
    const int64_t tile_b = rest / p.tiles_i;
    const int64_t b0 = tile_b << p.log_tb;
    const int64_t i0 = tile_i << p.log_ti;
    const int64_t j0 = tile_j << p.log_tj;

    // Load phase: j fastest, then whichever of b / i is next in memory.
    // All loads are issued before any shared store, for memory parallelism;
    // each keeps its shared-memory offset (-1: outside the tensor).
    LoadPack staged[kLoadIters];
    int smem_offset[kLoadIters];
#pragma unroll
    for (int it = 0; it < kLoadIters; ++it) {
      const int l = tid + it * kThreads;
      smem_offset[it] = -1;
      if (l < load_count) {
        const int tj = (l << log_load_w) & tj_mask;
        const int r = l >> (p.log_tj - log_load_w);
        const int tb = p.batch_middle ? (r & tb_mask) : (r >> p.log_ti);
        const int ti = p.batch_middle ? (r >> p.log_tb) : (r & ti_mask);
        const int64_t b = b0 + tb, i = i0 + ti, j = j0 + tj;
        if (b < p.B && i < p.I && j < p.J) {
          staged[it] = *reinterpret_cast<const LoadPack*>(
              in + b * p.in_stride_b + i * p.in_stride_i + j);
          smem_offset[it] = ((tb << p.log_ti) + ti) * row_stride + tj;
        }
      }
    }
#pragma unroll
    for (int it = 0; it < kLoadIters; ++it) {
      if (smem_offset[it] < 0) continue;
#pragma unroll
      for (int v = 0; v < kLoadW; ++v) tile[smem_offset[it] + v] = staged[it].v[v];
    }
    __syncthreads();

    // Store phase: i fastest, then whichever of b / j is next in memory.
#pragma unroll 2
    for (int l = tid; l < store_count; l += kThreads) {
      const int ti = (l << log_store_w) & ti_mask;
      const int r = l >> (p.log_ti - log_store_w);
      const int tb = p.batch_middle ? (r & tb_mask) : (r >> p.log_tj);
      const int tj = p.batch_middle ? (r >> p.log_tb) : (r & tj_mask);
      const int64_t b = b0 + tb, i = i0 + ti, j = j0 + tj;
      if (b < p.B && i < p.I && j < p.J) {
        const E* col = tile + ((tb << p.log_ti) + ti) * row_stride + tj;
        StorePack pack;
#pragma unroll
        for (int v = 0; v < kStoreW; ++v) pack.v[v] = col[v * row_stride];
        *reinterpret_cast<StorePack*>(out + b * p.out_stride_b +
                                      j * p.out_stride_j + i) = pack;
      }
    }
    // The next tile overwrites the shared tile.
    __syncthreads();
  }
}

}  // namespace layout_transform
}  // namespace jaxcnn
