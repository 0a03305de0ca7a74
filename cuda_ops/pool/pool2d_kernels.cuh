// 2-D pooling kernels. Each layout reads along its contiguous axis:
//   pool2d_vec_kernel:  [B, H, W, L] with L contiguous (NHWC: L=C, CHWN: L=N),
//                       VEC consecutive L elements per thread, one wide load per tap;
//   pool2d_rows_kernel: NCHW planes [B, H, W] (B=N*C), W contiguous: a CTA stages a
//                       contiguous range of input rows in shared memory with 16-byte
//                       loads, then pools from shared memory.
// Both accumulate in fp32 and round once.
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

// kR/kS > 0: the window is a compile-time constant (2x2, 3x3: fully unrolled, all taps'
// loads in flight together); 0: runtime window.
template <typename T, PoolMode kMode, int VEC, int kR, int kS, typename Index>
__global__ void __launch_bounds__(kThreads)
    pool2d_vec_kernel(const T* __restrict__ x, T* __restrict__ y, Geometry g, int LV,
                      Index total) {
  using Raw = RawVecOf<T, VEC>;
  const Raw* __restrict__ xv = reinterpret_cast<const Raw*>(x);
  Raw* __restrict__ yv = reinterpret_cast<Raw*>(y);
  const int R = kR > 0 ? kR : g.R;
  const int S = kS > 0 ? kS : g.S;
  const Index step = static_cast<Index>(gridDim.x) * kThreads;
  for (Index i = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += step) {
    // i = ((b * P + p) * Q + q) * LV + lv: the output's own vector index.
    const Index pix = i / LV;
    const int lv = static_cast<int>(i - pix * LV);
    const Index row = pix / g.Q;
    const int q = static_cast<int>(pix - row * g.Q);
    const Index b = row / g.P;
    const int p = static_cast<int>(row - b * g.P);
    const int h0 = p * g.sh - g.pt;
    const int w0 = q * g.sw - g.pl;
    const Raw* src = xv + static_cast<int64_t>(b) * g.H * g.W * LV + lv;

    float acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = init_value<kMode>();
#pragma unroll(kR > 0 ? kR : 1)
    for (int r = 0; r < R; ++r) {
      const int h = h0 + r;
      if (h < 0 || h >= g.H) continue;
#pragma unroll(kS > 0 ? kS : 1)
      for (int s = 0; s < S; ++s) {
        const int w = w0 + s;
        if (w < 0 || w >= g.W) continue;
        const Raw raw = src[(static_cast<int64_t>(h) * g.W + w) * LV];
        const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = combine<kMode>(acc[e], to_float(v[e]));
      }
    }
    if (kMode == PoolMode::kAvg) {
      const float d = avg_divisor(g, R, S, h0, w0);
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

// NCHW tile of one CTA: planes [b0, b0 + kb) and output rows [p0, p0 + tp) of each; its
// input is one contiguous range of x: whole planes when kb > 1, else rows
// [ih_lo, ih_hi) of plane b0.
struct RowsTile {
  int64_t b0;
  int kb, p0, tp, ih_lo, ih_hi;
};

__device__ __forceinline__ RowsTile rows_tile(const Geometry& g, int64_t B,
                                              int planes_per_cta, int rows_per_cta,
                                              int row_blocks) {
  RowsTile t;
  if (row_blocks == 1) {
    t.b0 = static_cast<int64_t>(blockIdx.x) * planes_per_cta;
    t.kb = static_cast<int>(min(static_cast<int64_t>(planes_per_cta), B - t.b0));
    t.p0 = 0;
    t.tp = g.P;
  } else {
    t.b0 = blockIdx.x / row_blocks;
    t.p0 = static_cast<int>(blockIdx.x % row_blocks) * rows_per_cta;
    t.kb = 1;
    t.tp = min(rows_per_cta, g.P - t.p0);
  }
  if (t.kb > 1) {
    t.ih_lo = 0;
    t.ih_hi = g.H;
  } else {
    t.ih_lo = max(0, t.p0 * g.sh - g.pt);
    t.ih_hi = max(t.ih_lo, min(g.H, (t.p0 + t.tp - 1) * g.sh - g.pt + g.R));
  }
  return t;
}

// Copies seg[0, len) to smem[lead + i] where `lead` gives smem the same 16-byte phase as
// seg, so the aligned middle moves as uint4 whatever the row length; head/tail go scalar.
// Four independent loads per thread are in flight before their shared stores.
template <typename T>
__device__ __forceinline__ int stage_to_shared(const T* __restrict__ seg, int len, T* smem) {
  constexpr int V = 16 / sizeof(T);
  const int lead = static_cast<int>((reinterpret_cast<uintptr_t>(seg) % 16) / sizeof(T));
  const int head = min(len, (V - lead) % V);
  const int nvec = (len - head) / V;
  const uint4* __restrict__ gsrc = reinterpret_cast<const uint4*>(seg + head);
  uint4* sdst = reinterpret_cast<uint4*>(smem + lead + head);
  int i = threadIdx.x;
  for (; i + 3 * kThreads < nvec; i += 4 * kThreads) {
    const uint4 a = gsrc[i], b = gsrc[i + kThreads], c = gsrc[i + 2 * kThreads],
                d = gsrc[i + 3 * kThreads];
    sdst[i] = a;
    sdst[i + kThreads] = b;
    sdst[i + 2 * kThreads] = c;
    sdst[i + 3 * kThreads] = d;
  }
  for (; i < nvec; i += kThreads) sdst[i] = gsrc[i];
  for (int j = threadIdx.x; j < head; j += kThreads) smem[lead + j] = seg[j];
  for (int j = head + nvec * V + threadIdx.x; j < len; j += kThreads) smem[lead + j] = seg[j];
  return lead;
}

template <typename T, PoolMode kMode, int kR, int kS>
__global__ void __launch_bounds__(kThreads)
    pool2d_rows_kernel(const T* __restrict__ x, T* __restrict__ y, Geometry g, int64_t B,
                       int planes_per_cta, int rows_per_cta, int row_blocks) {
  extern __shared__ __align__(16) unsigned char pool_smem_raw[];
  T* smem = reinterpret_cast<T*>(pool_smem_raw);
  const int R = kR > 0 ? kR : g.R;
  const int S = kS > 0 ? kS : g.S;
  const int HW = g.H * g.W;  // a staged plane fits in shared memory, so in int
  const RowsTile t = rows_tile(g, B, planes_per_cta, rows_per_cta, row_blocks);
  const T* seg = x + t.b0 * HW + static_cast<int64_t>(t.ih_lo) * g.W;
  const int len = t.kb > 1 ? t.kb * HW : (t.ih_hi - t.ih_lo) * g.W;
  const int lead = stage_to_shared(seg, len, smem);
  __syncthreads();

  const int per_plane = t.tp * g.Q;
  const int outputs = t.kb * per_plane;
  T* out = y + (t.b0 * g.P + t.p0) * static_cast<int64_t>(g.Q);
  for (int o = threadIdx.x; o < outputs; o += kThreads) {
    const int k = o / per_plane;
    const int rem = o - k * per_plane;
    const int r = rem / g.Q;
    const int q = rem - r * g.Q;
    const int h0 = (t.p0 + r) * g.sh - g.pt;
    const int w0 = q * g.sw - g.pl;
    // smem index of (plane k, input row h, col w) = base + h * W + w.
    const int base = lead + k * HW - t.ih_lo * g.W;
    float acc = init_value<kMode>();
#pragma unroll(kR > 0 ? kR : 1)
    for (int rr = 0; rr < R; ++rr) {
      const int h = h0 + rr;
      if (h < 0 || h >= g.H) continue;
      const T* line = smem + (base + h * g.W);
#pragma unroll(kS > 0 ? kS : 1)
      for (int ss = 0; ss < S; ++ss) {
        const int w = w0 + ss;
        if (w < 0 || w >= g.W) continue;
        acc = combine<kMode>(acc, to_float(line[w]));
      }
    }
    if (kMode == PoolMode::kAvg) acc = acc / avg_divisor(g, R, S, h0, w0);
    // Whole-plane tiles are contiguous in y; a row tile is contiguous within its plane.
    out[static_cast<int64_t>(k) * g.P * g.Q + r * g.Q + q] = from_float<T>(acc);
  }
}

}  // namespace pool2d
}  // namespace jaxcnn
