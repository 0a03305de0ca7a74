// Launcher for the tensor-core conv: validate, map the conv to what CUTLASS's
// im2col TMA accepts, pick a config, prepare the operands (fp32: weights to
// KRSC, 3xTF32 split; bf16/fp16 read x and the HWIO weights as they are),
// launch. No CUTLASS headers here: the kernels live in
// conv2d_tc_<dtype>_{a,b}_sm90a.cu behind conv2d_tc_configs.h.
#include <algorithm>
#include <type_traits>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "conv_tc/conv2d_tc_configs.h"
#include "conv_tc/conv2d_tc_prep.cuh"
#include "conv_tc/conv2d_tensorcore.h"

namespace jaxcnn {
namespace {

using conv_tc::TcKernelOps;
using conv_tc::TcProblem;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr size_t kWorkspaceAlign = 256;

// TMA im2col limits for 2 spatial dims (cuTensorMapEncodeIm2col): the
// window corners are signed 8-bit, the filter offsets unsigned 8-bit, the
// traversal stride at most 8; CUTLASS also caps pads at 256.
constexpr int kCornerMin = -128, kCornerMax = 127;
constexpr int kMaxFilterOffset = 254;
constexpr int kMaxTraversalStride = 8;

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

int ElementBytes(TcDType d) { return d == TcDType::kF32 ? 4 : 2; }

bool IsSplit3(const Conv2dParams& p, TcDType d) {
  return d == TcDType::kF32 && p.precision == MathPrecision::kHighest;
}

// Channels the kernels see: C rounded up to a 16-byte row (TMA). Few-channel
// inputs (RGB, C = 3) get x and w zero-padded to Cp in the workspace.
int64_t PaddedC(const Conv2dParams& p, TcDType d) {
  const int64_t align = 16 / ElementBytes(d);
  return (p.C + align - 1) / align * align;
}

bool NeedsChannelPad(const Conv2dParams& p, TcDType d) { return PaddedC(p, d) != p.C; }

// GEMM-K channels per filter tap: Cp, tripled for 3xTF32.
int64_t GemmC(const Conv2dParams& p, TcDType d) {
  return (IsSplit3(p, d) ? 3 : 1) * PaddedC(p, d);
}

// Input rows (or cols) the windows touch and the bottom (right) pad that makes
// the im2col extent come out as `out` exactly; TMA needs that pad >= 0, so
// rows no window reaches are cut off instead of padding negatively.
struct AxisMap {
  int64_t extent;  // rows of x the kernel may read (<= in)
  int64_t pad_hi;  // >= 0
};

AxisMap MapAxis(int64_t in, int64_t window, int64_t out, int stride, int pad_lo,
                int dil) {
  const int64_t pad_hi = (out - 1) * stride + (window - 1) * dil + 1 - in - pad_lo;
  if (pad_hi >= 0) return {in, pad_hi};
  return {in + pad_hi, 0};
}

struct DeviceInfo {
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
};

// Queried once for every device on first use, then read-only.
const DeviceInfo* GetDeviceInfo(int device) {
  static std::vector<DeviceInfo> infos;
  static std::once_flag once;
  std::call_once(once, [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    infos.resize(count);
    for (int d = 0; d < count; ++d) {
      cudaDeviceGetAttribute(&infos[d].sm_count, cudaDevAttrMultiProcessorCount, d);
      cudaDeviceGetAttribute(&infos[d].cc_major, cudaDevAttrComputeCapabilityMajor, d);
      cudaDeviceGetAttribute(&infos[d].cc_minor, cudaDevAttrComputeCapabilityMinor, d);
    }
    (void)cudaGetLastError();
  });
  if (device < 0 || device >= static_cast<int>(infos.size())) return nullptr;
  return &infos[device];
}

// Index of `config` among the residual variants of `dtype`'s family, or -1 where it has none.
int ResidualIndex(TcDType dtype, int config) {
  const int first = dtype == TcDType::kF32 ? conv_tc::kNumResidualConfigsHalf - 1 : 0;
  for (int i = first; i < conv_tc::kNumResidualConfigsHalf; ++i)
    if (conv_tc::kResidualConfigs[i] == config) return i - first;
  return -1;
}

// split3: fp32 kHighest, the 3xTF32 family (two-level accumulation). residual: the variant
// that reads one (`config` must have one: ResidualIndex >= 0).
const TcKernelOps& KernelOps(TcDType dtype, bool split3, int config, bool residual) {
  if (residual) {
    const int i = ResidualIndex(dtype, config);
    if (dtype == TcDType::kBF16) return conv_tc::kBf16KernelsResidual[i];
    if (dtype == TcDType::kF16) return conv_tc::kF16KernelsResidual[i];
    return split3 ? conv_tc::kTf32x3KernelsResidual[i] : conv_tc::kTf32KernelsResidual[i];
  }
  const TcKernelOps* a = conv_tc::kBf16KernelsA;
  const TcKernelOps* b = conv_tc::kBf16KernelsB;
  if (dtype == TcDType::kF16) {
    a = conv_tc::kF16KernelsA;
    b = conv_tc::kF16KernelsB;
  } else if (dtype == TcDType::kF32 && split3) {
    a = conv_tc::kTf32x3KernelsA;
    b = conv_tc::kTf32x3KernelsB;
  } else if (dtype == TcDType::kF32) {
    a = conv_tc::kTf32KernelsA;
    b = conv_tc::kTf32KernelsB;
  }
  return config < 3 ? a[config] : b[config - 3];
}

// Everything except the device and the pointers other than the residual's.
TcProblem MakeProblem(const Conv2dParams& p, TcDType dtype) {
  const int64_t c_gemm = GemmC(p, dtype);
  const AxisMap h = MapAxis(p.H, p.R, p.P, p.stride_h, p.pad_h, p.dil_h);
  const AxisMap w = MapAxis(p.W, p.S, p.Q, p.stride_w, p.pad_w, p.dil_w);
  TcProblem t;
  t.N = static_cast<int>(p.N);
  t.H_eff = static_cast<int>(h.extent);
  t.W_eff = static_cast<int>(w.extent);
  t.C = static_cast<int>(c_gemm);
  t.x_stride_w = c_gemm;
  t.x_stride_h = p.W * c_gemm;
  t.x_stride_n = p.H * p.W * c_gemm;
  t.R = static_cast<int>(p.R);
  t.S = static_cast<int>(p.S);
  t.K = static_cast<int>(p.K);
  t.P = static_cast<int>(p.P);
  t.Q = static_cast<int>(p.Q);
  t.stride_h = p.stride_h;
  t.stride_w = p.stride_w;
  t.pad_top = p.pad_h;
  t.pad_left = p.pad_w;
  t.pad_bottom = static_cast<int>(h.pad_hi);
  t.pad_right = static_cast<int>(w.pad_hi);
  t.dil_h = p.dil_h;
  t.dil_w = p.dil_w;
  t.residual = p.residual;  // which kernel variant runs (and sizes its workspace)
  t.act = static_cast<int>(p.epilogue.act);
  t.alpha = p.epilogue.alpha;
  t.y_stride_pixel = p.y_pixel_stride > 0 ? p.y_pixel_stride : p.K;
  return t;
}

bool OutputEmpty(const Conv2dParams& p) {
  return p.N == 0 || p.P == 0 || p.Q == 0 || p.K == 0;
}

// bf16/fp16 kernels read the HWIO weights directly (MN-major B); fp32 needs
// them K-major (wgmma TF32 operands), so it keeps the KRSC copy.
bool WeightsNeedKrsc(TcDType d) {
  return d == TcDType::kF32 || !conv_tc::kHalfBFromHwio;
}

struct WorkspaceLayout {
  // fp32: KRSC weights (3*Cp wide for 3xTF32); bf16/fp16: the HWIO weights
  // channel-padded to Cp when C is not a 16-byte row, else 0.
  size_t weights = 0;
  // 3xTF32 split of x (3*Cp wide), else x channel-padded to Cp if needed, else 0.
  size_t activations = 0;
  size_t cutlass_offset = 0;
  size_t cutlass = 0;  // max over configs
  size_t total = 0;
};

WorkspaceLayout GetWorkspaceLayout(const Conv2dParams& p, TcDType dtype) {
  WorkspaceLayout l;
  const bool split3 = IsSplit3(p, dtype);
  const bool pad = NeedsChannelPad(p, dtype);
  const size_t elem = static_cast<size_t>(ElementBytes(dtype));
  const size_t c_gemm = static_cast<size_t>(GemmC(p, dtype));
  if (WeightsNeedKrsc(dtype) || pad)
    l.weights = AlignUp(static_cast<size_t>(p.K * p.R * p.S) * c_gemm * elem,
                        kWorkspaceAlign);
  if (split3 || pad)
    l.activations = AlignUp(
        static_cast<size_t>(p.N * p.H * p.W) * c_gemm * elem, kWorkspaceAlign);
  l.cutlass_offset = l.weights + l.activations;
  const TcProblem problem = MakeProblem(p, dtype);
  const bool residual = p.residual != nullptr;
  for (int c = 0; c < conv_tc::kNumConfigs; ++c)
    if (!residual || ResidualIndex(dtype, c) >= 0)
      l.cutlass = std::max(l.cutlass,
                           KernelOps(dtype, split3, c, residual).workspace_bytes(problem));
  l.cutlass = AlignUp(l.cutlass, kWorkspaceAlign);
  l.total = l.cutlass_offset + l.cutlass;
  return l;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t NumTiles(int64_t m, int64_t n, int config, bool split3) {
  const conv_tc::TcConfigInfo& c = conv_tc::config_info(config, split3);
  return CeilDiv(m, c.tile_m) * CeilDiv(n, c.tile_n);
}

bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

template <typename T>
void LaunchWeightTransform(const T* w, T* out, const Conv2dParams& p,
                           bool split3, int64_t cpad, cudaStream_t stream) {
  const dim3 block(conv_tc::kTransposeTile, conv_tc::kTransposeRows);
  const dim3 grid(static_cast<unsigned>(CeilDiv(p.K, conv_tc::kTransposeTile)),
                  static_cast<unsigned>(CeilDiv(p.C, conv_tc::kTransposeTile)),
                  static_cast<unsigned>(p.R * p.S));
  const int rs = static_cast<int>(p.R * p.S), c = static_cast<int>(p.C),
            k = static_cast<int>(p.K), cp = static_cast<int>(cpad);
  if constexpr (std::is_same_v<T, float>) {
    if (split3) {
      conv_tc::weights_hwio_to_krsc<float, true>
          <<<grid, block, 0, stream>>>(w, out, rs, c, k, cp);
      return;
    }
  }
  conv_tc::weights_hwio_to_krsc<T, false><<<grid, block, 0, stream>>>(w, out, rs, c, k, cp);
}

}  // namespace

const char* conv2d_tensorcore_unsupported_reason(const Conv2dParams& q,
                                                 TcDType dtype) {
  if (dtype != TcDType::kF32 && dtype != TcDType::kBF16 && dtype != TcDType::kF16)
    return "unknown dtype";
  if (q.N < 0 || q.H < 0 || q.W < 0 || q.C < 0 || q.R < 0 || q.S < 0 ||
      q.K < 0 || q.P < 0 || q.Q < 0)
    return "negative dimension";
  if (q.layout != TensorLayout::kNHWC) return "the tensor-core kernel reads NHWC only";
  if (q.groups != 1) return "the tensor-core kernel supports groups == 1 only";
  if (q.stride_h < 1 || q.stride_w < 1) return "strides must be >= 1";
  if (q.dil_h < 1 || q.dil_w < 1) return "dilations must be >= 1";
  if (q.pad_h < 0 || q.pad_w < 0) return "pads must be >= 0";
  if (OutputEmpty(q)) return nullptr;  // nothing to compute: the launch is a no-op
  if (q.H == 0 || q.W == 0 || q.C == 0 || q.R == 0 || q.S == 0)
    return "empty input or window (output is bias only)";

  // C needs no alignment: other channel counts are zero-padded to Cp.
  const int align = 16 / ElementBytes(dtype);
  if (q.K % align != 0)
    return dtype == TcDType::kF32 ? "K must be a multiple of 4 (16-byte TMA rows)"
                                  : "K must be a multiple of 8 (16-byte TMA rows)";
  if (q.y_pixel_stride != 0 && (q.y_pixel_stride < q.K || q.y_pixel_stride % align != 0))
    return "y_pixel_stride must be 0 (packed) or >= K and a multiple of 16 bytes (TMA store)";
  if (q.residual != nullptr && q.y_pixel_stride != 0 && q.y_pixel_stride != q.K)
    return "a residual needs a packed y";
  if (q.stride_h > kMaxTraversalStride || q.stride_w > kMaxTraversalStride)
    return "strides above 8 (TMA im2col traversal stride limit)";

  if (q.N > kInt32Max || q.H > kInt32Max || q.W > kInt32Max || q.C > kInt32Max ||
      q.R > kInt32Max || q.S > kInt32Max || q.K > kInt32Max || q.P > kInt32Max ||
      q.Q > kInt32Max)
    return "a dimension exceeds int32";
  if ((q.R - 1) * q.dil_h > kMaxFilterOffset || (q.S - 1) * q.dil_w > kMaxFilterOffset)
    return "dilated window wider than 255 (TMA im2col offset limit)";
  if (q.pad_h > -kCornerMin || q.pad_w > -kCornerMin)
    return "top/left padding above 128 (TMA im2col corner limit)";

  const AxisMap h = MapAxis(q.H, q.R, q.P, q.stride_h, q.pad_h, q.dil_h);
  const AxisMap w = MapAxis(q.W, q.S, q.Q, q.stride_w, q.pad_w, q.dil_w);
  if (h.extent < 1 || w.extent < 1) return "no window touches the input";
  const int64_t upper_h = h.pad_hi - (q.R - 1) * q.dil_h;
  const int64_t upper_w = w.pad_hi - (q.S - 1) * q.dil_w;
  if (h.pad_hi > 256 || w.pad_hi > 256 || upper_h < kCornerMin ||
      upper_h > kCornerMax || upper_w < kCornerMin || upper_w > kCornerMax)
    return "bottom/right padding outside the TMA im2col corner range";

  const int64_t c_gemm = GemmC(q, dtype);
  if (c_gemm > kInt32Max) return "C exceeds int32";
  // GEMM M is an int in CUTLASS; TMA byte strides must stay below 2^40.
  int64_t m = 0, x_elems = 0, w_elems = 0;
  if (__builtin_mul_overflow(q.N * q.P, q.Q, &m) || m > kInt32Max)
    return "N*P*Q exceeds int32";
  if (__builtin_mul_overflow(q.N * q.H, q.W * c_gemm, &x_elems) ||
      x_elems > (int64_t{1} << 36))
    return "input too large for TMA addressing";
  if (__builtin_mul_overflow(q.K * q.R, q.S * c_gemm, &w_elems) ||
      w_elems > kInt32Max)
    return "weights too large";
  if (q.R * q.S > 65535) return "R*S exceeds 65535";
  return nullptr;
}

size_t conv2d_tensorcore_workspace_bytes(const Conv2dParams& params,
                                         TcDType dtype) {
  if (conv2d_tensorcore_unsupported_reason(params, dtype) != nullptr ||
      OutputEmpty(params))
    return 0;
  return GetWorkspaceLayout(params, dtype).total;
}

int conv2d_tensorcore_num_configs() { return conv_tc::kNumConfigs; }

const char* conv2d_tensorcore_config_name(int config) {
  if (config < 0 || config >= conv_tc::kNumConfigs) return nullptr;
  return conv_tc::config_info(config).name;
}

const char* conv2d_tensorcore_config_name(int config, const Conv2dParams& params,
                                          TcDType dtype) {
  if (config < 0 || config >= conv_tc::kNumConfigs) return nullptr;
  return conv_tc::config_info(config, IsSplit3(params, dtype)).name;
}

// GEMM view: M = N*P*Q, N = K, K = R*S*C (C tripled for 3xTF32, whose
// kernels have their own tile table, see conv2d_tc_configs.h).
//  * few channels (C*bytes <= 32 for bf16/fp16, <= 64 for fp32): 32-byte K
//    tiles; a 128-byte tile would be mostly TMA zero fill. At 64-byte bf16 rows
//    (C = 32) a 128-byte tile is half fill and a 32-byte one tiny TMA boxes (H200,
//    the fire expands, C = 32, K = 128: pp_128x128 1.0-1.2x faster than the
//    small-C tile): the 64-byte K tile config when K > 64 fills a wave;
//  * otherwise the largest tile whose tile count still fills the GPU with at
//    least ~2 waves (1 wave for the smallest), preferring the cooperative
//    128x256 / 256x128 tiles (fewer A/B re-reads, weights multicast across
//    the 2-CTA cluster) when the reduction is long enough to amortize their
//    non-overlapped epilogue, else the ping-pong tiles whose epilogue hides
//    behind the other warpgroup's mainloop (short-K 1x1 / memory-bound layers).
int conv2d_tensorcore_pick_config(const Conv2dParams& p, TcDType dtype) {
  using namespace conv_tc;
  const bool split3 = IsSplit3(p, dtype);
  const int64_t c_gemm = GemmC(p, dtype);
  const int64_t m = p.N * p.P * p.Q, n = p.K;
  const int64_t k_bytes = p.R * p.S * c_gemm * ElementBytes(dtype);
  int sm_count = 132;  // H100 SXM / H200
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess) {
    if (const DeviceInfo* info = GetDeviceInfo(device))
      if (info->sm_count > 0) sm_count = info->sm_count;
  } else {
    (void)cudaGetLastError();
  }

  // With a residual only the configs that have a residual variant: the wider tile where its
  // tiles still fill the GPU.
  if (p.residual != nullptr) {
    if (dtype != TcDType::kF32 && n > 64 && NumTiles(m, n, kPingpong128x128, false) >= sm_count)
      return kPingpong128x128;
    return kPingpong128x64;
  }

  const int64_t small_c_bytes = dtype == TcDType::kF32 ? 64 : 32;
  if (c_gemm * ElementBytes(dtype) <= small_c_bytes) return kPingpong128x64SmallC;
  if (dtype != TcDType::kF32 && c_gemm * ElementBytes(dtype) <= 64 && n > 64 &&
      NumTiles(m, n, kPingpong128x128K64, false) >= sm_count)
    return kPingpong128x128K64;

  if (split3) {
    // 3xTF32 table: 0 coop_128x128_c2, 1 coop_256x64_c2, 2 pp_64x128_c1.
    // Compute-bound (3x the MMAs): the cooperative tiles when they fill the
    // GPU twice, else the ping-pong ones down to one wave.
    const int big = n > 64 ? 0 : 1;
    if (NumTiles(m, n, big, true) >= 2 * sm_count) return big;
    if (NumTiles(m, n, kPingpong128x64, true) >= sm_count) return kPingpong128x64;
    if (n > 64 && NumTiles(m, n, 2, true) >= sm_count) return 2;
    return kPingpong64x64;
  }

  const bool long_k = k_bytes >= 1024;  // >= 8 k-tiles of 128 bytes
  int preferred[4];
  int count = 0;
  if (long_k && n >= 192) preferred[count++] = kCoop128x256C2;
  if (long_k && n > 64 && n <= 160) preferred[count++] = kCoop256x128C2;
  if (n > 64) preferred[count++] = kPingpong128x128;
  preferred[count++] = kPingpong128x64;
  for (int i = 0; i < count; ++i)
    if (NumTiles(m, n, preferred[i], false) >= 2 * sm_count) return preferred[i];
  // Small problems: the smallest tile that still fills one wave, else 64x64.
  if (NumTiles(m, n, kPingpong128x64, false) >= sm_count) return kPingpong128x64;
  return kPingpong64x64;
}

template <typename T>
cudaError_t launch_conv2d_tensorcore(const T* x, const T* w, const T* bias,
                                     T* y, const Conv2dParams& params,
                                     void* workspace, size_t workspace_bytes,
                                     cudaStream_t stream, int config) {
  constexpr TcDType dtype = TcDTypeOf<T>::value;
  if (conv2d_tensorcore_unsupported_reason(params, dtype) != nullptr)
    return cudaErrorInvalidValue;
  if (config < -1 || config >= conv_tc::kNumConfigs) return cudaErrorInvalidValue;
  if (OutputEmpty(params)) return cudaSuccess;
  if (x == nullptr || w == nullptr || y == nullptr) return cudaErrorInvalidValue;
  if (!Aligned16(x) || !Aligned16(w) || !Aligned16(y) || !Aligned16(params.residual))
    return cudaErrorInvalidValue;
  // bf16/fp16 usually need no workspace at all (then `workspace` may be null).
  const WorkspaceLayout layout = GetWorkspaceLayout(params, dtype);
  if (layout.total > 0 &&
      (workspace == nullptr || workspace_bytes < layout.total ||
       (reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlign) != 0))
    return cudaErrorInvalidValue;

  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const DeviceInfo* info = GetDeviceInfo(device);
  if (info == nullptr) return cudaErrorInvalidDevice;
  // The kernels are sm_90a code (wgmma, TMA im2col): Hopper only.
  if (info->cc_major != 9 || info->cc_minor != 0)
    return cudaErrorNoKernelImageForDevice;

  if (config < 0) config = conv2d_tensorcore_pick_config(params, dtype);
  const bool residual = params.residual != nullptr;
  if (residual && ResidualIndex(dtype, config) < 0) return cudaErrorInvalidValue;

  const bool split3 = IsSplit3(params, dtype);
  const bool pad = NeedsChannelPad(params, dtype);
  const int64_t cpad = PaddedC(params, dtype);
  const int c_in = static_cast<int>(params.C), cp = static_cast<int>(cpad);
  char* ws = static_cast<char*>(workspace);
  auto grid_for = [&](int64_t elements) {
    return static_cast<unsigned>(std::max<int64_t>(
        1, std::min<int64_t>(CeilDiv(elements, 256), int64_t{info->sm_count} * 16)));
  };

  const T* w_gemm = w;  // HWIO as it is for bf16/fp16 without padding
  if (WeightsNeedKrsc(dtype)) {
    T* w_krsc = reinterpret_cast<T*>(ws);
    // The pad columns (c >= C) of the KRSC rows are not written by the
    // transpose: zero them (0 * garbage could be NaN).
    if (pad) {
      status = cudaMemsetAsync(w_krsc, 0, layout.weights, stream);
      if (status != cudaSuccess) return status;
    }
    LaunchWeightTransform<T>(w, w_krsc, params, split3, cpad, stream);
    status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    w_gemm = w_krsc;
  } else if (pad) {
    T* w_pad = reinterpret_cast<T*>(ws);
    const int rs = static_cast<int>(params.R * params.S), k = static_cast<int>(params.K);
    conv_tc::pad_hwio_channels<T><<<grid_for(int64_t{rs} * cp * k), 256, 0, stream>>>(
        w, w_pad, rs, c_in, cp, k);
    status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    w_gemm = w_pad;
  }

  const void* x_gemm = x;
  const int64_t pixels = params.N * params.H * params.W;
  T* x_ws = reinterpret_cast<T*>(ws + layout.weights);
  if constexpr (std::is_same_v<T, float>) {
    if (split3 && !pad) {
      const int64_t num_vec4 = pixels * params.C / 4;
      conv_tc::activations_split3_tf32<<<grid_for(num_vec4), 256, 0, stream>>>(
          reinterpret_cast<const float4*>(x), x_ws, num_vec4, c_in);
      status = cudaGetLastError();
      if (status != cudaSuccess) return status;
      x_gemm = x_ws;
    } else if (split3) {
      conv_tc::activations_split3_tf32_padded<<<grid_for(pixels * cp), 256, 0,
                                                stream>>>(x, x_ws, pixels, c_in, cp);
      status = cudaGetLastError();
      if (status != cudaSuccess) return status;
      x_gemm = x_ws;
    }
  }
  if (pad && !split3) {
    conv_tc::pad_channels<T><<<grid_for(pixels * cp), 256, 0, stream>>>(
        x, x_ws, pixels, c_in, cp);
    status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    x_gemm = x_ws;
  }

  TcProblem problem = MakeProblem(params, dtype);
  problem.x = x_gemm;
  problem.w = w_gemm;
  problem.bias = bias;
  problem.y = y;
  problem.device = device;
  problem.sm_count = info->sm_count;
  return KernelOps(dtype, split3, config, residual)
      .run(problem, layout.cutlass > 0 ? ws + layout.cutlass_offset : nullptr,
            layout.cutlass, stream);
}

template cudaError_t launch_conv2d_tensorcore<float>(
    const float*, const float*, const float*, float*, const Conv2dParams&,
    void*, size_t, cudaStream_t, int);
template cudaError_t launch_conv2d_tensorcore<__nv_bfloat16>(
    const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
    __nv_bfloat16*, const Conv2dParams&, void*, size_t, cudaStream_t, int);
template cudaError_t launch_conv2d_tensorcore<__half>(
    const __half*, const __half*, const __half*, __half*, const Conv2dParams&,
    void*, size_t, cudaStream_t, int);

}  // namespace jaxcnn
