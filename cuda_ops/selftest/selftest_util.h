// Host-side helpers every standalone selftest uses: CUDA error exit, fp32 <->
// storage conversions, a fixed-seed LCG, conv output sizes. Header-only; the
// selftests are separate programs (cuda_ops/selftest is not part of the library).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "common/conv2d_params.h"

// Exit status 2 on any CUDA error, with where and what.
#define CHECK_CUDA(expr)                                                  \
  do {                                                                    \
    const cudaError_t status_ = (expr);                                   \
    if (status_ != cudaSuccess) {                                         \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n",                \
                   cudaGetErrorName(status_), __FILE__, __LINE__, #expr); \
      std::fprintf(stderr, "  %s\n", cudaGetErrorString(status_));        \
      std::exit(2);                                                       \
    }                                                                     \
  } while (0)

namespace selftest {

inline float ToFloat(float v) { return v; }
inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float ToFloat(__half v) { return __half2float(v); }
template <typename T> T FromFloat(float v);
template <> inline float FromFloat<float>(float v) { return v; }
template <> inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> inline __half FromFloat<__half>(float v) { return __float2half_rn(v); }

// Fixed-seed LCG: the same inputs on every run; next() is uniform in [-1, 1).
struct Lcg {
  uint64_t state;
  uint64_t next_u64() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state;
  }
  float next() {
    return static_cast<float>((next_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f -
           1.0f;
  }
};

// Output extent of a (dilated) window sliding over a padded input.
inline int64_t OutSize(int64_t in, int64_t window, int stride, int pad_lo,
                       int pad_hi, int dil) {
  const int64_t span = dil * (window - 1) + 1;
  return (in + pad_lo + pad_hi - span) / stride + 1;
}

// Storage types of the conv selftests and their max-rel-error bounds vs float64.
enum class DType { kF32, kBF16, kF16 };

// The DType of a storage type.
template <typename T> DType DTypeOf();
template <> inline DType DTypeOf<float>() { return DType::kF32; }
template <> inline DType DTypeOf<__nv_bfloat16>() { return DType::kBF16; }
template <> inline DType DTypeOf<__half>() { return DType::kF16; }

inline const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
  }
  return "?";
}

inline double Tolerance(DType d) {
  switch (d) {
    case DType::kF32: return 1e-5;
    case DType::kBF16: return 2e-2;
    case DType::kF16: return 2e-3;
  }
  return 0.0;
}

inline const char* LayoutName(jaxcnn::TensorLayout layout) {
  switch (layout) {
    case jaxcnn::TensorLayout::kNHWC: return "NHWC";
    case jaxcnn::TensorLayout::kNCHW: return "NCHW";
    case jaxcnn::TensorLayout::kCHWN: return "CHWN";
  }
  return "?";
}

// Offset of logical (n, c, h, w) in a [N, C, H, W] tensor laid out as `layout`.
inline int64_t LayoutOffset(jaxcnn::TensorLayout layout, int64_t N, int64_t C,
                            int64_t H, int64_t W, int64_t n, int64_t c,
                            int64_t h, int64_t w) {
  switch (layout) {
    case jaxcnn::TensorLayout::kNHWC: return ((n * H + h) * W + w) * C + c;
    case jaxcnn::TensorLayout::kNCHW: return ((n * C + c) * H + h) * W + w;
    case jaxcnn::TensorLayout::kCHWN: return ((c * H + h) * W + w) * N + n;
  }
  return 0;
}

}  // namespace selftest
