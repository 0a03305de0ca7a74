// Launcher for the softmax kernels: pick warp / block / online by row length, the vector
// width by alignment, and the per-thread register tile.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/host_arith.h"
#include "softmax/softmax.h"
#include "softmax/softmax_kernels.cuh"

namespace jaxcnn {
namespace {

namespace sm = softmax;

constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride past this many CTAs
// The online kernel's CTA: a row that long has work for every thread.
constexpr int kOnlineThreads = 1024;

int NextPow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// 16-byte vectors when every row starts 16-byte aligned, else one element at a time.
template <typename T>
int VecWidth(const SoftmaxParams& q, bool pointers_aligned) {
  constexpr int kWide = 16 / sizeof(T);
  return (q.cols % kWide == 0 && pointers_aligned) ? kWide : 1;
}

// Vectors per thread, a power of two with NVEC * VEC <= kMaxElemsPerThread; calls
// fn(integral_constant<NVEC>) for the smallest one >= `needed`.
template <int VEC, typename Fn>
cudaError_t DispatchNvec(int needed, Fn&& fn) {
  constexpr int kMax = sm::kMaxElemsPerThread / VEC;
  if (needed <= 1) return fn(std::integral_constant<int, 1>{});
  if (needed <= 2 && kMax >= 2) return fn(std::integral_constant<int, 2>{});
  if constexpr (kMax >= 4) {
    if (needed <= 4) return fn(std::integral_constant<int, 4>{});
  }
  if constexpr (kMax >= 8) {
    if (needed <= 8) return fn(std::integral_constant<int, 8>{});
  }
  if constexpr (kMax >= 16) {
    if (needed <= 16) return fn(std::integral_constant<int, 16>{});
  }
  if constexpr (kMax >= 32) {
    if (needed <= 32) return fn(std::integral_constant<int, 32>{});
  }
  return cudaErrorInvalidValue;  // the caller only asks for what fits
}

SoftmaxKernel KernelFor(int64_t vectors_per_row, int vec) {
  const int64_t per_thread = sm::kMaxElemsPerThread / vec;
  if (vectors_per_row <= 32 * per_thread) return SoftmaxKernel::kWarp;
  if (vectors_per_row <= sm::kMaxBlockThreads * per_thread) return SoftmaxKernel::kBlock;
  return SoftmaxKernel::kOnline;
}

template <typename T, int VEC, bool kLog>
cudaError_t LaunchWithVec(const T* x, T* y, const SoftmaxParams& q, cudaStream_t stream) {
  const int cols = static_cast<int>(q.cols);
  const int64_t nv = CeilDiv(q.cols, VEC);  // vectors per row
  switch (KernelFor(nv, VEC)) {
    case SoftmaxKernel::kWarp: {
      // Short rows: the fewest lanes (power of two) that hold the row in registers,
      // several rows per warp when rows are shorter than 32 vectors.
      const int tpr = nv <= 32 ? NextPow2(nv) : 32;
      const int needed = static_cast<int>(CeilDiv(nv, tpr));
      const int64_t rows_per_block = sm::kWarpKernelThreads / tpr;
      const unsigned blocks =
          static_cast<unsigned>(std::min(CeilDiv(q.rows, rows_per_block), kMaxBlocks));
      return DispatchNvec<VEC>(needed, [&](auto nvec) -> cudaError_t {
        sm::softmax_warp_kernel<T, VEC, decltype(nvec)::value, kLog>
            <<<blocks, sm::kWarpKernelThreads, 0, stream>>>(x, y, q.rows, cols, tpr);
        return cudaGetLastError();
      });
    }
    case SoftmaxKernel::kBlock: {
      // Long rows: the largest register tile (32 floats per thread) that still leaves the
      // CTA >= 128 threads. Small CTAs with much of the row per thread keep the most bytes
      // in flight per SM (1024-thread CTAs holding 4 floats each fit only 2 rows per SM)
      // and make the two block-wide reductions cheap.
      const int64_t per_thread_max = sm::kMaxElemsPerThread / VEC;
      // Scalar rows (VEC == 1) stop at 8 per thread: 32 scalars spill under the 64
      // registers a 1024-thread CTA allows.
      int needed = static_cast<int>(VEC == 1 ? std::min<int64_t>(8, per_thread_max) : per_thread_max);
      while (needed > 1 && CeilDiv(nv, needed) < 128) needed /= 2;
      while (needed < per_thread_max && CeilDiv(nv, needed) > sm::kMaxBlockThreads) needed *= 2;
      const int threads = static_cast<int>(CeilDiv(CeilDiv(nv, needed), 32) * 32);
      const unsigned blocks = static_cast<unsigned>(std::min(q.rows, kMaxBlocks));
      return DispatchNvec<VEC>(needed, [&](auto nvec) -> cudaError_t {
        sm::softmax_block_kernel<T, VEC, decltype(nvec)::value, kLog>
            <<<blocks, threads, 0, stream>>>(x, y, q.rows, cols);
        return cudaGetLastError();
      });
    }
    case SoftmaxKernel::kOnline: {
      const unsigned blocks = static_cast<unsigned>(std::min(q.rows, kMaxBlocks));
      sm::softmax_online_kernel<T, VEC, kLog>
          <<<blocks, kOnlineThreads, 0, stream>>>(x, y, q.rows, q.cols);
      return cudaGetLastError();
    }
  }
  return cudaErrorInvalidValue;
}

template <typename T, bool kLog>
cudaError_t LaunchTyped(const T* x, T* y, const SoftmaxParams& q, cudaStream_t stream) {
  constexpr int kWide = 16 / sizeof(T);
  if (VecWidth<T>(q, IsAligned(x, 16) && IsAligned(y, 16)) == kWide)
    return LaunchWithVec<T, kWide, kLog>(x, y, q, stream);
  return LaunchWithVec<T, 1, kLog>(x, y, q, stream);
}

}  // namespace

const char* softmax_unsupported_reason(const SoftmaxParams& q) {
  if (q.rows < 0 || q.cols < 0) return "negative dimension";
  if (q.cols > kInt32Max) return "row length exceeds int32";
  int64_t unused;
  if (__builtin_mul_overflow(q.rows, q.cols, &unused)) return "element count overflows int64";
  return nullptr;
}

SoftmaxKernel softmax_kernel_for(const SoftmaxParams& q, int elem_bytes) {
  const int wide = 16 / elem_bytes;
  const int vec = q.cols % wide == 0 ? wide : 1;
  return KernelFor(CeilDiv(q.cols, vec), vec);
}

template <typename T>
cudaError_t launch_softmax(const T* x, T* y, const SoftmaxParams& q, cudaStream_t stream) {
  if (softmax_unsupported_reason(q) != nullptr) return cudaErrorInvalidValue;
  if (q.rows == 0 || q.cols == 0) return cudaSuccess;  // nothing to write
  return q.log ? LaunchTyped<T, true>(x, y, q, stream) : LaunchTyped<T, false>(x, y, q, stream);
}

JAXCNN_XY_LAUNCHER_INSTANTIATE(launch_softmax, SoftmaxParams)

}  // namespace jaxcnn
