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


// ---------------------------------------------------------------------------
// Packed-word transpose for 1-, 2- and 4-byte elements when both sides take
// 16-byte vectors (J, I and the strides multiples of 16 bytes' worth of
// elements, both pointers 16-byte aligned, TI and TJ >= 128 bytes' worth).
//
// The shared tile holds the OUTPUT orientation [tj][ti] in 32-bit words of
// K = 4 / sizeof(E) elements consecutive along i. A thread loads K input rows
// (i .. i+K-1) of one 16-byte vector along j, transposes the K x V block in
// registers (byte_perm) into V words, one per j, and writes them with 32-bit
// shared stores; the store phase then moves whole 16-byte vectors from shared
// memory to global memory. Every shared-memory instruction thus moves >= 4
// bytes per lane (the scalar kernel above moves 2 or 1 for bf16 / int8, and
// gathers 8 / 16 of them per 16-byte store), and an XOR swizzle of 16-byte
// chunks keeps both phases free of bank conflicts:
//   write: lanes = 8 j-vectors x 4 word columns of one chunk; the chunk is
//          XORed with the j-vector index (mod 8), so the 32 words hit 32 banks;
//   read:  8 consecutive chunks of one row per quarter warp, a permutation.
// Tile index arithmetic is 32-bit (the launcher uses this kernel only for
// fewer than 2^31 tiles); element offsets stay 64-bit.
constexpr int kPackedThreads = 256;
constexpr int kPackedMaxTileBytes = 16384;
// Load units (K rows x one 16-byte vector) per thread in the largest tile:
// 4 / K, i.e. four 16-byte loads in flight per thread for every element size.
template <int kBytes>
__host__ __device__ constexpr int PackedUnitsPerThread() {
  return kPackedMaxTileBytes / (16 * (4 / kBytes)) / kPackedThreads;
}

struct PackedParams {
  int64_t I, J;
  int64_t in_stride_b, in_stride_i;    // input stride along j is 1
  int64_t out_stride_b, out_stride_j;  // output stride along i is 1
  uint32_t tiles_i, tiles_j, num_tiles;
  int log_ti, log_tj;
};

template <int kBytes>
struct PackedWords;

template <>
struct PackedWords<4> {
  static constexpr int K = 1;
  __device__ static void pack(const uint4 (&r)[1], uint32_t (&w)[4]) {
    w[0] = r[0].x; w[1] = r[0].y; w[2] = r[0].z; w[3] = r[0].w;
  }
};

template <>
struct PackedWords<2> {
  static constexpr int K = 2;
  __device__ static void pack(const uint4 (&r)[2], uint32_t (&w)[8]) {
    const uint32_t a[4] = {r[0].x, r[0].y, r[0].z, r[0].w};
    const uint32_t c[4] = {r[1].x, r[1].y, r[1].z, r[1].w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      w[2 * q] = __byte_perm(a[q], c[q], 0x5410);      // (a.lo, c.lo)
      w[2 * q + 1] = __byte_perm(a[q], c[q], 0x7632);  // (a.hi, c.hi)
    }
  }
};

template <>
struct PackedWords<1> {
  static constexpr int K = 4;
  __device__ static void pack(const uint4 (&r)[4], uint32_t (&w)[16]) {
    const uint32_t r0[4] = {r[0].x, r[0].y, r[0].z, r[0].w};
    const uint32_t r1[4] = {r[1].x, r[1].y, r[1].z, r[1].w};
    const uint32_t r2[4] = {r[2].x, r[2].y, r[2].z, r[2].w};
    const uint32_t r3[4] = {r[3].x, r[3].y, r[3].z, r[3].w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t t0 = __byte_perm(r0[q], r1[q], 0x5140);  // r0.b0 r1.b0 r0.b1 r1.b1
      const uint32_t t1 = __byte_perm(r2[q], r3[q], 0x5140);  // r2.b0 r3.b0 r2.b1 r3.b1
      const uint32_t t2 = __byte_perm(r0[q], r1[q], 0x7362);  // r0.b2 r1.b2 r0.b3 r1.b3
      const uint32_t t3 = __byte_perm(r2[q], r3[q], 0x7362);  // r2.b2 r3.b2 r2.b3 r3.b3
      w[4 * q + 0] = __byte_perm(t0, t1, 0x5410);
      w[4 * q + 1] = __byte_perm(t0, t1, 0x7632);
      w[4 * q + 2] = __byte_perm(t2, t3, 0x5410);
      w[4 * q + 3] = __byte_perm(t2, t3, 0x7632);
    }
  }
};

template <int kBytes>
__global__ void __launch_bounds__(kPackedThreads, 4)
    transpose_packed_kernel(const unsigned char* __restrict__ in_bytes,
                            unsigned char* __restrict__ out_bytes,
                            const PackedParams p) {
  constexpr int K = PackedWords<kBytes>::K;  // elements per shared word
  constexpr int V = 16 / kBytes;             // elements per 16-byte vector
  constexpr int kLogK = K == 1 ? 0 : (K == 2 ? 1 : 2);
  constexpr int kLogV = kLogK + 2;
  constexpr int kLogBytes = 2 - kLogK;
  constexpr int kUnitsPerThread = PackedUnitsPerThread<kBytes>();

  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint32_t* smem_words = reinterpret_cast<uint32_t*>(smem_raw);
  const uint4* smem_chunks = reinterpret_cast<const uint4*>(smem_raw);

  const int tid = static_cast<int>(threadIdx.x);
  const int log_nj = p.log_tj - kLogV;  // j-vectors per tile row (>= 3)
  const int log_ng = p.log_ti - kLogK;  // words per shared row (>= 5)
  const int log_nc = log_ng - 2;        // 16-byte chunks per shared row (>= 3)
  const int units = 1 << (log_nj + log_ng);  // K x V load blocks per tile
  const int store_units = 1 << (p.log_tj + log_nc);

  for (uint32_t t = blockIdx.x; t < p.num_tiles; t += gridDim.x) {
    const uint32_t tile_j = t % p.tiles_j;
    const uint32_t rest = t / p.tiles_j;
    const uint32_t tile_i = rest % p.tiles_i;
    const int64_t b = rest / p.tiles_i;
    const int64_t i0 = static_cast<int64_t>(tile_i) << p.log_ti;
    const int64_t j0 = static_cast<int64_t>(tile_j) << p.log_tj;

    // Load phase: lane bits 0-2 pick the j-vector, bits 3-4 the word column,
    // so a warp reads 4 x K rows of 128 contiguous bytes.
    uint4 staged[kUnitsPerThread][K];
    int jv_of[kUnitsPerThread], ig_of[kUnitsPerThread];
#pragma unroll
    for (int it = 0; it < kUnitsPerThread; ++it) {
      const int u = tid + it * kPackedThreads;
      const int rest_u = u >> 5;
      const int jv = (u & 7) | ((rest_u & ((1 << (log_nj - 3)) - 1)) << 3);
      const int ig = ((u >> 3) & 3) | ((rest_u >> (log_nj - 3)) << 2);
      jv_of[it] = jv;
      ig_of[it] = ig;
      const int64_t j = j0 + (jv << kLogV);
      const int64_t i = i0 + (ig << kLogK);
      const bool live = u < units && j < p.J;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (live && i + k < p.I) {
          staged[it][k] = __ldg(reinterpret_cast<const uint4*>(
              in_bytes +
              ((b * p.in_stride_b + (i + k) * p.in_stride_i + j) << kLogBytes)));
        } else {
          staged[it][k] = make_uint4(0, 0, 0, 0);
        }
      }
    }
#pragma unroll
    for (int it = 0; it < kUnitsPerThread; ++it) {
      const int u = tid + it * kPackedThreads;
      if (u >= units) continue;
      uint32_t w[V];
      PackedWords<kBytes>::pack(staged[it], w);
      const int jv = jv_of[it], ig = ig_of[it];
      const int col = ((((ig >> 2) ^ (jv & 7))) << 2) | (ig & 3);
#pragma unroll
      for (int jj = 0; jj < V; ++jj) {
        const int row = (jv << kLogV) + jj;
        smem_words[(row << log_ng) + col] = w[jj];
      }
    }
    __syncthreads();

    // Store phase: 16-byte chunks along i, consecutive lanes on one row.
#pragma unroll 4
    for (int u = tid; u < store_units; u += kPackedThreads) {
      const int cc = u & ((1 << log_nc) - 1);
      const int tj = u >> log_nc;
      const int64_t j = j0 + tj;
      const int64_t i = i0 + (cc << kLogV);
      if (j < p.J && i < p.I) {
        const int phys = cc ^ ((tj >> kLogV) & 7);
        const uint4 v = smem_chunks[(tj << log_nc) + phys];
        *reinterpret_cast<uint4*>(
            out_bytes + ((b * p.out_stride_b + j * p.out_stride_j + i)
                         << kLogBytes)) = v;
      }
    }
    __syncthreads();
  }
}

}  // namespace layout_transform
}  // namespace jaxcnn
