// conv3x3 -> conv1x1 straight fusion on mma.sync (bf16/fp16, sm_80+); see chain.h for the math.
//
// One CTA per 8 x 16 output tile, 8 warps; warp w owns output row w (one m16 MMA tile).
//   stage 1: for each 64-channel block of the intermediate t, the 3x3 as an implicit GEMM
//     [16 px x 9 C] x [9 C x 64] per warp: the input halo (10 x 18 px) and the weights stream in
//     kCC-channel chunks through a ring of kStages cp.async slots; the nine taps are shifted ldmatrix row
//     addresses into the same halo chunk. Bias + act1, rounded to T, into the t tile
//     [128 px][M] that stays in shared memory for the whole tile.
//   stage 2: for each 64-channel block of y, [16 px x M] x [M x 64] per warp with t as A and
//     the 1x1 weights streamed in 64-row pieces through the same slots; bias + act2 on the
//     fragments, stored straight to y.
// t never reaches DRAM: the saving is its write and read (2 x N H W M x sizeof(T)).
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

constexpr int kC31TileH = 8, kC31TileW = 16;
constexpr int kC31HaloW = kC31TileW + 2;
constexpr int kC31HaloPixels = (kC31TileH + 2) * kC31HaloW;  // 180
constexpr int kC31WStride = OddVecStride(kBlockN);          // weight rows of a 64-col block

// Elements (T) of one pipeline slot: a stage-1 chunk (halo + 3x3 weights) or, smaller, a
// stage-2 piece of 1x1 weights [64 rows][64 cols].
__host__ __device__ constexpr int C31XStride(int cc) { return OddVecStride(cc); }
__host__ __device__ constexpr int C31SlotElems(int cc) {
  return kC31HaloPixels * C31XStride(cc) + 9 * cc * kC31WStride;
}

struct C31Args {
  int N, H, W, C, M, K;
  Clamp act1, act2;  // the activations as clamps
  int tiles_h, tiles_w;
  int c_chunks;      // ceil(C / kCC)
  int m_blocks;      // ceil(M / 64): stage-1 blocks
  int m_pieces;      // ceil(Mp / 64): stage-2 K pieces
  int k_blocks;      // ceil(K / 64): stage-2 blocks
  int k_split, k_blocks_per_cta;  // CTAs per tile sharing its stage-2 blocks (each
                                  // recomputes t: only for grids too small to fill the GPU)
  int mp;            // M rounded up to 16 (t columns; the padding is zero)
  int t_stride;      // OddVecStride(mp)
};

using mma::CpAsync16;
using mma::CpAsync16L1;
using mma::CpAsyncCommit;
using mma::CpAsyncWait;
using mma::LdMatrixX4;
using mma::LdMatrixX4Trans;
using mma::Mma;
using mma::PackPair;

// kCC: input channels per stage-1 chunk (16 or 32); kStages: pipeline slots; kBlocks: CTAs
// per SM the launcher sized the shared memory for (2 needs <= 128 registers).
template <typename T, int kCC, int kStages, int kBlocks>
__global__ void __launch_bounds__(kThreads, kBlocks)
    conv3x3_conv1x1_kernel(C31Args a, const T* __restrict__ x, const T* __restrict__ w3,
                           const T* __restrict__ b3, const T* __restrict__ w1,
                           const T* __restrict__ b1, T* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const smem = reinterpret_cast<T*>(smem_raw);
  constexpr int kXStride = C31XStride(kCC);
  constexpr int kSlot = C31SlotElems(kCC);
  T* const t_tile = smem + kStages * kSlot;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;

  const int tiles = a.tiles_h * a.tiles_w;
  const int tile = blockIdx.x / a.k_split;
  const int n = tile / tiles;
  const int h0 = (tile % tiles) / a.tiles_w * kC31TileH;
  const int w0 = (tile % tiles) % a.tiles_w * kC31TileW;
  const T* const x_img = x + static_cast<int64_t>(n) * a.H * a.W * a.C;
  const int kb0 = (blockIdx.x % a.k_split) * a.k_blocks_per_cta;
  const int k_blocks = min(a.k_blocks - kb0, a.k_blocks_per_cta);

  const int s1_steps = a.m_blocks * a.c_chunks;
  const int steps = s1_steps + k_blocks * a.m_pieces;

  // Issues (no wait, no commit) step i's loads into slot i % kStages. Zero-filled past C, M, K and outside the
  // image (the 3x3's padding).
  auto issue = [&](int i) {
    T* const slot = smem + (i % kStages) * kSlot;
    if (i < s1_steps) {
      const int mb = i / a.c_chunks, c0 = (i % a.c_chunks) * kCC;
      constexpr int kVecs = kCC / 8;
      for (int e = threadIdx.x; e < kC31HaloPixels * kVecs; e += kThreads) {
        const int p = e / kVecs, v = e % kVecs;
        const int gy = h0 - 1 + p / kC31HaloW, gx = w0 - 1 + p % kC31HaloW, c = c0 + v * 8;
        const bool valid = c < a.C && static_cast<unsigned>(gy) < static_cast<unsigned>(a.H) &&
                           static_cast<unsigned>(gx) < static_cast<unsigned>(a.W);
        // Each halo pixel is read by up to 9 neighbouring tiles' chunks: keep it in L1.
        CpAsync16L1(slot + p * kXStride + v * 8,
                    valid ? x_img + (static_cast<int64_t>(gy) * a.W + gx) * a.C + c : x, valid);
      }
      T* const ws = slot + kC31HaloPixels * kXStride;
      const int m0 = mb * kBlockN;
      for (int e = threadIdx.x; e < 9 * kCC * (kBlockN / 8); e += kThreads) {
        const int r = e / (kBlockN / 8), v = e % (kBlockN / 8);
        const int tap = r / kCC, c = c0 + r % kCC, m = m0 + v * 8;
        const bool valid = c < a.C && m < a.M;
        CpAsync16(ws + r * kC31WStride + v * 8,
                  valid ? w3 + (static_cast<int64_t>(tap) * a.C + c) * a.M + m : w3, valid);
      }
    } else {
      const int j = i - s1_steps;
      const int k0 = (kb0 + j / a.m_pieces) * kBlockN, r0 = (j % a.m_pieces) * kBlockN;
      for (int e = threadIdx.x; e < kBlockN * (kBlockN / 8); e += kThreads) {
        const int r = e / (kBlockN / 8), v = e % (kBlockN / 8);
        const bool valid = r0 + r < a.M && k0 + v * 8 < a.K;
        CpAsync16(slot + r * kC31WStride + v * 8,
                  valid ? w1 + static_cast<int64_t>(r0 + r) * a.K + k0 + v * 8 : w1, valid);
      }
    }
  };

  float acc[8][4];
  // kStages - 1 steps in flight ahead of the one computed: one step's MMAs are far shorter
  // than a load's latency.
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < steps) issue(i);
    CpAsyncCommit();
  }
  for (int i = 0; i < steps; ++i) {
    CpAsyncWait<kStages - 2>();  // step i's group has landed
    __syncthreads();  // ... for every thread; and every warp is done with step i - 1's slot
    if (i + kStages - 1 < steps) issue(i + kStages - 1);  // into step i - 1's slot
    CpAsyncCommit();
    const T* const slot = smem + (i % kStages) * kSlot;
    const bool stage1 = i < s1_steps;
    const int j = stage1 ? i : i - s1_steps;
    const int inner = stage1 ? a.c_chunks : a.m_pieces;
    if (j % inner == 0) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    }
    if (stage1) {
      // Row w's 16 pixels at tap (dy, dx) are halo pixels (w + dy) * 18 + dx + [0, 16).
      const T* const xs = slot + (warp * kC31HaloW + lane % 16) * kXStride + (lane / 16) * 8;
      const T* const ws = slot + kC31HaloPixels * kXStride + (lane % 16) * kC31WStride +
                          (lane / 16) * 8;
#pragma unroll
      for (int tap = 0; tap < 9; ++tap) {
#pragma unroll
        for (int ks = 0; ks < kCC / 16; ++ks) {
          uint32_t af[4], bf[4][4];
          LdMatrixX4(af, xs + ((tap / 3) * kC31HaloW + tap % 3) * kXStride + ks * 16);
#pragma unroll
          for (int np = 0; np < 4; ++np)
            LdMatrixX4Trans(bf[np], ws + (tap * kCC + ks * 16) * kC31WStride + np * 16);
#pragma unroll
          for (int np = 0; np < 4; ++np) {
            Mma<T>(acc[2 * np], af, bf[np][0], bf[np][1]);
            Mma<T>(acc[2 * np + 1], af, bf[np][2], bf[np][3]);
          }
        }
      }
      if (j % inner == inner - 1) {
        // Bias + act1, rounded to T, into t. Columns in [M, mp) get act1(0) = 0.
        const int mb = j / inner;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int col = mb * kBlockN + nt * 8 + 2 * q;
          if (col >= a.mp) continue;
          const float bl = col < a.M ? to_float(b3[col]) : 0.0f;
          const float bh = col < a.M ? to_float(b3[col + 1]) : 0.0f;
          T* const row = t_tile + (warp * 16 + g) * a.t_stride + col;
          *reinterpret_cast<uint32_t*>(row) =
              PackPair<T>(Activate(acc[nt][0] + bl, a.act1), Activate(acc[nt][1] + bh, a.act1));
          *reinterpret_cast<uint32_t*>(row + 8 * a.t_stride) =
              PackPair<T>(Activate(acc[nt][2] + bl, a.act1), Activate(acc[nt][3] + bh, a.act1));
        }
      }
    } else {
      // t rows of this warp x the piece's 64 (or fewer) t channels.
      const int r0 = (j % inner) * kBlockN;
      const int ksteps = min(kBlockN, a.mp - r0) / 16;
      const T* const ts = t_tile + (warp * 16 + lane % 16) * a.t_stride + r0 + (lane / 16) * 8;
      const T* const ws = slot + (lane % 16) * kC31WStride + (lane / 16) * 8;
      for (int ks = 0; ks < ksteps; ++ks) {
        uint32_t af[4], bf[4][4];
        LdMatrixX4(af, ts + ks * 16);
#pragma unroll
        for (int np = 0; np < 4; ++np)
          LdMatrixX4Trans(bf[np], ws + ks * 16 * kC31WStride + np * 16);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          Mma<T>(acc[2 * np], af, bf[np][0], bf[np][1]);
          Mma<T>(acc[2 * np + 1], af, bf[np][2], bf[np][3]);
        }
      }
      if (j % inner == inner - 1) {
        const int k0 = (kb0 + j / inner) * kBlockN;
        const int gy = h0 + warp;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int gx = w0 + g + 8 * half;
          if (gy >= a.H || gx >= a.W) continue;
          T* const out = y + ((static_cast<int64_t>(n) * a.H + gy) * a.W + gx) * a.K;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            const int col = k0 + nt * 8 + 2 * q;
            if (col >= a.K) continue;
            *reinterpret_cast<uint32_t*>(out + col) =
                PackPair<T>(Activate(acc[nt][2 * half] + to_float(b1[col]), a.act2),
                            Activate(acc[nt][2 * half + 1] + to_float(b1[col + 1]), a.act2));
          }
        }
      }
    }
  }
#endif
}

}  // namespace chain
}  // namespace jaxcnn
