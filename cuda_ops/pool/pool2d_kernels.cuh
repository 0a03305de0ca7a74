// 2-D pooling kernels. Tensors are viewed as [B, H, W, L] with L contiguous (NHWC: L=C,
// CHWN: L=N, NCHW and any layout with L == 1: planes [B, H, W], W contiguous).
//   pool2d_vec_kernel:   L > 1, compile-time window: VEC consecutive L elements per thread,
//                        one wide load per tap, all taps' loads issued before any is used;
//   pool2d_plane_kernel: L == 1, compile-time window/stride/left pad: OQ consecutive outputs
//                        along W per thread; the thread loads the input columns its windows
//                        cover once per row (overlapping windows share them in registers),
//                        with 16- or 8-byte loads where rows are aligned;
//   pool2d_split_kernel: any window (global pools, odd shapes): G lanes share one output,
//                        each reduces a strided subset of the taps (4 loads in flight at a
//                        time), then a butterfly shuffle combines them.
// All accumulate in fp32 and round once. Index math is 32-bit with precomputed
// magic-number division wherever the launcher proves it cannot wrap; addresses are 64-bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/float_convert.cuh"
#include "common/vector_io.cuh"
#include "pool/pool2d.h"

namespace jaxcnn {
namespace pool2d {

constexpr int kThreads = 256;

// Window geometry; every field fits int32 (the launcher checks).
struct Geometry {
  int H, W, P, Q;
  int R, S, sh, sw, pt, pl;
  bool count_include_pad;
};

// n / d and n % d for 0 <= n < 2^31 and 1 <= d < 2^31 with a multiply-high and a shift
// (Granlund-Montgomery, as in PyTorch's IntDivider); the host computes mul and shift.
struct FastDiv {
  uint32_t d = 1, mul = 0, shift = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while (shift < 32 && (uint64_t{1} << shift) < d) ++shift;
    const uint64_t one = 1;
    mul = static_cast<uint32_t>(((one << 32) * ((one << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return (__umulhi(n, mul) + n) >> shift;
  }
};

template <PoolMode kMode>
__device__ __forceinline__ float init_value() {
  return kMode == PoolMode::kMax ? neg_inf() : 0.0f;
}

template <PoolMode kMode>
__device__ __forceinline__ float combine(float acc, float v) {
  return kMode == PoolMode::kMax ? max_nan(acc, v) : acc + v;
}

// The avg divisor of the window at (h0, w0): the full window, or its in-bounds taps
// (0 when the window lies entirely in padding: 0/0 = NaN, as the lax reference gives).
__device__ __forceinline__ float avg_divisor(const Geometry& g, int R, int S, int h0,
                                             int w0) {
  if (g.count_include_pad) return static_cast<float>(R * S);
  const int rows = min(h0 + R, g.H) - max(h0, 0);
  const int cols = min(w0 + S, g.W) - max(w0, 0);
  return static_cast<float>(max(rows, 0) * max(cols, 0));
}

__device__ __forceinline__ bool in_range(int v, int n) {
  return static_cast<unsigned>(v) < static_cast<unsigned>(n);
}

// ------------------------------------------------------------------ vec kernel (L > 1)

// i = ((b * P + p) * Q + q) * LV + lv: the output's own vector index. Fast division when
// total < 2^31 (kFast), else 64-bit division.
template <bool kFast>
struct VecIndex;
template <>
struct VecIndex<true> {
  FastDiv lv, q, p;
};
template <>
struct VecIndex<false> {
  int dummy;
};

// Output vector index i -> (image b, row p, column q, vector lv along the contiguous axis),
// i = ((b * P + p) * Q + q) * LV + lv; 32-bit magic-number division when `fast`.
__device__ __forceinline__ void DecomposeOutput(int64_t i, bool fast, const VecIndex<true>& div,
                                                int LV, const Geometry& g, int64_t* b, int* p,
                                                int* q, int* lv) {
  if (fast) {
    const uint32_t ii = static_cast<uint32_t>(i);
    const uint32_t pix = div.lv.div(ii);
    *lv = static_cast<int>(ii - pix * div.lv.d);
    const uint32_t row = div.q.div(pix);
    *q = static_cast<int>(pix - row * div.q.d);
    const uint32_t bb = div.p.div(row);
    *p = static_cast<int>(row - bb * div.p.d);
    *b = bb;
  } else {
    const int64_t pix = i / LV;
    *lv = static_cast<int>(i - pix * LV);
    const int64_t row = pix / g.Q;
    *q = static_cast<int>(pix - row * g.Q);
    *b = row / g.P;
    *p = static_cast<int>(row - *b * g.P);
  }
}

template <typename T, PoolMode kMode, int VEC, int kR, int kS, bool kFast>
__global__ void __launch_bounds__(kThreads)
    pool2d_vec_kernel(const T* __restrict__ x, T* __restrict__ y, Geometry g, int LV,
                      int64_t total, VecIndex<kFast> div) {
  using Raw = RawVecOf<T, VEC>;
  const Raw* __restrict__ xv = reinterpret_cast<const Raw*>(x);
  Raw* __restrict__ yv = reinterpret_cast<Raw*>(y);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += step) {
    int64_t b;
    int p, q, lv;
    if constexpr (kFast) {
      DecomposeOutput(i, true, div, LV, g, &b, &p, &q, &lv);
    } else {
      DecomposeOutput(i, false, VecIndex<true>{}, LV, g, &b, &p, &q, &lv);
    }
    const int h0 = p * g.sh - g.pt;
    const int w0 = q * g.sw - g.pl;
    const Raw* src = xv + (b * g.H * g.W) * LV + lv;

    // Phase 1: every in-bounds tap's load, back to back.
    Raw raw[kR * kS];
    bool ok[kR * kS];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const int h = h0 + r, w = w0 + s;
        const bool v = in_range(h, g.H) && in_range(w, g.W);
        ok[r * kS + s] = v;
        if (v) raw[r * kS + s] = __ldg(src + (static_cast<int64_t>(h) * g.W + w) * LV);
      }
    }
    // Phase 2: combine.
    float acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = init_value<kMode>();
#pragma unroll
    for (int t = 0; t < kR * kS; ++t) {
      if (!ok[t]) continue;
      const T* v = reinterpret_cast<const T*>(&raw[t]);
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] = combine<kMode>(acc[e], to_float(v[e]));
    }
    if (kMode == PoolMode::kAvg) {
      const float d = avg_divisor(g, kR, kS, h0, w0);
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] = acc[e] / d;
    }
    Raw out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int e = 0; e < VEC; ++e) o[e] = from_float<T>(acc[e]);
    yv[i] = out;
  }
}

// ------------------------------------------------------------ plane kernel (L == 1)

// A plane thread owns outputs [qc*OQ, qc*OQ + OQ) of output row (b, p). Its input columns
// per row are [A - kPL, A + OQ*kSW + kRH) with A = qc*OQ*kSW: the aligned middle
// [A, A + OQ*kSW) moves as VB-byte vectors when the whole block is in the row (and the
// launcher has checked every row start is VB-aligned), the halos element by element.
// Columns outside [0, W) read as the identity (-inf for max, 0 for avg), which is what
// skipping them gives; rows outside [0, H) are skipped.
template <typename T, PoolMode kMode, int kR, int kS, int kSW, int kPL, int OQ, int VB>
__global__ void __launch_bounds__(kThreads)
    pool2d_plane_kernel(const T* __restrict__ x, T* __restrict__ y, Geometry g, int64_t total,
                        FastDiv qc_div, FastDiv p_div, bool vec_store) {
  constexpr int CH = OQ * kSW;
  constexpr int kRH = kS - kSW - kPL;
  constexpr int SPAN = kPL + CH + kRH;  // = (OQ - 1) * kSW + kS
  constexpr int EV = VB / static_cast<int>(sizeof(T));  // elements per vector load
  static_assert(kRH >= 0 && kPL >= 0, "halo");
  static_assert(EV >= 1 && CH % EV == 0, "vector width must divide the block");
  using Raw = typename RawVec<VB>::type;
  using OutRaw = RawVecOf<T, OQ>;
  const T ident = from_float<T>(init_value<kMode>());

  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += step) {
    // total < 2^31 (launcher): i = row * QC + qc, row = b * P + p.
    const uint32_t ii = static_cast<uint32_t>(i);
    const uint32_t row = qc_div.div(ii);
    const int qc = static_cast<int>(ii - row * qc_div.d);
    const uint32_t b = p_div.div(row);
    const int p = static_cast<int>(row - b * p_div.d);
    const int h0 = p * g.sh - g.pt;
    const int A = qc * CH;
    const T* plane = x + static_cast<int64_t>(b) * g.H * g.W;
    const bool block_in_row = A + CH <= g.W;

    T e[kR][SPAN];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int h = h0 + r;
      const T* line = plane + static_cast<int64_t>(h) * g.W;
      if (!in_range(h, g.H)) {
#pragma unroll
        for (int j = 0; j < SPAN; ++j) e[r][j] = ident;
        continue;
      }
      if (VB > static_cast<int>(sizeof(T)) && block_in_row) {
        const Raw* vsrc = reinterpret_cast<const Raw*>(line + A);
#pragma unroll
        for (int k = 0; k < CH / EV; ++k) {
          const Raw raw = __ldg(vsrc + k);
          const T* t = reinterpret_cast<const T*>(&raw);
#pragma unroll
          for (int u = 0; u < EV; ++u) e[r][kPL + k * EV + u] = t[u];
        }
      } else {
#pragma unroll
        for (int j = 0; j < CH; ++j)
          e[r][kPL + j] = A + j < g.W ? __ldg(line + A + j) : ident;
      }
#pragma unroll
      for (int j = 0; j < kPL; ++j) {
        const int w = A - kPL + j;
        e[r][j] = in_range(w, g.W) ? __ldg(line + w) : ident;
      }
#pragma unroll
      for (int j = 0; j < kRH; ++j) {
        const int w = A + CH + j;
        e[r][kPL + CH + j] = in_range(w, g.W) ? __ldg(line + w) : ident;
      }
    }

    float acc[OQ];
#pragma unroll
    for (int o = 0; o < OQ; ++o) {
      float a = init_value<kMode>();
#pragma unroll
      for (int r = 0; r < kR; ++r) {
#pragma unroll
        for (int s = 0; s < kS; ++s) a = combine<kMode>(a, to_float(e[r][o * kSW + s]));
      }
      acc[o] = a;
    }
    const int q0 = qc * OQ;
    if (kMode == PoolMode::kAvg) {
#pragma unroll
      for (int o = 0; o < OQ; ++o) acc[o] = acc[o] / avg_divisor(g, kR, kS, h0, (q0 + o) * kSW - kPL);
    }
    T* out = y + static_cast<int64_t>(row) * g.Q + q0;
    if (vec_store && q0 + OQ <= g.Q) {
      OutRaw raw;
      T* o = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int k = 0; k < OQ; ++k) o[k] = from_float<T>(acc[k]);
      *reinterpret_cast<OutRaw*>(out) = raw;
    } else {
#pragma unroll
      for (int k = 0; k < OQ; ++k)
        if (q0 + k < g.Q) out[k] = from_float<T>(acc[k]);
    }
  }
}

// ------------------------------------------------------------ split kernel (any window)

// Output vector o (same indexing as the vec kernel) is reduced by G lanes of one warp.
// k_minor: lane = o_local * G + k (planes: neighbouring lanes read neighbouring taps);
// else lane = k * (32 / G) + o_local (vectors: neighbouring lanes read neighbouring L).
template <typename T, PoolMode kMode, int VEC>
__global__ void __launch_bounds__(kThreads)
    pool2d_split_kernel(const T* __restrict__ x, T* __restrict__ y, Geometry g, int LV,
                        int64_t total, int log_g, bool k_minor, VecIndex<true> fdiv,
                        bool fast) {
  using Raw = RawVecOf<T, VEC>;
  const Raw* __restrict__ xv = reinterpret_cast<const Raw*>(x);
  Raw* __restrict__ yv = reinterpret_cast<Raw*>(y);
  const int G = 1 << log_g;
  const int per_warp = 32 >> log_g;
  const int lane = threadIdx.x & 31;
  const int k = k_minor ? (lane & (G - 1)) : (lane >> (5 - log_g));
  const int ol = k_minor ? (lane >> log_g) : (lane & (per_warp - 1));
  const int taps = g.R * g.S;
  const int64_t warps_total = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  const int64_t warp0 = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  // Every lane of a warp runs the same number of iterations (the shuffles need them all).
  for (int64_t wbase = warp0 * per_warp; wbase < total; wbase += warps_total * per_warp) {
    const int64_t i = wbase + ol;
    const bool live = i < total;
    int64_t b;
    int p, q, lv;
    const int64_t ic = live ? i : 0;
    DecomposeOutput(ic, fast, fdiv, LV, g, &b, &p, &q, &lv);
    const int h0 = p * g.sh - g.pt;
    const int w0 = q * g.sw - g.pl;
    const Raw* src = xv + (b * g.H * g.W) * LV + lv;

    float acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = init_value<kMode>();
    int r = k / g.S, s = k - (k / g.S) * g.S;
    for (int t = k; t < taps && live;) {
      Raw raw[4];
      bool ok[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int h = h0 + r, w = w0 + s;
        const bool v = t < taps && in_range(h, g.H) && in_range(w, g.W);
        ok[u] = v;
        if (v) raw[u] = __ldg(src + (static_cast<int64_t>(h) * g.W + w) * LV);
        t += G;
        s += G;
        while (s >= g.S) {
          s -= g.S;
          ++r;
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (!ok[u]) continue;
        const T* v = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = combine<kMode>(acc[e], to_float(v[e]));
      }
    }
    // Butterfly over the G lanes of this output (lane bits [0, log_g) or [5 - log_g, 5)).
    for (int m = 0; m < log_g; ++m) {
      const int off = k_minor ? (1 << m) : (per_warp << m);
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        acc[e] = combine<kMode>(acc[e], __shfl_xor_sync(0xffffffffu, acc[e], off));
    }
    if (live && k == 0) {
      if (kMode == PoolMode::kAvg) {
        const float d = avg_divisor(g, g.R, g.S, h0, w0);
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = acc[e] / d;
      }
      Raw out;
      T* o = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int e = 0; e < VEC; ++e) o[e] = from_float<T>(acc[e]);
      yv[i] = out;
    }
  }
}

}  // namespace pool2d
}  // namespace jaxcnn
