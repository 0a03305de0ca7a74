// Launcher for the pooling kernels: validate, pick the kernel and vector width per
// layout, size the NCHW shared-memory tiles, launch.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "pool/pool2d.h"
#include "pool/pool2d_kernels.cuh"

namespace jaxcnn {
namespace {

using pool2d::Geometry;
using pool2d::kThreads;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// Enough CTAs for two waves on an H100/H200 (132 SMs): fewer leave SMs idle.
constexpr int64_t kMinCtas = 2 * 132;
// Staged input per NCHW CTA: ~8 resident CTAs per SM fit Hopper's 228 KB of shared memory.
constexpr int64_t kTileBytes = 24 * 1024;
// Dynamic shared memory available without a cudaFuncSetAttribute opt-in.
constexpr int64_t kMaxTileBytes = 48 * 1024;
// Grid-stride loops past this many CTAs (plenty to fill any GPU).
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

bool FitsInt32(int64_t v) { return v >= 0 && v <= kInt32Max; }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool CheckedProduct(std::initializer_list<int64_t> factors, int64_t* product) {
  int64_t acc = 1;
  for (int64_t f : factors) {
    if (__builtin_mul_overflow(acc, f, &acc)) return false;
  }
  *product = acc;
  return true;
}

bool Aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Calls fn(integral_constant R, integral_constant S): 2x2 and 3x3 (the CNN pools) get
// fully unrolled kernels, anything else the runtime-window one (0, 0).
template <typename Fn>
cudaError_t DispatchWindow(int R, int S, Fn&& fn) {
  using I = std::integral_constant<int, 0>;
  if (R == 2 && S == 2)
    return fn(std::integral_constant<int, 2>{}, std::integral_constant<int, 2>{});
  if (R == 3 && S == 3)
    return fn(std::integral_constant<int, 3>{}, std::integral_constant<int, 3>{});
  return fn(I{}, I{});
}

template <typename T, PoolMode kMode, int kR, int kS, int VEC>
cudaError_t LaunchVec(const T* x, T* y, const Geometry& g, int64_t B, int64_t L,
                      cudaStream_t stream) {
  const int64_t LV = L / VEC;
  const int64_t total = B * g.P * g.Q * LV;
  const unsigned blocks =
      static_cast<unsigned>(std::min(CeilDiv(total, kThreads), kMaxBlocks));
  // 32-bit index math where it cannot wrap (the grid-stride sum stays below 2^32).
  if (total <= kInt32Max) {
    pool2d::pool2d_vec_kernel<T, kMode, VEC, kR, kS, uint32_t>
        <<<blocks, kThreads, 0, stream>>>(x, y, g, static_cast<int>(LV),
                                          static_cast<uint32_t>(total));
  } else {
    pool2d::pool2d_vec_kernel<T, kMode, VEC, kR, kS, int64_t>
        <<<blocks, kThreads, 0, stream>>>(x, y, g, static_cast<int>(LV), total);
  }
  return cudaGetLastError();
}

// [B, H, W, L] with L contiguous: the widest vector that divides L and keeps every
// access aligned (16 bytes, else 4 bytes for half types, else one element).
template <typename T, PoolMode kMode, int kR, int kS>
cudaError_t LaunchVecAnyWidth(const T* x, T* y, const Geometry& g, int64_t B, int64_t L,
                              cudaStream_t stream) {
  constexpr int kWide = 16 / sizeof(T);
  constexpr int kNarrow = 4 / sizeof(T);
  if (L % kWide == 0 && Aligned(x, 16) && Aligned(y, 16))
    return LaunchVec<T, kMode, kR, kS, kWide>(x, y, g, B, L, stream);
  if constexpr (kNarrow > 1) {
    if (L % kNarrow == 0 && Aligned(x, 4) && Aligned(y, 4))
      return LaunchVec<T, kMode, kR, kS, kNarrow>(x, y, g, B, L, stream);
  }
  return LaunchVec<T, kMode, kR, kS, 1>(x, y, g, B, L, stream);
}

// Tile sizes of the NCHW shared-memory kernel; ok=false when it does not apply.
struct RowsPlan {
  bool ok = false;
  int planes_per_cta = 1, rows_per_cta = 1, row_blocks = 1;
  int64_t ctas = 0;
  size_t smem_bytes = 0;
};

RowsPlan PlanRows(const Geometry& g, int64_t B, int64_t elem_bytes) {
  RowsPlan plan;
  const int64_t hw = int64_t{g.H} * g.W;
  if (hw == 0 || hw > kInt32Max) return plan;
  const int64_t pad = 16 / elem_bytes;  // room for the 16-byte phase shift ("lead")
  const int64_t plane_bytes = hw * elem_bytes;
  if (2 * plane_bytes <= kTileBytes) {
    // Small planes: several whole planes per CTA, as long as enough CTAs remain.
    int64_t ppc = std::max<int64_t>(1, std::min(kTileBytes / plane_bytes, B / kMinCtas));
    ppc = CeilDiv(B, CeilDiv(B, ppc));  // same CTA count, planes spread evenly
    plan.planes_per_cta = static_cast<int>(ppc);
    plan.rows_per_cta = g.P;
    plan.row_blocks = 1;
    plan.ctas = CeilDiv(B, ppc);
    plan.smem_bytes = static_cast<size_t>((ppc * hw + pad) * elem_bytes);
  } else {
    // Large planes: blocks of output rows of one plane; halve them until there are
    // enough CTAs for the GPU.
    const int64_t rows_fit = kTileBytes / (int64_t{g.W} * elem_bytes);
    int64_t tp = rows_fit >= g.R ? (rows_fit - g.R) / g.sh + 1 : 1;
    tp = std::min<int64_t>(tp, g.P);
    while (tp > 1 && B * CeilDiv(g.P, tp) < kMinCtas) tp = (tp + 1) / 2;
    tp = CeilDiv(g.P, CeilDiv(g.P, tp));  // same tile count, rows spread evenly
    const int64_t in_rows = std::min<int64_t>(g.H, (tp - 1) * g.sh + g.R);
    plan.rows_per_cta = static_cast<int>(tp);
    plan.row_blocks = static_cast<int>(CeilDiv(g.P, tp));
    plan.ctas = B * plan.row_blocks;
    plan.smem_bytes = static_cast<size_t>((in_rows * g.W + pad) * elem_bytes);
  }
  plan.ok = plan.smem_bytes <= static_cast<size_t>(kMaxTileBytes) && FitsInt32(plan.ctas);
  return plan;
}

template <typename T, PoolMode kMode, int kR, int kS>
cudaError_t LaunchLayout(const T* x, T* y, const Pool2dParams& q, const Geometry& g,
                         cudaStream_t stream) {
  switch (q.layout) {
    case TensorLayout::kNHWC:
      return LaunchVecAnyWidth<T, kMode, kR, kS>(x, y, g, q.N, q.C, stream);
    case TensorLayout::kCHWN:
      return LaunchVecAnyWidth<T, kMode, kR, kS>(x, y, g, q.C, q.N, stream);
    case TensorLayout::kNCHW: {
      const int64_t B = q.N * q.C;
      const RowsPlan plan = PlanRows(g, B, sizeof(T));
      if (!plan.ok)  // rows too long to stage: one thread per output, L = 1
        return LaunchVec<T, kMode, kR, kS, 1>(x, y, g, B, 1, stream);
      pool2d::pool2d_rows_kernel<T, kMode, kR, kS>
          <<<static_cast<unsigned>(plan.ctas), kThreads, plan.smem_bytes, stream>>>(
              x, y, g, B, plan.planes_per_cta, plan.rows_per_cta, plan.row_blocks);
      return cudaGetLastError();
    }
  }
  return cudaErrorInvalidValue;
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
  return DispatchWindow(q.window_h, q.window_w, [&](auto kr, auto ks) -> cudaError_t {
    constexpr int kR = decltype(kr)::value;
    constexpr int kS = decltype(ks)::value;
    if (q.mode == PoolMode::kMax)
      return LaunchLayout<T, PoolMode::kMax, kR, kS>(x, y, q, g, stream);
    return LaunchLayout<T, PoolMode::kAvg, kR, kS>(x, y, q, g, stream);
  });
}

template cudaError_t launch_pool2d<float>(const float*, float*, const Pool2dParams&,
                                          cudaStream_t);
template cudaError_t launch_pool2d<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*,
                                                  const Pool2dParams&, cudaStream_t);
template cudaError_t launch_pool2d<__half>(const __half*, __half*, const Pool2dParams&,
                                           cudaStream_t);

}  // namespace jaxcnn
