// Launcher for the direct conv2d kernel: validate, derive the GEMM view,
// pick the grid, launch.
#include <algorithm>
#include <cstdint>

#include "common/host_arith.h"
#include "conv/conv2d_direct.h"
#include "conv/conv2d_direct_kernel.cuh"

namespace jaxcnn {
namespace {

constexpr int64_t kMaxGridY = 65535;

// Element strides of logical [N, C, H, W] (or y's [N, K, P, Q]) in `layout`.
void SetStrides(TensorLayout layout, int64_t N, int64_t C, int64_t H, int64_t W,
                int64_t* sn, int64_t* sc, int64_t* sh, int64_t* sw) {
  switch (layout) {
    case TensorLayout::kNHWC: *sc = 1; *sw = C; *sh = W * C; *sn = H * W * C; return;
    case TensorLayout::kNCHW: *sw = 1; *sh = W; *sc = H * W; *sn = C * H * W; return;
    case TensorLayout::kCHWN: *sn = 1; *sw = N; *sh = W * N; *sc = H * W * N; return;
  }
}

}  // namespace

const char* conv2d_direct_unsupported_reason(const Conv2dParams& q) {
  if (const char* reason = conv2d_params_unsupported_reason(q)) return reason;
  if (q.groups < 1) return "groups must be >= 1";
  if (q.stride_h < 1 || q.stride_w < 1) return "strides must be >= 1";
  if (q.dil_h < 1 || q.dil_w < 1) return "dilations must be >= 1";
  if (q.pad_h < 0 || q.pad_w < 0) return "pads must be >= 0";
  if (q.C % q.groups != 0) return "C must be divisible by groups";
  if (q.K % q.groups != 0) return "K must be divisible by groups";

  // The kernel indexes spatial/channel coordinates and GEMM-K in int32 and
  // global offsets in int64.
  if (!FitsInt32(q.H) || !FitsInt32(q.W) || !FitsInt32(q.C) ||
      !FitsInt32(q.R) || !FitsInt32(q.S) || !FitsInt32(q.P) || !FitsInt32(q.Q))
    return "a spatial or channel dimension exceeds int32";
  if (q.K > kInt32Max - conv2d_direct::kTileN)
    return "K exceeds the kernel's int32 range";
  const int64_t Cg = q.C / q.groups;
  if (q.R * q.S > kInt32Max || q.R * q.S * Cg > kInt32Max - conv2d_direct::kTileK)
    return "R*S*C/groups exceeds the kernel's int32 range";
  if (q.P * q.Q > kInt32Max) return "P*Q exceeds int32";
  if ((q.P > 0 ? (q.P - 1) * q.stride_h : 0) +
          (q.R > 0 ? (q.R - 1) * q.dil_h : 0) > kInt32Max ||
      (q.Q > 0 ? (q.Q - 1) * q.stride_w : 0) +
          (q.S > 0 ? (q.S - 1) * q.dil_w : 0) > kInt32Max)
    return "receptive field coordinates exceed int32";
  int64_t unused;
  if (!CheckedProduct({q.N, q.H, q.W, q.C}, &unused) ||
      !CheckedProduct({q.N, q.P, q.Q, q.K}, &unused) ||
      !CheckedProduct({q.R, q.S, Cg, q.K}, &unused))
    return "element count overflows int64";
  return nullptr;
}

template <typename T>
cudaError_t launch_conv2d_direct(const T* x, const T* w, const T* bias, T* y,
                                 const Conv2dParams& params,
                                 cudaStream_t stream) {
  namespace cd = conv2d_direct;
  if (conv2d_direct_unsupported_reason(params) != nullptr)
    return cudaErrorInvalidValue;

  const int64_t gemm_m = params.N * params.P * params.Q;
  if (gemm_m == 0 || params.K == 0) return cudaSuccess;  // nothing to write

  const int64_t Cg = params.C / params.groups;
  const int64_t Kg = params.K / params.groups;
  const int64_t gemm_k = params.R * params.S * Cg;
  // An empty input or window is legal: the output is then bias (+ReLU).
  if (y == nullptr) return cudaErrorInvalidValue;
  if (x == nullptr && params.N * params.H * params.W * params.C > 0)
    return cudaErrorInvalidValue;
  if (w == nullptr && gemm_k * params.K > 0) return cudaErrorInvalidValue;

  cd::KernelParams p;
  p.H = static_cast<int>(params.H);
  p.W = static_cast<int>(params.W);
  p.C = static_cast<int>(params.C);
  p.S = static_cast<int>(params.S);
  p.K = static_cast<int>(params.K);
  p.Cg = static_cast<int>(Cg);
  p.Kg = static_cast<int>(Kg);
  p.stride_h = params.stride_h;
  p.stride_w = params.stride_w;
  p.pad_h = params.pad_h;
  p.pad_w = params.pad_w;
  p.dil_h = params.dil_h;
  p.dil_w = params.dil_w;
  p.gemm_k = static_cast<int>(gemm_k);
  p.num_k_tiles = static_cast<int>(CeilDiv(gemm_k, cd::kTileK));
  p.Q = static_cast<int>(params.Q);
  p.tiles_n_per_group = static_cast<int>(CeilDiv(Kg, cd::kTileN));
  p.PQ = params.P * params.Q;
  p.HWC = params.H * params.W * params.C;
  p.N = params.N;
  SetStrides(params.layout, params.N, params.C, params.H, params.W,
             &p.x_stride_n, &p.x_stride_c, &p.x_stride_h, &p.x_stride_w);
  SetStrides(params.layout, params.N, params.K, params.P, params.Q,
             &p.y_stride_n, &p.y_stride_k, &p.y_stride_p, &p.y_stride_q);
  p.gemm_m = gemm_m;
  p.num_tiles_m = CeilDiv(gemm_m, cd::kTileM);
  p.num_tiles_gn = static_cast<int64_t>(params.groups) * p.tiles_n_per_group;
  p.epilogue = params.epilogue;
  const T* residual = static_cast<const T*>(params.residual);

  const dim3 grid(static_cast<unsigned>(std::min(p.num_tiles_m, kInt32Max)),
                  static_cast<unsigned>(std::min(p.num_tiles_gn, kMaxGridY)));
  switch (params.layout) {
    case TensorLayout::kNHWC:
      cd::conv2d_direct_kernel<T, TensorLayout::kNHWC>
          <<<grid, cd::kThreads, 0, stream>>>(x, w, bias, residual, y, p);
      break;
    case TensorLayout::kNCHW:
      cd::conv2d_direct_kernel<T, TensorLayout::kNCHW>
          <<<grid, cd::kThreads, 0, stream>>>(x, w, bias, residual, y, p);
      break;
    case TensorLayout::kCHWN:
      cd::conv2d_direct_kernel<T, TensorLayout::kCHWN>
          <<<grid, cd::kThreads, 0, stream>>>(x, w, bias, residual, y, p);
      break;
  }
  return cudaGetLastError();
}

JAXCNN_CONV2D_LAUNCHER_INSTANTIATE(launch_conv2d_direct)

}  // namespace jaxcnn
