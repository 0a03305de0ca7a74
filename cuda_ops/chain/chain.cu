// Launchers of the straight-chain kernels (chain.h): shape checks, tile and shared-memory
// planning, launch.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "chain/chain.h"
#include "chain/conv1x1_depthwise_kernel.cuh"
#include "chain/conv3x3_conv1x1_kernel.cuh"
#include "common/device_attribute.h"

namespace jaxcnn {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

bool ValidActivation(ChainActivation act) {
  return ValidChainActivationCode(static_cast<int64_t>(act));
}
constexpr const char* kActivationRule =
    "activations must be epilogue codes 0-7 (none, relu, relu6, silu, hard_swish, gelu_tanh, "
    "gelu_erf, sigmoid)";

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// CTAs per tile so that a grid of `ctas` tiles fills one wave of `per_sm` CTAs per SM where
// it is smaller, each CTA keeping at least one of the tile's `blocks` channel blocks (every
// split repeats the tile's shared work): {split, blocks per CTA}.
cudaError_t SplitBlocks(int64_t ctas, int per_sm, int blocks, int* split, int* per_cta) {
  int sms = 0;
  const cudaError_t status = CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>(&sms);
  if (status != cudaSuccess) return status;
  const int64_t want = std::max<int64_t>(1, int64_t{sms} * per_sm / std::max<int64_t>(ctas, 1));
  *per_cta = static_cast<int>(CeilDiv(blocks, std::min<int64_t>(want, blocks)));
  *split = static_cast<int>(CeilDiv(blocks, *per_cta));
  return cudaSuccess;
}

template <typename Kernel, typename... Args>
cudaError_t LaunchWithSmem(Kernel kernel, int64_t grid, int64_t smem, cudaStream_t stream,
                           Args... args) {
  int max_smem = 0;
  cudaError_t status =
      CurrentDeviceAttribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(&max_smem);
  if (status != cudaSuccess) return status;
  if (smem > max_smem || grid > kInt32Max) return cudaErrorInvalidConfiguration;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(smem));
  if (status != cudaSuccess) return status;
  // All of the unified L1 as shared memory: two CTAs per SM need more than the default split.
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                cudaSharedmemCarveoutMaxShared);
  if (status != cudaSuccess) return status;
  kernel<<<static_cast<unsigned>(grid), chain::kThreads, smem, stream>>>(args...);
  return cudaGetLastError();
}

}  // namespace

const char* conv3x3_conv1x1_unsupported_reason(const Conv3x3Conv1x1Params& p) {
  if (p.N < 0 || p.H < 0 || p.W < 0 || p.C < 1 || p.M < 1 || p.K < 1)
    return "sizes must be non-negative and channel counts positive";
  if (p.C % 8 || p.M % 8 || p.K % 8) return "C, M and K must be multiples of 8";
  if (p.M > kConv3x3Conv1x1MaxMid) return "M (the 3x3's output channels) must be <= 384";
  if (!chain::IsClamp(p.act1) || !chain::IsClamp(p.act2))
    return "activations must be 0 (none), 1 (relu) or 2 (relu6)";
  if (p.N * p.H * p.W * std::max({p.C, p.M, p.K}) > kInt32Max || 9 * p.C * p.M > kInt32Max)
    return "tensors must have fewer than 2^31 elements";
  return nullptr;
}

const char* conv1x1_depthwise_unsupported_reason(const Conv1x1DepthwiseParams& p) {
  if (p.N < 0 || p.H < 0 || p.W < 0 || p.C < 1 || p.M < 1)
    return "sizes must be non-negative and channel counts positive";
  if (p.C % 8 || p.M % 8) return "C and M must be multiples of 8";
  if (p.C > kConv1x1DepthwiseMaxIn) return "C (the 1x1's input channels) must be <= 256";
  if (p.stride != 1 && p.stride != 2) return "stride must be 1 or 2";
  for (int pad : {p.pad_top, p.pad_bottom, p.pad_left, p.pad_right})
    if (pad < 0 || pad > kConv1x1DepthwiseMaxPad) return "each padding must be 0, 1 or 2";
  if (!ValidActivation(p.act1) || !ValidActivation(p.act2)) return kActivationRule;
  if (p.N * p.H * p.W * std::max(p.C, p.M) > kInt32Max || p.C * p.M > kInt32Max)
    return "tensors must have fewer than 2^31 elements";
  return nullptr;
}

template <typename T>
cudaError_t launch_conv3x3_conv1x1(const Conv3x3Conv1x1Params& p, const T* x, const T* w3,
                                   const T* b3, const T* w1, const T* b1, T* y,
                                   cudaStream_t stream) {
  using namespace chain;
  if (conv3x3_conv1x1_unsupported_reason(p) || !x || !w3 || !b3 || !w1 || !b1 || !y)
    return cudaErrorInvalidValue;
  if (p.N * p.H * p.W == 0) return cudaSuccess;
  C31Args a{};
  a.N = p.N, a.H = p.H, a.W = p.W, a.C = p.C, a.M = p.M, a.K = p.K;
  a.act1 = ClampOf(p.act1), a.act2 = ClampOf(p.act2);
  a.tiles_h = CeilDiv(p.H, kC31TileH), a.tiles_w = CeilDiv(p.W, kC31TileW);
  a.m_blocks = CeilDiv(p.M, kBlockN);
  a.mp = RoundUp(a.M, 16);
  a.m_pieces = CeilDiv(a.mp, kBlockN);
  a.k_blocks = CeilDiv(p.K, kBlockN);
  a.t_stride = OddVecStride(a.mp);
  const int64_t tiles = p.N * a.tiles_h * a.tiles_w;
  const int64_t t_bytes = int64_t{kC31TileH} * kC31TileW * a.t_stride * sizeof(T);
  // Two CTAs per SM where their shared memory fits in one SM's 228 KB (1 KB reserved per
  // CTA): 16 warps hide the MMA and load latencies better than 8 (measured: more than a
  // deeper pipeline does). Else one, with the bigger chunks (fewer barriers) where they fit.
  constexpr int64_t kTwoPerSm = 113 * 1024;
  const int64_t slot16 = C31SlotElems(16) * sizeof(T), slot32 = C31SlotElems(32) * sizeof(T);
  int max_smem = 0;
  cudaError_t status = CurrentDeviceAttribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(&max_smem);
  if (status != cudaSuccess) return status;
  const int per_sm = 2 * slot16 + t_bytes <= kTwoPerSm ? 2 : 1;
  status = SplitBlocks(tiles, per_sm, a.k_blocks, &a.k_split, &a.k_blocks_per_cta);
  if (status != cudaSuccess) return status;
  const int64_t grid = tiles * a.k_split;
  a.c_chunks = CeilDiv(p.C, 16);
  if (3 * slot16 + t_bytes <= kTwoPerSm)
    return LaunchWithSmem(conv3x3_conv1x1_kernel<T, 16, 3, 2>, grid, 3 * slot16 + t_bytes,
                          stream, a, x, w3, b3, w1, b1, y);
  if (per_sm == 2)
    return LaunchWithSmem(conv3x3_conv1x1_kernel<T, 16, 2, 2>, grid, 2 * slot16 + t_bytes,
                          stream, a, x, w3, b3, w1, b1, y);
  if (3 * slot32 + t_bytes <= max_smem) {
    a.c_chunks = CeilDiv(p.C, 32);
    return LaunchWithSmem(conv3x3_conv1x1_kernel<T, 32, 3, 1>, grid, 3 * slot32 + t_bytes,
                          stream, a, x, w3, b3, w1, b1, y);
  }
  return LaunchWithSmem(conv3x3_conv1x1_kernel<T, 16, 4, 1>, grid, 4 * slot16 + t_bytes, stream,
                        a, x, w3, b3, w1, b1, y);
}

template <typename T>
cudaError_t launch_conv1x1_depthwise(const Conv1x1DepthwiseParams& p, const T* x, const T* w1,
                                     const T* b1, const T* wd, const T* bd, T* y,
                                     cudaStream_t stream) {
  using namespace chain;
  if (conv1x1_depthwise_unsupported_reason(p) || !x || !w1 || !b1 || !wd || !bd || !y)
    return cudaErrorInvalidValue;
  DwArgs a{};
  a.N = p.N, a.H = p.H, a.W = p.W, a.C = p.C, a.M = p.M;
  a.P = Conv1x1DepthwiseOutSize(p.H, p.pad_top, p.pad_bottom, p.stride);
  a.Q = Conv1x1DepthwiseOutSize(p.W, p.pad_left, p.pad_right, p.stride);
  a.pad_top = p.pad_top, a.pad_left = p.pad_left;
  if (p.N * a.P * a.Q <= 0) return cudaSuccess;
  a.act1 = ClampOf(p.act1), a.act2 = ClampOf(p.act2);
  a.cp = RoundUp(a.C, 16);
  a.x_stride = OddVecStride(a.cp);
  a.m_blocks = CeilDiv(p.M, kBlockN);
  a.w_slot_bytes = a.cp * kDwWStride * sizeof(T);
  int max_smem = 0;
  cudaError_t status = CurrentDeviceAttribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(&max_smem);
  if (status != cudaSuccess) return status;
  // The tile with the least halo work over the grid (small images waste less with small
  // tiles; the halo is recomputed by neighbours) among those whose shared memory fits.
  static constexpr int kTiles[][2] = {{8, 16}, {8, 8}, {4, 8}, {4, 4}};  // h: kStripRows multiples
  int64_t best_cost = -1, smem = 0;
  for (const auto& tile : kTiles) {
    const int th = tile[0], tw = tile[1];
    const int halo_h = (th - 1) * p.stride + 3, halo_w = (tw - 1) * p.stride + 3;
    const int halo_rows = RoundUp(halo_h * halo_w, 16);
    const int64_t x_bytes = int64_t{halo_rows} * a.x_stride * sizeof(T);
    const int64_t bytes = x_bytes + 2 * a.w_slot_bytes + int64_t{halo_rows} * kDwTStride * 4;
    const int64_t tiles = p.N * CeilDiv(a.P, th) * CeilDiv(a.Q, tw);
    const int64_t cost = tiles * halo_rows;
    if (bytes > max_smem || (best_cost >= 0 && cost >= best_cost)) continue;
    best_cost = cost, smem = bytes;
    a.tile_h = th, a.tile_w = tw, a.halo_h = halo_h, a.halo_w = halo_w;
    a.halo_rows = halo_rows;
    a.tiles_h = CeilDiv(a.P, th), a.tiles_w = CeilDiv(a.Q, tw);
    a.off_w = static_cast<int>(x_bytes);
    a.off_t = static_cast<int>(x_bytes + 2 * a.w_slot_bytes);
  }
  if (best_cost < 0) return cudaErrorInvalidConfiguration;
  const int64_t tiles = p.N * a.tiles_h * a.tiles_w;
  status = SplitBlocks(tiles, smem <= 113 * 1024 ? 2 : 1, a.m_blocks, &a.m_split,
                       &a.m_blocks_per_cta);
  if (status != cudaSuccess) return status;
  const int64_t grid = tiles * a.m_split;
  const bool other = !IsClamp(p.act1) || !IsClamp(p.act2);
  auto kernel = p.stride == 1 ? (other ? conv1x1_depthwise_kernel<T, 1, true>
                                       : conv1x1_depthwise_kernel<T, 1, false>)
                              : (other ? conv1x1_depthwise_kernel<T, 2, true>
                                       : conv1x1_depthwise_kernel<T, 2, false>);
  return LaunchWithSmem(kernel, grid, smem, stream, a, x, w1, b1, wd, bd, y);
}

#define JAXCNN_CHAIN_INSTANTIATE(T)                                                         \
  template cudaError_t launch_conv3x3_conv1x1<T>(const Conv3x3Conv1x1Params&, const T*,      \
                                                  const T*, const T*, const T*, const T*, T*, \
                                                  cudaStream_t);                              \
  template cudaError_t launch_conv1x1_depthwise<T>(const Conv1x1DepthwiseParams&, const T*,  \
                                                    const T*, const T*, const T*, const T*,   \
                                                    T*, cudaStream_t);
JAXCNN_CHAIN_INSTANTIATE(__nv_bfloat16)
JAXCNN_CHAIN_INSTANTIATE(__half)
#undef JAXCNN_CHAIN_INSTANTIATE

}  // namespace jaxcnn
