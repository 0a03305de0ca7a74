// Implicit-GEMM conv2d on CUDA cores, NHWC x HWIO -> NHWC, grouped.
//   GEMM M = N*P*Q (batch folded in so small images still fill tiles)
//   GEMM N = K/groups (one group per block)
//   GEMM K = R*S*(C/groups), c fastest: contiguous NHWC and HWIO reads.
// Split CUTLASS-style into a mainloop (gather -> shared -> fp32 FMA) and an
// epilogue (bias, ReLU, one rounding to T, bounds-checked store).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/float_convert.cuh"

namespace jaxcnn {
namespace conv2d_direct {

constexpr int kThreads = 256;
constexpr int kTileM = 64;  // output pixels per block
constexpr int kTileN = 64;  // output channels (within one group) per block
constexpr int kTileK = 16;  // GEMM-K per shared-memory stage
constexpr int kThreadTileM = 4;
constexpr int kThreadTileN = 4;
constexpr int kThreadsAlongN = kTileN / kThreadTileN;  // 16
static_assert(kThreadsAlongN * (kTileM / kThreadTileM) == kThreads,
              "each thread owns one 4x4 micro-tile");

// Gather assignment: a thread loads one GEMM-K column of A for rows
// a_m0 + kARowStep*i, and one GEMM-N column of B for k rows b_k0 + kBRowStep*i.
constexpr int kALoadsPerThread = kTileM * kTileK / kThreads;  // 4
constexpr int kBLoadsPerThread = kTileN * kTileK / kThreads;  // 4
constexpr int kARowStep = kThreads / kTileK;                  // 16
constexpr int kBRowStep = kThreads / kTileN;                  // 4
static_assert(kALoadsPerThread * kThreads == kTileM * kTileK, "");
static_assert(kBLoadsPerThread * kThreads == kTileN * kTileK, "");

// A is stored k-major so the FMA loop reads float4 along M. The +4 pad keeps
// rows 16B-aligned and makes the transposing store only 2-way bank conflicted.
constexpr int kSmemStrideA = kTileM + 4;

struct KernelParams {
  int H, W, C;
  int S, K;
  int Cg, Kg;  // channels per group in / out
  int stride_h, stride_w;
  int pad_h, pad_w;
  int dil_h, dil_w;
  int gemm_k;       // R*S*Cg
  int num_k_tiles;  // ceil(gemm_k / kTileK)
  int Q;
  int tiles_n_per_group;
  int64_t PQ;
  int64_t HWC;
  int64_t gemm_m;  // N*P*Q
  int64_t num_tiles_m;
  int64_t num_tiles_gn;  // groups * tiles_n_per_group
  bool relu;
};

struct SharedStorage {
  float a[2][kTileK][kSmemStrideA];
  float b[2][kTileK][kTileN];
};

// Global -> register -> shared gather of the A (im2col) and B (weight) tiles.
template <typename T>
struct Mainloop {
  // A: per-row state, decoded once per M tile.
  int64_t a_row_offset[kALoadsPerThread];  // x offset of (n, ih0, iw0, c=0)
  int a_ih0[kALoadsPerThread];
  int a_iw0[kALoadsPerThread];
  bool a_row_valid[kALoadsPerThread];
  int a_m0;
  int a_k_in_tile;
  int a_group_channel0;  // g * Cg
  // B: one weight column.
  int b_n_in_tile;
  int b_k0;
  int b_weight_col;  // g * Kg + n, column in the HWIO weight
  bool b_col_valid;
  // Staging registers: next tile's values while the current one is consumed.
  float a_staged[kALoadsPerThread];
  float b_staged[kBLoadsPerThread];

  __device__ __forceinline__ explicit Mainloop(int tid)
      : a_m0(tid / kTileK),
        a_k_in_tile(tid % kTileK),
        a_group_channel0(0),
        b_n_in_tile(tid % kTileN),
        b_k0(tid / kTileN),
        b_weight_col(0),
        b_col_valid(false) {}

  __device__ __forceinline__ void init_rows(const KernelParams& p,
                                            int64_t tile_m0) {
#pragma unroll
    for (int i = 0; i < kALoadsPerThread; ++i) {
      const int64_t m = tile_m0 + a_m0 + kARowStep * i;
      a_row_valid[i] = m < p.gemm_m;
      a_ih0[i] = 0;
      a_iw0[i] = 0;
      a_row_offset[i] = 0;
      if (a_row_valid[i]) {
        const int64_t n = m / p.PQ;
        const int pq = static_cast<int>(m - n * p.PQ);
        const int out_h = pq / p.Q;
        const int out_w = pq - out_h * p.Q;
        a_ih0[i] = out_h * p.stride_h - p.pad_h;
        a_iw0[i] = out_w * p.stride_w - p.pad_w;
        // May point before the image (padding); only dereferenced in bounds.
        a_row_offset[i] =
            n * p.HWC + (static_cast<int64_t>(a_ih0[i]) * p.W + a_iw0[i]) * p.C;
      }
    }
  }

  __device__ __forceinline__ void init_cols(const KernelParams& p, int group,
                                            int tile_n0) {
    a_group_channel0 = group * p.Cg;
    const int n = tile_n0 + b_n_in_tile;
    b_col_valid = n < p.Kg;
    b_weight_col = group * p.Kg + n;
  }

  __device__ __forceinline__ void gather(const T* __restrict__ x,
                                         const T* __restrict__ w,
                                         const KernelParams& p,
                                         int k_tile_start) {
    // A: decode this thread's GEMM-K column once for all its rows.
    const int k = k_tile_start + a_k_in_tile;
    const bool k_valid = k < p.gemm_k;
    const int k_decoded = k_valid ? k : 0;  // keeps r*dil in range past the end
    const int c = k_decoded % p.Cg;
    const int rs = k_decoded / p.Cg;
    const int s = rs % p.S;
    const int r = rs / p.S;
    const int dh = r * p.dil_h;
    const int dw = s * p.dil_w;
    const int64_t k_offset =
        (static_cast<int64_t>(dh) * p.W + dw) * p.C + a_group_channel0 + c;
#pragma unroll
    for (int i = 0; i < kALoadsPerThread; ++i) {
      const int ih = a_ih0[i] + dh;
      const int iw = a_iw0[i] + dw;
      const bool in_image = k_valid && a_row_valid[i] &&
                            static_cast<unsigned>(ih) < static_cast<unsigned>(p.H) &&
                            static_cast<unsigned>(iw) < static_cast<unsigned>(p.W);
      a_staged[i] = in_image ? to_float(x[a_row_offset[i] + k_offset]) : 0.0f;
    }
    // B: HWIO row index is exactly the GEMM-K index (r*S + s)*Cg + c.
#pragma unroll
    for (int i = 0; i < kBLoadsPerThread; ++i) {
      const int kb = k_tile_start + b_k0 + kBRowStep * i;
      const bool valid = b_col_valid && kb < p.gemm_k;
      b_staged[i] =
          valid ? to_float(w[static_cast<int64_t>(kb) * p.K + b_weight_col])
                : 0.0f;
    }
  }

  __device__ __forceinline__ void store(SharedStorage& smem, int stage) const {
#pragma unroll
    for (int i = 0; i < kALoadsPerThread; ++i)
      smem.a[stage][a_k_in_tile][a_m0 + kARowStep * i] = a_staged[i];
#pragma unroll
    for (int i = 0; i < kBLoadsPerThread; ++i)
      smem.b[stage][b_k0 + kBRowStep * i][b_n_in_tile] = b_staged[i];
  }
};

// One K tile of FMAs into the thread's 4x4 fp32 accumulators.
__device__ __forceinline__ void mma_tile(
    const SharedStorage& smem, int stage, int thread_m, int thread_n,
    float (&acc)[kThreadTileM][kThreadTileN]) {
#pragma unroll
  for (int kk = 0; kk < kTileK; ++kk) {
    const float4 a4 =
        *reinterpret_cast<const float4*>(&smem.a[stage][kk][thread_m]);
    const float4 b4 =
        *reinterpret_cast<const float4*>(&smem.b[stage][kk][thread_n]);
    const float a[kThreadTileM] = {a4.x, a4.y, a4.z, a4.w};
    const float b[kThreadTileN] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
    for (int i = 0; i < kThreadTileM; ++i)
#pragma unroll
      for (int j = 0; j < kThreadTileN; ++j)
        acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

template <typename T>
__device__ __forceinline__ void epilogue(
    const float (&acc)[kThreadTileM][kThreadTileN], const T* __restrict__ bias,
    T* __restrict__ y, const KernelParams& p, int64_t m_first, int group,
    int col_first) {
  float bias_f[kThreadTileN];
#pragma unroll
  for (int j = 0; j < kThreadTileN; ++j) {
    const int col = col_first + j;
    bias_f[j] = (bias != nullptr && col < p.Kg)
                    ? to_float(bias[group * p.Kg + col])
                    : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kThreadTileM; ++i) {
    const int64_t m = m_first + i;
    if (m >= p.gemm_m) continue;
    T* y_row = y + m * p.K + group * p.Kg;
#pragma unroll
    for (int j = 0; j < kThreadTileN; ++j) {
      const int col = col_first + j;
      if (col >= p.Kg) continue;
      float v = acc[i][j] + bias_f[j];
      // `v < 0` (not fmaxf) lets NaN through, like jnp.maximum(v, 0).
      if (p.relu && v < 0.0f) v = 0.0f;
      y_row[col] = from_float<T>(v);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
    conv2d_direct_kernel(const T* __restrict__ x, const T* __restrict__ w,
                         const T* __restrict__ bias, T* __restrict__ y,
                         const KernelParams p) {
  __shared__ __align__(16) SharedStorage smem;

  const int tid = static_cast<int>(threadIdx.x);
  const int thread_m = (tid / kThreadsAlongN) * kThreadTileM;
  const int thread_n = (tid % kThreadsAlongN) * kThreadTileN;
  Mainloop<T> mainloop(tid);

  // Grid-stride loops only matter past the grid limits (65535 in y).
  for (int64_t tile_m = blockIdx.x; tile_m < p.num_tiles_m;
       tile_m += gridDim.x) {
    const int64_t tile_m0 = tile_m * kTileM;
    mainloop.init_rows(p, tile_m0);
    for (int64_t tile_gn = blockIdx.y; tile_gn < p.num_tiles_gn;
         tile_gn += gridDim.y) {
      const int group = static_cast<int>(tile_gn / p.tiles_n_per_group);
      const int tile_n0 =
          static_cast<int>(tile_gn % p.tiles_n_per_group) * kTileN;
      mainloop.init_cols(p, group, tile_n0);

      float acc[kThreadTileM][kThreadTileN];
#pragma unroll
      for (int i = 0; i < kThreadTileM; ++i)
#pragma unroll
        for (int j = 0; j < kThreadTileN; ++j) acc[i][j] = 0.0f;

      if (p.num_k_tiles > 0) {
        mainloop.gather(x, w, p, 0);
        mainloop.store(smem, 0);
        __syncthreads();
        // Double-buffered: while stage kt is consumed, tile kt+1 is fetched to
        // registers and written to the other stage; one barrier per tile.
        for (int kt = 0; kt < p.num_k_tiles; ++kt) {
          const int stage = kt & 1;
          const bool has_next = kt + 1 < p.num_k_tiles;
          if (has_next) mainloop.gather(x, w, p, (kt + 1) * kTileK);
          mma_tile(smem, stage, thread_m, thread_n, acc);
          if (has_next) mainloop.store(smem, stage ^ 1);
          __syncthreads();
        }
      }
      // The loop's last barrier also orders this tile's reads of shared
      // memory before the next tile's first store.
      epilogue<T>(acc, bias, y, p, tile_m0 + thread_m, group,
                  tile_n0 + thread_n);
    }
  }
}

}  // namespace conv2d_direct
}  // namespace jaxcnn
