// The tile kernel of the zero-skipping conv: stride 1, dilation 1, square R x R windows
// (R = 1, 3, 5), no pool. Input-stationary scatter into an output tile held in registers.
//
// A CTA owns a TH x TW tile of output pixels of one image and a block of output channels; each
// warp owns 32 * KPL of those channels (lane: KPL consecutive k) and accumulates the whole tile
// for them: acc[TH * TW][KPL] in registers. Per chunk of 32 input channels the CTA stages the
// tile's input halo ((TH + R - 1) x (TW + R - 1) pixels) in shared memory (cp.async, double
// buffered: the next chunk loads during this one's walk), and ballots a bitmask of its
// nonzeros per channel. Then, per channel, every warp loads its R*R*KPL weights
// once and walks the set bits only: a nonzero at halo position pos hits the output pixels
// pos - (r, s) that lie in the tile, so `switch (pos)` jumps to code with compile-time
// accumulator indices (registers cannot be indexed at run time). The walk is warp-uniform (every
// lane sees the same mask), so it never diverges, and its length is the number of nonzeros.
// Each weight load serves every nonzero of its channel in the halo: reuse grows with the tile.
//
// With SPLIT, grid.z splits the input channels; each split stores raw fp32 partial sums into
// its slice of the workspace and finalize_split_partials adds them in a fixed order (bitwise
// deterministic), then bias, activation and the single rounding to T.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/float_convert.cuh"
#include "common/mma_sm80.cuh"

namespace jaxcnn {
namespace sparse {

constexpr int kTileChannels = 32;  // input channels per staged chunk (one ballot word per pos)

struct TileArgs {
  int N, H, W, C, K, P, Q, pad_h, pad_w, activation;
  int tiles_h, tiles_w;      // output tiles per image
  int chunks_per_split;      // 32-channel chunks each grid.z slice walks
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

// One case per halo position below 128 (the largest halo, 5x5 on a 4 x 8 tile, has 96).
#define JAXCNN_SCATTER_CASE(i)                                        \
  case (i):                                                           \
    if constexpr ((i) < kHalo) scatter_nonzero<(i), R, TH, TW, KPL>(v, acc, wr); \
    break;
#define JAXCNN_SCATTER_CASES8(b)                                                        \
  JAXCNN_SCATTER_CASE(b + 0) JAXCNN_SCATTER_CASE(b + 1) JAXCNN_SCATTER_CASE(b + 2)      \
  JAXCNN_SCATTER_CASE(b + 3) JAXCNN_SCATTER_CASE(b + 4) JAXCNN_SCATTER_CASE(b + 5)      \
  JAXCNN_SCATTER_CASE(b + 6) JAXCNN_SCATTER_CASE(b + 7)

template <int R, int TH, int TW, int KPL>
__device__ __forceinline__ void scatter_at(int pos, float v, float (&acc)[TH * TW][KPL],
                                           const float (&wr)[R * R][KPL]) {
  constexpr int kHalo = (TH + R - 1) * (TW + R - 1);
  static_assert(kHalo <= 128, "halo larger than the scatter switch");
  switch (pos) {
    JAXCNN_SCATTER_CASES8(0) JAXCNN_SCATTER_CASES8(8) JAXCNN_SCATTER_CASES8(16)
    JAXCNN_SCATTER_CASES8(24) JAXCNN_SCATTER_CASES8(32) JAXCNN_SCATTER_CASES8(40)
    JAXCNN_SCATTER_CASES8(48) JAXCNN_SCATTER_CASES8(56) JAXCNN_SCATTER_CASES8(64)
    JAXCNN_SCATTER_CASES8(72) JAXCNN_SCATTER_CASES8(80) JAXCNN_SCATTER_CASES8(88)
    JAXCNN_SCATTER_CASES8(96) JAXCNN_SCATTER_CASES8(104) JAXCNN_SCATTER_CASES8(112)
    JAXCNN_SCATTER_CASES8(120)
    default: break;
  }
}
#undef JAXCNN_SCATTER_CASES8
#undef JAXCNN_SCATTER_CASE

// KPL weights w[tap, c, k .. k + KPL) as fp32; k past K reads as zero.
template <typename T, int KPL>
__device__ __forceinline__ void load_weight_row(const T* __restrict__ row, int k, int K,
                                                bool vector_ok, float (&v)[KPL]) {
  if (vector_ok && k + KPL <= K) {
    if constexpr (sizeof(T) == 4 && KPL == 4) {
      const float4 q = __ldg(reinterpret_cast<const float4*>(row + k));
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
      return;
    } else if constexpr (sizeof(T) == 4 && KPL == 2) {
      const float2 q = __ldg(reinterpret_cast<const float2*>(row + k));
      v[0] = q.x, v[1] = q.y;
      return;
    } else if constexpr (sizeof(T) == 2 && KPL == 4) {
      const uint2 raw = __ldg(reinterpret_cast<const uint2*>(row + k));
      const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = to_float(h[j]);
      return;
    } else if constexpr (sizeof(T) == 2 && KPL == 2) {
      const uint32_t raw = __ldg(reinterpret_cast<const unsigned int*>(row + k));
      const T* h = reinterpret_cast<const T*>(&raw);
      v[0] = to_float(h[0]), v[1] = to_float(h[1]);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < KPL; ++j) v[j] = k + j < K ? to_float(row[k + j]) : 0.0f;
}

// The lane's weights of input channel c: wr[tap][j] = w[tap, c, k + j]. `row` points at
// w[0, c, k]; taps are tap_stride = C * K elements apart. `full`: the lane's KPL weights are in
// range and vector-aligned (decided once per thread), so the loads carry no per-tap checks.
template <typename T, int R, int KPL>
__device__ __forceinline__ void load_channel_weights(const T* __restrict__ row, int64_t tap_stride,
                                                     int k, int K, bool full,
                                                     float (&wr)[R * R][KPL]) {
  if (full) {
#pragma unroll
    for (int t = 0; t < R * R; ++t) load_weight_row<T, KPL>(row + t * tap_stride, 0, KPL, true, wr[t]);
  } else {
#pragma unroll
    for (int t = 0; t < R * R; ++t)
#pragma unroll
      for (int j = 0; j < KPL; ++j) wr[t][j] = k + j < K ? to_float(row[t * tap_stride + j]) : 0.0f;
  }
}

__device__ __forceinline__ float tile_nan_relu(float v) { return (v > 0.0f || v != v) ? v : 0.0f; }

// Shared-memory row of one halo pixel: the chunk's 32 channels as stored (T), padded by 16 bytes
// so rows stay 16-byte aligned for cp.async and the ballot's column reads spread over banks.
template <typename T>
constexpr int kRowElems = kTileChannels + 16 / static_cast<int>(sizeof(T));

// Issues the loads of chunk c0's halo into `buf` ([halo][kRowElems<T>]): 16-byte cp.asyncs
// (zero-filled outside the image and past C) when rows are 16-byte aligned (C a multiple of
// 16 / sizeof(T)), else plain loads, four in flight a thread.
template <typename T, int kHalo, int kHaloW>
__device__ __forceinline__ void stage_halo(T* buf, const T* __restrict__ x_img, int c0, int ih0,
                                           int iw0, const TileArgs& a) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kVecsPerPos = kTileChannels / kVec;
  if (a.C % kVec == 0) {
    for (int v = threadIdx.x; v < kHalo * kVecsPerPos; v += blockDim.x) {
      const int pos = v / kVecsPerPos, c = (v % kVecsPerPos) * kVec;
      const int ih = ih0 + pos / kHaloW, iw = iw0 + pos % kHaloW;
      const bool valid = ih >= 0 && ih < a.H && iw >= 0 && iw < a.W && c0 + c < a.C;
      const T* src = valid ? x_img + (static_cast<int64_t>(ih) * a.W + iw) * a.C + c0 + c : x_img;
      mma::CpAsync16L1(buf + pos * kRowElems<T> + c, src, valid);
    }
    return;
  }
  constexpr int kUnroll = 4;
  for (int e0 = threadIdx.x; e0 < kHalo * kTileChannels; e0 += kUnroll * blockDim.x) {
    T v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int e = e0 + u * blockDim.x;
      const int c = e % kTileChannels, pos = e / kTileChannels;
      const int ih = ih0 + pos / kHaloW, iw = iw0 + pos % kHaloW;
      v[u] = from_float<T>(0.0f);  // padding and channels past C never contribute
      if (e < kHalo * kTileChannels && ih >= 0 && ih < a.H && iw >= 0 && iw < a.W && c0 + c < a.C)
        v[u] = x_img[(static_cast<int64_t>(ih) * a.W + iw) * a.C + c0 + c];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int e = e0 + u * blockDim.x;
      if (e < kHalo * kTileChannels) buf[(e / kTileChannels) * kRowElems<T> + e % kTileChannels] = v[u];
    }
  }
}

template <typename T, int R, int TH, int TW, int KPL, bool SPLIT>
__global__ void __launch_bounds__(128)
    sparse_tile_conv(TileArgs a, const T* __restrict__ x, const T* __restrict__ w,
                     const T* __restrict__ bias, T* __restrict__ y, float* __restrict__ partials) {
  constexpr int kHaloH = TH + R - 1, kHaloW = TW + R - 1, kHalo = kHaloH * kHaloW;
  constexpr int kWords = (kHalo + 31) / 32;
  constexpr int kRow = kRowElems<T>;
  // Two chunks of halo (the next one loads while this one is walked), then the masks.
  __shared__ __align__(16) T xs[2][kHalo * kRow];
  __shared__ uint32_t nz[kTileChannels * kWords];  // [channel][word]: nonzero positions

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int tw_i = blockIdx.x % a.tiles_w;
  const int rest = blockIdx.x / a.tiles_w;
  const int th_i = rest % a.tiles_h, n = rest / a.tiles_h;
  const int oh0 = th_i * TH, ow0 = tw_i * TW;
  const int ih0 = oh0 - a.pad_h, iw0 = ow0 - a.pad_w;
  const int k = (blockIdx.y * warps + warp) * 32 * KPL + lane * KPL;
  const bool warp_active = (blockIdx.y * warps + warp) * 32 * KPL < a.K;
  // Vector weight loads need K % KPL == 0 (16- or 8-byte aligned rows) and all KPL in range.
  const bool full = a.K % KPL == 0 && k + KPL <= a.K;
  const int64_t tap_stride = static_cast<int64_t>(a.C) * a.K;
  const T* w_lane = w + k;  // w[0, 0, k]
  const T* x_img = x + static_cast<int64_t>(n) * a.H * a.W * a.C;

  float acc[TH * TW][KPL];
#pragma unroll
  for (int i = 0; i < TH * TW; ++i)
#pragma unroll
    for (int j = 0; j < KPL; ++j) acc[i][j] = 0.0f;

  const int chunks = (a.C + kTileChannels - 1) / kTileChannels;
  const int chunk_begin = blockIdx.z * a.chunks_per_split;
  const int chunk_end = min(chunks, chunk_begin + a.chunks_per_split);
  const int c_end = min(a.C, chunk_end * kTileChannels);
  // Weights of the next channel load while this one is walked (they come from L2).
  float wr[R * R][KPL];
  auto load_w = [&](int c, float (&dst)[R * R][KPL]) {
    load_channel_weights<T, R, KPL>(w_lane + static_cast<int64_t>(c) * a.K, tap_stride, k, a.K,
                                    full, dst);
  };
  if (warp_active) load_w(chunk_begin * kTileChannels, wr);
  stage_halo<T, kHalo, kHaloW>(xs[0], x_img, chunk_begin * kTileChannels, ih0, iw0, a);
  mma::CpAsyncCommit();
  for (int chunk = chunk_begin; chunk < chunk_end; ++chunk) {
    const int c0 = chunk * kTileChannels, buf = (chunk - chunk_begin) & 1;
    __syncthreads();  // every warp is done with the other buffer and with the masks
    if (chunk + 1 < chunk_end)
      stage_halo<T, kHalo, kHaloW>(xs[buf ^ 1], x_img, c0 + kTileChannels, ih0, iw0, a);
    mma::CpAsyncCommit();
    mma::CpAsyncWait<1>();  // this chunk's halo has landed (the next may be in flight)
    __syncthreads();
    const T* xb = xs[buf];
    // One ballot per (channel, 32 positions). NaN counts as nonzero: it propagates as in dense.
    for (int e = warp; e < kTileChannels * kWords; e += warps) {
      const int cc = e / kWords, pos = (e % kWords) * 32 + lane;
      const bool nonzero = pos < kHalo && to_float(xb[pos * kRow + cc]) != 0.0f;
      const uint32_t bits = __ballot_sync(0xffffffffu, nonzero);
      if (lane == 0) nz[e] = bits;
    }
    __syncthreads();
    if (!warp_active) continue;
    const int channels = min(kTileChannels, a.C - c0);
    // One walk per channel, then a register copy of the prefetched weights: unrolling by two
    // channels with alternating register sets (no copy) duplicates the walk's switch and
    // measured slower on H200 (VGG conv3_2 N=64, 90% zeros: 6.6 vs 5.4 ms).
    for (int cc = 0; cc < channels; ++cc) {
      float wn[R * R][KPL];
      if (c0 + cc + 1 < c_end) load_w(c0 + cc + 1, wn);
#pragma unroll
      for (int word = 0; word < kWords; ++word) {
        uint32_t bits = nz[cc * kWords + word];
        while (bits != 0) {  // warp-uniform: one trip per nonzero
          const int pos = word * 32 + __ffs(bits) - 1;
          bits &= bits - 1;
          scatter_at<R, TH, TW, KPL>(pos, to_float(xb[pos * kRow + cc]), acc, wr);
        }
      }
#pragma unroll
      for (int t = 0; t < R * R; ++t)
#pragma unroll
        for (int j = 0; j < KPL; ++j) wr[t][j] = wn[t][j];
    }
  }
  if (!warp_active) return;

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
