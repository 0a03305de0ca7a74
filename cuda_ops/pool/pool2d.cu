// Launcher for the pooling kernels: validate, view the tensor as [B, H, W, L] with L
// contiguous, pick the kernel (vec / plane / split) and its vector width, launch.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/host_arith.h"
#include "pool/pool2d.h"
#include "pool/pool2d_kernels.cuh"

namespace jaxcnn {
namespace {

using pool2d::Geometry;
using pool2d::kThreads;

// Grid-stride loops past this many CTAs (plenty to fill any GPU).
constexpr int64_t kMaxBlocks = int64_t{1} << 20;
// Threads that fill an H100/H200 (132 SMs x 2048): the split kernel adds lanes per output
// until it has about this many.
constexpr int64_t kFillThreads = 132 * 2048;

unsigned Blocks(int64_t threads) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(CeilDiv(threads, kThreads), kMaxBlocks)));
}

pool2d::VecIndex<true> MakeIndex(const Geometry& g, int64_t LV) {
  pool2d::VecIndex<true> d;
  d.lv = pool2d::FastDiv(static_cast<uint32_t>(LV));
  d.q = pool2d::FastDiv(static_cast<uint32_t>(g.Q));
  d.p = pool2d::FastDiv(static_cast<uint32_t>(g.P));
  return d;
}

// The widest vector (elements) that divides L and keeps every access aligned: 16 bytes,
// else 4 bytes for half types, else one element; calls fn(integral_constant VEC, LV, total):
// LV = L / VEC vectors per pixel, total = B * P * Q * LV output vectors.
template <typename T, typename Fn>
cudaError_t DispatchVecWidth(const T* x, const T* y, const Geometry& g, int64_t B, int64_t L,
                             Fn&& fn) {
  auto with_sizes = [&](auto vec) -> cudaError_t {
    const int64_t LV = L / decltype(vec)::value;
    return fn(vec, LV, B * g.P * g.Q * LV);
  };
  constexpr int kWide = 16 / sizeof(T);
  constexpr int kNarrow = 4 / sizeof(T);
  if (L % kWide == 0 && IsAligned(x, 16) && IsAligned(y, 16))
    return with_sizes(std::integral_constant<int, kWide>{});
  if constexpr (kNarrow > 1) {
    if (L % kNarrow == 0 && IsAligned(x, 4) && IsAligned(y, 4))
      return with_sizes(std::integral_constant<int, kNarrow>{});
  }
  return with_sizes(std::integral_constant<int, 1>{});
}

// L > 1, window 2x2 or 3x3: one output vector per thread.
template <typename T, PoolMode kMode, int kR, int kS>
cudaError_t LaunchVec(const T* x, T* y, const Geometry& g, int64_t B, int64_t L,
                      cudaStream_t stream) {
  return DispatchVecWidth(x, y, g, B, L, [&](auto vec, int64_t LV, int64_t total) -> cudaError_t {
    constexpr int VEC = decltype(vec)::value;
    const unsigned blocks = Blocks(total);
    if (total <= kInt32Max) {
      pool2d::pool2d_vec_kernel<T, kMode, VEC, kR, kS, true>
          <<<blocks, kThreads, 0, stream>>>(x, y, g, static_cast<int>(LV), total,
                                            MakeIndex(g, LV));
    } else {
      pool2d::pool2d_vec_kernel<T, kMode, VEC, kR, kS, false>
          <<<blocks, kThreads, 0, stream>>>(x, y, g, static_cast<int>(LV), total,
                                            pool2d::VecIndex<false>{});
    }
    return cudaGetLastError();
  });
}

// Any window, any L: G lanes per output vector, G growing (a power of two <= 32, at most
// a quarter of the taps per lane) until the grid fills the GPU.
template <typename T, PoolMode kMode>
cudaError_t LaunchSplit(const T* x, T* y, const Geometry& g, int64_t B, int64_t L,
                        cudaStream_t stream) {
  return DispatchVecWidth(x, y, g, B, L, [&](auto vec, int64_t LV, int64_t total) -> cudaError_t {
    constexpr int VEC = decltype(vec)::value;
    const int64_t taps = int64_t{g.R} * g.S;
    int log_g = 0;
    while (log_g < 5 && (int64_t{4} << log_g) <= taps && (total << log_g) < kFillThreads)
      ++log_g;
    const bool fast = total <= kInt32Max;
    const pool2d::VecIndex<true> d = fast ? MakeIndex(g, LV) : pool2d::VecIndex<true>{};
    pool2d::pool2d_split_kernel<T, kMode, VEC>
        <<<Blocks(CeilDiv(total << log_g, 32) * 32), kThreads, 0, stream>>>(
            x, y, g, static_cast<int>(LV), total, log_g, /*k_minor=*/LV == 1, d, fast);
    return cudaGetLastError();
  });
}

// L == 1 with one of the compiled windows: OQ outputs along W per thread (16 bytes of
// output), loads of VB bytes where every row start is VB-aligned.
template <typename T, PoolMode kMode, int kR, int kS, int kSW, int kPL>
cudaError_t LaunchPlane(const T* x, T* y, const Geometry& g, int64_t B, cudaStream_t stream) {
  constexpr int OQ = 16 / sizeof(T);
  constexpr int E = sizeof(T);
  const int64_t qcs = CeilDiv(g.Q, OQ);
  const int64_t rows = B * g.P;
  const int64_t total = rows * qcs;
  if (!FitsInt32(total)) return LaunchSplit<T, kMode>(x, y, g, B, 1, stream);
  const pool2d::FastDiv qc_div(static_cast<uint32_t>(qcs)), p_div(static_cast<uint32_t>(g.P));
  const bool vec_store = g.Q % OQ == 0 && IsAligned(y, 16);
  const int64_t row_bytes = int64_t{g.W} * E;
  const unsigned blocks = Blocks(total);
  auto go = [&](auto vb) -> cudaError_t {
    constexpr int VB = decltype(vb)::value;
    pool2d::pool2d_plane_kernel<T, kMode, kR, kS, kSW, kPL, OQ, VB>
        <<<blocks, kThreads, 0, stream>>>(x, y, g, total, qc_div, p_div, vec_store);
    return cudaGetLastError();
  };
  if (row_bytes % 16 == 0 && IsAligned(x, 16)) return go(std::integral_constant<int, 16>{});
  if (row_bytes % 8 == 0 && IsAligned(x, 8)) return go(std::integral_constant<int, 8>{});
  if constexpr (E < 4) {
    if (row_bytes % 4 == 0 && IsAligned(x, 4)) return go(std::integral_constant<int, 4>{});
  }
  return go(std::integral_constant<int, E>{});
}

template <typename T, PoolMode kMode>
cudaError_t LaunchPlaneOrSplit(const T* x, T* y, const Geometry& g, int64_t B,
                               cudaStream_t stream) {
  if (g.R == 2 && g.S == 2 && g.sw == 2 && g.pl == 0)
    return LaunchPlane<T, kMode, 2, 2, 2, 0>(x, y, g, B, stream);
  if (g.R == 3 && g.S == 3 && g.sw == 2 && g.pl == 0)
    return LaunchPlane<T, kMode, 3, 3, 2, 0>(x, y, g, B, stream);
  if (g.R == 3 && g.S == 3 && g.sw == 2 && g.pl == 1)
    return LaunchPlane<T, kMode, 3, 3, 2, 1>(x, y, g, B, stream);
  if (g.R == 3 && g.S == 3 && g.sw == 1 && g.pl == 1)
    return LaunchPlane<T, kMode, 3, 3, 1, 1>(x, y, g, B, stream);
  return LaunchSplit<T, kMode>(x, y, g, B, 1, stream);
}

template <typename T, PoolMode kMode>
cudaError_t LaunchLayout(const T* x, T* y, const Pool2dParams& q, const Geometry& g,
                         cudaStream_t stream) {
  int64_t B = 0, L = 0;
  switch (q.layout) {
    case TensorLayout::kNHWC:
      B = q.N, L = q.C;
      break;
    case TensorLayout::kCHWN:
      B = q.C, L = q.N;
      break;
    case TensorLayout::kNCHW:
      B = q.N * q.C, L = 1;
      break;
    default:
      return cudaErrorInvalidValue;
  }
  if (L == 1) return LaunchPlaneOrSplit<T, kMode>(x, y, g, B, stream);
  if (g.R == 2 && g.S == 2) return LaunchVec<T, kMode, 2, 2>(x, y, g, B, L, stream);
  if (g.R == 3 && g.S == 3) return LaunchVec<T, kMode, 3, 3>(x, y, g, B, L, stream);
  return LaunchSplit<T, kMode>(x, y, g, B, L, stream);
}

}  // namespace

const char* pool2d_unsupported_reason(const Pool2dParams& q) {
  if (q.N < 0 || q.H < 0 || q.W < 0 || q.C < 0 || q.P < 0 || q.Q < 0)
    return "negative dimension";
  if (q.layout != TensorLayout::kNHWC && q.layout != TensorLayout::kNCHW &&
      q.layout != TensorLayout::kCHWN)
    return "layout must be NHWC, NCHW or CHWN";
  if (q.mode != PoolMode::kMax && q.mode != PoolMode::kAvg) return "mode must be max or avg";
  if (q.window_h < 1 || q.window_w < 1) return "window must be >= 1";
  if (q.stride_h < 1 || q.stride_w < 1) return "strides must be >= 1";
  if (q.pad_top < 0 || q.pad_left < 0) return "pads must be >= 0";
  if (!FitsInt32(q.N) || !FitsInt32(q.H) || !FitsInt32(q.W) || !FitsInt32(q.C) ||
      !FitsInt32(q.P) || !FitsInt32(q.Q))
    return "a dimension exceeds int32";
  // Window coordinates are int32 in the kernels.
  if (q.P > 0 && (q.P - 1) * int64_t{q.stride_h} + q.window_h > kInt32Max)
    return "(P - 1) * stride_h + window_h exceeds int32";
  if (q.Q > 0 && (q.Q - 1) * int64_t{q.stride_w} + q.window_w > kInt32Max)
    return "(Q - 1) * stride_w + window_w exceeds int32";
  if (int64_t{q.window_h} * q.window_w > kInt32Max) return "window_h * window_w exceeds int32";
  int64_t unused;
  if (!CheckedProduct({q.N, q.H, q.W, q.C}, &unused) ||
      !CheckedProduct({q.N, q.P, q.Q, q.C}, &unused) ||
      !CheckedProduct({q.N, q.P, q.Q, q.C, 2}, &unused))
    return "element count overflows int64";
  return nullptr;
}

template <typename T>
cudaError_t launch_pool2d(const T* x, T* y, const Pool2dParams& q, cudaStream_t stream) {
  if (pool2d_unsupported_reason(q) != nullptr) return cudaErrorInvalidValue;
  if (q.N == 0 || q.C == 0 || q.P == 0 || q.Q == 0) return cudaSuccess;  // nothing to write
  const Geometry g{static_cast<int>(q.H), static_cast<int>(q.W),  static_cast<int>(q.P),
                   static_cast<int>(q.Q), q.window_h,             q.window_w,
                   q.stride_h,            q.stride_w,             q.pad_top,
                   q.pad_left,            q.count_include_pad};
  if (q.mode == PoolMode::kMax) return LaunchLayout<T, PoolMode::kMax>(x, y, q, g, stream);
  return LaunchLayout<T, PoolMode::kAvg>(x, y, q, g, stream);
}

JAXCNN_XY_LAUNCHER_INSTANTIATE(launch_pool2d, Pool2dParams)

}  // namespace jaxcnn
