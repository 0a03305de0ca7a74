// Hopper fused 3x3 conv + bias + ReLU + 2x2/2 max-pool (see conv_pool_wgmma.h for the idea).
//
// Warp-specialized: one producer thread fills kStages shared-memory stages by TMA, two
// consumer warpgroups run the wgmmas and the pool epilogue (each on alternate 16x16 tiles, or
// both on one tile, conv rows 0-7 and 8-15: Shape::kPingPong); full/empty mbarriers hand
// stages over. A stage is one chunk of input
// channels of one tile:
//   A  the input tile, [18 x 18 halo pixels][kChunkC channels] (one 4-D TMA box; outside
//      the image TMA fills zeros = the conv padding), with TMA's 64B (32 channels) or 32B
//      (16 channels) swizzle: K-major, one 8-row group = 8 consecutive pixels of a halo row.
//      The A operand of an 8x8 conv block and tap (r, s) is the same tile started at pixel
//      (row + r, col + s), stepping kASbo per conv row. That start is mid swizzle pattern,
//      which works because wgmma, like TMA, swizzles by absolute shared-memory address bits
//      (base offset 0; measured: setting the base offset from the address gives wrong
//      results).
//   B  the weights of one tap per 64 output channels, [kChunkC rows][64 channels] with the
//      128B swizzle: HWIO rows as they are in memory, MN-major (CUTLASS's usual B tile).
//      The no-swizzle layout with 16-byte TMA rows ran the layer at 40% of this speed
//      (half-used L2 sectors).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "common/device_attribute.h"
#include "common/tensor_map.h"
#include "conv_pool/conv_pool_wgmma.h"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"

namespace jaxcnn {
namespace conv_pool_wgmma {
namespace {

constexpr int kHaloW = kTileW + 2;
constexpr int kHaloPixels = (kTileH + 2) * kHaloW;
static_assert(kTileH == 16 && kTileW == 16, "four 8x8 blocks per tile");
constexpr int kTaps = 9;

// kChunkC input channels per stage: 32 with 64-channel blocks, 16 with 128.
template <int kN>
struct Shape {
  static constexpr int kChunkC = kN == 64 ? 32 : 16;
  static constexpr int kRowBytes = kChunkC * 2;  // A: one pixel
  static constexpr int kAtom = 8 * kRowBytes;    // A: swizzle pattern repeat
  static constexpr uint32_t kALayout = kRowBytes == 64 ? 2 : 3;  // descriptor: 64B / 32B swizzle
  static constexpr int kASbo = kHaloW * kRowBytes;  // A: next conv row (the next 8 rows of M)
  static constexpr int kABytesUsed = kHaloPixels * kRowBytes;
  static constexpr int kABytes = (kABytesUsed + kAtom - 1) / kAtom * kAtom;
  // B: per tap [64-channel half][kChunkC rows][64 output channels], 128B swizzle (MN-major).
  static constexpr int kBLbo = kChunkC * 128;  // next 64 output channels
  static constexpr int kBSbo = 8 * 128;        // next 8 input channels
  static constexpr int kBTapBytes = (kN / 64) * kChunkC * 128;
  static constexpr int kBBytes = kTaps * kBTapBytes;
  static constexpr int kStages = 4;
  // All B stages first (1024-byte aligned for the 128B swizzle), then all A stages.
  static constexpr int kAOffset = kStages * kBBytes;
  static constexpr int kBarrierOffset = kAOffset + kStages * kABytes;
  static constexpr int kSmemBytes = kBarrierOffset + 2 * kStages * 8;
  static constexpr int kStageTx = kBBytes + kABytesUsed;
  // 64-channel blocks: "ping-pong", each consumer warpgroup takes whole tiles (all four 8x8
  // blocks, 128 accumulators), alternating, so one's epilogue overlaps the other's wgmmas
  // (1-, 2-chunk tiles spend a large share in the epilogue). 128: "cooperative", the two
  // split each tile (two blocks each; four would need 256 accumulators).
  static constexpr bool kPingPong = kN == 64;
  static constexpr int kBlocks = kPingPong ? 4 : 2;  // 8x8 blocks per consumer warpgroup
  static_assert(kBTapBytes % 1024 == 0 && kABytes % kAtom == 0, "TMA / swizzle alignment");
  static_assert(kSmemBytes <= 232448, "227 KB of shared memory per CTA");
};

struct Args {
  const void* bias;
  void* y;
  int C, K, PH, PW;
  int tiles_h, tiles_w, n_blocks, chunks;
  int work;  // N * tiles_h * tiles_w * n_blocks
};

// A wgmma shared-memory matrix descriptor: start, LBO and SBO in 16-byte units, base offset 0,
// layout type (1 128B, 2 64B, 3 32B swizzle).
__device__ __forceinline__ uint64_t Desc(uint32_t addr, uint32_t lbo, uint32_t sbo,
                                         uint32_t layout) {
  return uint64_t((addr >> 4) & 0x3FFF) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(layout) << 62);
}

template <typename T, int kN>
struct WgmmaOp;
using cute::SM90::GMMA::Major;
template <>
struct WgmmaOp<__nv_bfloat16, 64> {
  using type = cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<Major::K, Major::MN>;
};
template <>
struct WgmmaOp<__nv_bfloat16, 128> {
  using type = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<Major::K, Major::MN>;
};
template <>
struct WgmmaOp<__half, 64> {
  using type = cute::SM90::GMMA::MMA_64x64x16_F32F16F16_SS<Major::K, Major::MN>;
};
template <>
struct WgmmaOp<__half, 128> {
  using type = cute::SM90::GMMA::MMA_64x128x16_F32F16F16_SS<Major::K, Major::MN>;
};

template <class Op, int... I>
__device__ __forceinline__ void Fma(uint64_t da, uint64_t db, float* d,
                                    cute::SM90::GMMA::ScaleOut scale,
                                    std::integer_sequence<int, I...>) {
  Op::fma(da, db, d[I]..., scale);
}

// max that propagates NaN (as the reference's reduce_window max does).
__device__ __forceinline__ float NanMax(float a, float b) { return (a != a || a > b) ? a : b; }

struct Item {
  int img, oh0, ow0, n0;
};
template <int kN>
__device__ __forceinline__ Item DecodeItem(const Args& a, int item) {
  Item it;
  const int nb = item % a.n_blocks;
  int rest = item / a.n_blocks;  // channel blocks innermost: they share the input tile in L2
  const int tx = rest % a.tiles_w;
  rest /= a.tiles_w;
  it.oh0 = (rest % a.tiles_h) * kTileH;
  it.img = rest / a.tiles_h;
  it.ow0 = tx * kTileW;
  it.n0 = nb * kN;
  return it;
}

template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// The top-left conv output (row, column in the tile) of a consumer's 8x8 block.
template <int kN>
__device__ __forceinline__ int BlockRow(int consumer, int blk) {
  return Shape<kN>::kPingPong ? 8 * (blk / 2) : 8 * consumer;
}
template <int kN>
__device__ __forceinline__ int BlockCol(int blk) {
  return Shape<kN>::kPingPong ? 8 * (blk % 2) : 8 * blk;
}

// Pool a consumer warpgroup's 8x8 blocks (rows 2*warp, 2*warp + 1 of each: one pooled row),
// add bias, ReLU, store. max(acc) + bias then ReLU equals the pool of ReLU(acc + bias), and
// rounding once after the max equals the max of rounded values (both monotone).
template <typename T, int kN>
__device__ __forceinline__ void Epilogue(const Args& a, const Item& it, int consumer,
                                         float (&acc)[Shape<kN>::kBlocks][kN / 2]) {
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const T* bias = static_cast<const T*>(a.bias);
  const int n_lane = it.n0 + 2 * (lane % 4);
#pragma unroll
  for (int blk = 0; blk < Shape<kN>::kBlocks; ++blk) {
    const int ph = (it.oh0 + BlockRow<kN>(consumer, blk) + 2 * warp) / 2;
    const int pw = (it.ow0 + BlockCol<kN>(blk) + lane / 4) / 2;
    const bool writer = (lane / 4) % 2 == 0 && ph < a.PH && pw < a.PW;
    uint32_t* y = reinterpret_cast<uint32_t*>(
        static_cast<T*>(a.y) +
        ((static_cast<int64_t>(it.img) * a.PH + ph) * a.PW + pw) * a.K + n_lane);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      float v0 = NanMax(acc[blk][4 * j], acc[blk][4 * j + 2]);  // rows 2*warp, 2*warp + 1
      float v1 = NanMax(acc[blk][4 * j + 1], acc[blk][4 * j + 3]);
      v0 = NanMax(v0, __shfl_xor_sync(0xffffffffu, v0, 4));  // the next column's lane
      v1 = NanMax(v1, __shfl_xor_sync(0xffffffffu, v1, 4));
      if (writer) {
        if (bias != nullptr) {
          v0 += static_cast<float>(bias[n_lane + 8 * j]);
          v1 += static_cast<float>(bias[n_lane + 8 * j + 1]);
        }
        v0 = v0 < 0.f ? 0.f : v0;  // keeps NaN
        v1 = v1 < 0.f ? 0.f : v1;
        y[4 * j] = PackPair<T>(v0, v1);  // 8 channels = 4 words further
      }
    }
  }
}

template <int kN>
__device__ __forceinline__ void FenceAcc(float (&acc)[Shape<kN>::kBlocks][kN / 2]) {
#pragma unroll
  for (int blk = 0; blk < Shape<kN>::kBlocks; ++blk)
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) cute::warpgroup_fence_operand(acc[blk][i]);
}

// Threads: warpgroup 0 produces (one thread issues the TMA loads), 1 and 2 consume.
constexpr int kKernelThreads = 3 * 128;

template <typename T, int kN>
__global__ void __launch_bounds__(kKernelThreads, 1)
    conv_pool_wgmma_kernel(const __grid_constant__ CUtensorMap x_map,
                           const __grid_constant__ CUtensorMap w_map, const Args a) {
  using S = Shape<kN>;
  using Op = typename WgmmaOp<T, kN>::type;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  extern __shared__ __align__(1024) uint8_t smem[];
  auto* full = reinterpret_cast<FullBarrier*>(smem + S::kBarrierOffset);
  auto* empty = reinterpret_cast<EmptyBarrier*>(full + S::kStages);
  const int wg = threadIdx.x / 128;
  const int items = a.work > static_cast<int>(blockIdx.x)
                        ? (a.work - 1 - static_cast<int>(blockIdx.x)) / gridDim.x + 1
                        : 0;
  const int steps = items * a.chunks;

  if (threadIdx.x == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      full[s].init(1);
      empty[s].init(S::kPingPong ? 4 : 2 * 4);  // one arrival per warp reading the stage
    }
    cutlass::arch::fence_barrier_init();
    cute::prefetch_tma_descriptor(&x_map);
    cute::prefetch_tma_descriptor(&w_map);
  }
  __syncthreads();

  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x != 0) return;
    for (int t = 0; t < steps; ++t) {
      const int stage = t % S::kStages;
      empty[stage].wait(((t / S::kStages) & 1) ^ 1);
      const Item it = DecodeItem<kN>(a, blockIdx.x + (t / a.chunks) * gridDim.x);
      const int c0 = (t % a.chunks) * S::kChunkC;
      uint64_t* bar = reinterpret_cast<uint64_t*>(&full[stage]);
      uint8_t* sa = smem + S::kAOffset + stage * S::kABytes;
      uint8_t* sb = smem + stage * S::kBBytes;
      full[stage].arrive_and_expect_tx(S::kStageTx);
      cute::SM90_TMA_LOAD_4D::copy(&x_map, bar, 0, sa, c0, it.ow0 - 1, it.oh0 - 1, it.img);
#pragma unroll
      for (int tap = 0; tap < kTaps; ++tap)
#pragma unroll
        for (int h = 0; h < kN / 64; ++h)
          cute::SM90_TMA_LOAD_2D::copy(&w_map, bar, 0,
                                       sb + tap * S::kBTapBytes + h * S::kChunkC * 128,
                                       it.n0 + 64 * h, tap * a.C + c0);
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<232>();
  const int consumer = wg - 1;
  const bool release_lane = threadIdx.x % 32 == 0;
  // Never zeroed or copied by ordinary code: the first wgmma of a tile overwrites (scale 0),
  // so the compiler need not wait on in-flight wgmmas to move them.
  float acc[S::kBlocks][kN / 2];
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int first = S::kPingPong ? consumer : 0, stride = S::kPingPong ? 2 : 1;
  for (int item = first; item < items; item += stride) {
    int held = -1;  // the stage whose wgmmas may still be reading
    for (int chunk = 0, t = item * a.chunks; chunk < a.chunks; ++chunk, ++t) {
      const int stage = t % S::kStages;
      full[stage].wait((t / S::kStages) & 1);
      const uint32_t a_base = smem_base + S::kAOffset + stage * S::kABytes;
      const uint32_t b_base = smem_base + stage * S::kBBytes;
      FenceAcc<kN>(acc);
      cute::warpgroup_arrive();
#pragma unroll
      for (int tap = 0; tap < kTaps; ++tap) {
        const int r = tap / 3, s = tap % 3;
#pragma unroll
        for (int kk = 0; kk < S::kChunkC / 16; ++kk) {
          const uint64_t db =
              Desc(b_base + tap * S::kBTapBytes + kk * 16 * 128, S::kBLbo, S::kBSbo, 1);
          const auto scale = (chunk > 0 || tap > 0 || kk > 0) ? cute::SM90::GMMA::ScaleOut::One
                                                              : cute::SM90::GMMA::ScaleOut::Zero;
#pragma unroll
          for (int blk = 0; blk < S::kBlocks; ++blk) {
            const int pix = (BlockRow<kN>(consumer, blk) + r) * kHaloW + BlockCol<kN>(blk) + s;
            // LBO is unused by swizzled K-major layouts (16 bytes, as CUTLASS sets it).
            const uint64_t da =
                Desc(a_base + pix * S::kRowBytes + kk * 32, 16, S::kASbo, S::kALayout);
            Fma<Op>(da, db, acc[blk], scale, std::make_integer_sequence<int, kN / 2>{});
          }
        }
      }
      cute::warpgroup_commit_batch();
      // Keep this step's wgmmas in flight; the previous step's are done: free its stage.
      cute::warpgroup_wait<1>();
      if (held >= 0 && release_lane) empty[held].arrive();
      held = stage;
    }
    cute::warpgroup_wait<0>();
    FenceAcc<kN>(acc);
    if (release_lane) empty[held].arrive();
    Epilogue<T, kN>(a, DecodeItem<kN>(a, blockIdx.x + item * gridDim.x), consumer, acc);
  }
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t Work(const ConvPoolParams& p) {
  return p.N * CeilDiv(p.P, kTileH) * CeilDiv(p.Q, kTileW) * (p.K / BlockN(p.K));
}

template <typename T>
constexpr CUtensorMapDataType kTmaType = std::is_same_v<T, __nv_bfloat16>
                                             ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;

// Tensor maps (innermost dimension first, strides in bytes for dimensions 1..):
//   x: [N][H][W][C], box = one chunk's 18 x 18 halo tile, [pixel][kChunkC], 64B / 32B swizzle;
//   w: [R*S*C][K], box = kChunkC rows x 64 output channels, 128B swizzle.
template <typename T, int kN>
cudaError_t EncodeMaps(const ConvPoolParams& p, const ConvPoolBuffers<T>& b, CUtensorMap* x_map,
                       CUtensorMap* w_map) {
  using S = Shape<kN>;
  const EncodeTiledFn encode = TensorMapEncoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  constexpr cuuint64_t e = sizeof(T);
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(p.C), static_cast<cuuint64_t>(p.W),
                              static_cast<cuuint64_t>(p.H), static_cast<cuuint64_t>(p.N)};
  const cuuint64_t strides[3] = {p.C * e, p.W * p.C * e, p.H * p.W * p.C * e};
  const cuuint32_t box[4] = {S::kChunkC, kTileW + 2, kTileH + 2, 1};
  CUresult r = encode(x_map, kTmaType<T>, 4, const_cast<T*>(b.x), dims, strides, box, unit,
                      CU_TENSOR_MAP_INTERLEAVE_NONE,
                      S::kRowBytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_32B,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  const cuuint64_t w_dims[2] = {static_cast<cuuint64_t>(p.K),
                                static_cast<cuuint64_t>(kTaps * p.C)};
  const cuuint64_t w_strides[1] = {p.K * e};
  const cuuint32_t w_box[2] = {64, S::kChunkC};
  r = encode(w_map, kTmaType<T>, 2, const_cast<T*>(b.w), w_dims, w_strides, w_box, unit,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <typename T, int kN>
cudaError_t LaunchN(const ConvPoolParams& p, const ConvPoolBuffers<T>& b, cudaStream_t stream) {
  using S = Shape<kN>;
  Args a{};
  a.bias = b.bias, a.y = b.y;
  a.C = static_cast<int>(p.C), a.K = static_cast<int>(p.K);
  a.PH = static_cast<int>(p.PH), a.PW = static_cast<int>(p.PW);
  a.tiles_h = static_cast<int>(CeilDiv(p.P, kTileH));
  a.tiles_w = static_cast<int>(CeilDiv(p.Q, kTileW));
  a.n_blocks = static_cast<int>(p.K / kN);
  a.chunks = static_cast<int>(p.C / S::kChunkC);
  a.work = static_cast<int>(Work(p));
  CUtensorMap x_map{}, w_map{};
  cudaError_t status = EncodeMaps<T, kN>(p, b, &x_map, &w_map);
  if (status != cudaSuccess) return status;
  auto kernel = conv_pool_wgmma_kernel<T, kN>;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                S::kSmemBytes);
  if (status != cudaSuccess) return status;
  kernel<<<static_cast<unsigned>(Grid(p)), kKernelThreads, S::kSmemBytes, stream>>>(x_map,
                                                                                    w_map, a);
  return cudaGetLastError();
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int64_t SmemBytes(int block_n) {
  return block_n == 128 ? Shape<128>::kSmemBytes : Shape<64>::kSmemBytes;
}

int64_t Grid(const ConvPoolParams& p) {
  int sms = 0;
  if (CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>(&sms) != cudaSuccess) sms = 1;
  const int64_t work = Work(p);
  return work < sms ? work : sms;
}

const char* UnsupportedReason(const ConvPoolParams& p, int dtype_bytes, bool is_float,
                              const void* x, const void* w, const void* y) {
  if (is_float || dtype_bytes != 2) return "wgmma kernel: bfloat16 / float16 only";
  if (p.R != 3 || p.S != 3 || p.stride_h != 1 || p.stride_w != 1 || p.dilation_h != 1 ||
      p.dilation_w != 1 || p.pad_top != 1 || p.pad_left != 1 || p.P != p.H || p.Q != p.W)
    return "wgmma kernel: 3x3 conv, stride 1, padding 1 (SAME) only";
  if (p.pool_h != 2 || p.pool_w != 2 || p.pool_stride_h != 2 || p.pool_stride_w != 2 ||
      p.pool_pad_top != 0 || p.pool_pad_left != 0 || p.PH != p.P / 2 || p.PW != p.Q / 2)
    return "wgmma kernel: 2x2 stride-2 unpadded (VALID) pool only";
  if (p.C % kChannelMultiple != 0) return "wgmma kernel: C must be a multiple of 32";
  if (p.K % 64 != 0) return "wgmma kernel: K must be a multiple of 64";
  if (!Aligned16(x) || !Aligned16(w) || !Aligned16(y))
    return "wgmma kernel: x, w and y must be 16-byte aligned";
  if (Work(p) > std::numeric_limits<int32_t>::max())
    return "wgmma kernel: more than 2^31 - 1 work items";
  if (TensorMapEncoder() == nullptr) return "wgmma kernel: the driver has no cuTensorMapEncodeTiled";
  int major = 0, smem_max = 0;
  if (CurrentDeviceAttribute<cudaDevAttrComputeCapabilityMajor>(&major) != cudaSuccess ||
      major != 9)
    return "wgmma kernel: needs an sm_90 (Hopper) device";
  if (CurrentDeviceAttribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(&smem_max) !=
          cudaSuccess ||
      smem_max < SmemBytes(BlockN(p.K)))
    return "wgmma kernel: not enough shared memory per block";
  return nullptr;
}

template <typename T>
cudaError_t Launch(const ConvPoolParams& p, const ConvPoolBuffers<T>& b, cudaStream_t stream) {
  return BlockN(p.K) == 128 ? LaunchN<T, 128>(p, b, stream)
                            : LaunchN<T, 64>(p, b, stream);
}

template cudaError_t Launch<__nv_bfloat16>(const ConvPoolParams&,
                                           const ConvPoolBuffers<__nv_bfloat16>&, cudaStream_t);
template cudaError_t Launch<__half>(const ConvPoolParams&, const ConvPoolBuffers<__half>&,
                                    cudaStream_t);

}  // namespace conv_pool_wgmma
}  // namespace jaxcnn
