// Operand preparation for the tensor-core conv (plain CUDA, no CUTLASS):
//   * fp32 weights HWIO [R,S,C,K] -> KRSC [K,R,S,C]: the TF32 wgmma B operand
//     must be K-major (c contiguous per output channel);
//   * channel padding C -> Cp (16-byte rows) of x and w for few-channel
//     inputs (RGB stems);
//   * 3xTF32 split for fp32 kHighest: v = big + small with big = tf32_rn(v),
//     small = tf32_rn(v - big), both exactly representable in TF32 so the
//     tensor core reads them without further rounding. x gets channel blocks
//     [big | big | small] and w [big | small | big]: one GEMM over 3*C channels
//     then sums big*big + big*small + small*big (the small*small term,
//     ~2^-22 relative, is dropped), accumulated in fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace jaxcnn {
namespace conv_tc {

constexpr int kTransposeTile = 32;
constexpr int kTransposeRows = 8;  // block is 32 x 8 threads

// Round to the nearest TF32 value (10 explicit mantissa bits), ties to even.
// Inf/NaN pass through (NaN made quiet with high mantissa bits so a TF32
// reader that drops the low 13 bits still sees NaN); a finite value that
// would round up to inf is truncated instead, keeping big + small finite.
__device__ __forceinline__ float round_to_tf32(float v) {
  const uint32_t u = __float_as_uint(v);
  if ((u & 0x7f800000u) == 0x7f800000u)
    return (u & 0x007fffffu) ? __uint_as_float(0x7fffffffu) : v;
  uint32_t r = (u + 0x00000fffu + ((u >> 13) & 1u)) & 0xffffe000u;
  if ((r & 0x7f800000u) == 0x7f800000u) r = u & 0xffffe000u;
  return __uint_as_float(r);
}

struct Tf32Split {
  float big, small;
};

__device__ __forceinline__ Tf32Split split_tf32(float v) {
  const float big = round_to_tf32(v);
  // v - big is exact in fp32; inf/NaN carry everything in `big`.
  const float small = isfinite(v) ? round_to_tf32(v - big) : 0.0f;
  return {big, small};
}

// out[k][rs][c] = w[rs][c][k] (kSplit3: out row has 3*Cp entries,
// [big | small | big] of w[rs][c][k]). Rows are Cp >= C wide (channel
// padding); columns c >= C are not written (the launcher zeroes them).
// Grid (ceil(K/32), ceil(C/32), R*S), block (32, 8); a shared tile makes both
// the read (along k) and the write (along c) coalesced.
template <typename T, bool kSplit3>
__global__ void __launch_bounds__(kTransposeTile* kTransposeRows)
    weights_hwio_to_krsc(const T* __restrict__ w, T* __restrict__ out, int RS,
                         int C, int K, int Cp) {
  __shared__ T tile[kTransposeTile][kTransposeTile + 1];
  const int rs = blockIdx.z;
  const int c0 = blockIdx.y * kTransposeTile;
  const int k0 = blockIdx.x * kTransposeTile;
  const int tx = threadIdx.x, ty = threadIdx.y;

  for (int i = ty; i < kTransposeTile; i += kTransposeRows) {
    const int c = c0 + i, k = k0 + tx;
    if (c < C && k < K)
      tile[i][tx] = w[(static_cast<int64_t>(rs) * C + c) * K + k];
  }
  __syncthreads();

  const int c_out_row = kSplit3 ? 3 * Cp : Cp;
  for (int i = ty; i < kTransposeTile; i += kTransposeRows) {
    const int k = k0 + i, c = c0 + tx;
    if (k >= K || c >= C) continue;
    const int64_t base = (static_cast<int64_t>(k) * RS + rs) * c_out_row + c;
    if constexpr (kSplit3) {
      const Tf32Split s = split_tf32(tile[tx][i]);
      out[base] = s.big;
      out[base + Cp] = s.small;
      out[base + 2 * Cp] = s.big;
    } else {
      out[base] = tile[tx][i];
    }
  }
}

// x [pixels, C] -> out [pixels, 3*C] with blocks [big | big | small].
// C % 4 == 0 (float4 along channels; 16-byte aligned rows).
__global__ void __launch_bounds__(256)
    activations_split3_tf32(const float4* __restrict__ x,
                            float* __restrict__ out, int64_t num_vec4,
                            int C) {
  const int c_vec4 = C / 4;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < num_vec4; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pixel = i / c_vec4;
    const int c = static_cast<int>(i - pixel * c_vec4) * 4;
    const float4 v = x[i];
    const Tf32Split sx = split_tf32(v.x), sy = split_tf32(v.y),
                    sz = split_tf32(v.z), sw = split_tf32(v.w);
    const float4 big = make_float4(sx.big, sy.big, sz.big, sw.big);
    const float4 small = make_float4(sx.small, sy.small, sz.small, sw.small);
    float* row = out + pixel * (3 * static_cast<int64_t>(C)) + c;
    *reinterpret_cast<float4*>(row) = big;
    *reinterpret_cast<float4*>(row + C) = big;
    *reinterpret_cast<float4*>(row + 2 * C) = small;
  }
}

// Channel padding for inputs whose rows are not 16-byte multiples (e.g. RGB,
// C = 3): out [rows, Cp] = [in [rows, C] | zeros], Cp > C. Used for x
// ([N*H*W, C]) and, for bf16/fp16, the HWIO weights viewed as [R*S, C*K]
// Grid-stride over rows * Cp elements; the HWIO weights use
// pad_hwio_channels below.
template <typename T>
__global__ void __launch_bounds__(256)
    pad_channels(const T* __restrict__ in, T* __restrict__ out, int64_t rows,
                 int C, int Cp) {
  const int64_t total = rows * Cp;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / Cp;
    const int c = static_cast<int>(i - row * Cp);
    out[i] = c < C ? in[row * C + c] : T(0.0f);
  }
}

// HWIO [RS, C, K] -> [RS, Cp, K], zero rows for c >= C.
template <typename T>
__global__ void __launch_bounds__(256)
    pad_hwio_channels(const T* __restrict__ w, T* __restrict__ out, int RS,
                      int C, int Cp, int K) {
  const int64_t total = static_cast<int64_t>(RS) * Cp * K;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t rsc = i / K;
    const int k = static_cast<int>(i - rsc * K);
    const int64_t rs = rsc / Cp;
    const int c = static_cast<int>(rsc - rs * Cp);
    out[i] = c < C ? w[(rs * C + c) * K + k] : T(0.0f);
  }
}

// 3xTF32 split with channel padding (C % 4 != 0): x [pixels, C] ->
// out [pixels, 3*Cp] with blocks [big | big | small], zeros for c >= C.
__global__ void __launch_bounds__(256)
    activations_split3_tf32_padded(const float* __restrict__ x,
                                   float* __restrict__ out, int64_t pixels,
                                   int C, int Cp) {
  const int64_t total = pixels * Cp;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pixel = i / Cp;
    const int c = static_cast<int>(i - pixel * Cp);
    Tf32Split s{0.0f, 0.0f};
    if (c < C) s = split_tf32(x[pixel * C + c]);
    float* row = out + pixel * (3 * static_cast<int64_t>(Cp)) + c;
    row[0] = s.big;
    row[Cp] = s.big;
    row[2 * Cp] = s.small;
  }
}

}  // namespace conv_tc
}  // namespace jaxcnn
