// Fused softmax / log-softmax kernels over rows of a [rows, cols] tensor, fp32 math:
//   softmax_warp_kernel:   `tpr` lanes (a power of two <= 32) per row, row in registers;
//   softmax_block_kernel:  a CTA per row, row in registers (up to 32 floats per thread);
//   softmax_online_kernel: a CTA per row, pass 1 keeps a running (max, sum of exp), pass 2
//                          re-reads x and writes y (rows too long for registers).
// Threads own VEC-element vectors interleaved across the row, so each load/store
// instruction of a warp covers consecutive bytes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/float_convert.cuh"
#include "common/vector_io.cuh"

namespace jaxcnn {
namespace softmax {

constexpr int kWarpKernelThreads = 128;
constexpr int kMaxBlockThreads = 1024;
constexpr int kMaxElemsPerThread = 32;  // floats of the row a thread keeps in registers

// fp32 results need an accurate exp (jax's is); half outputs round far above the
// ex2.approx error, and there the fast exp keeps the kernel memory-bound.
template <typename T>
__device__ __forceinline__ float exp_for(float v) {
  return __expf(v);
}
template <>
__device__ __forceinline__ float exp_for<float>(float v) {
  return expf(v);
}

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return max_nan(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// Reduction over the `width` lanes (a power of two) of this lane's group; `mask` names
// exactly those lanes, so groups may leave their row loop independently.
template <typename Op>
__device__ __forceinline__ float group_reduce(float v, unsigned mask, int width, Op op) {
  for (int offset = width / 2; offset > 0; offset /= 2)
    v = op(v, __shfl_xor_sync(mask, v, offset, width));
  return v;
}

// Block-wide reduction; every thread gets the result. `scratch` holds 32 floats and may be
// reused right after (the leading barrier protects the previous call's readers).
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, float* scratch, float identity, Op op) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = group_reduce(v, 0xffffffffu, 32, op);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : identity;
  return group_reduce(v, 0xffffffffu, 32, op);
}

// Running (max, sum of exp(x - max)) merge. A side that saw nothing (m = -inf, s = 0) adds
// 0 rather than exp(-inf - -inf) = NaN; NaN maxima propagate through exp(NaN).
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
  const float mn = max_nan(m, m2);
  const float a = m == mn ? s : s * expf(m - mn);
  const float b = m2 == mn ? s2 : s2 * expf(m2 - mn);
  m = mn;
  s = a + b;
}

// Normalizes the row values v[] (already exp(x - m), or x - m for log) and stores them.
template <typename T, int VEC, int NVEC, bool kLog>
__device__ __forceinline__ void store_row(T* __restrict__ yrow, const float (&v)[NVEC * VEC],
                                          float sum, int first, int step, int cols) {
  using Raw = RawVecOf<T, VEC>;
  const float scale = kLog ? logf(sum) : 1.0f / sum;
#pragma unroll
  for (int j = 0; j < NVEC; ++j) {
    const int col = (j * step + first) * VEC;
    if (col >= cols) continue;
    Raw raw;
    T* o = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      o[e] = from_float<T>(kLog ? v[j * VEC + e] - scale : v[j * VEC + e] * scale);
    reinterpret_cast<Raw*>(yrow)[col / VEC] = raw;
  }
}

// Loads this thread's NVEC vectors of the row (vector j at element (j*step + first)*VEC)
// as floats; columns past the row read as -inf. Returns the thread's max. Every load is
// issued unconditionally (a vector past the row re-reads the row's first one and is then
// replaced by -inf), so all NVEC loads are in flight before the first is used: a branch
// per load would serialize their latencies. cols % VEC == 0 whenever VEC > 1.
template <typename T, int VEC, int NVEC>
__device__ __forceinline__ float load_row(const T* __restrict__ xrow, float (&v)[NVEC * VEC],
                                          int first, int step, int cols) {
  using Raw = RawVecOf<T, VEC>;
  const Raw* __restrict__ src = reinterpret_cast<const Raw*>(xrow);
  Raw raw[NVEC];
#pragma unroll
  for (int j = 0; j < NVEC; ++j) {
    const int col = (j * step + first) * VEC;
    raw[j] = __ldg(src + (col < cols ? col / VEC : 0));
  }
#pragma unroll
  for (int j = 0; j < NVEC; ++j) {
    const bool in_row = (j * step + first) * VEC < cols;
    const T* e = reinterpret_cast<const T*>(&raw[j]);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[j * VEC + k] = in_row ? to_float(e[k]) : neg_inf();
  }
  float m = neg_inf();
#pragma unroll
  for (int i = 0; i < NVEC * VEC; ++i) m = max_nan(m, v[i]);
  return m;
}

// Turns v[] into exp(v - m) (softmax) or v - m (log-softmax) and returns this thread's
// sum of exp(v - m) over the row's real columns.
template <typename T, int VEC, int NVEC, bool kLog>
__device__ __forceinline__ float exp_and_sum(float (&v)[NVEC * VEC], float m, int first,
                                             int step, int cols) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < NVEC; ++j) {
    const bool in_row = (j * step + first) * VEC < cols;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float d = v[j * VEC + k] - m;
      const float e = exp_for<T>(d);
      if (in_row) s += e;
      v[j * VEC + k] = kLog ? d : e;
    }
  }
  return s;
}

template <typename T, int VEC, int NVEC, bool kLog>
__global__ void __launch_bounds__(kWarpKernelThreads)
    softmax_warp_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int cols,
                        int tpr) {
  const int lane = threadIdx.x & (tpr - 1);
  const int lane_in_warp = threadIdx.x & 31;
  const unsigned mask =
      tpr == 32 ? 0xffffffffu : ((1u << tpr) - 1u) << (lane_in_warp & ~(tpr - 1));
  const int64_t rows_per_block = kWarpKernelThreads / tpr;
  for (int64_t row = blockIdx.x * rows_per_block + threadIdx.x / tpr; row < rows;
       row += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    float v[NVEC * VEC];
    float m = load_row<T, VEC, NVEC>(x + row * cols, v, lane, tpr, cols);
    m = group_reduce(m, mask, tpr, MaxOp{});
    float s = exp_and_sum<T, VEC, NVEC, kLog>(v, m, lane, tpr, cols);
    s = group_reduce(s, mask, tpr, SumOp{});
    store_row<T, VEC, NVEC, kLog>(y + row * cols, v, s, lane, tpr, cols);
  }
}

template <typename T, int VEC, int NVEC, bool kLog>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_block_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int cols) {
  __shared__ float scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float v[NVEC * VEC];
    float m = load_row<T, VEC, NVEC>(x + row * cols, v, threadIdx.x, blockDim.x, cols);
    m = block_reduce(m, scratch, neg_inf(), MaxOp{});
    float s = exp_and_sum<T, VEC, NVEC, kLog>(v, m, threadIdx.x, blockDim.x, cols);
    s = block_reduce(s, scratch, 0.0f, SumOp{});
    store_row<T, VEC, NVEC, kLog>(y + row * cols, v, s, threadIdx.x, blockDim.x, cols);
  }
}

// Pass 1 takes kUnroll vectors per thread per step (all loads in flight together) and
// merges their (max, sum) into the running pair once; pass 2 walks the row backwards so
// the part of it pass 1 read last is re-read while it is still in L2.
template <typename T, int VEC, bool kLog>
__global__ void __launch_bounds__(kMaxBlockThreads)
    softmax_online_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                          int64_t cols) {
  using Raw = RawVecOf<T, VEC>;
  constexpr int kUnroll = 4;
  __shared__ float scratch_m[32], scratch_s[32];
  const int64_t nv = cols / VEC;  // cols % VEC == 0 whenever VEC > 1
  const int64_t step = blockDim.x;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const Raw* __restrict__ xrow = reinterpret_cast<const Raw*>(x + row * cols);
    float m = neg_inf(), s = 0.0f;
    for (int64_t base = threadIdx.x; base < nv; base += kUnroll * step) {
      Raw raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = base + u * step;
        raw[u] = __ldg(xrow + (j < nv ? j : nv - 1));
      }
      float vm = m;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const T* e = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
        for (int k = 0; k < VEC; ++k) vm = max_nan(vm, to_float(e[k]));
      }
      float vs = 0.0f;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (base + u * step >= nv) continue;  // a duplicate of vector `base`
        const T* e = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float xv = to_float(e[k]);
          // -inf adds 0 (not exp(-inf - -inf) = NaN before any finite value is seen);
          // +inf gives exp(inf - inf) = NaN, as jax does.
          vs += xv == neg_inf() ? 0.0f : exp_for<T>(xv - vm);
        }
      }
      online_merge(m, s, vm, vs);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
      const float s2 = __shfl_xor_sync(0xffffffffu, s, offset);
      online_merge(m, s, m2, s2);
    }
    __syncthreads();  // the previous row's readers are done with scratch
    if (lane == 0) {
      scratch_m[warp] = m;
      scratch_s[warp] = s;
    }
    __syncthreads();
    const bool live = lane < static_cast<int>(blockDim.x >> 5);
    m = live ? scratch_m[lane] : neg_inf();
    s = live ? scratch_s[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
      const float s2 = __shfl_xor_sync(0xffffffffu, s, offset);
      online_merge(m, s, m2, s2);
    }
    const float scale = kLog ? logf(s) : 1.0f / s;
    Raw* __restrict__ yrow = reinterpret_cast<Raw*>(y + row * cols);
    // Backwards, kUnroll vectors per step: chunk c covers vectors [c*kUnroll*step, ...).
    const int64_t chunk = kUnroll * step;
    for (int64_t c = (nv - 1) / chunk; c >= 0; --c) {
      const int64_t base = c * chunk + threadIdx.x;
      Raw raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = base + u * step;
        raw[u] = __ldg(xrow + (j < nv ? j : nv - 1));
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j = base + u * step;
        if (j >= nv) continue;
        const T* e = reinterpret_cast<const T*>(&raw[u]);
        Raw out;
        T* o = reinterpret_cast<T*>(&out);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float d = to_float(e[k]) - m;
          o[k] = from_float<T>(kLog ? d - scale : exp_for<T>(d) * scale);
        }
        yrow[j] = out;
      }
    }
  }
}

}  // namespace softmax
}  // namespace jaxcnn
