// conv1x1 -> depthwise3x3 straight fusion (bf16/fp16, sm_80+); see chain.h for the math.
//
// One CTA per tile_h x tile_w output tile, 8 warps. Its input halo ((tile - 1) * stride + 3
// pixels a side, all C channels) is loaded once and stays resident; then for each 64-channel
// block of t (= of y: the depthwise keeps channels):
//   1x1: [halo px x C] x [C x 64] on mma.sync (m16 tiles of halo pixels dealt to the warps),
//     bias + act1, rounded to T, zero outside the image (the depthwise's padding applies to
//     t), stored as fp32 into the t tile [halo px][64]: the depthwise reads every element 9
//     (stride 1) times, fp32 saves a conversion per read;
//   depthwise: each thread owns 4 channels of the block (their 9 taps in registers) and walks
//     strips of 4 output rows of one column, each t load (16 bytes) feeding every output of
//     the strip that reads it; bias + act2, 8-byte stores to y.
// The 1x1 weights of block b + 1 stream in (cp.async) while block b computes. t never reaches
// DRAM: the saving is its write and read (2 x N H W M x sizeof(T), M = 6 C in MobileNetV2).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "chain/chain_common.cuh"
#include "common/float_convert.cuh"
#include "common/mma_sm80.cuh"

namespace jaxcnn {
namespace chain {

constexpr int kDwWStride = OddVecStride(kBlockN);  // 1x1 weight rows of a 64-column block
constexpr int kDwTStride = kBlockN + 4;           // fp32 t rows: 16-byte aligned
constexpr int kDwVecs = kBlockN / 4;               // 4-channel vectors per t row

struct DwArgs {
  int N, H, W, C, M, P, Q;
  int pad_top, pad_left;  // the depthwise's zero rows above / columns left of t
  Clamp act1, act2;  // the activations as clamps
  int tile_h, tile_w, tiles_h, tiles_w;
  int halo_h, halo_w, halo_rows;  // halo_rows: halo pixels rounded up to 16 (zero rows)
  int cp;                         // C rounded up to 16 (zero columns)
  int x_stride;                   // OddVecStride(cp)
  int m_blocks;
  int m_split, m_blocks_per_cta;  // CTAs per tile sharing its channel blocks (each loads the
                                  // halo: only for grids too small to fill the GPU)
  // Offsets (bytes) of the shared-memory regions.
  int off_w, w_slot_bytes, off_t;
};

// Two T from global memory as floats (4-byte aligned).
template <typename T>
__device__ __forceinline__ float2 Load2(const T* p) {
  const uint32_t bits = *reinterpret_cast<const uint32_t*>(p);
  const T* v = reinterpret_cast<const T*>(&bits);
  return make_float2(to_float(v[0]), to_float(v[1]));
}
// Four T from global memory as floats (8-byte aligned).
template <typename T>
__device__ __forceinline__ void Load4(const T* p, float (&out)[4]) {
  const uint2 bits = *reinterpret_cast<const uint2*>(p);
  const T* v = reinterpret_cast<const T*>(&bits);
#pragma unroll
  for (int k = 0; k < 4; ++k) out[k] = to_float(v[k]);
}

constexpr int kStripRows = 4;  // output rows per depthwise item (tile_h is a multiple)

// Two CTAs per SM where the shared memory allows (<= 128 registers). kOther: an activation is
// no clamp (see Activate).
template <typename T, int kStride, bool kOther>
__global__ void __launch_bounds__(kThreads, 2)
    conv1x1_depthwise_kernel(DwArgs a, const T* __restrict__ x, const T* __restrict__ w1,
                             const T* __restrict__ b1, const T* __restrict__ wd,
                             const T* __restrict__ bd, T* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using mma::CpAsync16;
  using mma::CpAsyncCommit;
  using mma::CpAsyncWait;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const xs = reinterpret_cast<T*>(smem_raw);
  float* const ts = reinterpret_cast<float*>(smem_raw + a.off_t);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;

  const int tiles = a.tiles_h * a.tiles_w;
  const int tile = blockIdx.x / a.m_split;
  const int n = tile / tiles;
  const int oy0 = (tile % tiles) / a.tiles_w * a.tile_h;
  const int ox0 = (tile % tiles) % a.tiles_w * a.tile_w;
  const int b_begin = (blockIdx.x % a.m_split) * a.m_blocks_per_cta;
  const int b_end = min(a.m_blocks, b_begin + a.m_blocks_per_cta);
  const int iy0 = oy0 * kStride - a.pad_top, ix0 = ox0 * kStride - a.pad_left;  // halo origin
  const int halo_pixels = a.halo_h * a.halo_w;

  // Group 0: the halo (zero outside the image, past C and in the padding rows).
  {
    const int vecs = a.cp / 8;
    const T* const x_img = x + static_cast<int64_t>(n) * a.H * a.W * a.C;
    for (int e = threadIdx.x; e < a.halo_rows * vecs; e += kThreads) {
      const int p = e / vecs, v = e % vecs;
      const int gy = iy0 + p / a.halo_w, gx = ix0 + p % a.halo_w, c = v * 8;
      const bool valid = p < halo_pixels && c < a.C &&
                         static_cast<unsigned>(gy) < static_cast<unsigned>(a.H) &&
                         static_cast<unsigned>(gx) < static_cast<unsigned>(a.W);
      CpAsync16(xs + p * a.x_stride + c,
                valid ? x_img + (static_cast<int64_t>(gy) * a.W + gx) * a.C + c : x, valid);
    }
  }
  // The 1x1 weights of block b into slot b % 2, zero past C and M.
  auto issue_weights = [&](int b) {
    T* const slot = reinterpret_cast<T*>(smem_raw + a.off_w + ((b - b_begin) % 2) * a.w_slot_bytes);
    const int m0 = b * kBlockN;
    for (int e = threadIdx.x; e < a.cp * (kBlockN / 8); e += kThreads) {
      const int r = e / (kBlockN / 8), v = e % (kBlockN / 8);
      const bool valid = r < a.C && m0 + v * 8 < a.M;
      CpAsync16(slot + r * kDwWStride + v * 8,
                valid ? w1 + static_cast<int64_t>(r) * a.M + m0 + v * 8 : w1, valid);
    }
  };
  issue_weights(b_begin);
  CpAsyncCommit();
  if (b_begin + 1 < b_end) issue_weights(b_begin + 1);
  CpAsyncCommit();

  const int m_tiles = a.halo_rows / 16;
  static_assert(kThreads / kDwVecs == 16, "every tile width (16, 8, 4) divides a pass");
  const int vec = threadIdx.x % kDwVecs;  // this thread's 4 channels of every block
  for (int b = b_begin; b < b_end; ++b) {
    const int m0 = b * kBlockN;
    CpAsyncWait<1>();  // block b's weights (and the halo) have landed
    __syncthreads();   // ... for every thread; and the last block's depthwise is done with t
    const T* const ws =
        reinterpret_cast<const T*>(smem_raw + a.off_w + ((b - b_begin) % 2) * a.w_slot_bytes);

    // This thread's bias pairs of the block (zero past M: those t columns are never read).
    float2 bias1[8];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int col = m0 + nt * 8 + 2 * q;
      bias1[nt] = col < a.M ? Load2(b1 + col) : make_float2(0.0f, 0.0f);
    }
    // ---- 1x1 over the halo: warp takes m16 tiles warp, warp + 8, ...
    for (int mt = warp; mt < m_tiles; mt += kWarps) {
      float acc[8][4] = {};
      const T* const xa = xs + (mt * 16 + lane % 16) * a.x_stride + (lane / 16) * 8;
      const T* const wb = ws + (lane % 16) * kDwWStride + (lane / 16) * 8;
      for (int ks = 0; ks < a.cp / 16; ++ks) {
        uint32_t af[4], bf[4][4];
        mma::LdMatrixX4(af, xa + ks * 16);
#pragma unroll
        for (int np = 0; np < 4; ++np)
          mma::LdMatrixX4Trans(bf[np], wb + ks * 16 * kDwWStride + np * 16);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          mma::Mma<T>(acc[2 * np], af, bf[np][0], bf[np][1]);
          mma::Mma<T>(acc[2 * np + 1], af, bf[np][2], bf[np][3]);
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int p = mt * 16 + g + 8 * half;
        const int gy = iy0 + p / a.halo_w, gx = ix0 + p % a.halo_w;
        const bool inside = p < halo_pixels &&
                            static_cast<unsigned>(gy) < static_cast<unsigned>(a.H) &&
                            static_cast<unsigned>(gx) < static_cast<unsigned>(a.W);
        float* const row = ts + p * kDwTStride;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          // Rounded to T as the unfused layer's output would be.
          float lo = to_float(from_float<T>(Activate<kOther>(acc[nt][2 * half] + bias1[nt].x, a.act1)));
          float hi = to_float(from_float<T>(Activate<kOther>(acc[nt][2 * half + 1] + bias1[nt].y, a.act1)));
          if (!inside) lo = hi = 0.0f;
          *reinterpret_cast<float2*>(row + nt * 8 + 2 * q) = make_float2(lo, hi);
        }
      }
    }
    __syncthreads();  // t is complete; slot b % 2 is free
    if (b + 2 < b_end) issue_weights(b + 2);
    CpAsyncCommit();

    // ---- depthwise 3x3 on the t tile: each item is a strip of kStripRows output rows of one
    // column (their input rows overlap: each t load feeds up to 3 / stride outputs).
    // tile_w divides the 16 items a pass covers: a thread keeps its column and steps its
    // strip by 16 / tile_w strips per pass (no division in the loop).
    constexpr int kPerPass = kThreads / kDwVecs;
    const int c = m0 + vec * 4;
    const int ox = threadIdx.x / kDwVecs % a.tile_w;
    if (c < a.M && ox0 + ox < a.Q) {
      float wk[9][4], bias[4];
      Load4(bd + c, bias);
#pragma unroll
      for (int tap = 0; tap < 9; ++tap) Load4(wd + tap * a.M + c, wk[tap]);
      constexpr int kInRows = (kStripRows - 1) * kStride + 3;
      const int oy_step = kPerPass / a.tile_w * kStripRows;
      const int oy_end = min(a.tile_h, a.P - oy0);
      for (int oy = threadIdx.x / kDwVecs / a.tile_w * kStripRows; oy < oy_end; oy += oy_step) {
        float out[kStripRows][4];
#pragma unroll
        for (int j = 0; j < kStripRows; ++j)
#pragma unroll
          for (int k = 0; k < 4; ++k) out[j][k] = bias[k];
        const float* const t0 =
            ts + (oy * kStride * a.halo_w + ox * kStride) * kDwTStride + vec * 4;
#pragma unroll
        for (int r = 0; r < kInRows; ++r)
#pragma unroll
          for (int dx = 0; dx < 3; ++dx) {
            const float4 v =
                *reinterpret_cast<const float4*>(t0 + (r * a.halo_w + dx) * kDwTStride);
#pragma unroll
            for (int j = 0; j < kStripRows; ++j) {
              const int dy = r - j * kStride;
              if (dy < 0 || dy > 2) continue;
              const float* const wt = wk[dy * 3 + dx];
              out[j][0] = fmaf(v.x, wt[0], out[j][0]);
              out[j][1] = fmaf(v.y, wt[1], out[j][1]);
              out[j][2] = fmaf(v.z, wt[2], out[j][2]);
              out[j][3] = fmaf(v.w, wt[3], out[j][3]);
            }
          }
        T* const y_px = y + ((static_cast<int64_t>(n) * a.P + oy0 + oy) * a.Q + ox0 + ox) * a.M + c;
#pragma unroll
        for (int j = 0; j < kStripRows; ++j) {
          if (oy0 + oy + j >= a.P) break;
          *reinterpret_cast<uint2*>(y_px + static_cast<int64_t>(j) * a.Q * a.M) = make_uint2(
              mma::PackPair<T>(Activate<kOther>(out[j][0], a.act2), Activate<kOther>(out[j][1], a.act2)),
              mma::PackPair<T>(Activate<kOther>(out[j][2], a.act2), Activate<kOther>(out[j][3], a.act2)));
        }
      }
    }
  }
#endif
}

}  // namespace chain
}  // namespace jaxcnn
