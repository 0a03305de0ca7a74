// Launcher for the fused conv + bias + ReLU + max-pool: validate, plan (tensor cores or CUDA
// cores; conv block shape and channel block), launch.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "common/device_attribute.h"
#include "common/tensor_map.h"
#include "conv_pool/conv_pool.h"
#include "conv_pool/conv_pool_kernels.cuh"
#include "conv_pool/conv_pool_stem_kernel.cuh"
#include "conv_pool/conv_pool_wgmma.h"

namespace jaxcnn {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Conv block widths the tensor-core kernel is instantiated for (height = 128 / width).
constexpr int kTileWidths[] = {16, 8, 32};

struct BlockChoice {
  int tile_w = 0, tile_h = 0, pooled_h = 0, pooled_w = 0;
  int64_t tiles_h = 0, tiles_w = 0;
};

// The block shape computing the fewest conv outputs per image (whole pool windows per block;
// ties keep the earlier width, 16 first: one m16 MMA row per block row). tile_w == 0: none fits.
BlockChoice ChooseBlock(const ConvPoolParams& p) {
  BlockChoice best;
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  for (int tw : kTileWidths) {
    const int tile_h = conv_pool::kTileM / tw;
    if (p.pool_h > tile_h || p.pool_w > tw) continue;
    BlockChoice c;
    c.tile_w = tw, c.tile_h = tile_h;
    c.pooled_h = (tile_h - p.pool_h) / p.pool_stride_h + 1;
    c.pooled_w = (tw - p.pool_w) / p.pool_stride_w + 1;
    c.tiles_h = CeilDiv(p.PH, c.pooled_h);
    c.tiles_w = CeilDiv(p.PW, c.pooled_w);
    const int64_t cost = c.tiles_h * c.tiles_w;
    if (cost < best_cost) best = c, best_cost = cost;
  }
  return best;
}

// Output channels per CTA: the block (64 or 128) wasting the fewest padded channels, 128 on
// ties (half the input-tile re-reads).
int ChooseBlockK(int64_t K) {
  return CeilDiv(K, 128) * 128 <= CeilDiv(K, 64) * 64 ? 128 : 64;
}

// The layer fields every kernel's args share (TcArgs, StemArgs, DirectArgs: same names).
template <typename Args>
void FillLayerArgs(const ConvPoolParams& p, Args& a) {
  a.H = static_cast<int>(p.H), a.W = static_cast<int>(p.W), a.C = static_cast<int>(p.C);
  a.K = static_cast<int>(p.K), a.S = static_cast<int>(p.S);
  a.stride_h = p.stride_h, a.stride_w = p.stride_w, a.pad_top = p.pad_top,
  a.pad_left = p.pad_left, a.dilation_h = p.dilation_h, a.dilation_w = p.dilation_w;
  a.P = static_cast<int>(p.P), a.Q = static_cast<int>(p.Q);
  a.pool_h = p.pool_h, a.pool_w = p.pool_w, a.pool_stride_h = p.pool_stride_h,
  a.pool_stride_w = p.pool_stride_w, a.pool_pad_top = p.pool_pad_top,
  a.pool_pad_left = p.pool_pad_left;
  a.PH = static_cast<int>(p.PH), a.PW = static_cast<int>(p.PW);
}

conv_pool::TcArgs MakeTcArgs(const ConvPoolParams& p, const BlockChoice& b, int block_k,
                             bool flat_k) {
  conv_pool::TcArgs a{};
  FillLayerArgs(p, a);
  a.pooled_h = b.pooled_h, a.pooled_w = b.pooled_w;
  a.tiles_h = static_cast<int>(b.tiles_h), a.tiles_w = static_cast<int>(b.tiles_w);
  a.k_blocks = static_cast<int>(CeilDiv(p.K, block_k));
  a.c_chunks = static_cast<int>(CeilDiv(p.C, conv_pool::kBlockC));
  a.taps = static_cast<int>(p.R * p.S);
  a.steps = flat_k ? static_cast<int>(CeilDiv(p.R * p.S * p.C, conv_pool::kBlockC))
                   : a.taps * a.c_chunks;
  return a;
}

// ---- stem kernel

constexpr int64_t kStemMaxRsc = 512;              // GEMM-K (R*S*C) the stem kernel takes
constexpr int64_t kStemSmemTwoCtas = 113 * 1024;  // two CTAs per SM fit Hopper's 228 KB
constexpr int64_t kTmaMaxBox = 256;               // TMA box extent limit per dimension

template <typename T>
int64_t StemSmem(int block_k, int64_t kf_pad, int64_t in_buf_elems) {
  return block_k == 128 ? conv_pool::StemSmemBytes<T, 2>(kf_pad, in_buf_elems)
                        : conv_pool::StemSmemBytes<T, 1>(kf_pad, in_buf_elems);
}

struct StemChoice {
  int pooled_h = 0, pooled_w = 0;  // 0: no tile fits
  int conv_h = 0, conv_w = 0;
  bool tma = false;
  int64_t grid_x = 0, smem = 0;
};

int64_t StemKfPad(const ConvPoolParams& p) {
  return CeilDiv(p.R * p.S * p.C, conv_pool::kStemChunk) * conv_pool::kStemChunk;
}

// Conv-tile extent covering `pooled` pool windows, and the input extent it reads.
int StemConvExtent(int pooled, int pool, int pool_stride) { return (pooled - 1) * pool_stride + pool; }
int StemInExtent(int conv, int64_t window, int stride, int dilation) {
  return static_cast<int>((conv - 1) * stride + (window - 1) * dilation + 1);
}

// Input-tile geometry of a conv tile: rows, elements per row, and the shared-memory row stride
// (TMA boxes are whole 16-byte rows starting on a 16-byte boundary).
struct StemInput {
  int64_t rows, row_elems, stride, buf_elems;
};
template <typename T>
StemInput StemInputTile(const ConvPoolParams& p, int conv_h, int conv_w, bool tma) {
  StemInput in;
  in.rows = StemInExtent(conv_h, p.R, p.stride_h, p.dilation_h);
  in.row_elems = StemInExtent(conv_w, p.S, p.stride_w, p.dilation_w) * p.C;
  constexpr int64_t kVec = 16 / sizeof(T);
  // TMA rows start at the 16-byte boundary at or before the tile's first element.
  in.stride = tma ? CeilDiv(in.row_elems + kVec - 1, kVec) * kVec : in.row_elems;
  in.buf_elems = conv_pool::StemInBufElems<T>(in.rows, in.stride);
  return in;
}

// The pooled tile (up to 16 x 16) with the least modeled time: waves of persistent CTAs times
// a tile's work in thread-element steps (A-fragment gathers and MMAs over the conv rows, pool
// window reads, element-wise input loads where TMA does not apply, and a fixed cost for
// barriers and index math). Its conv tile must fit the kernel's M (256 or 128 outputs) and its
// shared memory the device's per-block limit (smem_max); two CTAs per SM where it is at most
// kStemSmemTwoCtas, else one. tma_ok: x can be loaded by TMA (then the box must fit too).
template <typename T>
StemChoice ChooseStemTile(const ConvPoolParams& p, int block_k, int sm_count, int smem_max,
                          bool tma_ok) {
  const int max_m = block_k == 128 ? conv_pool::StemShape<T, 2>::kMaxM
                                   : conv_pool::StemShape<T, 1>::kMaxM;
  const int64_t kf_pad = StemKfPad(p);
  const int64_t k_blocks = CeilDiv(p.K, block_k);
  StemChoice best;
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  for (int ph = 1; ph <= 16; ++ph) {
    for (int pw = 1; pw <= 16; ++pw) {
      const int ch = StemConvExtent(ph, p.pool_h, p.pool_stride_h);
      const int cw = StemConvExtent(pw, p.pool_w, p.pool_stride_w);
      if (ch * cw > max_m) break;  // wider tiles only grow
      StemInput in = StemInputTile<T>(p, ch, cw, tma_ok);
      const bool tma = tma_ok && in.stride <= kTmaMaxBox && in.rows <= kTmaMaxBox;
      if (tma_ok && !tma) in = StemInputTile<T>(p, ch, cw, false);
      const int64_t smem = StemSmem<T>(block_k, kf_pad, in.buf_elems);
      if (smem > smem_max) continue;
      const int64_t ctas_per_sm = smem <= kStemSmemTwoCtas ? conv_pool::kStemMinBlocks : 1;
      const int64_t per_block =
          std::max<int64_t>(1, CeilDiv(int64_t{sm_count} * ctas_per_sm, k_blocks));
      const int64_t tiles = p.N * CeilDiv(p.PH, ph) * CeilDiv(p.PW, pw);
      const int64_t m_pad = CeilDiv(ch * cw, 32) * 32;
      const int64_t tile_cost = m_pad * kf_pad + (tma ? 0 : 4 * in.rows * in.row_elems) +
                                int64_t{ph} * pw * p.pool_h * p.pool_w * block_k / 8 + 8192;
      const int64_t cost = CeilDiv(tiles, per_block) * tile_cost;
      if (cost < best_cost) {
        best_cost = cost;
        best.pooled_h = ph, best.pooled_w = pw, best.conv_h = ch, best.conv_w = cw;
        best.tma = tma;
        best.grid_x = std::min(tiles, per_block), best.smem = smem;
      }
    }
  }
  return best;
}

template <typename T>
conv_pool::StemArgs MakeStemArgs(const ConvPoolParams& p, const ConvPoolPlan& plan) {
  conv_pool::StemArgs a{};
  FillLayerArgs(p, a);
  a.pooled_h = plan.pooled_h, a.pooled_w = plan.pooled_w;
  a.conv_h = plan.tile_h, a.conv_w = plan.tile_w;
  const StemInput in = StemInputTile<T>(p, plan.tile_h, plan.tile_w, plan.tma);
  a.in_h = static_cast<int>(in.rows), a.in_row = static_cast<int>(in.row_elems);
  a.in_stride = static_cast<int>(in.stride), a.in_buf_elems = in.buf_elems;
  a.tiles_h = static_cast<int>(CeilDiv(p.PH, plan.pooled_h));
  a.tiles_w = static_cast<int>(CeilDiv(p.PW, plan.pooled_w));
  a.tiles = p.N * a.tiles_h * a.tiles_w;
  a.rsc = static_cast<int>(p.R * p.S * p.C);
  a.kf_pad = static_cast<int>(StemKfPad(p));
  a.use_tma = plan.tma ? 1 : 0;
  a.act = p.act;
  return a;
}

// x as [N][H][W * C] (innermost first for the driver), box = one input tile; elements outside
// the tensor read as zero (the conv padding).
template <typename T>
cudaError_t EncodeStemInputMap(const ConvPoolParams& p, const conv_pool::StemArgs& a, const T* x,
                               CUtensorMap* map) {
  const EncodeTiledFn encode = TensorMapEncoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const CUtensorMapDataType dtype = std::is_same_v<T, float>           ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                    : std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(p.W * p.C), static_cast<cuuint64_t>(p.H),
                              static_cast<cuuint64_t>(p.N)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.W * p.C * sizeof(T)),
                                 static_cast<cuuint64_t>(p.H * p.W * p.C * sizeof(T))};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(a.in_stride),
                             static_cast<cuuint32_t>(a.in_h), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, dtype, 3, const_cast<T*>(x), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <typename T, int kWarpsN>
cudaError_t LaunchStem(const ConvPoolParams& p, const ConvPoolPlan& plan,
                       const ConvPoolBuffers<T>& b, cudaStream_t stream) {
  auto kernel = conv_pool::conv_pool_stem_kernel<T, kWarpsN>;
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(plan.smem_bytes));
  if (status != cudaSuccess) return status;
  const conv_pool::StemArgs a = MakeStemArgs<T>(p, plan);
  CUtensorMap map{};
  if (plan.tma && (status = EncodeStemInputMap<T>(p, a, b.x, &map)) != cudaSuccess) return status;
  const int64_t k_blocks = CeilDiv(p.K, plan.block_k);
  const dim3 grid(static_cast<unsigned>(plan.grid / k_blocks), static_cast<unsigned>(k_blocks));
  kernel<<<grid, conv_pool::kStemThreads, plan.smem_bytes, stream>>>(a, map, b.x, b.w, b.bias,
                                                                     b.y);
  return cudaGetLastError();
}

conv_pool::DirectArgs MakeDirectArgs(const ConvPoolParams& p) {
  conv_pool::DirectArgs a{};
  FillLayerArgs(p, a);
  a.N = p.N, a.R = static_cast<int>(p.R);
  a.k_groups = static_cast<int>(CeilDiv(p.K, conv_pool::kDirectChannels));
  return a;
}

template <typename T, int TW, int kWarpsN, bool kFlatK>
cudaError_t LaunchTc(const conv_pool::TcArgs& a, int64_t grid, const ConvPoolBuffers<T>& b,
                     cudaStream_t stream) {
  using Shape = conv_pool::TcShape<T, kWarpsN>;
  auto kernel = conv_pool::conv_pool_tc_kernel<T, TW, kWarpsN, kFlatK>;
  cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            Shape::kSmemBytes);
  if (status != cudaSuccess) return status;
  kernel<<<static_cast<unsigned>(grid), Shape::kThreads, Shape::kSmemBytes, stream>>>(
      a, b.x, b.w, b.bias, b.y);
  return cudaGetLastError();
}

template <typename T, int kWarpsN, bool kFlatK>
cudaError_t LaunchTcWidth(int tile_w, const conv_pool::TcArgs& a, int64_t grid,
                          const ConvPoolBuffers<T>& b, cudaStream_t stream) {
  switch (tile_w) {
    case 8: return LaunchTc<T, 8, kWarpsN, kFlatK>(a, grid, b, stream);
    case 16: return LaunchTc<T, 16, kWarpsN, kFlatK>(a, grid, b, stream);
    case 32: return LaunchTc<T, 32, kWarpsN, kFlatK>(a, grid, b, stream);
    default: return cudaErrorInvalidValue;
  }
}

// The plan's channel block (kWarpsN = block_k / 32) and conv block width.
template <typename T, bool kFlatK>
cudaError_t LaunchTcPlan(const ConvPoolPlan& plan, const conv_pool::TcArgs& a,
                         const ConvPoolBuffers<T>& b, cudaStream_t stream) {
  return plan.block_k == 128 ? LaunchTcWidth<T, 4, kFlatK>(plan.tile_w, a, plan.grid, b, stream)
                             : LaunchTcWidth<T, 2, kFlatK>(plan.tile_w, a, plan.grid, b, stream);
}

}  // namespace

const char* conv_pool_unsupported_reason(const ConvPoolParams& p) {
  if (p.N < 1 || p.H < 1 || p.W < 1 || p.C < 1 || p.R < 1 || p.S < 1 || p.K < 1)
    return "every dimension of x and w must be >= 1";
  if (p.stride_h < 1 || p.stride_w < 1 || p.dilation_h < 1 || p.dilation_w < 1)
    return "stride and dilation must be >= 1";
  if (p.pad_top < 0 || p.pad_left < 0 || p.pool_pad_top < 0 || p.pool_pad_left < 0)
    return "padding must be >= 0";
  if (p.pool_h < 1 || p.pool_w < 1 || p.pool_stride_h < 1 || p.pool_stride_w < 1)
    return "pool window and stride must be >= 1";
  if (p.P < 1 || p.Q < 1 || p.PH < 1 || p.PW < 1) return "conv and pooled outputs must be >= 1";
  if (p.pool_pad_top >= p.pool_h || p.pool_pad_left >= p.pool_w)
    return "pool padding must be smaller than the pool window";
  // The last pool window must start inside the conv output: with pads smaller than the
  // window, every window then holds at least one conv output.
  if ((p.PH - 1) * p.pool_stride_h - p.pool_pad_top >= p.P ||
      (p.PW - 1) * p.pool_stride_w - p.pool_pad_left >= p.Q)
    return "pooled output extent does not match the conv output, pool stride and padding";
  // 32-bit index math inside the kernels (per-image offsets and coordinates are int).
  if (p.H * p.W * p.C > kInt32Max || p.R * p.S * p.C * p.K > kInt32Max ||
      p.P * static_cast<int64_t>(p.stride_h) + (p.R - 1) * p.dilation_h > kInt32Max ||
      p.Q * static_cast<int64_t>(p.stride_w) + (p.S - 1) * p.dilation_w > kInt32Max ||
      p.PH * p.PW * p.K > kInt32Max)
    return "a per-image extent exceeds 32-bit indexing";
  return nullptr;
}

namespace {

// Settles the plan on `kernel` when it can run (`reason` null; why: "forced" when it was the
// requested algorithm, else `auto_why`), or as unsupported (`reason`) when it was forced and
// cannot; returns false, the plan untouched, when the next kernel is to be tried.
bool Settle(ConvPoolAlgorithm algorithm, ConvPoolAlgorithm kernel, const char* reason,
            const char* auto_why, ConvPoolPlan* plan) {
  if (reason != nullptr) {
    if (algorithm != kernel) return false;
    plan->unsupported = reason;
    return true;
  }
  plan->kernel = kernel;
  plan->why = algorithm == kernel ? "forced" : auto_why;
  return true;
}

}  // namespace

template <typename T>
ConvPoolPlan plan_conv_pool(const ConvPoolParams& p, const ConvPoolBuffers<T>& b,
                            ConvPoolAlgorithm algorithm) {
  ConvPoolPlan plan;
  if (const char* reason = conv_pool_unsupported_reason(p)) {
    plan.unsupported = reason;
    return plan;
  }
  if (p.act.act != Activation::kRelu) {
    const bool pooled = p.pool_h * p.pool_w > 1;
    const Activation act = p.act.act;
    const bool monotone = act == Activation::kNone || act == Activation::kRelu ||
                          act == Activation::kRelu6 || act == Activation::kSigmoid ||
                          (act == Activation::kLeakyRelu && p.act.alpha >= 0.f);
    if (algorithm != ConvPoolAlgorithm::kStem)
      plan.unsupported = "an activation other than relu runs on the stem kernel only";
    else if (pooled && !monotone)
      plan.unsupported = "max-pool after a non-monotone activation (it does not commute)";
    if (plan.unsupported != nullptr) return plan;
  }
  // The wgmma kernel, where its shape family, dtype and device fit.
  const char* wgmma_reason =
      algorithm == ConvPoolAlgorithm::kAuto || algorithm == ConvPoolAlgorithm::kWgmma
          ? conv_pool_wgmma::UnsupportedReason(p, sizeof(T), std::is_same_v<T, float>, b.x, b.w,
                                               b.y)
          : "not requested";
  if (Settle(algorithm, ConvPoolAlgorithm::kWgmma, wgmma_reason,
             "3x3 stride-1 conv + 2x2/2 pool, 16-bit, Hopper: wgmma kernel", &plan)) {
    if (plan.unsupported != nullptr) return plan;
    conv_pool_wgmma::TileShape(p, &plan.tile_h, &plan.tile_w);
    plan.pooled_h = plan.tile_h / 2, plan.pooled_w = plan.tile_w / 2;
    plan.block_k = conv_pool_wgmma::BlockN(p);
    plan.grid = conv_pool_wgmma::Grid(p);
    plan.smem_bytes = conv_pool_wgmma::SmemBytes(p);
    plan.tma = true;
    plan.recompute = static_cast<double>(CeilDiv(p.P, plan.tile_h) * CeilDiv(p.Q, plan.tile_w) *
                                         plan.tile_h * plan.tile_w) /
                     static_cast<double>(p.P * p.Q);
    return plan;
  }

  // Why the mma.sync kernels (tensor-core and stem) cannot run, or nullptr. Weights and outputs
  // move in 16-byte vectors of output channels; x in 16-byte vectors of input channels, except
  // flat-K and the stem kernel, which gather it element by element: C off the vector multiple,
  // or so small that a 32-channel chunk per filter tap would be mostly zero padding.
  constexpr int64_t kVec = 16 / sizeof(T);
  const bool flat_k = p.C % kVec != 0 || p.C < 16;
  const char* mma_reason = nullptr;
  int major = 0;
  if (std::is_same_v<T, float> && !p.allow_tf32)
    mma_reason = "float32 at precision 'highest' runs on CUDA cores (fp32 FMA)";
  else if (p.K % kVec != 0)
    mma_reason = std::is_same_v<T, float> ? "output channels K must be a multiple of 4"
                                          : "output channels K must be a multiple of 8";
  else if (!Aligned16(b.w) || !Aligned16(b.y))
    mma_reason = "w and y must be 16-byte aligned";
  else if (CurrentDeviceAttribute<cudaDevAttrComputeCapabilityMajor>(&major) != cudaSuccess || major < 8)
    mma_reason = "mma.sync needs compute capability >= 8.0";
  const int block_k = ChooseBlockK(p.K);

  // The stem kernel: small GEMM-K, a tile shape that fits.
  const bool stem_wanted = algorithm == ConvPoolAlgorithm::kStem ||
                           (algorithm == ConvPoolAlgorithm::kAuto && flat_k);
  const char* stem_reason = stem_wanted ? mma_reason : "not requested";
  StemChoice stem;
  int sm_count = 0, smem_max = 0;
  if (stem_reason == nullptr && p.R * p.S * p.C > kStemMaxRsc)
    stem_reason = "GEMM-K = R*S*C above 512 (the stem kernel is for few-channel first layers)";
  else if (stem_reason == nullptr && CeilDiv(p.K, block_k) > 65535)
    stem_reason = "too many channel blocks for one launch";
  else if (stem_reason == nullptr &&
           (CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>(&sm_count) != cudaSuccess ||
            CurrentDeviceAttribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(&smem_max) !=
                cudaSuccess))
    stem_reason = "cannot query the SM count or shared memory size";
  if (stem_reason == nullptr) {
    // TMA (sm_90) loads x as [N][H][W * C]: 16-byte aligned, rows whole 16-byte multiples.
    const bool tma_ok = major >= 9 && Aligned16(b.x) && (p.W * p.C * int64_t{sizeof(T)}) % 16 == 0 &&
                        TensorMapEncoder() != nullptr;
    stem = ChooseStemTile<T>(p, block_k, sm_count, smem_max, tma_ok);
    if (stem.pooled_h == 0)
      stem_reason = "no stem tile fits (conv tile <= 256 outputs (128 with 128-channel blocks) "
                    "and the weights, conv tile and input tile in one CTA's shared memory)";
    else if (p.N * CeilDiv(p.PH, stem.pooled_h) * CeilDiv(p.PW, stem.pooled_w) >
             std::numeric_limits<int32_t>::max())
      stem_reason = "more than 2^31 - 1 tiles (the stem kernel's tile indices are 32-bit)";
  }
  if (Settle(algorithm, ConvPoolAlgorithm::kStem, stem_reason,
             "small GEMM-K (C below 16 or off the 16-byte multiple): stem kernel", &plan)) {
    if (plan.unsupported != nullptr) return plan;
    plan.tile_h = stem.conv_h, plan.tile_w = stem.conv_w;
    plan.pooled_h = stem.pooled_h, plan.pooled_w = stem.pooled_w;
    plan.block_k = block_k;
    plan.grid = stem.grid_x * CeilDiv(p.K, block_k);
    plan.smem_bytes = stem.smem;
    plan.flat_k = true;
    plan.tma = stem.tma;
    plan.recompute = static_cast<double>(CeilDiv(p.PH, stem.pooled_h) *
                                         CeilDiv(p.PW, stem.pooled_w) * stem.conv_h * stem.conv_w) /
                     static_cast<double>(p.P * p.Q);
    return plan;
  }

  const char* tc_reason = mma_reason;
  if (tc_reason == nullptr && !flat_k && !Aligned16(b.x))
    tc_reason = "x must be 16-byte aligned (C is a multiple of 16 bytes)";
  BlockChoice block;
  if (tc_reason == nullptr) {
    block = ChooseBlock(p);
    if (block.tile_w == 0) tc_reason = "pool window larger than every conv block (16x8, 8x16, 4x32)";
  }
  int64_t grid = 0;
  if (tc_reason == nullptr) {
    grid = p.N * block.tiles_h * block.tiles_w * CeilDiv(p.K, block_k);
    if (grid > kInt32Max) tc_reason = "too many CTAs for one launch";
  }
  if (algorithm == ConvPoolAlgorithm::kTensorCore && tc_reason != nullptr) {
    plan.unsupported = tc_reason;
    return plan;
  }
  if (algorithm != ConvPoolAlgorithm::kDirect && tc_reason == nullptr) {
    plan.kernel = ConvPoolAlgorithm::kTensorCore;
    if (algorithm == ConvPoolAlgorithm::kAuto)
      plan.why = flat_k ? "tensor cores apply, flat-K (C below 16 or off the 16-byte multiple)"
                        : "tensor cores apply";
    else
      plan.why = flat_k ? "forced, flat-K" : "forced";
    plan.flat_k = flat_k;
    plan.tile_h = block.tile_h, plan.tile_w = block.tile_w;
    plan.pooled_h = block.pooled_h, plan.pooled_w = block.pooled_w;
    plan.block_k = block_k;
    plan.grid = grid;
    plan.smem_bytes = block_k == 128 ? conv_pool::TcShape<T, 4>::kSmemBytes
                                     : conv_pool::TcShape<T, 2>::kSmemBytes;
    plan.recompute = static_cast<double>(block.tiles_h * block.tiles_w * conv_pool::kTileM) /
                     static_cast<double>(p.P * p.Q);
    return plan;
  }
  plan.kernel = ConvPoolAlgorithm::kDirect;
  plan.why = algorithm == ConvPoolAlgorithm::kDirect ? "forced" : tc_reason;
  const int64_t threads =
      p.N * p.PH * p.PW * CeilDiv(p.K, conv_pool::kDirectChannels);
  plan.grid = CeilDiv(threads, conv_pool::kDirectThreads);
  plan.block_k = conv_pool::kDirectChannels;
  plan.recompute = static_cast<double>(p.PH * p.PW * p.pool_h * p.pool_w) /
                   static_cast<double>(p.P * p.Q);
  if (plan.grid > kInt32Max) plan.unsupported = "too many CTAs for one launch";
  return plan;
}

template <typename T>
cudaError_t launch_conv_pool(const ConvPoolParams& p, const ConvPoolBuffers<T>& b,
                             ConvPoolAlgorithm algorithm, cudaStream_t stream) {
  const ConvPoolPlan plan = plan_conv_pool<T>(p, b, algorithm);
  if (plan.unsupported != nullptr) return cudaErrorInvalidValue;
  if (p.N * p.PH * p.PW * p.K == 0) return cudaSuccess;
  if constexpr (!std::is_same_v<T, float>) {
    if (plan.kernel == ConvPoolAlgorithm::kWgmma) return conv_pool_wgmma::Launch<T>(p, b, stream);
  }
  if (plan.kernel == ConvPoolAlgorithm::kStem)
    return plan.block_k == 128 ? LaunchStem<T, 2>(p, plan, b, stream)
                               : LaunchStem<T, 1>(p, plan, b, stream);
  if (plan.kernel == ConvPoolAlgorithm::kDirect) {
    conv_pool::conv_pool_direct_kernel<T>
        <<<static_cast<unsigned>(plan.grid), conv_pool::kDirectThreads, 0, stream>>>(
            MakeDirectArgs(p), b.x, b.w, b.bias, b.y);
    return cudaGetLastError();
  }
  BlockChoice block;
  block.tile_w = plan.tile_w, block.tile_h = plan.tile_h;
  block.pooled_h = plan.pooled_h, block.pooled_w = plan.pooled_w;
  block.tiles_h = CeilDiv(p.PH, plan.pooled_h), block.tiles_w = CeilDiv(p.PW, plan.pooled_w);
  const conv_pool::TcArgs a = MakeTcArgs(p, block, plan.block_k, plan.flat_k);
  return plan.flat_k ? LaunchTcPlan<T, true>(plan, a, b, stream)
                     : LaunchTcPlan<T, false>(plan, a, b, stream);
}

#define JAXCNN_CONV_POOL_INSTANTIATE(T)                                                        \
  template ConvPoolPlan plan_conv_pool<T>(const ConvPoolParams&, const ConvPoolBuffers<T>&,    \
                                          ConvPoolAlgorithm);                                  \
  template cudaError_t launch_conv_pool<T>(const ConvPoolParams&, const ConvPoolBuffers<T>&,   \
                                           ConvPoolAlgorithm, cudaStream_t);
JAXCNN_CONV_POOL_INSTANTIATE(float)
JAXCNN_CONV_POOL_INSTANTIATE(__nv_bfloat16)
JAXCNN_CONV_POOL_INSTANTIATE(__half)
#undef JAXCNN_CONV_POOL_INSTANTIATE

}  // namespace jaxcnn
