// Implicit-GEMM conv2d on CUDA cores, x and y in NHWC, NCHW or CHWN, HWIO
// weights, grouped.
//   GEMM M = N*P*Q (batch folded in so small images still fill tiles), ordered
//            so that consecutive rows are consecutive addresses of x and y:
//            (n, p, q) with q fastest for NHWC/NCHW, (p, q, n) with n fastest
//            for CHWN
//   GEMM N = K/groups (one group per block)
//   GEMM K = R*S*(C/groups), c fastest: contiguous HWIO reads (and NHWC reads)
// The layout is a template parameter. NHWC gathers A along GEMM-K (c is
// contiguous); NCHW and CHWN gather A along GEMM-M (q resp. n is contiguous)
// and give each warp a run of M in the epilogue, so all three coalesce.
// Split CUTLASS-style into a mainloop (gather -> shared -> fp32 FMA) and an
// epilogue (bias, ReLU, one rounding to T, bounds-checked store).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/conv2d_params.h"
#include "common/epilogue.cuh"
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
// NCHW/CHWN gather A along M instead: a thread loads GEMM row a_m for k
// columns a_k0 + kAKStep*i.
constexpr int kAKStep = kThreads / kTileM;  // 4
static_assert(kALoadsPerThread * kAKStep == kTileK, "");
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
  int64_t N;
  // Element strides of the logical dims of x [N,C,H,W] and y [N,K,P,Q] in
  // the tensor's layout (NCHW/CHWN paths; NHWC uses HWC, W and C).
  int64_t x_stride_n, x_stride_c, x_stride_h, x_stride_w;
  int64_t y_stride_n, y_stride_k, y_stride_p, y_stride_q;
  int64_t gemm_m;  // N*P*Q
  int64_t num_tiles_m;
  int64_t num_tiles_gn;  // groups * tiles_n_per_group
  EpilogueActivation epilogue;
};

struct SharedStorage {
  float a[2][kTileK][kSmemStrideA];
  float b[2][kTileK][kTileN];
};

// Global -> register -> shared gather of one GEMM-N column of the B (HWIO
// weight) tile; the same for every layout.
template <typename T>
struct WeightGather {
  int b_n_in_tile;
  int b_k0;
  int b_weight_col;  // g * Kg + n, column in the HWIO weight
  bool b_col_valid;
  float b_staged[kBLoadsPerThread];

  __device__ __forceinline__ explicit WeightGather(int tid)
      : b_n_in_tile(tid % kTileN),
        b_k0(tid / kTileN),
        b_weight_col(0),
        b_col_valid(false) {}

  __device__ __forceinline__ void init_cols(const KernelParams& p, int group,
                                            int tile_n0) {
    const int n = tile_n0 + b_n_in_tile;
    b_col_valid = n < p.Kg;
    b_weight_col = group * p.Kg + n;
  }

  __device__ __forceinline__ void gather(const T* __restrict__ w,
                                         const KernelParams& p,
                                         int k_tile_start) {
    // HWIO row index is exactly the GEMM-K index (r*S + s)*Cg + c.
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
    for (int i = 0; i < kBLoadsPerThread; ++i)
      smem.b[stage][b_k0 + kBRowStep * i][b_n_in_tile] = b_staged[i];
  }
};

// NHWC gather of the A (im2col) tile: a thread loads one GEMM-K column for
// kALoadsPerThread rows, so 16 consecutive threads read 16 consecutive
// channels.
template <typename T>
struct MainloopNHWC {
  // A: per-row state, decoded once per M tile.
  int64_t a_row_offset[kALoadsPerThread];  // x offset of (n, ih0, iw0, c=0)
  int a_ih0[kALoadsPerThread];
  int a_iw0[kALoadsPerThread];
  bool a_row_valid[kALoadsPerThread];
  int a_m0;
  int a_k_in_tile;
  int a_group_channel0;  // g * Cg
  // Staging registers: next tile's values while the current one is consumed.
  float a_staged[kALoadsPerThread];
  WeightGather<T> b;

  __device__ __forceinline__ explicit MainloopNHWC(int tid)
      : a_m0(tid / kTileK),
        a_k_in_tile(tid % kTileK),
        a_group_channel0(0),
        b(tid) {}

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
    b.init_cols(p, group, tile_n0);
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
    b.gather(w, p, k_tile_start);
  }

  __device__ __forceinline__ void store(SharedStorage& smem, int stage) const {
#pragma unroll
    for (int i = 0; i < kALoadsPerThread; ++i)
      smem.a[stage][a_k_in_tile][a_m0 + kARowStep * i] = a_staged[i];
    b.store(smem, stage);
  }
};

// Output pixel (n, out_h, out_w) of GEMM row m: q fastest for NHWC/NCHW,
// n fastest for CHWN.
template <TensorLayout L>
__device__ __forceinline__ void decode_row(const KernelParams& p, int64_t m,
                                           int64_t* n, int* out_h, int* out_w) {
  int pq;
  if constexpr (L == TensorLayout::kCHWN) {
    const int64_t pq64 = m / p.N;
    *n = m - pq64 * p.N;
    pq = static_cast<int>(pq64);
  } else {
    *n = m / p.PQ;
    pq = static_cast<int>(m - *n * p.PQ);
  }
  *out_h = pq / p.Q;
  *out_w = pq - *out_h * p.Q;
}

// NCHW/CHWN gather of the A tile: a thread loads one GEMM row for
// kALoadsPerThread k columns, so consecutive threads read consecutive rows:
// consecutive w (NCHW) or n (CHWN) addresses.
template <typename T, TensorLayout L>
struct MainloopStrided {
  int64_t a_row_offset;  // x offset of (n, c=0, ih0, iw0); may be out of image
  int64_t a_group_offset;  // g * Cg * x_stride_c
  int a_ih0, a_iw0;
  bool a_row_valid;
  int a_m;   // row in the tile
  int a_k0;  // first k column in the tile
  // (r, s, c) of this thread's next GEMM-K index; the k-loop visits
  // k_tile_start = 0, kTileK, 2*kTileK, ... so it advances by kAKStep per
  // load instead of dividing by Cg and S for each.
  int k_r, k_s, k_c;
  float a_staged[kALoadsPerThread];
  WeightGather<T> b;

  __device__ __forceinline__ explicit MainloopStrided(int tid)
      : a_row_offset(0),
        a_group_offset(0),
        a_ih0(0),
        a_iw0(0),
        a_row_valid(false),
        a_m(tid % kTileM),
        a_k0(tid / kTileM),
        k_r(0),
        k_s(0),
        k_c(0),
        b(tid) {}

  __device__ __forceinline__ void init_rows(const KernelParams& p,
                                            int64_t tile_m0) {
    const int64_t m = tile_m0 + a_m;
    a_row_valid = m < p.gemm_m;
    a_ih0 = 0;
    a_iw0 = 0;
    a_row_offset = 0;
    if (a_row_valid) {
      int64_t n;
      int out_h, out_w;
      decode_row<L>(p, m, &n, &out_h, &out_w);
      a_ih0 = out_h * p.stride_h - p.pad_h;
      a_iw0 = out_w * p.stride_w - p.pad_w;
      a_row_offset = n * p.x_stride_n + a_ih0 * p.x_stride_h +
                     a_iw0 * p.x_stride_w;
    }
  }

  __device__ __forceinline__ void init_cols(const KernelParams& p, int group,
                                            int tile_n0) {
    a_group_offset = static_cast<int64_t>(group) * p.Cg * p.x_stride_c;
    // Restart the k walk at k = a_k0 (the walk is per (M tile, N tile)).
    k_c = a_k0 % p.Cg;
    const int rs = a_k0 / p.Cg;
    k_s = rs % p.S;
    k_r = rs / p.S;
    b.init_cols(p, group, tile_n0);
  }

  __device__ __forceinline__ void gather(const T* __restrict__ x,
                                         const T* __restrict__ w,
                                         const KernelParams& p,
                                         int k_tile_start) {
#pragma unroll
    for (int i = 0; i < kALoadsPerThread; ++i) {
      const int k = k_tile_start + a_k0 + kAKStep * i;
      const bool k_valid = k < p.gemm_k;
      // Past the end r grows beyond R: keep r*dil out of the arithmetic.
      const int dh = k_valid ? k_r * p.dil_h : 0;
      const int dw = k_valid ? k_s * p.dil_w : 0;
      const int ih = a_ih0 + dh;
      const int iw = a_iw0 + dw;
      const bool in_image = k_valid && a_row_valid &&
                            static_cast<unsigned>(ih) < static_cast<unsigned>(p.H) &&
                            static_cast<unsigned>(iw) < static_cast<unsigned>(p.W);
      a_staged[i] =
          in_image ? to_float(x[a_row_offset + a_group_offset +
                                k_c * p.x_stride_c + dh * p.x_stride_h +
                                dw * p.x_stride_w])
                   : 0.0f;
      // Advance (r, s, c) by kAKStep; more than one carry only when Cg < 4.
      k_c += kAKStep;
      while (k_c >= p.Cg) {
        k_c -= p.Cg;
        if (++k_s == p.S) {
          k_s = 0;
          ++k_r;
        }
      }
    }
    b.gather(w, p, k_tile_start);
  }

  __device__ __forceinline__ void store(SharedStorage& smem, int stage) const {
    // Consecutive threads write consecutive m: conflict-free.
#pragma unroll
    for (int i = 0; i < kALoadsPerThread; ++i)
      smem.a[stage][a_k0 + kAKStep * i][a_m] = a_staged[i];
    b.store(smem, stage);
  }
};

template <typename T, TensorLayout L>
using Mainloop = std::conditional_t<L == TensorLayout::kNHWC, MainloopNHWC<T>,
                                    MainloopStrided<T, L>>;

// Each thread owns a 4x4 micro-tile at (thread_m, thread_n). NHWC spreads a
// warp along N (its stores run along contiguous channels); NCHW/CHWN spread
// it along M (their stores run along contiguous q resp. n).
template <TensorLayout L>
__device__ __forceinline__ void thread_tile(int tid, int* thread_m,
                                            int* thread_n) {
  if constexpr (L == TensorLayout::kNHWC) {
    *thread_m = (tid / kThreadsAlongN) * kThreadTileM;
    *thread_n = (tid % kThreadsAlongN) * kThreadTileN;
  } else {
    constexpr int kThreadsAlongM = kTileM / kThreadTileM;  // 16
    *thread_m = (tid % kThreadsAlongM) * kThreadTileM;
    *thread_n = (tid / kThreadsAlongM) * kThreadTileN;
  }
}

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

template <typename T, TensorLayout L>
__device__ __forceinline__ void epilogue(
    const float (&acc)[kThreadTileM][kThreadTileN], const T* __restrict__ bias,
    const T* __restrict__ residual, T* __restrict__ y, const KernelParams& p,
    int64_t m_first, int group, int col_first) {
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
    int64_t row;  // offset of (m, group's first channel) in y, and in the residual
    int64_t col_stride;
    if constexpr (L == TensorLayout::kNHWC) {
      row = m * p.K + group * p.Kg;
      col_stride = 1;
    } else {
      int64_t n;
      int out_h, out_w;
      decode_row<L>(p, m, &n, &out_h, &out_w);
      row = n * p.y_stride_n + out_h * p.y_stride_p + out_w * p.y_stride_q +
            static_cast<int64_t>(group) * p.Kg * p.y_stride_k;
      col_stride = p.y_stride_k;
    }
#pragma unroll
    for (int j = 0; j < kThreadTileN; ++j) {
      const int col = col_first + j;
      if (col >= p.Kg) continue;
      const int64_t at = row + col * col_stride;
      float v = acc[i][j] + bias_f[j];
      if (residual != nullptr) v += to_float(residual[at]);
      y[at] = from_float<T>(ApplyActivation(p.epilogue, v));
    }
  }
}

template <typename T, TensorLayout L>
__global__ void __launch_bounds__(kThreads, 2)
    conv2d_direct_kernel(const T* __restrict__ x, const T* __restrict__ w,
                         const T* __restrict__ bias,
                         const T* __restrict__ residual, T* __restrict__ y,
                         const KernelParams p) {
  __shared__ __align__(16) SharedStorage smem;

  const int tid = static_cast<int>(threadIdx.x);
  int thread_m, thread_n;
  thread_tile<L>(tid, &thread_m, &thread_n);
  Mainloop<T, L> mainloop(tid);

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
      epilogue<T, L>(acc, bias, residual, y, p, tile_m0 + thread_m, group,
                     tile_n0 + thread_n);
    }
  }
}

}  // namespace conv2d_direct
}  // namespace jaxcnn
