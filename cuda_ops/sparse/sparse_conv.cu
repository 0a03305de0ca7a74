// Launcher of the zero-skipping conv: validate, plan (tile kernel, or channels per lane /
// pixels per warp / taps per stage of the walk kernel), encode the nonzeros, run the conv.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>

#include "common/device_attribute.h"
#include "sparse/sparse_conv.h"
#include "sparse/sparse_conv_kernels.cuh"
#include "sparse/sparse_tile_kernel.cuh"

namespace jaxcnn {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// Static shared-memory budget of one stage: 48 KiB needs no opt-in attribute, so launches stay
// attribute-free (CUDA-graph safe) and up to 4 CTAs fit an SM next to each other.
constexpr int64_t kStageBytes = 48 * 1024;
constexpr int kMaxPoolSlots = 9;  // pooled windows up to 3x3 run in one round

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

sparse::ConvArgs MakeArgs(const SparseConvParams& p, int taps_per_stage) {
  sparse::ConvArgs a;
  a.N = static_cast<int>(p.N), a.H = static_cast<int>(p.H), a.W = static_cast<int>(p.W);
  a.C = static_cast<int>(p.C), a.G = static_cast<int>(p.groups32());
  a.R = static_cast<int>(p.R), a.S = static_cast<int>(p.S), a.K = static_cast<int>(p.K);
  a.P = static_cast<int>(p.P), a.Q = static_cast<int>(p.Q);
  a.stride_h = static_cast<int>(p.stride_h), a.stride_w = static_cast<int>(p.stride_w);
  a.pad_h = static_cast<int>(p.pad_h), a.pad_w = static_cast<int>(p.pad_w);
  a.dilation_h = static_cast<int>(p.dilation_h), a.dilation_w = static_cast<int>(p.dilation_w);
  a.activation = static_cast<int>(p.activation);
  a.pool_h = static_cast<int>(p.pool_h), a.pool_w = static_cast<int>(p.pool_w);
  a.pool_stride_h = static_cast<int>(p.pool_stride_h);
  a.pool_stride_w = static_cast<int>(p.pool_stride_w);
  a.pool_pad_h = static_cast<int>(p.pool_pad_h), a.pool_pad_w = static_cast<int>(p.pool_pad_w);
  a.PP = static_cast<int>(p.PP), a.PQ = static_cast<int>(p.PQ);
  a.taps_per_stage = taps_per_stage;
  a.M = p.pooled() ? p.N * p.PP * p.PQ : p.N * p.P * p.Q;
  return a;
}

// Pixel slots per warp of the pooled kernel: the window in one round when it has 4 or 9
// entries (2x2, 3x3), else rounds of 8.
int PoolSlots(const SparseConvParams& p) {
  const int64_t window = p.pool_h * p.pool_w;
  if (window <= 4) return 4;
  if (window <= kMaxPoolSlots) return 9;
  return 8;
}

template <typename T, int KPT, int PW, bool POOL>
cudaError_t LaunchConv(const SparseConvPlan& plan, const sparse::ConvArgs& args, const T* x,
                       const uint32_t* masks, const T* w, const T* bias, T* y,
                       cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y));
  sparse::sparse_conv_kernel<T, KPT, PW, POOL>
      <<<grid, sparse::kThreads, plan.smem_bytes, stream>>>(args, x, masks, w, bias, y);
  return cudaGetLastError();
}

template <typename T, int KPT, bool POOL>
cudaError_t LaunchSlots(const SparseConvPlan& plan, const sparse::ConvArgs& args, const T* x,
                        const uint32_t* masks, const T* w, const T* bias, T* y,
                        cudaStream_t stream) {
  if constexpr (POOL) {
    switch (plan.pixels_per_warp) {
      case 4: return LaunchConv<T, KPT, 4, true>(plan, args, x, masks, w, bias, y, stream);
      case 9: return LaunchConv<T, KPT, 9, true>(plan, args, x, masks, w, bias, y, stream);
      default: return LaunchConv<T, KPT, 8, true>(plan, args, x, masks, w, bias, y, stream);
    }
  } else {
    if (plan.pixels_per_warp == 4)
      return LaunchConv<T, KPT, 4, false>(plan, args, x, masks, w, bias, y, stream);
    return LaunchConv<T, KPT, 8, false>(plan, args, x, masks, w, bias, y, stream);
  }
}

template <typename T, bool POOL>
cudaError_t LaunchKpt(const SparseConvPlan& plan, const sparse::ConvArgs& args, const T* x,
                      const uint32_t* masks, const T* w, const T* bias, T* y,
                      cudaStream_t stream) {
  switch (plan.k_per_lane) {
    case 4: return LaunchSlots<T, 4, POOL>(plan, args, x, masks, w, bias, y, stream);
    case 2: return LaunchSlots<T, 2, POOL>(plan, args, x, masks, w, bias, y, stream);
    default: return LaunchSlots<T, 1, POOL>(plan, args, x, masks, w, bias, y, stream);
  }
}

// Tile kernel: channel splits per layer at most, and the cost model that picks the count.
// A CTA's time per chunk of channels: each channel costs a warp a fixed scan (halo loads,
// ballot, group tests) plus a part proportional to its tile's dense MACs. Fitted to the
// selftest timings at 90% zeros on an H100 (the sparsity the sparse path is picked for):
// 3x3 tiles of 16-18 K MACs a warp-channel take 0.7-0.95 us a channel step, 1x1 tiles of 2 K
// MACs 0.43 us. A split adds its fp32 partial sums' round trip through memory (each split
// writes its slice, the finalize pass reads them all) and the finalize launch: VGG conv1_2 at
// N=1 took 90 us in four splits and takes 66 us unsplit, in one wave of 98 CTAs.
constexpr int kTileMaxSplits = 16;
constexpr double kTileChannelStepSeconds = 0.4e-6;
constexpr double kTileSecondsPerWarpMac = 2.3e-11;
constexpr double kTilePartialsBytesPerSecond = 3.0e12;
constexpr double kTileSplitPassSeconds = 4e-6;

bool TileEligible(const SparseConvParams& p) {
  return !p.pooled() && p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 &&
         p.dilation_w == 1 && p.R == p.S && (p.R == 1 || p.R == 3 || p.R == 5);
}

// The warp tile (TH x TW pixels, KPL channels a lane) for these params: 64 fp32 accumulators a
// lane, 2x8 pixels x 4 channels (K > 64) or 4x8 x 2 (K <= 64, and 5x5), so that 16 warps of a CTA
// fit the registers (H100, VGG conv3_2 fp32 at 90% zeros: 2x8 tiles in 16 warps 2.91 ms, 4x8
// tiles x 4 channels in 8 warps 3.43 ms). A 5x5 window's 50 weight registers keep it at 8 warps.
// Tiles are 7 pixels wide where that covers the output's width with fewer pixels than 8 (widths
// 7, 13, 14, 27, 28: the deep layers of VGG, AlexNet and ResNet, where 8-wide tiles compute
// 12-19% of their pixels past the image).
struct TileShape {
  int th, tw, kpl;
};
TileShape TileShapeFor(const SparseConvParams& p) {
  const bool two_channels = p.R == 5 || p.K <= 64;
  const int tw = CeilDiv(p.Q, 7) * 7 < CeilDiv(p.Q, 8) * 8 ? 7 : 8;
  return two_channels ? TileShape{4, tw, 2} : TileShape{2, tw, 4};
}

// Shared memory of a CTA of warps_y x warps_x warp tiles.
int64_t TileSmemFor(const SparseConvParams& p, int warps_y, int warps_x) {
  const TileShape t = TileShapeFor(p);
  return sparse::TileSmemBytes(static_cast<int>(p.elem_bytes), static_cast<int>(p.R), t.th, t.tw,
                               t.kpl, warps_y, warps_x);
}

// JAXCNN_SPARSE_TILE_REGION="WYxWX" forces the CTA's warp arrangement (benchmarks), where the
// tile shape's launch bound allows that many warps.
bool ForcedTileRegion(int max_warps, int* warps_y, int* warps_x) {
  static const std::pair<int, int> forced = [] {
    const char* v = std::getenv("JAXCNN_SPARSE_TILE_REGION");
    int a = 0, b = 0;
    if (v == nullptr || std::sscanf(v, "%dx%d", &a, &b) != 2 || a < 1 || b < 1)
      return std::pair<int, int>{0, 0};
    return std::pair<int, int>{a, b};
  }();
  if (forced.first == 0 || forced.first * forced.second > max_warps) return false;
  *warps_y = forced.first, *warps_x = forced.second;
  return true;
}

// Fills the tile kernel's plan, or returns false when no CTA of it fits this GPU's shared
// memory. The CTA's region is the arrangement of the most warps (they share every weight load)
// that fits, with the fewest pixels past the image (then the squarest: the smaller halo); the
// input channels are split where the idle SMs of fewer waves cost more than the partial sums'
// round trip through memory, as far as `scratch_bytes` holds them.
bool PlanTile(const SparseConvParams& p, int sm_count, int smem_optin,
              int64_t scratch_bytes, SparseConvPlan& plan) {
  const TileShape t = TileShapeFor(p);
  int best_y = 0, best_x = 0;
  int64_t best_area = 0;
  int fy = 0, fx = 0;
  const int max_warps = sparse::TileMaxWarps(static_cast<int>(p.R), t.th, t.tw, t.kpl);
  if (ForcedTileRegion(max_warps, &fy, &fx) && TileSmemFor(p, fy, fx) <= smem_optin) {
    best_y = fy, best_x = fx;
  } else {
    for (int warps = max_warps; warps >= 1 && best_y == 0; warps /= 2) {
      for (int wy = 1; wy <= warps; wy *= 2) {
        const int wx = warps / wy;
        if (TileSmemFor(p, wy, wx) > smem_optin) continue;
        const int64_t rh = int64_t{wy} * t.th, rw = int64_t{wx} * t.tw;
        const int64_t area = CeilDiv(p.P, rh) * rh * CeilDiv(p.Q, rw) * rw;
        const bool squarer = std::abs(rh - rw) < std::abs(int64_t{best_y} * t.th - int64_t{best_x} * t.tw);
        if (best_y == 0 || area < best_area || (area == best_area && squarer))
          best_y = wy, best_x = wx, best_area = area;
      }
    }
  }
  if (best_y == 0) return false;
  plan.kernel = SparseKernel::kTile;
  plan.k_per_lane = t.kpl;
  plan.tile_h = t.th, plan.tile_w = t.tw;
  plan.warps_y = best_y, plan.warps_x = best_x;
  plan.warps = best_y * best_x;
  plan.region_h = best_y * t.th, plan.region_w = best_x * t.tw;
  plan.grid_y = CeilDiv(p.K, 32 * t.kpl);
  plan.grid_x = p.N * CeilDiv(p.P, plan.region_h) * CeilDiv(p.Q, plan.region_w);
  const int64_t chunk = sparse::TileChunkChannels(static_cast<int>(p.elem_bytes), static_cast<int>(p.R));
  plan.chunk_channels = static_cast<int>(chunk);
  const int64_t chunks = CeilDiv(p.C, chunk);
  const int64_t ctas = plan.grid_x * plan.grid_y;
  const int64_t slice = p.N * p.P * p.Q * p.K * static_cast<int64_t>(sizeof(float));
  // Waves (one CTA an SM) x chunks a CTA walks x a chunk's time, plus a split's partial sums.
  const double warp_macs = static_cast<double>(t.th) * t.tw * 32 * t.kpl * p.R * p.S;
  const double chunk_seconds =
      static_cast<double>(chunk) * (kTileChannelStepSeconds + kTileSecondsPerWarpMac * warp_macs);
  auto split_seconds = [&](int64_t s) {
    const double walk = static_cast<double>(CeilDiv(ctas * s, sm_count) * CeilDiv(chunks, s)) *
                        chunk_seconds;
    if (s == 1) return walk;
    return walk + 2.0 * static_cast<double>(s * slice) / kTilePartialsBytesPerSecond +
           kTileSplitPassSeconds;
  };
  int64_t splits = 1;
  double best_cost = split_seconds(1);
  for (int64_t s = 2; s <= std::min<int64_t>(chunks, kTileMaxSplits); ++s) {
    if (s * slice > scratch_bytes) break;
    const double cost = split_seconds(s);
    if (cost < best_cost) best_cost = cost, splits = s;
  }
  splits = CeilDiv(chunks, CeilDiv(chunks, splits));  // no empty split
  plan.splits = static_cast<int>(splits);
  plan.scratch_bytes = splits > 1 ? splits * slice : 0;
  plan.smem_bytes = TileSmemFor(p, best_y, best_x);
  if (plan.grid_x > kInt32Max || plan.grid_y > 65535) plan.unsupported = "grid too large";
  return true;
}

template <typename T, int R, int TH, int TW, int KPL>
cudaError_t LaunchTileShape(const SparseConvParams& p, const SparseConvPlan& plan, const T* x,
                            const T* w, const T* bias, T* y, float* partials,
                            cudaStream_t stream) {
  // LaunchTile's instantiations must match TileShapeFor: the plan's grid and regions assume it.
  if (plan.tile_h != TH || plan.tile_w != TW || plan.k_per_lane != KPL)
    return cudaErrorInvalidConfiguration;
  sparse::TileArgs a;
  a.N = static_cast<int>(p.N), a.H = static_cast<int>(p.H), a.W = static_cast<int>(p.W);
  a.C = static_cast<int>(p.C), a.K = static_cast<int>(p.K);
  a.P = static_cast<int>(p.P), a.Q = static_cast<int>(p.Q);
  a.pad_h = static_cast<int>(p.pad_h), a.pad_w = static_cast<int>(p.pad_w);
  a.activation = static_cast<int>(p.activation);
  a.warps_y = plan.warps_y, a.warps_x = plan.warps_x;
  a.regions_h = static_cast<int>(CeilDiv(p.P, plan.region_h));
  a.regions_w = static_cast<int>(CeilDiv(p.Q, plan.region_w));
  const int64_t chunks = CeilDiv(p.C, sparse::TileChunkChannels(sizeof(T), R));
  a.chunks_per_split = static_cast<int>(CeilDiv(chunks, plan.splits));
  a.M = p.N * p.P * p.Q;
  const dim3 grid(static_cast<unsigned>(plan.grid_x), static_cast<unsigned>(plan.grid_y),
                  static_cast<unsigned>(plan.splits));
  const unsigned threads = 32u * static_cast<unsigned>(plan.warps);
  const int smem = static_cast<int>(plan.smem_bytes);
  auto run = [&](auto kernel, float* out_partials) {
    cudaError_t status =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (status != cudaSuccess) return status;
    kernel<<<grid, threads, smem, stream>>>(a, x, w, bias, y, out_partials);
    return cudaGetLastError();
  };
  if (plan.splits == 1) return run(sparse::sparse_tile_conv<T, R, TH, TW, KPL, false>, nullptr);
  cudaError_t status = run(sparse::sparse_tile_conv<T, R, TH, TW, KPL, true>, partials);
  if (status != cudaSuccess) return status;
  const int64_t elems = a.M * p.K;
  const int64_t blocks = std::min<int64_t>(CeilDiv(elems, 256), 1 << 16);
  sparse::finalize_split_partials<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      partials, plan.splits, elems, a.K, bias, a.activation, y);
  return cudaGetLastError();
}

template <typename T, int TW>
cudaError_t LaunchTileWidth(const SparseConvParams& p, const SparseConvPlan& plan, const T* x,
                            const T* w, const T* bias, T* y, float* partials,
                            cudaStream_t stream) {
  const int kpl = plan.k_per_lane;
  switch (p.R) {
    case 1:
      return kpl == 4 ? LaunchTileShape<T, 1, 2, TW, 4>(p, plan, x, w, bias, y, partials, stream)
                      : LaunchTileShape<T, 1, 4, TW, 2>(p, plan, x, w, bias, y, partials, stream);
    case 3:
      return kpl == 4 ? LaunchTileShape<T, 3, 2, TW, 4>(p, plan, x, w, bias, y, partials, stream)
                      : LaunchTileShape<T, 3, 4, TW, 2>(p, plan, x, w, bias, y, partials, stream);
    default:  // 5x5
      return LaunchTileShape<T, 5, 4, TW, 2>(p, plan, x, w, bias, y, partials, stream);
  }
}

template <typename T>
cudaError_t LaunchTile(const SparseConvParams& p, const SparseConvPlan& plan, const T* x,
                       const T* w, const T* bias, T* y, float* partials, cudaStream_t stream) {
  return plan.tile_w == 7 ? LaunchTileWidth<T, 7>(p, plan, x, w, bias, y, partials, stream)
                          : LaunchTileWidth<T, 8>(p, plan, x, w, bias, y, partials, stream);
}

}  // namespace

const char* sparse_conv_unsupported_reason(const SparseConvParams& p) {
  if (p.N < 1 || p.H < 1 || p.W < 1 || p.C < 1) return "x must have N, H, W, C >= 1";
  if (p.R < 1 || p.S < 1 || p.K < 1) return "w must have R, S, K >= 1";
  if (p.P < 1 || p.Q < 1) return "the conv output must be at least 1x1";
  if (p.stride_h < 1 || p.stride_w < 1) return "stride must be >= 1";
  if (p.dilation_h < 1 || p.dilation_w < 1) return "dilation must be >= 1";
  if (p.pad_h < 0 || p.pad_w < 0) return "padding must be >= 0";
  if (p.activation != 0 && p.activation != 1) return "activation must be 0 (none) or 1 (relu)";
  // Kernel indices are 32-bit within an image row/tensor dimension; offsets are 64-bit.
  if (p.N * p.H > kInt32Max || p.H + p.pad_h + p.R * p.dilation_h > kInt32Max ||
      p.W + p.pad_w + p.S * p.dilation_w > kInt32Max || p.R * p.S * p.C > kInt32Max ||
      p.K > kInt32Max)
    return "a dimension is too large for 32-bit indices";
  if (p.pooled()) {
    if (p.pool_h < 1 || p.pool_w < 1) return "pool window must be >= 1";
    if (p.pool_stride_h < 1 || p.pool_stride_w < 1) return "pool stride must be >= 1";
    if (p.pool_pad_h < 0 || p.pool_pad_w < 0) return "pool padding must be >= 0";
    if (p.PP < 1 || p.PQ < 1) return "the pooled output must be at least 1x1";
    if (p.pool_h * p.pool_w > 1024) return "pool window larger than 1024 entries";
  }
  return nullptr;
}

SparseConvPlan plan_sparse_conv(const SparseConvParams& p, int64_t scratch_bytes) {
  SparseConvPlan plan;
  plan.unsupported = sparse_conv_unsupported_reason(p);
  if (plan.unsupported != nullptr) return plan;
  int sm_count = 132, smem_optin = 227 * 1024;
  if (CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>(&sm_count) != cudaSuccess || sm_count < 1) sm_count = 132;
  // No device to ask: plan for the opt-in-free 48 KiB (the walk kernel then; nothing launches).
  if (CurrentDeviceAttribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(&smem_optin) != cudaSuccess)
    smem_optin = 48 * 1024;
  if (TileEligible(p) && PlanTile(p, sm_count, smem_optin, scratch_bytes, plan))
    return plan;
  // Widest channel block the layer fills (a lane's float4 of weights per nonzero), then
  // narrower blocks / fewer pixels per CTA until the grid covers the GPU.
  int kpt = p.K > 64 ? 4 : (p.K > 32 ? 2 : 1);
  const int64_t pixels = p.pooled() ? p.N * p.PP * p.PQ : p.N * p.P * p.Q;
  auto ctas = [&](int k_per_lane, int per_warp) {
    return CeilDiv(pixels, sparse::kWarps * per_warp) * CeilDiv(p.K, 32 * k_per_lane);
  };
  int per_warp;
  if (p.pooled()) {
    per_warp = PoolSlots(p);
    while (kpt > 1 && ctas(kpt, 1) < sm_count) kpt /= 2;
    plan.grid_x = CeilDiv(pixels, sparse::kWarps);
  } else {
    per_warp = ctas(kpt, 8) >= 2 * sm_count ? 8 : 4;
    while (kpt > 1 && ctas(kpt, per_warp) < sm_count) kpt /= 2;
    plan.grid_x = CeilDiv(pixels, sparse::kWarps * per_warp);
  }
  plan.k_per_lane = kpt;
  plan.pixels_per_warp = per_warp;
  plan.warps = sparse::kWarps;
  plan.scratch_bytes = sparse_conv_mask_bytes(p);
  if (scratch_bytes < plan.scratch_bytes) plan.unsupported = "scratch smaller than the nonzero masks";
  plan.grid_y = CeilDiv(p.K, 32 * kpt);
  const int64_t tap_bytes = 32 * 32 * kpt * static_cast<int64_t>(sizeof(float));
  plan.taps_per_stage = static_cast<int>(std::max<int64_t>(1, std::min(p.R * p.S, kStageBytes / tap_bytes)));
  plan.smem_bytes = plan.taps_per_stage * tap_bytes;
  if (plan.grid_x > kInt32Max || plan.grid_y > 65535) plan.unsupported = "grid too large";
  return plan;
}

template <typename T>
cudaError_t launch_sparse_conv(const SparseConvParams& p, const T* x, const T* w, const T* bias,
                               T* y, void* scratch, int64_t scratch_bytes, cudaStream_t stream) {
  // The plan (its staging sizes and scratch) is for p.elem_bytes: it must be T's.
  if (p.elem_bytes != static_cast<int64_t>(sizeof(T))) return cudaErrorInvalidValue;
  const SparseConvPlan plan = plan_sparse_conv(p, scratch_bytes);
  if (plan.unsupported != nullptr) return cudaErrorInvalidValue;
  if (plan.kernel == SparseKernel::kTile)
    return LaunchTile<T>(p, plan, x, w, bias, y, static_cast<float*>(scratch), stream);
  uint32_t* masks = static_cast<uint32_t*>(scratch);
  const int64_t entries = p.N * p.H * p.W * p.groups32();
  const int64_t encode_blocks =
      std::min<int64_t>(CeilDiv(entries, sparse::kWarps), 1 << 20);
  sparse::encode_nonzeros<T><<<static_cast<unsigned>(encode_blocks), sparse::kThreads, 0, stream>>>(
      x, masks, entries, static_cast<int>(p.C), static_cast<int>(p.groups32()));
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  const sparse::ConvArgs args = MakeArgs(p, plan.taps_per_stage);
  if (p.pooled()) return LaunchKpt<T, true>(plan, args, x, masks, w, bias, y, stream);
  return LaunchKpt<T, false>(plan, args, x, masks, w, bias, y, stream);
}

template cudaError_t launch_sparse_conv<float>(const SparseConvParams&, const float*,
                                               const float*, const float*, float*, void*, int64_t,
                                               cudaStream_t);
template cudaError_t launch_sparse_conv<__nv_bfloat16>(const SparseConvParams&,
                                                       const __nv_bfloat16*,
                                                       const __nv_bfloat16*,
                                                       const __nv_bfloat16*, __nv_bfloat16*,
                                                       void*, int64_t, cudaStream_t);
template cudaError_t launch_sparse_conv<__half>(const SparseConvParams&, const __half*,
                                                const __half*, const __half*, __half*,
                                                void*, int64_t, cudaStream_t);

}  // namespace jaxcnn
