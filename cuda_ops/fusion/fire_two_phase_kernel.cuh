// Two-phase fire kernel for small problems (N = 1, 13x13 .. 27x27 images): one cooperative
// launch of at most two CTAs per SM (as many as are resident at once).
//   phase 1 (squeeze): s = relu(x w_sq + b_sq) as a plain GEMM over all N*H*W pixels (a 1x1
//     conv ignores the image layout), in items of 16*MT pixels x 16 squeeze channels spread
//     over the grid; a CTA's 8 warps split the item's C reduction and sum their partials
//     through shared memory; s is rounded to T and written to the workspace [N*H*W][S].
//   grid barrier (cooperative groups): s is complete.
//   phase 2 (expands): items of a 4x16 output tile x 32 channels of E1 or E3; the item's s
//     halo (6x18 pixels) comes from the workspace, its weight block from w_e1 / w_e3; the
//     CTA's first weight block is loaded during phase 1. Results go straight into the item's
//     channel slice of y (no concatenate).
// Why: at N = 1 the single-pass fused kernel (fire_kernels.cuh) has few tiles, so each CTA
// streams its halo's whole C and all squeeze weights (~200 KB into one SM for SqueezeNet
// fire9) and the three wgmma convs pay three launches' fixed cost; here each CTA moves tens
// of KB, s stays in L2, and there is one launch.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "fusion/fire_kernels.cuh"

namespace jaxcnn {
namespace fire {

constexpr int kTwoPhaseTileH = 4;      // output rows per phase-2 tile (tile width kTileW)
constexpr int kTwoPhaseBlock = 32;     // output channels per phase-2 item
constexpr int kTwoPhaseSqBlock = 16;   // squeeze channels per phase-1 item
constexpr int kTwoPhaseMaxKChunk = 512;  // input channels staged at once in phase 1
// 8 warps = 4 output rows x 2 halves of the 32-channel block (one m16n16 tile each).
static_assert(kTwoPhaseTileH * (kTwoPhaseBlock / 16) == kWarps, "one m16n16 tile per warp");

// Everything the kernel needs, computed by the launcher (fire.cu).
struct TwoPhaseArgs {
  int N, H, W, C, S, E1, E3;
  // Phase 1.
  int pixels;       // N * H * W
  int sq_mtiles;    // MT: m16 pixel tiles per item (1 or 2)
  int sq_ksplit;    // warps sharing one m tile's reduction: kWarps / MT
  int sq_items;     // ceil(pixels / (16 MT)) * (SK / 16)
  int k_chunk;      // staged input channels (multiple of 16, <= kTwoPhaseMaxKChunk)
  int k_chunks;     // ceil(C / k_chunk)
  // Phase 2.
  int tiles_h, tiles_w, num_tiles;
  int e1_blocks, e3_blocks;  // 32-channel blocks of each expand
  int ex_items;              // (e1_blocks + e3_blocks) * num_tiles
  // Element offsets (T units) of the shared-memory regions; off_red is 16-byte aligned.
  int off_x, off_wsq, off_red, off_s, off_wex;
};

// Smem row strides (T elements): conflict-free ldmatrix (fire_kernels.cuh PaddedStride).
__host__ __device__ constexpr int TwoPhaseWexStride() { return PaddedStride(kTwoPhaseBlock); }
__host__ __device__ constexpr int TwoPhaseWsqStride() { return PaddedStride(kTwoPhaseSqBlock); }

// [lo, hi) of `items` dealt in contiguous runs to gridDim.x CTAs (a CTA's consecutive items
// share their weight block: phase 2 orders items block-major).
__device__ __forceinline__ void ItemRange(int items, int* lo, int* hi) {
  const int per = (items + gridDim.x - 1) / gridDim.x;
  *lo = min(items, static_cast<int>(blockIdx.x) * per);
  *hi = min(items, *lo + per);
}

// Issues (no commit) phase 2's weight block `blk` (E1 blocks first, then E3): kTaps * SK rows
// of 32 output channels, zero past S and past the conv's channels.
template <typename T, int SK>
__device__ __forceinline__ void IssueExpandWeights(const TwoPhaseArgs& a, const T* __restrict__ w_e1,
                                                   const T* __restrict__ w_e3, T* wex, int blk) {
  const bool is3 = blk >= a.e1_blocks;
  const int k = is3 ? a.E3 : a.E1;
  const int c0 = (is3 ? blk - a.e1_blocks : blk) * kTwoPhaseBlock;
  const T* w = is3 ? w_e3 : w_e1;
  constexpr int kVecs = kTwoPhaseBlock / 8;
  const int rows = (is3 ? 9 : 1) * SK;
  for (int i = threadIdx.x; i < rows * kVecs; i += kThreads) {
    const int r = i / kVecs, v = i % kVecs;
    const int tap = r / SK, ch = r % SK, c = c0 + v * 8;
    const bool valid = ch < a.S && c < k;
    const T* src = valid ? w + (static_cast<int64_t>(tap) * a.S + ch) * k + c : w;
    CpAsync16(wex + r * TwoPhaseWexStride() + v * 8, src, valid);
  }
}

template <typename T, int SK>
__global__ void __launch_bounds__(kThreads, 2)
    fire_two_phase_kernel(TwoPhaseArgs a, const T* __restrict__ x, const T* __restrict__ w_sq,
                          const T* __restrict__ b_sq, const T* __restrict__ w_e1,
                          const T* __restrict__ b_e1, const T* __restrict__ w_e3,
                          const T* __restrict__ b_e3, T* __restrict__ y, T* __restrict__ s_ws) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  constexpr int kSqStride = PaddedStride(SK);
  constexpr int kWsqStride = TwoPhaseWsqStride();
  constexpr int kWexStride = TwoPhaseWexStride();
  constexpr int kSqBlocks = SK / kTwoPhaseSqBlock;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;  // MMA fragment row group and column pair
  T* const xs = smem + a.off_x;
  T* const ws = smem + a.off_wsq;
  float* const red = reinterpret_cast<float*>(smem + a.off_red);
  T* const s_tile = smem + a.off_s;
  T* const wex = smem + a.off_wex;
  const int x_stride = PaddedStride(a.k_chunk);

  int lo1, hi1, lo2, hi2;
  ItemRange(a.sq_items, &lo1, &hi1);
  ItemRange(a.ex_items, &lo2, &hi2);
  // Phase 2's first weight block, in flight behind phase 1's first chunk (it does not
  // depend on s).
  int loaded_blk = -1;
  auto issue_first_weights = [&] {
    if (lo2 < hi2) {
      loaded_blk = lo2 / a.num_tiles;
      IssueExpandWeights<T, SK>(a, w_e1, w_e3, wex, loaded_blk);
    }
    CpAsyncCommit();
  };

  // ---------------- phase 1: s = relu(x w_sq + b_sq) -> workspace ----------------
  const int mt = warp % a.sq_mtiles, kg = warp / a.sq_mtiles;
  const int item_px = 16 * a.sq_mtiles;
  bool first_chunk = true;
  for (int item = lo1; item < hi1; ++item) {
    const int p0 = (item / kSqBlocks) * item_px;
    const int s0 = (item % kSqBlocks) * kTwoPhaseSqBlock;
    float acc[2][4] = {};
    for (int kc = 0; kc < a.k_chunks; ++kc) {
      const int c0 = kc * a.k_chunk;
      const int vecs = a.k_chunk / 8;
      for (int i = threadIdx.x; i < item_px * vecs; i += kThreads) {
        const int r = i / vecs, v = i % vecs;
        const int p = p0 + r, c = c0 + v * 8;
        const bool valid = p < a.pixels && c < a.C;
        CpAsync16(xs + r * x_stride + v * 8, valid ? x + static_cast<int64_t>(p) * a.C + c : x,
                  valid);
      }
      for (int i = threadIdx.x; i < a.k_chunk * 2; i += kThreads) {
        const int r = i / 2, c = c0 + r, s = s0 + (i % 2) * 8;
        const bool valid = c < a.C && s < a.S;
        CpAsync16(ws + r * kWsqStride + (i % 2) * 8,
                  valid ? w_sq + static_cast<int64_t>(c) * a.S + s : w_sq, valid);
      }
      CpAsyncCommit();
      if (first_chunk) {
        issue_first_weights();
        CpAsyncWait<1>();  // the chunk, not the expand weights behind it
        first_chunk = false;
      } else {
        CpAsyncWait<0>();
      }
      __syncthreads();
      for (int ks = kg; ks < a.k_chunk / 16; ks += a.sq_ksplit) {
        uint32_t af[4], bf[4];
        LdMatrixX4(af, xs + (mt * 16 + lane % 16) * x_stride + ks * 16 + (lane / 16) * 8);
        LdMatrixX4Trans(bf, ws + (ks * 16 + lane % 16) * kWsqStride + (lane / 16) * 8);
        Mma<T>(acc[0], af, bf[0], bf[1]);
        Mma<T>(acc[1], af, bf[2], bf[3]);
      }
      __syncthreads();  // the chunk buffers are refilled next
    }
    // Sum the k-split partials: red[warp][16 px][16 ch] (fp32).
    float* const mine = red + warp * 256;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        mine[(g + half * 8) * 16 + j * 8 + 2 * q] = acc[j][2 * half];
        mine[(g + half * 8) * 16 + j * 8 + 2 * q + 1] = acc[j][2 * half + 1];
      }
    __syncthreads();
    for (int i = threadIdx.x; i < item_px * kTwoPhaseSqBlock; i += kThreads) {
      const int m = i / 256, r = (i / 16) % 16, col = i % 16;
      const int p = p0 + m * 16 + r, s = s0 + col;
      if (p >= a.pixels || s >= a.S) continue;
      float sum = to_float(b_sq[s]);
      for (int k = 0; k < a.sq_ksplit; ++k) sum += red[(k * a.sq_mtiles + m) * 256 + r * 16 + col];
      s_ws[static_cast<int64_t>(p) * a.S + s] = from_float<T>(fmaxf(sum, 0.0f));
    }
    __syncthreads();  // red is rewritten by the next item
  }
  if (first_chunk) issue_first_weights();  // no phase-1 item here

  cooperative_groups::this_grid().sync();  // s is complete (and visible) everywhere

  // ---------------- phase 2: the expands, straight into y's channel slices ----------------
  const int E = a.E1 + a.E3;
  const int row = warp / 2, col0 = (warp % 2) * 16;
  for (int item = lo2; item < hi2; ++item) {
    const int blk = item / a.num_tiles, tile = item % a.num_tiles;
    if (blk != loaded_blk) {
      IssueExpandWeights<T, SK>(a, w_e1, w_e3, wex, blk);
      loaded_blk = blk;
    }
    const int per_image = a.tiles_h * a.tiles_w;
    const int n = tile / per_image, rem = tile % per_image;
    const int h0 = (rem / a.tiles_w) * kTwoPhaseTileH, w0 = (rem % a.tiles_w) * kTileW;
    // The s halo, zero outside the image (the 3x3's padding) and past S.
    constexpr int kVecs = SK / 8;
    for (int i = threadIdx.x; i < HaloPixels(kTwoPhaseTileH) * kVecs; i += kThreads) {
      const int hp = i / kVecs, v = i % kVecs;
      const int gy = h0 - 1 + hp / kHaloW, gx = w0 - 1 + hp % kHaloW;
      const bool valid = v * 8 < a.S && static_cast<unsigned>(gy) < static_cast<unsigned>(a.H) &&
                         static_cast<unsigned>(gx) < static_cast<unsigned>(a.W);
      const T* src =
          valid ? s_ws + ((static_cast<int64_t>(n) * a.H + gy) * a.W + gx) * a.S + v * 8 : s_ws;
      CpAsync16(s_tile + hp * kSqStride + v * 8, src, valid);
    }
    CpAsyncCommit();
    CpAsyncWait<0>();
    __syncthreads();

    const bool is3 = blk >= a.e1_blocks;
    const int conv_c0 = (is3 ? blk - a.e1_blocks : blk) * kTwoPhaseBlock;
    const int width = min(kTwoPhaseBlock, (is3 ? a.E3 : a.E1) - conv_c0);
    const int h = h0 + row;
    if (col0 < width && h < a.H) {  // warp-uniform
      const T* bias = is3 ? b_e3 : b_e1;
      float acc[1][8][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = conv_c0 + col0 + j * 8 + 2 * q;
        const bool ok = col0 + j * 8 < width;  // widths are multiples of 8
        const float b0 = ok ? to_float(bias[c]) : 0.0f, b1 = ok ? to_float(bias[c + 1]) : 0.0f;
        acc[0][j][0] = acc[0][j][2] = b0;
        acc[0][j][1] = acc[0][j][3] = b1;
      }
      if (is3)
        ExpandMma<T, SK, 9, 1, 1, 1>(acc, s_tile, wex, kWexStride, row, col0);
      else
        ExpandMma<T, SK, 1, 1, 1, 1>(acc, s_tile, wex, kWexStride, row, col0);
      const int out_c = (is3 ? a.E1 : 0) + conv_c0 + col0;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (col0 + j * 8 >= width) continue;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int w = w0 + g + half * 8;
          if (w >= a.W) continue;
          *reinterpret_cast<uint32_t*>(y + ((static_cast<int64_t>(n) * a.H + h) * a.W + w) * E +
                                       out_c + j * 8 + 2 * q) =
              PackPair<T>(fmaxf(acc[0][j][2 * half], 0.0f), fmaxf(acc[0][j][2 * half + 1], 0.0f));
        }
      }
    }
    __syncthreads();  // s_tile (and the weights, if the block changes) are refilled next
  }
  CpAsyncWait<0>();  // no cp.async may outlive the CTA (weights of a CTA without items)
#else
  __trap();  // the launcher only selects this kernel on sm_80+
#endif
}

}  // namespace fire
}  // namespace jaxcnn
