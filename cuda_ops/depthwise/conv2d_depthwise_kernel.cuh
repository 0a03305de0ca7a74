// Depthwise conv2d kernels. The op is memory-bound (9 FMAs per output element
// for 3x3), so both kernels stage an input tile + halo in shared memory once
// and let each thread slide a vertical strip of TH outputs over it, reusing
// every loaded input row for up to R outputs from registers.
//
//  * VecKernel ("channel-last"): NHWC and CHWN. The innermost dimension
//    (channels for NHWC, batch for CHWN) is contiguous in memory, so a thread
//    owns V=4 adjacent elements of it (8-byte bf16/fp16 or 16-byte fp32
//    vectors). Persistent CTAs walk the tiles with a 2-stage cp.async pipeline
//    so the next tile streams in while the current one is computed.
//  * PlaneKernel: NCHW (and CHWN with N == 1, the same memory order). Each
//    (n, k) plane is an independent 2-D stencil; a CTA stages the tiles of
//    several planes (small late-network planes would leave most threads idle)
//    as fp32, so each input element is converted once.
//
// Shapes: kR == 0 selects the generic path (runtime R, S, stride, dilation,
// weights in shared memory); kR > 0 is a compile-time fast path with dilation
// 1 and stride kStr (weights in registers, fully unrolled sliding window).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/epilogue.cuh"
#include "common/float_convert.cuh"

namespace jaxcnn {
namespace conv2d_depthwise {

constexpr int kMaxThreads = 256;
// <= 80 registers: three 256-thread CTAs per SM, so one CTA's compute overlaps
// the others' tile loads (ptxas: 55-80 registers, at most a 4-byte spill).
constexpr int kVecMinBlocks = 3;

// n / d and n % d for a runtime d with a multiply-high and a shift
// (Granlund-Montgomery, as in CUTLASS's FastDivmod); valid for n < 2^31.
struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 0;
  uint32_t shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(uint32_t d) : divisor(d) {
    if (d > 1) {
      uint32_t log2_ceil = 0;
      while ((uint64_t(1) << log2_ceil) < d) ++log2_ceil;
      const uint32_t p = 31 + log2_ceil;
      multiplier = static_cast<uint32_t>(((uint64_t(1) << p) + d - 1) / d);
      shift = p - 32;
    }
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return divisor == 1 ? n : (__umulhi(n, multiplier) >> shift);
  }
  __device__ __forceinline__ void divmod(uint32_t n, uint32_t& q,
                                         uint32_t& r) const {
    q = div(n);
    r = n - q * divisor;
  }
};

// ---------------------------------------------------------------------------
// Small device helpers.

// Asynchronous global->shared copy; invalid sources zero-fill (src-size 0
// reads nothing), which is how padding and channel tails become zeros.
template <int kBytes>
__device__ __forceinline__ void cp_async_zfill(void* smem_dst,
                                               const void* gmem_src,
                                               bool valid) {
  const unsigned dst =
      static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int src_size = valid ? kBytes : 0;
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(gmem_src), "r"(src_size)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst),
                 "l"(gmem_src), "n"(kBytes), "r"(src_size)
                 : "memory");
  }
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// One V-element chunk: cp.async when it is >= 4 bytes, else (2-byte scalars) a
// plain load/store, which makes that fallback's prefetch synchronous.
template <typename T, int V>
__device__ __forceinline__ void copy_chunk(T* dst, const T* src, bool valid) {
  constexpr int kBytes = V * static_cast<int>(sizeof(T));
  if constexpr (kBytes >= 4) {
    cp_async_zfill<kBytes>(dst, src, valid);
  } else {
    *dst = valid ? *src : from_float<T>(0.0f);
  }
}

// V adjacent elements <-> fp32. bf16 -> fp32 is a 16-bit shift, so the packed
// words are split by hand instead of going through conversion intrinsics.
template <typename T, int V>
struct VecIO;

template <typename T>
struct VecIO<T, 1> {
  __device__ __forceinline__ static void load(const T* p, float (&f)[1]) {
    f[0] = to_float(*p);
  }
  __device__ __forceinline__ static void store(T* p, const float (&f)[1]) {
    *p = from_float<T>(f[0]);
  }
};

template <>
struct VecIO<float, 4> {
  __device__ __forceinline__ static void load(const float* p, float (&f)[4]) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    f[0] = v.x;
    f[1] = v.y;
    f[2] = v.z;
    f[3] = v.w;
  }
  __device__ __forceinline__ static void store(float* p, const float (&f)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
  }
};

template <>
struct VecIO<__nv_bfloat16, 4> {
  __device__ __forceinline__ static void load(const __nv_bfloat16* p,
                                              float (&f)[4]) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    f[0] = __uint_as_float(u.x << 16);
    f[1] = __uint_as_float(u.x & 0xffff0000u);
    f[2] = __uint_as_float(u.y << 16);
    f[3] = __uint_as_float(u.y & 0xffff0000u);
  }
  __device__ __forceinline__ static void store(__nv_bfloat16* p,
                                               const float (&f)[4]) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(f[0], f[1]);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(f[2], f[3]);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t*>(&lo);
    u.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(p) = u;
  }
};

template <>
struct VecIO<__half, 4> {
  __device__ __forceinline__ static void load(const __half* p, float (&f)[4]) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
    f[0] = lo.x;
    f[1] = lo.y;
    f[2] = hi.x;
    f[3] = hi.y;
  }
  __device__ __forceinline__ static void store(__half* p, const float (&f)[4]) {
    const __half2 lo = __floats2half2_rn(f[0], f[1]);
    const __half2 hi = __floats2half2_rn(f[2], f[3]);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t*>(&lo);
    u.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(p) = u;
  }
};

// The conv epilogue (common/epilogue.cuh): bias and residual added, then the activation.
__device__ __forceinline__ float finish(float acc, float bias, float residual,
                                        const EpilogueActivation& e) {
  return ApplyActivation(e, acc + bias + residual);
}

// Sliding window over one strip for the fast path. Tap column s outermost so
// only its kR weight vectors are live; input row j of the strip
// (0 .. (TH-1)*kStr + kR - 1) is then loaded once and feeds every output row i
// with j == i*kStr + r. All indices fold at compile time.
// load_x(j, s, xv) fetches V inputs; load_w(r, s, wv) the V fp32 weights.
template <int TH, int V, int kR, int kS, int kStr, class LoadX, class LoadW>
__device__ __forceinline__ void strip_fast(float (&acc)[TH][V], LoadX load_x,
                                           LoadW load_w) {
  constexpr int kRows = (TH - 1) * kStr + kR;
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    // Keeps the scheduler from hoisting every column's loads to the top
    // (kRows*kS vectors live at once spilled at 128 registers).
    asm volatile("" ::: "memory");
    float wv[kR][V];
#pragma unroll
    for (int r = 0; r < kR; ++r) load_w(r, s, wv[r]);
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (j % 4 == 0) asm volatile("" ::: "memory");
      float xv[V];
      load_x(j, s, xv);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const int d = j - r;
        if (d < 0 || d % kStr != 0 || d / kStr >= TH) continue;
        const int i = d / kStr;
#pragma unroll
        for (int v = 0; v < V; ++v) acc[i][v] = fmaf(xv[v], wv[r][v], acc[i][v]);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Channel-last kernel (NHWC / CHWN).
//
// Index roles: "outer" o is the slowest tensor index (NHWC: n, CHWN: k) and
// "inner" the contiguous one (NHWC: channel, CHWN: n). For NHWC the weight
// depends on the inner index, for CHWN on the outer one (kChanInner).
// Shared memory per stage: [IH][IWs * stride_w][lanes] of T, where lanes =
// tcv * V inner elements of one slice. Columns are stored phase-split by the
// stride (col c at (c % stride_w) * IWs + c / stride_w) so the threads of a
// warp, which own adjacent output columns, read adjacent words at any stride.
struct VecParams {
  int H, W, P, Q;
  int inner;    // elements per output pixel (NHWC: K, CHWN: N)
  int x_inner;  // elements per input pixel (NHWC: C, CHWN: N)
  int K;        // HWIO weight row length
  int R, S;
  int stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  int TP, TQ;       // output tile (TP = strip rows * TH)
  int IH, IW;       // input tile (halo included)
  int IWs;          // columns per stride phase: ceil(IW / stride_w)
  int row_pitch;    // smem elements per tile row: IWs * stride_w * lanes
  int phase_pitch;  // smem elements per stride phase: IWs * lanes
  int lanes;        // inner elements per tile: tcv * V
  int tcv;          // threads along inner
  int strips;       // strips per tile (TQ * TP / TH), one thread each
  int stage_elems;  // smem elements per pipeline stage (16-byte multiple)
  int num_tiles;
  FastDivmod div_tcv, div_iw, div_slices, div_tiles_q, div_tiles_p, div_tq,
      div_stride_w, div_mult;
  EpilogueActivation epilogue;
};

struct VecTile {
  int o, tp, tq, cs;  // outer index, tile row, tile column, inner slice
};

__device__ __forceinline__ VecTile decode_vec_tile(const VecParams& p, int t) {
  // slice fastest: a persistent CTA striding by a multiple of `slices` keeps
  // one slice (NHWC: one set of weights) for all its tiles.
  uint32_t rest, cs, tq, tp, o;
  p.div_slices.divmod(static_cast<uint32_t>(t), rest, cs);
  p.div_tiles_q.divmod(rest, rest, tq);
  p.div_tiles_p.divmod(rest, o, tp);
  return VecTile{static_cast<int>(o), static_cast<int>(tp),
                 static_cast<int>(tq), static_cast<int>(cs)};
}

template <typename T, bool kChanInner, int V, int kStr>
__device__ __forceinline__ void load_vec_tile(const T* __restrict__ x,
                                              T* stage, const VecParams& p,
                                              const VecTile& tile, int tid,
                                              int nthreads) {
  const int ih0 = tile.tp * p.TP * p.stride_h - p.pad_h;
  const int iw0 = tile.tq * p.TQ * p.stride_w - p.pad_w;
  // CHWN: output plane k reads input plane k / multiplier.
  const int in_outer =
      kChanInner ? tile.o : static_cast<int>(p.div_mult.div(tile.o));
  const int inner0 = tile.cs * p.lanes;
  const T* x_outer =
      x + static_cast<int64_t>(in_outer) * p.H * p.W * p.x_inner;
  const uint32_t chunks = static_cast<uint32_t>(p.IH * p.IW * p.tcv);
  for (uint32_t e = tid; e < chunks; e += nthreads) {
    uint32_t pix, lv, row, col;
    p.div_tcv.divmod(e, pix, lv);
    p.div_iw.divmod(pix, row, col);
    const int ih = ih0 + static_cast<int>(row);
    const int iw = iw0 + static_cast<int>(col);
    const int idx = inner0 + static_cast<int>(lv) * V;  // output inner index
    const bool valid = static_cast<unsigned>(ih) < static_cast<unsigned>(p.H) &&
                       static_cast<unsigned>(iw) < static_cast<unsigned>(p.W) &&
                       idx < p.inner;
    // NHWC with a multiplier (V == 1 only): output channel k reads k / mult.
    const int src_inner =
        (kChanInner && V == 1) ? static_cast<int>(p.div_mult.div(idx)) : idx;
    const T* src =
        valid ? x_outer + (static_cast<int64_t>(ih) * p.W + iw) * p.x_inner +
                    src_inner
              : x;
    uint32_t phys_col;
    if constexpr (kStr == 1) {
      phys_col = col;
    } else if constexpr (kStr > 1) {
      phys_col = (col % kStr) * p.IWs + col / kStr;
    } else {
      uint32_t q, r;
      p.div_stride_w.divmod(col, q, r);
      phys_col = r * p.IWs + q;
    }
    T* dst = stage + row * p.row_pitch + phys_col * p.lanes + lv * V;
    copy_chunk<T, V>(dst, src, valid);
  }
}

template <typename T, bool kChanInner, int V, int TH, int kR, int kS, int kStr>
__global__ void __launch_bounds__(kMaxThreads, kVecMinBlocks)
    dw_vec_kernel(const T* __restrict__ x, const T* __restrict__ w,
                  const T* __restrict__ bias, const T* __restrict__ residual,
                  T* __restrict__ y, const VecParams p) {
  constexpr bool kFast = kR > 0;
  constexpr int WV = kChanInner ? V : 1;  // bias values per thread
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* stages = reinterpret_cast<T*>(smem_raw);
  // fp32 weights [R*S][kChanInner ? lanes : 1] after the two stages.
  float* w_smem =
      reinterpret_cast<float*>(smem_raw + 2 * p.stage_elems * sizeof(T));

  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  uint32_t strip, lv;
  p.div_tcv.divmod(static_cast<uint32_t>(tid), strip, lv);
  uint32_t sp, sq;
  p.div_tq.divmod(strip, sp, sq);
  const int pl0 = static_cast<int>(sp) * TH;  // first output row in the tile
  const int ql = static_cast<int>(sq);        // output column in the tile
  const int lane = static_cast<int>(lv) * V;  // first inner element in slice
  // Offset of this strip's first input (row pl0*stride_h, col ql*stride_w):
  // column ql*stride_w + t lands in phase t % stride_w at index ql + t / stride_w.
  const int x_base = pl0 * p.stride_h * p.row_pitch + ql * p.lanes + lane;

  int t = static_cast<int>(blockIdx.x);
  if (t >= p.num_tiles) return;
  load_vec_tile<T, kChanInner, V, kStr>(x, stages, p, decode_vec_tile(p, t),
                                        tid, nthreads);
  cp_async_commit();

  int weight_key = -1;
  float breg[WV];
  for (int it = 0; t < p.num_tiles; t += gridDim.x, ++it) {
    const VecTile tile = decode_vec_tile(p, t);
    // Prefetch the next tile into the other stage; the trailing barrier of the
    // previous iteration guarantees nobody still reads it.
    const int t_next = t + static_cast<int>(gridDim.x);
    if (t_next < p.num_tiles)
      load_vec_tile<T, kChanInner, V, kStr>(
          x, stages + ((it + 1) & 1) * p.stage_elems, p,
          decode_vec_tile(p, t_next), tid, nthreads);
    cp_async_commit();

    const int inner0 = tile.cs * p.lanes;
    const int idx = inner0 + lane;
    const bool lane_valid = idx < p.inner;
    // Weights and bias change with the slice (NHWC) or the plane (CHWN); the
    // loads overlap the wait for this tile. Weights go to shared memory as
    // fp32 (registers would cost R*S*V per thread and limit occupancy).
    const int key = kChanInner ? tile.cs : tile.o;
    if (key != weight_key) {
      weight_key = key;
      const int wl = kChanInner ? p.lanes : 1;
      const int n_w = p.R * p.S * wl;
      for (int e = tid; e < n_w; e += nthreads) {
        const int tap = e / wl;
        const int k = kChanInner ? inner0 + (e - tap * wl) : tile.o;
        w_smem[e] = (k < p.K) ? to_float(w[static_cast<int64_t>(tap) * p.K + k])
                              : 0.0f;
      }
#pragma unroll
      for (int v = 0; v < WV; ++v) {
        const int k = kChanInner ? idx + v : tile.o;
        breg[v] = (bias != nullptr && (!kChanInner || lane_valid))
                      ? to_float(bias[k])
                      : 0.0f;
      }
    }
    cp_async_wait<1>();
    __syncthreads();

    // The per-tap smem offsets are loop-invariant; hoisted out of the tile
    // loop they would pin ~kRows*kS address registers for the whole kernel.
    // Laundering the pitches through an empty asm keeps them per tile.
    int row_pitch = p.row_pitch, phase_pitch = p.phase_pitch, lanes = p.lanes;
    asm volatile("" : "+r"(row_pitch), "+r"(phase_pitch), "+r"(lanes));
    const T* xs = stages + (it & 1) * p.stage_elems + x_base;
    float acc[TH][V];
#pragma unroll
    for (int i = 0; i < TH; ++i)
#pragma unroll
      for (int v = 0; v < V; ++v) acc[i][v] = 0.0f;

    if constexpr (kFast) {
      strip_fast<TH, V, kR, kS, kStr>(
          acc,
          [&](int j, int s, float(&xv)[V]) {
            VecIO<T, V>::load(
                xs + j * row_pitch + (s % kStr) * phase_pitch + (s / kStr) * lanes,
                xv);
          },
          [&](int r, int s, float(&wv)[V]) {
            const float* wt = w_smem + (r * kS + s) * (kChanInner ? lanes : 1);
            if constexpr (kChanInner) {
              VecIO<float, V>::load(wt + lane, wv);
            } else {
#pragma unroll
              for (int v = 0; v < V; ++v) wv[v] = wt[0];
            }
          });
    } else {
      for (int r = 0; r < p.R; ++r) {
        const int row_off = r * p.dil_h * p.row_pitch;
        for (int s = 0; s < p.S; ++s) {
          uint32_t cq, cr;
          p.div_stride_w.divmod(static_cast<uint32_t>(s * p.dil_w), cq, cr);
          const int off =
              row_off + static_cast<int>(cr) * p.phase_pitch + static_cast<int>(cq) * p.lanes;
          const float* wt = w_smem + (r * p.S + s) * (kChanInner ? p.lanes : 1) +
                            (kChanInner ? lane : 0);
          float wv[V];
#pragma unroll
          for (int v = 0; v < V; ++v) wv[v] = wt[kChanInner ? v : 0];
#pragma unroll
          for (int i = 0; i < TH; ++i) {
            float xv[V];
            VecIO<T, V>::load(xs + off + i * p.stride_h * p.row_pitch, xv);
#pragma unroll
            for (int v = 0; v < V; ++v) acc[i][v] = fmaf(xv[v], wv[v], acc[i][v]);
          }
        }
      }
    }

    const int q = tile.tq * p.TQ + ql;
    if (lane_valid && q < p.Q) {
      const int p0 = tile.tp * p.TP + pl0;
      const int64_t out0 = ((static_cast<int64_t>(tile.o) * p.P + p0) * p.Q + q) * p.inner + idx;
#pragma unroll
      for (int i = 0; i < TH; ++i) {
        if (p0 + i >= p.P) break;
        const int64_t at = out0 + static_cast<int64_t>(i) * p.Q * p.inner;
        float res[V];
        if (residual != nullptr) {
          VecIO<T, V>::load(residual + at, res);
        } else {
#pragma unroll
          for (int v = 0; v < V; ++v) res[v] = 0.0f;
        }
        float out[V];
#pragma unroll
        for (int v = 0; v < V; ++v)
          out[v] = finish(acc[i][v], breg[kChanInner ? v : 0], res[v], p.epilogue);
        VecIO<T, V>::store(y + at, out);
      }
    }
    // Everyone is done reading this stage (and w_smem) before it is refilled.
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------
// Plane kernel (NCHW, and CHWN with N == 1).
//
// A CTA handles PL planes x one TP x TQ output tile. Shared memory: fp32
// [PL][IH][IWs * stride_w] (same stride-phase column split as above), then for
// the generic path fp32 weights [PL][R*S]. Threads: output column fastest (so
// warps store contiguous runs of a row), then strip row, then plane.
struct PlaneParams {
  int H, W, P, Q;
  int C, K;  // input / output channels
  int R, S;
  int stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  int planes;  // N * K output planes
  int PL, TP, TQ, IH, IW, IWs;
  int row_pitch;    // IWs * stride_w
  int plane_pitch;  // IH * row_pitch
  int strips;       // TQ * TP / TH per plane
  int num_tiles;
  FastDivmod div_iw, div_ih, div_tq, div_strips, div_tiles_q, div_tiles_p,
      div_K, div_mult, div_stride_w;
  EpilogueActivation epilogue;
};

template <typename T, int TH, int kR, int kS, int kStr>
__global__ void __launch_bounds__(kMaxThreads)
    dw_plane_kernel(const T* __restrict__ x, const T* __restrict__ w,
                    const T* __restrict__ bias, const T* __restrict__ residual,
                    T* __restrict__ y, const PlaneParams p) {
  constexpr bool kFast = kR > 0;
  constexpr int kTaps = kFast ? kR * kS : 1;
  constexpr int kBatch = 4;  // loads in flight per thread while filling smem
  extern __shared__ __align__(16) float smem_f[];
  float* w_smem = smem_f + p.PL * p.plane_pitch;

  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  uint32_t rest, tq, tp, pg;
  p.div_tiles_q.divmod(blockIdx.x, rest, tq);
  p.div_tiles_p.divmod(rest, pg, tp);
  const int plane0 = static_cast<int>(pg) * p.PL;
  const int ih0 = static_cast<int>(tp) * p.TP * p.stride_h - p.pad_h;
  const int iw0 = static_cast<int>(tq) * p.TQ * p.stride_w - p.pad_w;
  const int64_t HW = static_cast<int64_t>(p.H) * p.W;

  // Fill: element e -> (plane, row, col), converted to fp32 once.
  const uint32_t total = static_cast<uint32_t>(p.PL * p.IH * p.IW);
  for (uint32_t base = tid; base < total; base += kBatch * nthreads) {
    float v[kBatch];
    uint32_t dst[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const uint32_t e = base + u * nthreads;
      v[u] = 0.0f;
      dst[u] = 0xffffffffu;
      if (e < total) {
        uint32_t line, col, pl, row;
        p.div_iw.divmod(e, line, col);
        p.div_ih.divmod(line, pl, row);
        const int plane = plane0 + static_cast<int>(pl);
        const int ih = ih0 + static_cast<int>(row);
        const int iw = iw0 + static_cast<int>(col);
        uint32_t cq, cr;
        p.div_stride_w.divmod(col, cq, cr);
        dst[u] = pl * p.plane_pitch + row * p.row_pitch + cr * p.IWs + cq;
        if (plane < p.planes &&
            static_cast<unsigned>(ih) < static_cast<unsigned>(p.H) &&
            static_cast<unsigned>(iw) < static_cast<unsigned>(p.W)) {
          uint32_t n, k;
          p.div_K.divmod(static_cast<uint32_t>(plane), n, k);
          const int64_t in_plane =
              static_cast<int64_t>(n) * p.C + p.div_mult.div(k);
          v[u] = to_float(x[in_plane * HW + static_cast<int64_t>(ih) * p.W + iw]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (dst[u] != 0xffffffffu) smem_f[dst[u]] = v[u];
  }

  uint32_t strip_all, pl, sp, sq;
  p.div_strips.divmod(static_cast<uint32_t>(tid), pl, strip_all);
  p.div_tq.divmod(strip_all, sp, sq);
  const int plane = plane0 + static_cast<int>(pl);
  const bool plane_valid = plane < p.planes;
  uint32_t plane_n = 0, plane_k = 0;
  if (plane_valid) p.div_K.divmod(static_cast<uint32_t>(plane), plane_n, plane_k);
  const int k = static_cast<int>(plane_k);

  float wreg[kTaps];
  if constexpr (kFast) {
#pragma unroll
    for (int tap = 0; tap < kTaps; ++tap)
      wreg[tap] = plane_valid ? to_float(w[static_cast<int64_t>(tap) * p.K + k]) : 0.0f;
  } else {
    const int taps = p.R * p.S;
    for (int e = tid; e < p.PL * taps; e += nthreads) {
      const int wpl = e / taps;
      const int tap = e - wpl * taps;
      const int wplane = plane0 + wpl;
      uint32_t wn, wk;
      p.div_K.divmod(static_cast<uint32_t>(wplane), wn, wk);
      w_smem[e] = wplane < p.planes
                      ? to_float(w[static_cast<int64_t>(tap) * p.K + wk])
                      : 0.0f;
    }
  }
  const float b = (bias != nullptr && plane_valid) ? to_float(bias[k]) : 0.0f;
  __syncthreads();

  const int pl0 = static_cast<int>(sp) * TH;
  const int ql = static_cast<int>(sq);
  const float* xs = smem_f + static_cast<int>(pl) * p.plane_pitch +
                    pl0 * p.stride_h * p.row_pitch + ql;
  float acc[TH][1];
#pragma unroll
  for (int i = 0; i < TH; ++i) acc[i][0] = 0.0f;

  if constexpr (kFast) {
    strip_fast<TH, 1, kR, kS, kStr>(
        acc,
        [&](int j, int s, float(&xv)[1]) {
          xv[0] = xs[j * p.row_pitch + (s % kStr) * p.IWs + s / kStr];
        },
        [&](int r, int s, float(&wv)[1]) { wv[0] = wreg[r * kS + s]; });
  } else {
    const float* wt = w_smem + static_cast<int>(pl) * p.R * p.S;
    for (int r = 0; r < p.R; ++r) {
      const int row_off = r * p.dil_h * p.row_pitch;
      for (int s = 0; s < p.S; ++s) {
        uint32_t cq, cr;
        p.div_stride_w.divmod(static_cast<uint32_t>(s * p.dil_w), cq, cr);
        const int off = row_off + static_cast<int>(cr) * p.IWs + static_cast<int>(cq);
        const float wv = wt[r * p.S + s];
#pragma unroll
        for (int i = 0; i < TH; ++i)
          acc[i][0] = fmaf(xs[off + i * p.stride_h * p.row_pitch], wv, acc[i][0]);
      }
    }
  }

  const int q = static_cast<int>(tq) * p.TQ + ql;
  if (plane_valid && q < p.Q) {
    const int p0 = static_cast<int>(tp) * p.TP + pl0;
    const int64_t out0 = (static_cast<int64_t>(plane) * p.P + p0) * p.Q + q;
#pragma unroll
    for (int i = 0; i < TH; ++i) {
      if (p0 + i >= p.P) break;
      const int64_t at = out0 + static_cast<int64_t>(i) * p.Q;
      const float res = residual != nullptr ? to_float(residual[at]) : 0.0f;
      y[at] = from_float<T>(finish(acc[i][0], b, res, p.epilogue));
    }
  }
}

}  // namespace conv2d_depthwise
}  // namespace jaxcnn
