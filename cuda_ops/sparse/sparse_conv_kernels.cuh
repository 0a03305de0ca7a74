// Kernels of the zero-skipping conv (see sparse_conv.h for the design).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/float_convert.cuh"

namespace jaxcnn {
namespace sparse {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Kernel-side parameters (32-bit where the extents allow; M and offsets are 64-bit).
struct ConvArgs {
  int N, H, W, C, G, R, S, K, P, Q;
  int stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, activation;
  int pool_h, pool_w, pool_stride_h, pool_stride_w, pool_pad_h, pool_pad_w, PP, PQ;
  int taps_per_stage;
  int64_t M;  // output pixels: N*P*Q (conv) or N*PP*PQ (pooled)
};

// NaN-propagating max and ReLU, as lax.max / jnp.maximum (fmaxf would drop a NaN).
__device__ __forceinline__ float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float nan_relu(float v) { return nan_max(v, 0.0f); }

// One warp per (input pixel, 32-channel group): lane c tests channel g*32 + c (coalesced
// along C) and the ballot is the group's nonzero mask. NaN counts as nonzero, so it
// propagates as in the dense conv.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    encode_nonzeros(const T* __restrict__ x, uint32_t* __restrict__ masks, int64_t entries,
                    int C, int G) {
  const int lane = threadIdx.x & 31;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t step = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t e = first; e < entries; e += step) {  // trip count is warp-uniform
    const int64_t pixel = e / G;
    const int c = static_cast<int>(e - pixel * G) * 32 + lane;
    const bool nonzero = c < C && to_float(x[pixel * C + c]) != 0.0f;
    const uint32_t mask = __ballot_sync(kFullMask, nonzero);
    if (lane == 0) masks[e] = mask;
  }
}

// Four consecutive elements as floats from a 4-element-aligned address (XLA buffers are
// 16-byte aligned; the callers' offsets are multiples of 4).
__device__ __forceinline__ float4 load4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
  const uint2 raw = __ldg(reinterpret_cast<const uint2*>(p));
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ float4 load4(const __half* p) {
  const uint2 raw = __ldg(reinterpret_cast<const uint2*>(p));
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

template <int KPT>
__device__ __forceinline__ void load_weights(const float* p, float (&v)[KPT]) {
  if constexpr (KPT == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else if constexpr (KPT == 2) {
    const float2 q = *reinterpret_cast<const float2*>(p);
    v[0] = q.x, v[1] = q.y;
  } else {
    v[0] = *p;
  }
}

// Output-stationary zero-skipping conv. CTA: kWarps warps x PW pixel slots each, one block of
// TK = 32 * KPT output channels (blockIdx.y); lane owns channels k0 + lane*KPT .. +KPT.
// Plain (POOL=false): a warp's slots are PW consecutive output pixels.
// Pooled (POOL=true): a warp owns one pooled pixel; its slots are the window's conv pixels
// (in rounds of PW when the window is larger), reduced by max in registers: the pre-pool
// output never leaves the SM.
// For each 32-channel group g and each stage of taps, the CTA stages W[taps, g*32.., k-block]
// (fp32) in shared memory; then every warp, for each tap and each valid slot whose input pixel
// is inside x, reads that pixel's mask for g (warp-uniform), loads the values of the set bits
// (one per lane) and loops over the set bits only: shuffle-broadcast the value, FMA it with the
// staged weight row. All control flow depends on warp-uniform values only.
template <typename T, int KPT, int PW, bool POOL>
__global__ void __launch_bounds__(kThreads)
    sparse_conv_kernel(ConvArgs a, const T* __restrict__ x, const uint32_t* __restrict__ masks,
                       const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ y) {
  constexpr int TK = 32 * KPT;
  extern __shared__ float4 smem_f4[];
  float* staged = reinterpret_cast<float*>(smem_f4);  // [taps_per_stage][32][TK]
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int k0 = blockIdx.y * TK;
  const int taps = a.R * a.S;
  const int64_t item = POOL ? static_cast<int64_t>(blockIdx.x) * kWarps + warp
                            : (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * PW;
  const int window = POOL ? a.pool_h * a.pool_w : PW;
  const int rounds = POOL ? (window + PW - 1) / PW : 1;  // same for every warp of the CTA

  // Pooled pixel of this warp (POOL only).
  int pool_n = 0, pool_p0 = 0, pool_q0 = 0;
  if (POOL && item < a.M) {
    const int pq = static_cast<int>(item % a.PQ);
    const int64_t rest = item / a.PQ;
    pool_p0 = static_cast<int>(rest % a.PP) * a.pool_stride_h - a.pool_pad_h;
    pool_q0 = pq * a.pool_stride_w - a.pool_pad_w;
    pool_n = static_cast<int>(rest / a.PP);
  }

  float best[KPT];
#pragma unroll
  for (int j = 0; j < KPT; ++j) best[j] = -INFINITY;
  bool any_valid = false;

  for (int round = 0; round < rounds; ++round) {
    // Slot i: conv output pixel (n, p, q), kept as its image row base n*H and the top-left
    // input coordinate of its receptive field.
    int slot_nh[PW], slot_h0[PW], slot_w0[PW];
    uint32_t valid = 0;
#pragma unroll
    for (int i = 0; i < PW; ++i) {
      int n = 0, p = 0, q = 0;
      bool ok;
      if constexpr (POOL) {
        const int slot = round * PW + i;
        p = pool_p0 + slot / a.pool_w;
        q = pool_q0 + slot % a.pool_w;
        n = pool_n;
        ok = item < a.M && slot < window && p >= 0 && p < a.P && q >= 0 && q < a.Q;
      } else {
        const int64_t m = item + i;
        ok = m < a.M;
        if (ok) {
          q = static_cast<int>(m % a.Q);
          const int64_t rest = m / a.Q;
          p = static_cast<int>(rest % a.P);
          n = static_cast<int>(rest / a.P);
        }
      }
      slot_nh[i] = n * a.H;
      slot_h0[i] = p * a.stride_h - a.pad_h;
      slot_w0[i] = q * a.stride_w - a.pad_w;
      if (ok) valid |= 1u << i;
    }

    float acc[PW][KPT];
#pragma unroll
    for (int i = 0; i < PW; ++i)
#pragma unroll
      for (int j = 0; j < KPT; ++j) acc[i][j] = 0.0f;

    for (int g = 0; g < a.G; ++g) {
      const int c_lane = g * 32 + lane;  // this lane's channel in group g
      for (int t0 = 0; t0 < taps; t0 += a.taps_per_stage) {
        const int stage_taps = min(a.taps_per_stage, taps - t0);
        __syncthreads();  // the previous stage's weights are no longer read
        if (a.K % 4 == 0) {
          // 4 consecutive k per thread: one 16-byte (fp32) / 8-byte (16-bit) load, one
          // 16-byte shared store. k0 and K are multiples of 4, so a group is all in or all out.
          for (int e = threadIdx.x; e < stage_taps * 32 * TK / 4; e += kThreads) {
            const int kk = (e % (TK / 4)) * 4;
            const int rest = e / (TK / 4);
            const int c = g * 32 + rest % 32;
            const int k = k0 + kk;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (c < a.C && k < a.K)
              v = load4(w + (static_cast<int64_t>(t0 + rest / 32) * a.C + c) * a.K + k);
            reinterpret_cast<float4*>(staged)[e] = v;
          }
        } else {
          for (int e = threadIdx.x; e < stage_taps * 32 * TK; e += kThreads) {
            const int kk = e % TK;
            const int rest = e / TK;
            const int c = g * 32 + rest % 32;
            const int k = k0 + kk;
            float v = 0.0f;  // channels past C / K stay zero: they never contribute
            if (c < a.C && k < a.K)
              v = to_float(w[(static_cast<int64_t>(t0 + rest / 32) * a.C + c) * a.K + k]);
            staged[e] = v;
          }
        }
        __syncthreads();
        if (valid == 0) continue;
        for (int tl = 0; tl < stage_taps; ++tl) {
          const int t = t0 + tl;
          const int r = t / a.S;
          const int dh = r * a.dilation_h;
          const int dw = (t - r * a.S) * a.dilation_w;
          // Three batched phases per tap, so the PW slots' loads are in flight together:
          // masks (warp-uniform: every lane reads the same word), then the values of the set
          // bits (a lane loads only its own channel, and only if its bit is set: sectors of
          // zeros are never fetched), then the FMA walk over the set bits.
          uint32_t mask[PW];
#pragma unroll
          for (int i = 0; i < PW; ++i) {
            const int h = slot_h0[i] + dh;
            const int wx = slot_w0[i] + dw;
            const bool inside = ((valid >> i) & 1u) && h >= 0 && h < a.H && wx >= 0 && wx < a.W;
            mask[i] = inside ? __ldg(masks + (static_cast<int64_t>(slot_nh[i] + h) * a.W + wx) * a.G + g)
                             : 0u;
          }
          float x_lane[PW];
#pragma unroll
          for (int i = 0; i < PW; ++i) {
            x_lane[i] = 0.0f;
            if ((mask[i] >> lane) & 1u) {  // implies c_lane < C (masks have no bits past C)
              const int64_t pixel =
                  static_cast<int64_t>(slot_nh[i] + slot_h0[i] + dh) * a.W + slot_w0[i] + dw;
              x_lane[i] = to_float(x[pixel * a.C + c_lane]);
            }
          }
          const float* w_row = staged + tl * 32 * TK + lane * KPT;
#pragma unroll
          for (int i = 0; i < PW; ++i) {
            uint32_t bits = mask[i];
            while (bits != 0) {  // warp-uniform trip count: one iteration per nonzero
              const int bit = __ffs(bits) - 1;
              bits &= bits - 1;
              const float xv = __shfl_sync(kFullMask, x_lane[i], bit);
              float wv[KPT];
              load_weights<KPT>(w_row + bit * TK, wv);
#pragma unroll
              for (int j = 0; j < KPT; ++j) acc[i][j] = fmaf(xv, wv[j], acc[i][j]);
            }
          }
        }
      }
    }

    float b[KPT];
#pragma unroll
    for (int j = 0; j < KPT; ++j) {
      const int k = k0 + lane * KPT + j;
      b[j] = (bias != nullptr && k < a.K) ? to_float(bias[k]) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < PW; ++i) {
      if (!((valid >> i) & 1u)) continue;
      if constexpr (POOL) {
        any_valid = true;
#pragma unroll
        for (int j = 0; j < KPT; ++j) best[j] = nan_max(best[j], acc[i][j] + b[j]);
      } else {
        T* out = y + (item + i) * a.K;
#pragma unroll
        for (int j = 0; j < KPT; ++j) {
          const int k = k0 + lane * KPT + j;
          if (k < a.K) {
            float v = acc[i][j] + b[j];
            if (a.activation == 1) v = nan_relu(v);
            out[k] = from_float<T>(v);
          }
        }
      }
    }
  }

  if constexpr (POOL) {
    if (item < a.M) {
      T* out = y + item * a.K;
#pragma unroll
      for (int j = 0; j < KPT; ++j) {
        const int k = k0 + lane * KPT + j;
        // relu(max) == max(relu) (monotone); a window entirely in the padding is -inf, as
        // reduce_window's init.
        if (k < a.K) out[k] = from_float<T>(any_valid ? nan_relu(best[j]) : -INFINITY);
      }
    }
  }
}

}  // namespace sparse
}  // namespace jaxcnn
