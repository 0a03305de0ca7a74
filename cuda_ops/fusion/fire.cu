// Launcher for the fire module: validate, plan (three wgmma convs, the fused mma.sync kernel
// or the CUDA-core kernel; tile, channel split, which weights stay in shared memory), launch.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

#include "common/device_attribute.h"
#include "conv_pool/conv_pool_wgmma.h"
#include "conv_tc/conv2d_tensorcore.h"
#include "fusion/fire.h"
#include "fusion/fire_fused_wgmma.h"
#include "fusion/fire_kernels.cuh"
#include "fusion/fire_two_phase_kernel.cuh"

namespace jaxcnn {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int SqueezeK(int64_t S) { return static_cast<int>(CeilDiv(S, 16) * 16); }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// Shared-memory layout and work split of the tensor-core kernel for one choice of tile
// height, channel split and squeeze-weight residency (expand weights are always resident).
fire::TcArgs TcLayout(const FireParams& p, int tile_h, int split, bool sq_resident,
                      int sm_count, int ctas_per_sm) {
  using namespace fire;
  TcArgs a{};
  a.N = static_cast<int>(p.N), a.H = static_cast<int>(p.H), a.W = static_cast<int>(p.W);
  a.C = static_cast<int>(p.C), a.S = static_cast<int>(p.S);
  a.E1 = static_cast<int>(p.E1), a.E3 = static_cast<int>(p.E3);
  a.tile_h = tile_h;
  a.tiles_h = static_cast<int>(CeilDiv(p.H, tile_h));
  a.tiles_w = static_cast<int>(CeilDiv(p.W, kTileW));
  a.num_tiles = static_cast<int>(p.N * a.tiles_h * a.tiles_w);
  a.split = split;
  a.ctas_per_sm = ctas_per_sm;
  // One wave of persistent CTAs (ctas_per_sm per SM), each slice walked by 1 / split of them.
  a.walkers = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(a.num_tiles, int64_t{sm_count} * ctas_per_sm / split)));
  a.e1_slice = static_cast<int>(RoundUp(CeilDiv(p.E1, split), 8));
  a.e3_slice = static_cast<int>(RoundUp(CeilDiv(p.E3, split), 8));
  a.in_chunks = static_cast<int>(CeilDiv(p.C, kInChunk));
  const int sk = SqueezeK(p.S);
  a.sq_stride = PaddedStride(sk);
  a.ex_chunk = static_cast<int>(
      std::min<int64_t>(kMaxExpandChunk, RoundUp(std::max(a.e1_slice, a.e3_slice), 16)));
  a.ex_stride = PaddedStride(a.ex_chunk);
  a.e1_chunks = static_cast<int>(CeilDiv(a.e1_slice, a.ex_chunk));
  a.e3_chunks = static_cast<int>(CeilDiv(a.e3_slice, a.ex_chunk));
  a.sq_resident = sq_resident;
  a.x_buf_elems = HaloRows(tile_h) * PaddedStride(kInChunk);
  a.wsq_chunk_elems = kInChunk * a.sq_stride;
  a.wex_e1_elems = sk * a.ex_stride;
  a.wex_e3_elems = 9 * sk * a.ex_stride;
  int off = 0;
  a.off_x = off;
  off += 2 * a.x_buf_elems;
  a.off_wsq = off;
  off += (sq_resident ? a.in_chunks : 2) * a.wsq_chunk_elems;
  a.off_s = off;
  off += HaloRows(tile_h) * a.sq_stride;
  a.off_wex = off;
  off += a.e1_chunks * a.wex_e1_elems + a.e3_chunks * a.wex_e3_elems;
  a.off_stage = off;
  off += kWarps * kTileW * PaddedStride(kExpandBlock);
  a.off_bias = static_cast<int>(RoundUp(off, 8));
  return a;
}

int64_t TcSmemBytes(const fire::TcArgs& a) {
  // fp32 biases: two T elements each.
  return (int64_t{a.off_bias} + 2 * (int64_t{a.S} + a.E1 + a.E3)) * 2;
}

// Slices thinner than this (per expand conv) are not worth their squeeze recompute unless
// the weights need them to fit.
constexpr int kMinUsefulSlice = 32;

// Shared memory the SM keeps per resident CTA besides its dynamic allocation.
constexpr int kSmemReservedPerCta = 1024;

// The tensor-core kernel's layout for `p` with `ctas_per_sm` CTAs sharing each of `sm_count`
// SMs, each given at most `smem_limit` bytes of shared memory; false when nothing fits.
//  - tile height 8, or 4 when 8-row tiles leave SMs idle (small images, small batches);
//  - split: the smallest power of two whose slice weights fit in shared memory and that
//    gives every SM a (tile, slice), stopping at kMinUsefulSlice channels per slice;
//  - squeeze weights resident when they fit too.
bool ChooseTcLayoutFor(const FireParams& p, int sm_count, int ctas_per_sm, int64_t smem_limit,
                       fire::TcArgs* out) {
  const int64_t tiles8 = p.N * CeilDiv(p.H, 8) * CeilDiv(p.W, fire::kTileW);
  const int tile_h = tiles8 < sm_count ? 4 : 8;
  bool found = false;
  int64_t prev_e1 = -1, prev_e3 = -1;
  for (int split = 1; split <= 1024; split *= 2) {
    const int64_t e1 = RoundUp(CeilDiv(p.E1, split), 8), e3 = RoundUp(CeilDiv(p.E3, split), 8);
    if (e1 == prev_e1 && e3 == prev_e3) break;  // slices no longer shrink
    prev_e1 = e1, prev_e3 = e3;
    bool fits = false;
    for (bool sq_resident : {true, false}) {
      const fire::TcArgs a = TcLayout(p, tile_h, split, sq_resident, sm_count, ctas_per_sm);
      if (TcSmemBytes(a) <= smem_limit) {
        *out = a;
        fits = found = true;
        break;
      }
    }
    if (fits && (out->num_tiles * int64_t{split} >= int64_t{sm_count} * ctas_per_sm ||
                 std::max(e1, e3) <= kMinUsefulSlice))
      break;
  }
  return found;
}

// CTAs per SM forced by JAXCNN_FIRE_CTAS_PER_SM (1 or 2; benchmarks compare the two), else 0.
int ForcedCtasPerSm() {
  static const int forced = [] {
    const char* v = std::getenv("JAXCNN_FIRE_CTAS_PER_SM");
    return v != nullptr && (v[0] == '1' || v[0] == '2') && v[1] == '\0' ? v[0] - '0' : 0;
  }();
  return forced;
}

// The tensor-core kernel's configuration on this device; false when nothing fits. Two CTAs
// per SM (one-row expand items, 128 registers) hide latency that one CTA of 8 warps leaves
// exposed; they are taken when their layout needs no more expand-channel slices (squeeze
// recompute) than one CTA's.
bool ChooseTcLayout(const FireParams& p, const DeviceLimits& dev, fire::TcArgs* out) {
  fire::TcArgs one, two;
  const bool fits1 = ChooseTcLayoutFor(p, dev.sm_count, 1, dev.smem_optin, &one);
  const int64_t half = std::min<int64_t>(dev.smem_optin, dev.smem_per_sm / 2 - kSmemReservedPerCta);
  const bool fits2 = ChooseTcLayoutFor(p, dev.sm_count, 2, half, &two);
  const int forced = ForcedCtasPerSm();
  bool use2 = fits2 && (!fits1 || two.split <= one.split);
  if (forced != 0) use2 = forced == 2 ? fits2 : !fits1 && fits2;
  if (!use2 && !fits1) return false;
  *out = use2 ? two : one;
  return true;
}

// Why the tensor-core kernel cannot run these params/buffers, or nullptr.
template <typename T>
const char* TcUnsupportedReason(const FireParams& p, const FireBuffers<T>& b) {
  if constexpr (std::is_same_v<T, float>) {
    return "tensor-core fire kernel is bf16/fp16 only (float32 runs the CUDA-core kernel)";
  } else {
    if (p.C % 8 != 0 || p.S % 8 != 0 || p.E1 % 8 != 0 || p.E3 % 8 != 0)
      return "tensor-core fire kernel needs C, squeeze, expand1 and expand3 channels that are "
             "multiples of 8";
    if (p.S == 0 || p.S > 64)
      return "tensor-core fire kernel supports 8 to 64 squeeze channels";
    if (!Aligned16(b.x) || !Aligned16(b.y) || !Aligned16(b.w_sq) || !Aligned16(b.w_e1) ||
        !Aligned16(b.w_e3))
      return "tensor-core fire kernel needs 16-byte aligned x, y and weights";
    return nullptr;
  }
}

// kAuto takes the three wgmma convs from this many output pixels on (or for any S > 32,
// where the fused kernel splits the expand channels and recomputes the squeeze per slice):
// below it the fused kernel's single launch wins. H200 measurements: scripts/bench_fusion.py.
constexpr int64_t kWgmmaMinPixels = 8192;
// ... except up to this many squeeze channels when the fused kernel runs two CTAs per SM
// with no channel split: its s tile never leaves the SM and the expands' K (9 S) is too short
// for the wgmma convs' pipelines (fire_selftest prints both kernels' times).
constexpr int64_t kFusedMaxSqueezeAtScale = 16;
// kAuto takes the two-phase kernel up to this many output pixels (N * H * W) when each of its
// phases runs in one pass (no more items than resident CTAs): there the single-pass fused
// kernel has too few tiles to spread its per-tile loads (each CTA streams the halo's whole C
// and the squeeze weights) and the wgmma convs pay three launches; a second pass costs about
// a launch, so larger images go back to the fused kernel (bench_fusion's two_phase column).
constexpr int64_t kTwoPhaseMaxPixels = 1024;
constexpr size_t kWorkspaceAlign = 256;

// The kWgmma path's convs: squeeze into the packed workspace, then each expand into its
// channel slice of y (pixels E1 + E3 elements apart).
struct WgmmaConvs {
  Conv2dParams squeeze, expand1, expand3;
};

WgmmaConvs MakeWgmmaConvs(const FireParams& p) {
  auto conv = [&p](int64_t c_in, int64_t k, int window, int64_t y_pixel_stride) {
    Conv2dParams c{};
    c.N = p.N, c.H = p.H, c.W = p.W, c.C = c_in;
    c.R = c.S = window, c.K = k, c.P = p.H, c.Q = p.W;
    c.stride_h = c.stride_w = 1;
    c.pad_h = c.pad_w = window / 2;
    c.dil_h = c.dil_w = 1;
    c.groups = 1;
    c.epilogue.act = Activation::kRelu;
    c.layout = TensorLayout::kNHWC;
    c.precision = MathPrecision::kDefault;  // unused: 16-bit types only
    c.y_pixel_stride = y_pixel_stride;
    return c;
  };
  const int64_t y_channels = p.E1 + p.E3;
  return {conv(p.C, p.S, 1, 0), conv(p.S, p.E1, 1, y_channels), conv(p.S, p.E3, 3, y_channels)};
}

int64_t WgmmaWorkspaceBytes(const FireParams& p, size_t element_bytes) {
  const int64_t s_bytes = p.N * p.H * p.W * p.S * static_cast<int64_t>(element_bytes);
  return CeilDiv(s_bytes, kWorkspaceAlign) * kWorkspaceAlign;
}

// For A/B measurements: JAXCNN_FIRE_WGMMA set to anything turns the one-launch kernel off
// (=two_launch: the CUTLASS squeeze + merged expand); =conv_tc runs the kWgmma path's three
// convs on the CUTLASS kernels (the path before the merged expand); =squeeze_wgmma runs the
// squeeze on the wgmma conv kernel as a 1x1-only layer instead of the CUTLASS conv.
std::string FireWgmmaOverride() {
  static const std::string value = [] {
    const char* v = std::getenv("JAXCNN_FIRE_WGMMA");
    return std::string(v == nullptr ? "" : v);
  }();
  return value;
}

// The whole module as one launch (fire_fused_wgmma.h: s never leaves shared memory), or why not,
// on `device` (nullptr: the current one). JAXCNN_FIRE_WGMMA=two_launch (or any other override)
// keeps the squeeze + merged expand path.
template <typename T>
const char* FusedUnsupportedReason(const FireParams& p, const FireBuffers<T>& b,
                                   const DeviceLimits* device = nullptr) {
  if constexpr (std::is_same_v<T, float>) {
    return "float32";
  } else {
    if (!FireWgmmaOverride().empty()) return "JAXCNN_FIRE_WGMMA is set";
    return fire_fused_wgmma::UnsupportedReason(p, sizeof(T), false, b.x, b.w_sq, b.w_e1,
                                               b.w_e3, b.y, device);
  }
}

// Both expands as one wgmma launch (nullptr), or why not, on `device` (nullptr: the current one).
template <typename T>
const char* MergedExpandUnsupportedReason(const FireParams& p, const FireBuffers<T>& b,
                                          const DeviceLimits* device = nullptr) {
  if constexpr (std::is_same_v<T, float>) {
    return "float32";
  } else {
    if (FireWgmmaOverride() == "conv_tc") return "JAXCNN_FIRE_WGMMA=conv_tc";
    return conv_pool_wgmma::FireExpandUnsupportedReason(
        {p.N, p.H, p.W, p.S, p.E1, p.E3}, sizeof(T), false, b.workspace, b.w_e1, b.w_e3, b.y,
        device);
  }
}

// The squeeze as a 1x1-only launch of the wgmma conv kernel (nullptr), or why not, on `device`
// (nullptr: the current one). Only on request: against the CUTLASS 1x1 conv it measured no
// faster on SqueezeNet's fires (bench_fusion reports).
template <typename T>
const char* WgmmaSqueezeUnsupportedReason(const FireParams& p, const FireBuffers<T>& b,
                                          const DeviceLimits* device = nullptr) {
  if constexpr (std::is_same_v<T, float>) {
    return "float32";
  } else {
    if (FireWgmmaOverride() != "squeeze_wgmma") return "the CUTLASS squeeze measured faster";
    return conv_pool_wgmma::FireExpandUnsupportedReason({p.N, p.H, p.W, p.C, p.S, 0}, sizeof(T),
                                                        false, b.x, b.w_sq, nullptr,
                                                        b.workspace, device);
  }
}

// Why the kWgmma path cannot run these params/buffers (workspace aside), or nullptr.
template <typename T>
const char* WgmmaUnsupportedReason(const FireParams& p, const FireBuffers<T>& b) {
  if constexpr (std::is_same_v<T, float>) {
    return "the wgmma fire path is bf16/fp16 only (float32 runs the CUDA-core kernel)";
  } else {
    if (p.C % 8 != 0 || p.S % 8 != 0 || p.E1 % 8 != 0 || p.E3 % 8 != 0)
      return "the wgmma fire path needs C, squeeze, expand1 and expand3 channels that are "
             "multiples of 8 (16-byte TMA rows)";
    if (p.S == 0) return "the wgmma fire path needs squeeze channels";
    if (!Aligned16(b.x) || !Aligned16(b.y) || !Aligned16(b.w_sq) || !Aligned16(b.w_e1) ||
        !Aligned16(b.w_e3))
      return "the wgmma fire path needs 16-byte aligned x, y and weights";
    const WgmmaConvs convs = MakeWgmmaConvs(p);
    constexpr TcDType dtype = TcDTypeOf<T>::value;
    // 16-bit convs with 16-byte channel rows need no scratch of their own (a launch that did
    // would fail with cudaErrorInvalidValue); not asked here: it sizes every config's CUTLASS
    // arguments, host work on each call's path.
    for (const Conv2dParams* c : {&convs.squeeze, &convs.expand1, &convs.expand3})
      if (const char* reason = conv2d_tensorcore_unsupported_reason(*c, dtype)) return reason;
    return nullptr;
  }
}

// The two-phase kernel's placement: CTAs launched, CTAs per SM (1 or 2: every CTA must be
// resident for the grid barrier) and its shared memory.
struct TwoPhaseLaunch {
  int64_t grid = 0;
  int ctas_per_sm = 0;  // 0: does not fit
  int64_t smem_bytes = 0;
  int64_t capacity = 0;  // CTAs resident at once: more items than this take several passes
};

// m16 pixel tiles per squeeze item of the two-phase kernel: short reductions (C <= 64, at
// most 4 k-steps) share the warps between two m tiles.
int TwoPhaseSqueezeMTiles(const FireParams& p) { return RoundUp(p.C, 16) <= 64 ? 2 : 1; }

// Work items of the two-phase kernel's squeeze and expand phases (int64: checked against
// int32 before TwoPhaseLayout narrows them).
int64_t TwoPhaseSqueezeItems(const FireParams& p) {
  return CeilDiv(p.N * p.H * p.W, 16 * TwoPhaseSqueezeMTiles(p)) *
         (SqueezeK(p.S) / fire::kTwoPhaseSqBlock);
}
int64_t TwoPhaseExpandItems(const FireParams& p) {
  return (CeilDiv(p.E1, fire::kTwoPhaseBlock) + CeilDiv(p.E3, fire::kTwoPhaseBlock)) * p.N *
         CeilDiv(p.H, fire::kTwoPhaseTileH) * CeilDiv(p.W, fire::kTileW);
}

// The two-phase kernel's work split and shared-memory layout (fire_two_phase_kernel.cuh).
fire::TwoPhaseArgs TwoPhaseLayout(const FireParams& p, const DeviceLimits& dev,
                                  TwoPhaseLaunch* launch) {
  using namespace fire;
  TwoPhaseArgs a{};
  a.N = static_cast<int>(p.N), a.H = static_cast<int>(p.H), a.W = static_cast<int>(p.W);
  a.C = static_cast<int>(p.C), a.S = static_cast<int>(p.S);
  a.E1 = static_cast<int>(p.E1), a.E3 = static_cast<int>(p.E3);
  const int sk = SqueezeK(p.S);
  const int64_t c16 = RoundUp(p.C, 16);
  a.pixels = static_cast<int>(p.N * p.H * p.W);
  a.sq_mtiles = TwoPhaseSqueezeMTiles(p);
  a.sq_ksplit = kWarps / a.sq_mtiles;
  a.sq_items = static_cast<int>(TwoPhaseSqueezeItems(p));
  a.k_chunk = static_cast<int>(std::min<int64_t>(c16, kTwoPhaseMaxKChunk));
  a.k_chunks = static_cast<int>(CeilDiv(p.C, a.k_chunk));
  a.tiles_h = static_cast<int>(CeilDiv(p.H, kTwoPhaseTileH));
  a.tiles_w = static_cast<int>(CeilDiv(p.W, kTileW));
  a.num_tiles = static_cast<int>(p.N * a.tiles_h * a.tiles_w);
  a.e1_blocks = static_cast<int>(CeilDiv(p.E1, kTwoPhaseBlock));
  a.e3_blocks = static_cast<int>(CeilDiv(p.E3, kTwoPhaseBlock));
  a.ex_items = static_cast<int>(TwoPhaseExpandItems(p));
  int off = 0;
  a.off_x = off;
  off += 16 * a.sq_mtiles * PaddedStride(a.k_chunk);
  a.off_wsq = off;
  off += a.k_chunk * TwoPhaseWsqStride();
  a.off_red = static_cast<int>(RoundUp(off, 8));  // 16 bytes
  off = a.off_red + kWarps * 256 * 2;              // fp32 [warp][16][16]: two T each
  a.off_s = off;
  off += HaloPixels(kTwoPhaseTileH) * PaddedStride(sk);
  a.off_wex = off;
  off += 9 * sk * TwoPhaseWexStride();
  launch->smem_bytes = int64_t{off} * 2;
  // Two CTAs per SM where their shared memory fits (the registers do: __launch_bounds__).
  launch->ctas_per_sm =
      launch->smem_bytes > dev.smem_optin ? 0
      : 2 * (launch->smem_bytes + kSmemReservedPerCta) <= dev.smem_per_sm ? 2 : 1;
  launch->capacity = int64_t{dev.sm_count} * launch->ctas_per_sm;
  launch->grid = std::max<int64_t>(
      1, std::min<int64_t>(launch->capacity, std::max(a.sq_items, a.ex_items)));
  return a;
}

// Why the two-phase kernel cannot run these params/buffers on `dev` with its planned
// `launch` (workspace aside), or nullptr.
template <typename T>
const char* TwoPhaseUnsupportedReason(const FireParams& p, const FireBuffers<T>& b,
                                      cudaError_t dev_status, const DeviceLimits& dev,
                                      const TwoPhaseLaunch& launch) {
  if constexpr (std::is_same_v<T, float>) {
    return "the two-phase fire kernel is bf16/fp16 only (float32 runs the CUDA-core kernel)";
  } else {
    if (p.C % 8 != 0 || p.S % 8 != 0 || p.E1 % 8 != 0 || p.E3 % 8 != 0)
      return "the two-phase fire kernel needs C, squeeze, expand1 and expand3 channels that are "
             "multiples of 8";
    if (p.S == 0 || p.S > 64) return "the two-phase fire kernel supports 8 to 64 squeeze channels";
    if (p.N * p.H * p.W > kInt32Max / 64 || TwoPhaseExpandItems(p) > kInt32Max)
      return "too many pixels or work items for the two-phase fire kernel's int32 indices";
    if (!Aligned16(b.x) || !Aligned16(b.y) || !Aligned16(b.w_sq) || !Aligned16(b.w_e1) ||
        !Aligned16(b.w_e3))
      return "the two-phase fire kernel needs 16-byte aligned x, y and weights";
    if (dev_status != cudaSuccess) return "cannot query the current CUDA device";
    if (dev.major < 8) return "the two-phase fire kernel needs sm_80 or newer (mma.sync bf16/fp16)";
    if (dev.cooperative == 0)
      return "the two-phase fire kernel needs cooperative launch (grid barrier) support";
    if (launch.ctas_per_sm == 0)
      return "the two-phase fire kernel's shared memory exceeds this GPU's per-block limit";
    return nullptr;
  }
}

bool HasWorkspace(const void* workspace, size_t bytes, int64_t need) {
  if (need == 0) return true;
  return workspace != nullptr && bytes >= static_cast<size_t>(need) &&
         reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlign == 0;
}

}  // namespace

const char* fire_unsupported_reason(const FireParams& p) {
  if (p.N < 0 || p.H < 0 || p.W < 0 || p.C < 0 || p.S < 0 || p.E1 < 0 || p.E3 < 0)
    return "negative dimension";
  if (p.N > kInt32Max || p.H > kInt32Max || p.W > kInt32Max || p.C > kInt32Max ||
      p.S > kInt32Max || p.E1 > kInt32Max || p.E3 > kInt32Max)
    return "a dimension exceeds int32";
  if (p.S > 0 && (p.C == 0)) return "input channels must be >= 1";
  // Tile indices are int32 in the kernels.
  if (p.N * CeilDiv(p.H, fire::kFmaTile) * CeilDiv(p.W, fire::kFmaTile) > kInt32Max)
    return "too many output tiles for int32 indices";
  // The CUDA-core kernel keeps the 10x10 squeeze tile in fp32 shared memory.
  if (p.S * fire::kFmaHalo * fire::kFmaHalo * 4 > 200 * 1024)
    return "squeeze channels too many for the CUDA-core kernel's shared-memory tile (> 512)";
  return nullptr;
}

namespace {

// plan_fire and plan_fire_for_device: `dev` (whose query returned `dev_status`) is the device
// planned for; `described` is it when it was described rather than queried (the wgmma
// kernels' checks then skip this process's device and driver), else nullptr.
template <typename T>
FirePlan PlanFire(const FireParams& p, const FireBuffers<T>& b, FireAlgorithm algorithm,
                  cudaError_t dev_status, const DeviceLimits& dev,
                  const DeviceLimits* described) {
  FirePlan plan;
  if (const char* reason = fire_unsupported_reason(p)) {
    plan.unsupported = reason;
    return plan;
  }
  if (algorithm == FireAlgorithm::kFma) {
    plan.kernel = FireAlgorithm::kFma;
    plan.why = "requested";
    return plan;
  }
  // The fused kernel's layout, worked out once: auto's choice at scale and the tensor-core
  // plan both read it.
  const char* tc_reason = TcUnsupportedReason(p, b);
  if (tc_reason == nullptr) {
    if (dev_status != cudaSuccess) {
      tc_reason = "cannot query the current CUDA device";
    } else if (dev.major < 8) {
      tc_reason = "tensor-core fire kernel needs sm_80 or newer (mma.sync bf16/fp16)";
    }
  }
  fire::TcArgs tc{};
  if (tc_reason == nullptr && !ChooseTcLayout(p, dev, &tc))
    tc_reason = "tensor-core fire kernel's tiles do not fit in this GPU's shared memory";

  if (algorithm == FireAlgorithm::kTwoPhase || algorithm == FireAlgorithm::kAuto) {
    TwoPhaseLaunch launch;
    const fire::TwoPhaseArgs a = TwoPhaseLayout(p, dev, &launch);
    const char* reason = TwoPhaseUnsupportedReason(p, b, dev_status, dev, launch);
    const int64_t need = WgmmaWorkspaceBytes(p, sizeof(T));  // s, packed [N*H*W][S]
    const bool one_pass = std::max(a.sq_items, a.ex_items) <= launch.capacity;
    const bool wanted = algorithm == FireAlgorithm::kTwoPhase ||
                        (p.N * p.H * p.W <= kTwoPhaseMaxPixels && one_pass &&
                         HasWorkspace(b.workspace, b.workspace_bytes, need));
    if (wanted && (reason == nullptr || algorithm == FireAlgorithm::kTwoPhase)) {
      plan.unsupported = reason;
      plan.kernel = FireAlgorithm::kTwoPhase;
      plan.why = algorithm == FireAlgorithm::kTwoPhase
                     ? "requested"
                     : "small problem (the single-pass kernel has too few tiles)";
      plan.workspace_bytes = need;
      if (reason == nullptr) {
        plan.grid = launch.grid;
        plan.ctas_per_sm = launch.ctas_per_sm;
        plan.smem_bytes = launch.smem_bytes;
        plan.tile_h = fire::kTwoPhaseTileH;
        plan.tile_w = fire::kTileW;
        plan.expand_chunk = fire::kTwoPhaseBlock;
        plan.squeeze_items = a.sq_items;
        plan.expand_items = a.ex_items;
      }
      return plan;
    }
  }
  if (algorithm == FireAlgorithm::kWgmma || algorithm == FireAlgorithm::kAuto) {
    const char* wg_reason = WgmmaUnsupportedReason(p, b);
    if (wg_reason == nullptr) {
      if (dev_status != cudaSuccess)
        wg_reason = "cannot query the current CUDA device";
      else if (dev.major != 9)
        wg_reason = "the wgmma fire path needs a compute capability 9.0 (Hopper) GPU";
    }
    // One launch needs no workspace: s stays in shared memory.
    const int launches = FusedUnsupportedReason(p, b, described) == nullptr           ? 1
                         : MergedExpandUnsupportedReason(p, b, described) == nullptr ? 2
                                                                                      : 3;
    const int64_t need = launches == 1 ? 0 : WgmmaWorkspaceBytes(p, sizeof(T));
    plan.wgmma_squeeze = WgmmaSqueezeUnsupportedReason(p, b, described) == nullptr;
    if (algorithm == FireAlgorithm::kWgmma) {
      plan.unsupported = wg_reason;
      plan.kernel = FireAlgorithm::kWgmma;
      plan.why = "requested";
      plan.workspace_bytes = need;
      plan.wgmma_launches = launches;
      return plan;
    }
    const bool fused_at_scale = tc_reason == nullptr && p.S <= kFusedMaxSqueezeAtScale &&
                                tc.ctas_per_sm == 2 && tc.split == 1;
    const bool pays =
        (p.N * p.H * p.W >= kWgmmaMinPixels && !fused_at_scale) || p.S > 32;
    if (wg_reason == nullptr && pays && HasWorkspace(b.workspace, b.workspace_bytes, need)) {
      plan.kernel = FireAlgorithm::kWgmma;
      plan.why = p.S > 32 ? "more than 32 squeeze channels (the fused kernel would split)"
                          : "large problem (the fused kernel's mma.sync loses to wgmma)";
      plan.workspace_bytes = need;
      plan.wgmma_launches = launches;
      return plan;
    }
  }
  if (tc_reason == nullptr) {
    plan.kernel = FireAlgorithm::kTensorCore;
    plan.why = "bf16/fp16 with channel counts multiple of 8";
    plan.smem_bytes = TcSmemBytes(tc);
    plan.squeeze_weights_resident = tc.sq_resident;
    plan.expand_weights_resident = true;
    plan.expand_chunk = tc.ex_chunk;
    plan.tile_h = tc.tile_h;
    plan.tile_w = fire::kTileW;
    plan.split = tc.split;
    plan.ctas_per_sm = tc.ctas_per_sm;
    plan.grid = static_cast<int64_t>(tc.walkers) * tc.split;
    return plan;
  }
  if (algorithm == FireAlgorithm::kTensorCore) {
    plan.unsupported = tc_reason;
    return plan;
  }
  plan.kernel = FireAlgorithm::kFma;
  plan.why = tc_reason;
  return plan;
}

}  // namespace

template <typename T>
FirePlan plan_fire(const FireParams& p, const FireBuffers<T>& b, FireAlgorithm algorithm) {
  DeviceLimits dev;
  const cudaError_t dev_status = CurrentDeviceLimits(&dev);
  return PlanFire(p, b, algorithm, dev_status, dev, nullptr);
}

template <typename T>
FirePlan plan_fire_for_device(const FireParams& p, const FireBuffers<T>& b,
                              FireAlgorithm algorithm, const DeviceLimits& device) {
  return PlanFire(p, b, algorithm, cudaSuccess, device, &device);
}

namespace {

template <typename T, int SK, int TH, int kBlocks>
cudaError_t LaunchTc(const FireParams& p, const FireBuffers<T>& b, const FirePlan& plan,
                     cudaStream_t stream) {
  DeviceLimits dev;
  cudaError_t status = CurrentDeviceLimits(&dev);
  if (status != cudaSuccess) return status;
  fire::TcArgs a;
  if (!ChooseTcLayout(p, dev, &a) || a.ctas_per_sm != kBlocks) return cudaErrorInvalidValue;
  auto kernel = fire::fire_tc_kernel<T, SK, TH, kBlocks>;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(plan.smem_bytes));
  if (status != cudaSuccess) return status;
  kernel<<<static_cast<unsigned>(plan.grid), fire::kThreads, plan.smem_bytes, stream>>>(
      a, b.x, b.w_sq, b.b_sq, b.w_e1, b.b_e1, b.w_e3, b.b_e3, b.y);
  return cudaGetLastError();
}

// The kernel instance for the squeeze width (K padded to 16), the tile height and the CTAs
// per SM.
template <typename T, int SK>
cudaError_t LaunchTcTile(const FireParams& p, const FireBuffers<T>& b, const FirePlan& plan,
                         cudaStream_t stream) {
  if (plan.ctas_per_sm == 2)
    return plan.tile_h == 4 ? LaunchTc<T, SK, 4, 2>(p, b, plan, stream)
                            : LaunchTc<T, SK, 8, 2>(p, b, plan, stream);
  return plan.tile_h == 4 ? LaunchTc<T, SK, 4, 1>(p, b, plan, stream)
                          : LaunchTc<T, SK, 8, 1>(p, b, plan, stream);
}

template <typename T>
cudaError_t LaunchWgmma(const FireParams& p, const FireBuffers<T>& b, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, float>) {
    if (FusedUnsupportedReason(p, b) == nullptr) return fire_fused_wgmma::Launch<T>(p, b, stream);
  }
  const WgmmaConvs convs = MakeWgmmaConvs(p);
  T* s = static_cast<T*>(b.workspace);
  cudaError_t status = cudaErrorInvalidValue;
  if constexpr (!std::is_same_v<T, float>) {
    if (WgmmaSqueezeUnsupportedReason(p, b) == nullptr)
      status = conv_pool_wgmma::LaunchFireExpand<T>({p.N, p.H, p.W, p.C, p.S, 0},
                                                    {b.x, b.w_sq, b.b_sq, nullptr, nullptr, s},
                                                    stream);
    else
      status = launch_conv2d_tensorcore<T>(b.x, b.w_sq, b.b_sq, s, convs.squeeze, nullptr, 0,
                                           stream);
  }
  if (status != cudaSuccess) return status;
  if constexpr (!std::is_same_v<T, float>) {
    if (MergedExpandUnsupportedReason(p, b) == nullptr)
      return conv_pool_wgmma::LaunchFireExpand<T>({p.N, p.H, p.W, p.S, p.E1, p.E3},
                                                  {s, b.w_e1, b.b_e1, b.w_e3, b.b_e3, b.y},
                                                  stream);
  }
  // An empty expand1 (conv1x1_conv3x3) is a no-op launch.
  status = launch_conv2d_tensorcore<T>(s, b.w_e1, b.b_e1, b.y, convs.expand1, nullptr, 0, stream);
  if (status != cudaSuccess) return status;
  return launch_conv2d_tensorcore<T>(s, b.w_e3, b.b_e3, b.y + p.E1, convs.expand3, nullptr, 0,
                                     stream);
}

// One cooperative launch (the grid barrier needs every CTA resident; the runtime refuses a
// grid that cannot be).
template <typename T, int SK>
cudaError_t LaunchTwoPhase(const FireParams& p, const FireBuffers<T>& b, cudaStream_t stream) {
  DeviceLimits dev;
  cudaError_t status = CurrentDeviceLimits(&dev);
  if (status != cudaSuccess) return status;
  TwoPhaseLaunch launch;
  const fire::TwoPhaseArgs a = TwoPhaseLayout(p, dev, &launch);
  if (launch.ctas_per_sm == 0) return cudaErrorInvalidValue;
  auto kernel = fire::fire_two_phase_kernel<T, SK>;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(launch.smem_bytes));
  if (status != cudaSuccess) return status;
  // The largest shared-memory carveout, so that two CTAs per SM are resident as planned.
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                cudaSharedmemCarveoutMaxShared);
  if (status != cudaSuccess) return status;
  cudaLaunchAttribute cooperative{};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(launch.grid));
  config.blockDim = dim3(fire::kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(launch.smem_bytes);
  config.stream = stream;
  config.attrs = &cooperative;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, a, b.x, b.w_sq, b.b_sq, b.w_e1, b.b_e1, b.w_e3,
                            b.b_e3, b.y, static_cast<T*>(b.workspace));
}

template <typename T>
cudaError_t LaunchFma(const FireParams& p, const FireBuffers<T>& b, cudaStream_t stream) {
  fire::FmaArgs a{};
  a.N = static_cast<int>(p.N), a.H = static_cast<int>(p.H), a.W = static_cast<int>(p.W);
  a.C = static_cast<int>(p.C), a.S = static_cast<int>(p.S);
  a.E1 = static_cast<int>(p.E1), a.E3 = static_cast<int>(p.E3);
  a.tiles_h = static_cast<int>(CeilDiv(p.H, fire::kFmaTile));
  a.tiles_w = static_cast<int>(CeilDiv(p.W, fire::kFmaTile));
  const int64_t blocks = p.N * a.tiles_h * a.tiles_w;
  const size_t smem = static_cast<size_t>(p.S) * fire::kFmaHalo * fire::kFmaHalo * sizeof(float);
  auto kernel = fire::fire_fma_kernel<T>;
  if (smem > 48 * 1024) {
    const cudaError_t status = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (status != cudaSuccess) return status;
  }
  kernel<<<static_cast<unsigned>(blocks), fire::kThreads, smem, stream>>>(
      a, b.x, b.w_sq, b.b_sq, b.w_e1, b.b_e1, b.w_e3, b.b_e3, b.y);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t launch_fire(const FireParams& p, const FireBuffers<T>& b, FireAlgorithm algorithm,
                        cudaStream_t stream) {
  if (fire_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  // Nothing to write. (S == 0 with outputs: y = relu(bias), still launched.)
  if (p.N == 0 || p.H == 0 || p.W == 0 || p.E1 + p.E3 == 0) return cudaSuccess;
  const FirePlan plan = plan_fire(p, b, algorithm);
  if (plan.unsupported != nullptr) return cudaErrorInvalidValue;
  if (plan.kernel == FireAlgorithm::kFma) return LaunchFma(p, b, stream);
  if (plan.kernel == FireAlgorithm::kWgmma || plan.kernel == FireAlgorithm::kTwoPhase) {
    if (!HasWorkspace(b.workspace, b.workspace_bytes, plan.workspace_bytes))
      return cudaErrorInvalidValue;
    if (plan.kernel == FireAlgorithm::kWgmma) return LaunchWgmma(p, b, stream);
  }
  if constexpr (std::is_same_v<T, float>) {
    return cudaErrorInvalidValue;  // plan_fire never picks tensor cores for fp32
  } else {
    if (plan.kernel == FireAlgorithm::kTwoPhase) {
      switch (SqueezeK(p.S)) {
        case 16: return LaunchTwoPhase<T, 16>(p, b, stream);
        case 32: return LaunchTwoPhase<T, 32>(p, b, stream);
        case 48: return LaunchTwoPhase<T, 48>(p, b, stream);
        case 64: return LaunchTwoPhase<T, 64>(p, b, stream);
        default: return cudaErrorInvalidValue;  // plan_fire checked 8 <= S <= 64
      }
    }
    switch (SqueezeK(p.S)) {
      case 16: return LaunchTcTile<T, 16>(p, b, plan, stream);
      case 32: return LaunchTcTile<T, 32>(p, b, plan, stream);
      case 48: return LaunchTcTile<T, 48>(p, b, plan, stream);
      case 64: return LaunchTcTile<T, 64>(p, b, plan, stream);
      default: return LaunchFma(p, b, stream);  // S == 0: no squeeze channels
    }
  }
}

template FirePlan plan_fire<float>(const FireParams&, const FireBuffers<float>&, FireAlgorithm);
template FirePlan plan_fire<__nv_bfloat16>(const FireParams&, const FireBuffers<__nv_bfloat16>&,
                                           FireAlgorithm);
template FirePlan plan_fire<__half>(const FireParams&, const FireBuffers<__half>&, FireAlgorithm);
template FirePlan plan_fire_for_device<float>(const FireParams&, const FireBuffers<float>&,
                                              FireAlgorithm, const DeviceLimits&);
template FirePlan plan_fire_for_device<__nv_bfloat16>(const FireParams&,
                                                      const FireBuffers<__nv_bfloat16>&,
                                                      FireAlgorithm, const DeviceLimits&);
template FirePlan plan_fire_for_device<__half>(const FireParams&, const FireBuffers<__half>&,
                                               FireAlgorithm, const DeviceLimits&);
template cudaError_t launch_fire<float>(const FireParams&, const FireBuffers<float>&,
                                        FireAlgorithm, cudaStream_t);
template cudaError_t launch_fire<__nv_bfloat16>(const FireParams&,
                                                const FireBuffers<__nv_bfloat16>&, FireAlgorithm,
                                                cudaStream_t);
template cudaError_t launch_fire<__half>(const FireParams&, const FireBuffers<__half>&,
                                         FireAlgorithm, cudaStream_t);

}  // namespace jaxcnn
