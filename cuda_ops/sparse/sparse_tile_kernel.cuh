// The tile kernel of the zero-skipping conv: stride 1, dilation 1, square R x R windows
// (R = 1, 3, 5), no pool. Input-stationary scatter into output tiles held in registers.
//
// A CTA owns a region of warps_y x warps_x warp tiles (each TH x TW output pixels) of one image
// and a block of 32 * KPL output channels (lane: KPL consecutive k); every warp accumulates
// its own tile for the whole block: acc[TH * TW][KPL] in registers. Per chunk of CH input
// channels the CTA stages, with cp.async and double buffered (the next chunk loads while this
// one is walked), the region's input halo and the block's weights w[tap, chunk, k-block]: every
// warp of the CTA reads the same weights from shared memory, so L2 serves each weight once per
// region rather than once per warp tile (with weights read per warp from L2, their traffic was
// the cost that did not shrink with the zeros: ~15 GB for VGG conv3_2 at N = 64).
// Per channel, a warp loads its halo's values (one per lane and 32 positions), ballots the
// nonzero positions, and only when there is one reads its R*R*KPL weights; then it sweeps the
// halo positions in compile-time order, branching past the zeros (sweep_nonzeros): a nonzero at
// halo position pos hits the output pixels pos - (r, s) that lie in the tile, and each position
// has its own code with compile-time accumulator indices (registers cannot be indexed at run
// time). Every lane sees the same mask, so the sweep never diverges; values come by shuffle from
// the lanes that loaded them.
//
// With SPLIT, grid.z splits the input channels; each split stores raw fp32 partial sums into
// its slice of the workspace and finalize_split_partials adds them in a fixed order (bitwise
// deterministic), then bias, activation and the single rounding to T.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "common/float_convert.cuh"
#include "common/mma_sm80.cuh"

namespace jaxcnn {
namespace sparse {

// Input channels per staged chunk: as many as keep the two buffers of weights (R*R x chunk x
// 128 output channels) and halo within an SM's shared memory (fp32 3x3: 2 x 147 KiB would not).
// `elem_bytes`: sizeof the storage type. Host and device share these sizes.
__host__ __device__ constexpr int TileChunkChannels(int elem_bytes, int R) {
  return (elem_bytes == 4 ? 16 : 32) / (R == 5 ? 2 : 1);
}

// Shared-memory row of one halo pixel: the chunk's channels as stored, padded by 16 bytes so
// rows stay 16-byte aligned for cp.async and the per-channel column reads spread over banks.
__host__ __device__ constexpr int TileXRow(int elem_bytes, int R) {
  return TileChunkChannels(elem_bytes, R) + 16 / elem_bytes;
}

// Elements of one buffer of the region's halo and of the block's weights; the CTA holds two of
// each, halos first. Both are multiples of 16 bytes.
__host__ __device__ constexpr int64_t TileHaloElems(int elem_bytes, int R, int TH, int TW,
                                                    int warps_y, int warps_x) {
  return static_cast<int64_t>(warps_y * TH + R - 1) * (warps_x * TW + R - 1) *
         TileXRow(elem_bytes, R);
}
__host__ __device__ constexpr int64_t TileWeightElems(int elem_bytes, int R, int KPL) {
  return static_cast<int64_t>(R) * R * TileChunkChannels(elem_bytes, R) * 32 * KPL;
}
__host__ __device__ constexpr int64_t TileSmemBytes(int elem_bytes, int R, int TH, int TW,
                                                    int KPL, int warps_y, int warps_x) {
  return 2 * (TileHaloElems(elem_bytes, R, TH, TW, warps_y, warps_x) +
              TileWeightElems(elem_bytes, R, KPL)) * elem_bytes;
}

// Warps a CTA may have (the kernel's launch bound). A lane's fp32 accumulators and weight
// registers: up to ~100 fit in 128 registers, so 16 warps (4 a scheduler) run, which hide the
// sweep's branch and shared-memory latencies that 2 a scheduler did not (H100, VGG conv3_2
// fp32 at 90% zeros: 2x8 tiles in 16 warps 2.91 ms, 4x8 in 8 warps 3.43 ms); more take ~210
// registers, and 8 warps fill the SM.
__host__ __device__ constexpr int TileMaxWarps(int R, int TH, int TW, int KPL) {
  return TH * TW * KPL + R * R * KPL <= 100 ? 16 : 8;
}

struct TileArgs {
  int N, H, W, C, K, P, Q, pad_h, pad_w, activation;
  int warps_y, warps_x;      // warp tiles of a CTA's region (blockDim.x = 32 * warps_y * warps_x)
  int regions_h, regions_w;  // CTA regions per image
  int chunks_per_split;      // channel chunks each grid.z slice walks
  int64_t M;                 // N * P * Q output pixels
};

// acc[pixel] += v * w[tap] for the taps that carry halo position POS into the tile (all
// indices fold to constants).
template <int POS, int R, int TH, int TW, int KPL>
__device__ __forceinline__ void scatter_nonzero(float v, float (&acc)[TH * TW][KPL],
                                                const float (&wr)[R * R][KPL]) {
  constexpr int kHaloW = TW + R - 1;
  constexpr int hy = POS / kHaloW, hx = POS % kHaloW;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const int oy = hy - r, ox = hx - s;
      if (oy >= 0 && oy < TH && ox >= 0 && ox < TW) {
#pragma unroll
        for (int j = 0; j < KPL; ++j)
          acc[oy * TW + ox][j] = fmaf(v, wr[r * R + s][j], acc[oy * TW + ox][j]);
      }
    }
  }
}

// Shared-memory loads by 32-bit address. The addresses stay in registers across the channel
// loop; generic pointers into the dynamic shared memory were rebuilt from SR_CgaCtaId every
// channel under the 128-register bound (short-scoreboard stalls in the loop's head).
template <typename T>
__device__ __forceinline__ float lds_value(uint32_t addr) {
  if constexpr (sizeof(T) == 4) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
    return v;
  } else {
    uint16_t raw;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(raw) : "r"(addr) : "memory");
    return to_float(*reinterpret_cast<const T*>(&raw));
  }
}

// KPL consecutive values of a shared-memory weight row as fp32 (one 16- or 8-byte load for
// fp32 / 16-bit with KPL = 4; the row offsets are multiples of KPL elements).
template <typename T, int KPL>
__device__ __forceinline__ void lds_weight_row(uint32_t addr, float (&v)[KPL]) {
  static_assert(KPL == 2 || KPL == 4, "the tile kernel runs 2 or 4 channels a lane");
  if constexpr (sizeof(T) == 4 && KPL == 4) {
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "r"(addr) : "memory");
  } else if constexpr (sizeof(T) == 4) {
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v[0]), "=f"(v[1]) : "r"(addr) : "memory");
  } else {
    uint32_t raw[KPL / 2];
    if constexpr (KPL == 4) {
      asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(raw[0]), "=r"(raw[1]) : "r"(addr) : "memory");
    } else {
      asm volatile("ld.shared.u32 %0, [%1];" : "=r"(raw[0]) : "r"(addr) : "memory");
    }
    const T* h = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int j = 0; j < KPL; ++j) v[j] = to_float(h[j]);
  }
}

// The sweep over one channel's nonzeros. Registers cannot be indexed at run time, so every halo
// position has its own code with compile-time accumulator indices; the sweep visits the
// positions in a fixed order, four at a time, and branches (warp-uniformly: every lane holds
// the same ballot) past each group of four without a nonzero and then past each zero of the
// group. Only direct branches: the previous walk jumped per nonzero through a 60-way table
// (bit scan, jump-table load, indirect branch: ~22 instructions around 19 FFMAs); here a zero
// costs one predicated branch and an empty group of four one test. A group's values come by
// shuffle from the lanes that loaded them for the ballot, issued together before its FMAs
// (a broadcast shared-memory load per nonzero instead measured 1% faster at 90% zeros and 12%
// slower at 0-50%, H100).
template <int P0, int I, int R, int TH, int TW, int KPL>
__device__ __forceinline__ void sweep_position(uint32_t group_bits, const float (&v)[4],
                                               float (&acc)[TH * TW][KPL],
                                               const float (&wr)[R * R][KPL]) {
  constexpr int kHalo = (TH + R - 1) * (TW + R - 1);
  if constexpr (P0 + I < kHalo) {
    if (group_bits & (1u << I)) scatter_nonzero<P0 + I, R, TH, TW, KPL>(v[I], acc, wr);
  }
}

template <int G, int R, int TH, int TW, int KPL, int kWords>
__device__ __forceinline__ void sweep_group(const uint32_t (&bits)[kWords],
                                            const float (&lane_value)[kWords],
                                            float (&acc)[TH * TW][KPL],
                                            const float (&wr)[R * R][KPL]) {
  constexpr int kP0 = 4 * G, kWord = kP0 / 32, kShift = kP0 % 32;  // a group lies in one word
  const uint32_t group_bits = (bits[kWord] >> kShift) & 0xFu;
  if (group_bits == 0) return;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = __shfl_sync(0xffffffffu, lane_value[kWord], kShift + i);
  sweep_position<kP0, 0, R, TH, TW, KPL>(group_bits, v, acc, wr);
  sweep_position<kP0, 1, R, TH, TW, KPL>(group_bits, v, acc, wr);
  sweep_position<kP0, 2, R, TH, TW, KPL>(group_bits, v, acc, wr);
  sweep_position<kP0, 3, R, TH, TW, KPL>(group_bits, v, acc, wr);
}

template <int R, int TH, int TW, int KPL, int kWords, int... G>
__device__ __forceinline__ void sweep_groups(std::integer_sequence<int, G...>,
                                             const uint32_t (&bits)[kWords],
                                             const float (&lane_value)[kWords],
                                             float (&acc)[TH * TW][KPL],
                                             const float (&wr)[R * R][KPL]) {
  (sweep_group<G, R, TH, TW, KPL, kWords>(bits, lane_value, acc, wr), ...);
}

// Scatters every nonzero of one channel: bit i of bits[word] is halo position 32 word + i, its
// value held by lane i as lane_value[word].
template <int R, int TH, int TW, int KPL, int kWords>
__device__ __forceinline__ void sweep_nonzeros(const uint32_t (&bits)[kWords],
                                               const float (&lane_value)[kWords],
                                               float (&acc)[TH * TW][KPL],
                                               const float (&wr)[R * R][KPL]) {
  constexpr int kHalo = (TH + R - 1) * (TW + R - 1);
  static_assert(kWords * 32 >= kHalo, "one mask bit per halo position");
  sweep_groups<R, TH, TW, KPL, kWords>(std::make_integer_sequence<int, (kHalo + 3) / 4>{}, bits,
                                       lane_value, acc, wr);
}

__device__ __forceinline__ float tile_nan_relu(float v) { return (v > 0.0f || v != v) ? v : 0.0f; }

// Issues the loads of chunk c0 of the region's halo into `buf` ([rows x cols][TileXRow]):
// 16-byte cp.asyncs (zero-filled outside the image and past C) when pixel rows are 16-byte
// aligned (C a multiple of 16 / sizeof(T)), else plain loads.
template <typename T, int R>
__device__ __forceinline__ void stage_region_halo(T* buf, const T* __restrict__ x_img, int c0,
                                                  int ih0, int iw0, int rows, int cols,
                                                  const TileArgs& a) {
  constexpr int kBytes = sizeof(T);
  constexpr int kCh = TileChunkChannels(kBytes, R), kRow = TileXRow(kBytes, R);
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kVecsPerPos = kCh / kVec;
  const unsigned positions = rows * cols;
  if (a.C % kVec == 0) {
    for (unsigned v = threadIdx.x; v < positions * kVecsPerPos; v += blockDim.x) {
      const unsigned pos = v / kVecsPerPos, c = (v % kVecsPerPos) * kVec;
      const unsigned py = pos / cols;
      const int ih = ih0 + static_cast<int>(py), iw = iw0 + static_cast<int>(pos - py * cols);
      const bool valid = ih >= 0 && ih < a.H && iw >= 0 && iw < a.W && c0 + c < a.C;
      const T* src = valid ? x_img + (static_cast<int64_t>(ih) * a.W + iw) * a.C + c0 + c : x_img;
      mma::CpAsync16(buf + pos * kRow + c, src, valid);
    }
    return;
  }
  for (int e = threadIdx.x; e < static_cast<int>(positions) * kCh; e += blockDim.x) {
    const int pos = e / kCh, c = e % kCh;
    const int py = pos / cols, ih = ih0 + py, iw = iw0 + pos - py * cols;
    T v = from_float<T>(0.0f);  // padding and channels past C never contribute
    if (ih >= 0 && ih < a.H && iw >= 0 && iw < a.W && c0 + c < a.C)
      v = x_img[(static_cast<int64_t>(ih) * a.W + iw) * a.C + c0 + c];
    buf[pos * kRow + c] = v;
  }
}

// Issues the loads of chunk c0's weights of output channels [k0, k0 + 32 KPL) into `buf`
// ([tap][chunk channel][32 KPL]): 16-byte cp.asyncs when K is a multiple of 16 / sizeof(T)
// (rows 16-byte aligned; a vector is then wholly in or past K), zero past C and K.
template <typename T, int R, int KPL>
__device__ __forceinline__ void stage_block_weights(T* buf, const T* __restrict__ w, int c0,
                                                    int k0, const TileArgs& a) {
  constexpr int kCh = TileChunkChannels(sizeof(T), R), kCols = 32 * KPL;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kVecsPerRow = kCols / kVec;
  if (a.K % kVec == 0) {
    // A thread keeps one column and steps over rows (unsigned: shifts, no sign fix-ups).
    const unsigned col = (threadIdx.x % kVecsPerRow) * kVec, k = k0 + col;
    const unsigned step = blockDim.x / kVecsPerRow;
    const bool k_in = k < static_cast<unsigned>(a.K);
    for (unsigned row = threadIdx.x / kVecsPerRow; row < R * R * kCh; row += step) {
      const unsigned t = row / kCh, c = c0 + row % kCh;
      const bool valid = k_in && c < static_cast<unsigned>(a.C);
      const T* src = valid ? w + (static_cast<int64_t>(t) * a.C + c) * a.K + k : w;
      mma::CpAsync16(buf + row * kCols + col, src, valid);
    }
    return;
  }
  for (int e = threadIdx.x; e < R * R * kCh * kCols; e += blockDim.x) {
    const int row = e / kCols, col = e % kCols;
    const int t = row / kCh, c = c0 + row % kCh, k = k0 + col;
    buf[e] = (c < a.C && k < a.K) ? w[(static_cast<int64_t>(t) * a.C + c) * a.K + k]
                                  : from_float<T>(0.0f);
  }
}

template <typename T, int R, int TH, int TW, int KPL, bool SPLIT>
__global__ void __launch_bounds__(32 * TileMaxWarps(R, TH, TW, KPL), 1)
    sparse_tile_conv(TileArgs a, const T* __restrict__ x, const T* __restrict__ w,
                     const T* __restrict__ bias, T* __restrict__ y, float* __restrict__ partials) {
  constexpr int kHaloW = TW + R - 1, kHalo = (TH + R - 1) * kHaloW;
  constexpr int kWords = (kHalo + 31) / 32;
  constexpr int kBytes = sizeof(T);
  constexpr int kCh = TileChunkChannels(kBytes, R), kRow = TileXRow(kBytes, R), kCols = 32 * KPL;
  extern __shared__ __align__(16) unsigned char tile_smem[];
  const int halo_rows = a.warps_y * TH + R - 1, halo_cols = a.warps_x * TW + R - 1;
  const int64_t halo_elems = TileHaloElems(kBytes, R, TH, TW, a.warps_y, a.warps_x);
  T* const xs = reinterpret_cast<T*>(tile_smem);  // [2][halo_elems], then [2][weights]
  T* const ws = xs + 2 * halo_elems;
  const uint32_t xs_addr = mma::SmemAddr(xs), ws_addr = mma::SmemAddr(ws);
  constexpr int64_t kWeightElems = TileWeightElems(kBytes, R, KPL);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wy = warp / a.warps_x, wx = warp - wy * a.warps_x;
  const int rw_i = blockIdx.x % a.regions_w;
  const int rest = blockIdx.x / a.regions_w;
  const int rh_i = rest % a.regions_h, n = rest / a.regions_h;
  const int oh_r = rh_i * a.warps_y * TH, ow_r = rw_i * a.warps_x * TW;  // region origin
  const int oh0 = oh_r + wy * TH, ow0 = ow_r + wx * TW;                   // this warp's tile
  const int k0 = blockIdx.y * kCols, k = k0 + lane * KPL;
  const bool tile_live = oh0 < a.P && ow0 < a.Q;  // warp-uniform
  const T* x_img = x + static_cast<int64_t>(n) * a.H * a.W * a.C;

  // The lane's halo positions word * 32 + lane, as offsets into a halo buffer (-1: none).
  int xoff[kWords];
#pragma unroll
  for (int word = 0; word < kWords; ++word) {
    const int pos = word * 32 + lane;
    const int hy = pos / kHaloW, hx = pos % kHaloW;
    xoff[word] = pos < kHalo ? ((wy * TH + hy) * halo_cols + wx * TW + hx) * kRow : -1;
  }

  float acc[TH * TW][KPL];
#pragma unroll
  for (int i = 0; i < TH * TW; ++i)
#pragma unroll
    for (int j = 0; j < KPL; ++j) acc[i][j] = 0.0f;

  const int chunks = (a.C + kCh - 1) / kCh;
  const int chunk_begin = blockIdx.z * a.chunks_per_split;
  const int chunk_end = min(chunks, chunk_begin + a.chunks_per_split);
  auto stage = [&](int chunk, int buf) {
    stage_region_halo<T, R>(xs + buf * halo_elems, x_img, chunk * kCh, oh_r - a.pad_h,
                            ow_r - a.pad_w, halo_rows, halo_cols, a);
    stage_block_weights<T, R, KPL>(ws + buf * kWeightElems, w, chunk * kCh, k0, a);
  };
  if (chunk_begin < chunk_end) stage(chunk_begin, 0);
  mma::CpAsyncCommit();
  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    const int buf = (chunk - chunk_begin) & 1;
    __syncthreads();  // every warp is done with the other buffers
    if (chunk + 1 < chunk_end) stage(chunk + 1, buf ^ 1);
    mma::CpAsyncCommit();
    mma::CpAsyncWait<1>();  // this chunk has landed (the next may be in flight)
    __syncthreads();
    if (!tile_live) continue;
    const uint32_t xb = xs_addr + static_cast<uint32_t>(buf * halo_elems * kBytes);
    const uint32_t wb = ws_addr + static_cast<uint32_t>((buf * kWeightElems + lane * KPL) * kBytes);
    const int channels = min(kCh, a.C - chunk * kCh);
    // The lane's halo values of a channel (0 past the halo). Loaded one channel ahead, so the
    // ballot does not wait on them; past the chunk's last channel the read stays in the row's
    // padding and is unused.
    auto load_halo_values = [&](int cc, float (&v)[kWords]) {
#pragma unroll
      for (int word = 0; word < kWords; ++word)
        v[word] = xoff[word] >= 0 ? lds_value<T>(xb + (xoff[word] + cc) * kBytes) : 0.0f;
    };
    float next_xv[kWords];
    load_halo_values(0, next_xv);
    for (int cc = 0; cc < channels; ++cc) {
      float xv[kWords];
#pragma unroll
      for (int word = 0; word < kWords; ++word) xv[word] = next_xv[word];
      load_halo_values(cc + 1, next_xv);
      // NaN counts as nonzero: it propagates as in dense.
      uint32_t bits[kWords], any = 0;
#pragma unroll
      for (int word = 0; word < kWords; ++word) {
        bits[word] = __ballot_sync(0xffffffffu, xv[word] != 0.0f);
        any |= bits[word];
      }
      if (any == 0) continue;  // warp-uniform: no nonzero, no weight reads
      float wr[R * R][KPL];
#pragma unroll
      for (int t = 0; t < R * R; ++t)
        lds_weight_row<T, KPL>(wb + (t * kCh + cc) * kCols * kBytes, wr[t]);
      sweep_nonzeros<R, TH, TW, KPL, kWords>(bits, xv, acc, wr);
    }
  }
  if (!tile_live) return;

  float b[KPL];
#pragma unroll
  for (int j = 0; j < KPL; ++j) b[j] = (!SPLIT && bias != nullptr && k + j < a.K) ? to_float(bias[k + j]) : 0.0f;
#pragma unroll
  for (int i = 0; i < TH * TW; ++i) {
    const int oh = oh0 + i / TW, ow = ow0 + i % TW;
    if (oh >= a.P || ow >= a.Q) continue;
    const int64_t m = (static_cast<int64_t>(n) * a.P + oh) * a.Q + ow;
    if constexpr (SPLIT) {
      float* out = partials + (static_cast<int64_t>(blockIdx.z) * a.M + m) * a.K;
#pragma unroll
      for (int j = 0; j < KPL; ++j)
        if (k + j < a.K) out[k + j] = acc[i][j];
    } else {
      T* out = y + m * a.K;
#pragma unroll
      for (int j = 0; j < KPL; ++j) {
        if (k + j < a.K) {
          float v = acc[i][j] + b[j];
          if (a.activation == 1) v = tile_nan_relu(v);
          out[k + j] = from_float<T>(v);
        }
      }
    }
  }
}

// y = act(sum over splits of partials + bias), summed in split order.
template <typename T>
__global__ void finalize_split_partials(const float* __restrict__ partials, int splits,
                                        int64_t elems, int K, const T* __restrict__ bias,
                                        int activation, T* __restrict__ y) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < elems;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = 0.0f;
    for (int z = 0; z < splits; ++z) v += partials[z * elems + e];
    if (bias != nullptr) v += to_float(bias[e % K]);
    if (activation == 1) v = tile_nan_relu(v);
    y[e] = from_float<T>(v);
  }
}

}  // namespace sparse
}  // namespace jaxcnn
