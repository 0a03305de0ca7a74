// The fire module as one TMA + wgmma kernel (see fire_fused_wgmma.h for the idea).
//
// Warp-specialized like conv_pool_wgmma_sm90a.cu, whose operand layouts it reuses: one producer
// thread fills the stages by TMA, two consumer warpgroups take alternate tiles (ping-pong, an
// ordering mbarrier keeps their stage waits in item order). Shared memory:
//   expand weights, resident: per 64-channel block [S rows][64 channels] per tap, 128B swizzle
//      (an MN-major A operand); the 1x1 blocks one tap, the 3x3 blocks nine;
//   y tiles, one per consumer: [28 rows][8 columns][64 channels], 128B swizzle, stored by TMA;
//   s tiles, one per consumer: the squeeze over the 30x10 halo, [pixel][32 channels], 64B
//      swizzle by absolute address as TMA writes it: the expand's K-major B operand, tap (r, s)
//      being the tile viewed from halo pixel (r, s) on, as the conv kernel views its x tile;
//   stages: a 32-channel chunk of the x halo tile (TMA zero-fills outside the image) as the
//      squeeze's K-major A operand, and the matching [32 rows][32 channels] of w_sq (64B
//      swizzle, an MN-major B operand).
// Measured on the headline fire (H100, N = 64, 55x55, 128 -> 32 -> (128, 128); selftest graph
// times, each against the step before on the same machine): the stmatrix epilogue 62.1 us
// (shuffles + 4-byte stores: 68.2); each squeeze stage given back as soon as its wgmmas are
// done 63.6 (held until the next chunk arrived: 66.6). Dropped, all slower than 63.6: TMA L2
// prefetch of the next tile's x (73.4 us) or of the tile's chunks past the stages (67.5),
// 256-byte L2 promotion of x (64.2), y tiles copied out by the consumer threads instead of
// TMA stores (67.5). Report: benchmarks/results/h100-2026-11-27-fire_one_launch.md.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "common/device_attribute.h"
#include "common/tensor_map.h"
#include "common/wgmma_sm90.cuh"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "fusion/fire_fused_wgmma.h"

namespace jaxcnn {
namespace fire_fused_wgmma {
namespace {

using wgmma_sm90::Desc;
using wgmma_sm90::Fma;
using wgmma_sm90::kSwizzle128B;
using wgmma_sm90::kSwizzle64B;
using wgmma_sm90::Major;
using wgmma_sm90::PackPair;
using wgmma_sm90::ScaleOut;

constexpr int kSmemMax = 232448;  // 227 KB per CTA
constexpr int kTaps = 9;
constexpr int kSqueeze = 32;       // squeeze channels (s: one 64-byte row per pixel)
constexpr int kChunkC = 32;        // input channels per stage
constexpr int kTileH = 28, kTileW = 8;  // output tile: m64n224 over 64 channels
constexpr int kHaloW = kTileW + 2, kHaloH = kTileH + 2;
constexpr int kHaloPixels = kHaloW * kHaloH;  // 300
constexpr int kRowBytes = 64;                 // one pixel of x's chunk, of s
constexpr int kSqueezeBlocks = 5;             // m64 blocks over the halo (320 rows, 300 used)
constexpr int kXLoadBytes = kHaloPixels * kRowBytes;
constexpr int kXBytes = kSqueezeBlocks * 64 * kRowBytes;  // the last block reads past the tile
constexpr int kWsqBytes = kChunkC * kSqueeze * 2;
constexpr int kStageBytes = kXBytes + kWsqBytes;
constexpr int kSTileBytes = (kHaloPixels * kRowBytes + 1023) / 1024 * 1024;
constexpr int kYTileBytes = kTileH * kTileW * 64 * 2;
constexpr int kTapBytes = kSqueeze * 64 * 2;  // one tap of one 64-channel block
constexpr int kMmaN = kTileH * kTileW;        // 224
constexpr int kAcc = kMmaN / 2;               // accumulators per consumer thread
constexpr int kSqueezeAcc = kSqueeze / 2;     // per m64n32 block
static_assert(kXBytes % 1024 == 0 && kStageBytes % 1024 == 0 && kYTileBytes % 1024 == 0,
              "swizzle alignment");

constexpr int kKernelThreads = 3 * 128;  // producer warpgroup, two consumers

// Shared-memory offsets (bytes) for a given expand width.
struct Layout {
  int blocks1, blocks3;  // 64-channel blocks of the 1x1 / 3x3 expand
  int w3, y, s, stages_at, barriers, stages, biases, bytes;
};

Layout LayoutOf(const FireParams& p) {
  Layout l{};
  l.blocks1 = static_cast<int>(p.E1 / 64);
  l.blocks3 = static_cast<int>(p.E3 / 64);
  l.w3 = l.blocks1 * kTapBytes;
  l.y = l.w3 + l.blocks3 * kTaps * kTapBytes;
  l.s = l.y + 2 * kYTileBytes;
  l.stages_at = l.s + 2 * kSTileBytes;
  const int free = kSmemMax - l.stages_at - 256 - static_cast<int>(p.E1 + p.E3) * 4;
  l.stages = std::max(0, std::min(4, free / kStageBytes));
  l.barriers = l.stages_at + l.stages * kStageBytes;
  l.biases = l.barriers + (2 * l.stages + 2) * 8;
  l.bytes = l.biases + static_cast<int>(p.E1 + p.E3) * 4;
  return l;
}

struct Args {
  const void* b_sq;
  const void* b1;
  const void* b3;
  int H, W, E1, E3;
  int chunks, tiles_h, tiles_w, work;
  int blocks1, blocks3;
  int w3, y, s, stages_at, barriers, stages, biases;
};

struct Tile {
  int img, oh0, ow0;
};
__device__ __forceinline__ Tile TileOf(const Args& a, int item) {
  Tile t;
  const int tx = item % a.tiles_w;  // tile columns innermost: neighbours share halos in L2
  const int rest = item / a.tiles_w;
  t.ow0 = tx * kTileW;
  t.oh0 = (rest % a.tiles_h) * kTileH;
  t.img = rest / a.tiles_h;
  return t;
}

template <typename T>
__device__ __forceinline__ float Load(const void* p, int i) {
  return p == nullptr ? 0.f : static_cast<float>(static_cast<const T*>(p)[i]);
}

// bias, then ReLU that keeps NaN.
__device__ __forceinline__ float Relu(float v, float bias) {
  v += bias;
  return v < 0.f ? 0.f : v;
}

template <int kCount>
__device__ __forceinline__ void FenceAcc(float (&acc)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) cute::warpgroup_fence_operand(acc[i]);
}

// The squeeze's m64n32 accumulators (block blk in acc[16 blk ..]: element 4j + e is halo
// pixel 64 blk + 16 warp + lane/4 (+8 for e >= 2), channel 8j + 2(lane%4) + e%2) as s: bias,
// ReLU, zero outside the image, rounded to T, at pixel p's 64-byte row with its 16-byte
// chunks XORed by address bits 7-8 (TMA's 64B swizzle; the tile is 1024-byte aligned).
template <typename T>
__device__ __forceinline__ void StoreSqueeze(const Args& a, const Tile& t, uint32_t s_tile,
                                             const float (&bias)[8],
                                             const float (&acc)[kSqueezeBlocks * kSqueezeAcc]) {
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int blk = 0; blk < kSqueezeBlocks; ++blk)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int p = 64 * blk + 16 * warp + lane / 4 + 8 * half;
      if (p >= kHaloPixels) continue;
      const int ih = t.oh0 - 1 + p / kHaloW, iw = t.ow0 - 1 + p % kHaloW;
      const bool inside = ih >= 0 && ih < a.H && iw >= 0 && iw < a.W;
      const uint32_t row = s_tile + p * kRowBytes + (lane % 4) * 4;
#pragma unroll
      for (int j = 0; j < kSqueeze / 8; ++j) {
        const float* d = &acc[kSqueezeAcc * blk + 4 * j + 2 * half];
        const uint32_t v =
            inside ? PackPair<T>(Relu(d[0], bias[2 * j]), Relu(d[1], bias[2 * j + 1])) : 0u;
        asm volatile("st.shared.u32 [%0], %1;" ::"r"(row + ((j ^ ((p >> 1) & 3)) << 4)), "r"(v));
      }
    }
}

// One 64-channel block's m64n224 accumulators (element 4j + e: channel 16 warp + lane/4 (+8
// for e >= 2) at tile row j, column 2(lane%4) + e%2) into the consumer's y tile: bias, ReLU,
// rounded to T; [row][column][64 channels], 128-byte pixels, TMA's 128B swizzle (16-byte
// chunk XOR pixel mod 8). Each 8 channels x 8 pixels of a warp is one transposed stmatrix
// (lane 8i + r gives pixel r's row of matrix i): 14 stmatrix.x4 a warp, where pairing the
// channels by shuffles and 4-byte stores took 56 of each.
// bias: the block's 64 fp32 biases in shared memory.
template <typename T>
__device__ __forceinline__ void StoreBlock(const float* bias, uint32_t y_tile,
                                           const float (&acc)[kAcc]) {
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const float b_lo = bias[16 * warp + lane / 4], b_hi = bias[16 * warp + lane / 4 + 8];
  const int r = lane % 8, matrix = lane / 8;  // matrices: (rows j, j + 1) x (channels, +8)
  const uint32_t row = y_tile + ((matrix / 2) * kTileW + r) * 128 +
                       (((2 * warp + matrix % 2) ^ r) << 4);
#pragma unroll
  for (int j = 0; j < kTileH; j += 2) {
    const float* d0 = &acc[4 * j];
    const float* d1 = &acc[4 * (j + 1)];
    const uint32_t m0 = PackPair<T>(Relu(d0[0], b_lo), Relu(d0[1], b_lo));
    const uint32_t m1 = PackPair<T>(Relu(d0[2], b_hi), Relu(d0[3], b_hi));
    const uint32_t m2 = PackPair<T>(Relu(d1[0], b_lo), Relu(d1[1], b_lo));
    const uint32_t m3 = PackPair<T>(Relu(d1[2], b_hi), Relu(d1[3], b_hi));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                     row + j * kTileW * 128),
                 "r"(m0), "r"(m1), "r"(m2), "r"(m3));
  }
}

template <typename T>
__global__ void __launch_bounds__(kKernelThreads, 1)
    fire_fused_wgmma_kernel(const __grid_constant__ CUtensorMap x_map,
                            const __grid_constant__ CUtensorMap wsq_map,
                            const __grid_constant__ CUtensorMap w1_map,
                            const __grid_constant__ CUtensorMap w3_map,
                            const __grid_constant__ CUtensorMap y_map, const Args a) {
  using SqueezeOp = typename wgmma_sm90::WgmmaOp<T, kSqueeze, Major::K, Major::MN>::type;
  using ExpandOp = typename wgmma_sm90::WgmmaOp<T, kMmaN, Major::MN, Major::K>::type;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  extern __shared__ __align__(1024) uint8_t smem[];
  auto* full = reinterpret_cast<FullBarrier*>(smem + a.barriers);
  auto* empty = reinterpret_cast<EmptyBarrier*>(full + a.stages);
  auto* weights_loaded = reinterpret_cast<FullBarrier*>(empty + a.stages);
  // Phase i completes once item i's consumer has waited on all its stages (see
  // conv_pool_wgmma_sm90a.cu: a consumer must not pass a stage two phases ahead).
  auto* order = reinterpret_cast<EmptyBarrier*>(weights_loaded + 1);
  const int wg = cutlass::canonical_warp_group_idx();
  const int items = a.work > static_cast<int>(blockIdx.x)
                        ? (a.work - 1 - static_cast<int>(blockIdx.x)) / gridDim.x + 1
                        : 0;

  if (threadIdx.x == 0) {
    for (int s = 0; s < a.stages; ++s) {
      full[s].init(1);
      empty[s].init(4);  // one arrival per warp of the consuming warpgroup
    }
    weights_loaded->init(1);
    order->init(4);
    cutlass::arch::fence_barrier_init();
    cute::prefetch_tma_descriptor(&x_map);
    cute::prefetch_tma_descriptor(&wsq_map);
    cute::prefetch_tma_descriptor(&w1_map);
    cute::prefetch_tma_descriptor(&w3_map);
    cute::prefetch_tma_descriptor(&y_map);
  }
  __syncthreads();

  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x != 0) return;
    uint64_t* wbar = reinterpret_cast<uint64_t*>(weights_loaded);
    weights_loaded->arrive_and_expect_tx((a.blocks1 + kTaps * a.blocks3) * kTapBytes);
    for (int b = 0; b < a.blocks1; ++b)
      cute::SM90_TMA_LOAD_2D::copy(&w1_map, wbar, 0, smem + b * kTapBytes, 64 * b, 0);
    for (int b = 0; b < a.blocks3; ++b)
      for (int tap = 0; tap < kTaps; ++tap)
        cute::SM90_TMA_LOAD_2D::copy(&w3_map, wbar, 0,
                                     smem + a.w3 + (b * kTaps + tap) * kTapBytes, 64 * b,
                                     tap * kSqueeze);
    const int steps = items * a.chunks;
    for (int t = 0; t < steps; ++t) {
      const int stage = t % a.stages;
      empty[stage].wait(((t / a.stages) & 1) ^ 1);
      const Tile tile = TileOf(a, blockIdx.x + (t / a.chunks) * gridDim.x);
      const int c0 = (t % a.chunks) * kChunkC;
      uint64_t* bar = reinterpret_cast<uint64_t*>(&full[stage]);
      uint8_t* at = smem + a.stages_at + stage * kStageBytes;
      full[stage].arrive_and_expect_tx(kXLoadBytes + kWsqBytes);
      cute::SM90_TMA_LOAD_4D::copy(&x_map, bar, 0, at, c0, tile.ow0 - 1, tile.oh0 - 1, tile.img);
      cute::SM90_TMA_LOAD_2D::copy(&wsq_map, bar, 0, at + kXBytes, 0, c0);
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<232>();
  const int consumer = wg - 1;
  const bool release_lane = threadIdx.x % 32 == 0;
  const bool leader = threadIdx.x % 128 == 0;
  const int lane = threadIdx.x % 32;
  float sq_bias[8];  // this lane's squeeze channels 8j + 2(lane%4) + {0, 1}
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    sq_bias[2 * j] = Load<T>(a.b_sq, 8 * j + 2 * (lane % 4));
    sq_bias[2 * j + 1] = Load<T>(a.b_sq, 8 * j + 2 * (lane % 4) + 1);
  }
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t s_tile = smem_base + a.s + consumer * kSTileBytes;
  const uint32_t y_tile = smem_base + a.y + consumer * kYTileBytes;
  uint8_t* const y_tile_ptr = smem + a.y + consumer * kYTileBytes;
  // Both expands' biases as one fp32 table in y's channel order, loaded once: the epilogues
  // then read shared memory only.
  float* const bias = reinterpret_cast<float*>(smem + a.biases);
  for (int i = threadIdx.x - 128; i < a.E1 + a.E3; i += 256)
    bias[i] = i < a.E1 ? Load<T>(a.b1, i) : Load<T>(a.b3, i - a.E1);
  cutlass::arch::NamedBarrier::sync(256, 2);
  weights_loaded->wait(0);
  for (int item = consumer; item < items; item += 2) {
    if (item > 0) order->wait((item - 1) & 1);
    // 1. The squeeze over the halo tile, a chunk of input channels per stage. Its
    // accumulators and the expand's are zeroed where they start (the first wgmma overwrites
    // them anyway) so that neither is live across the other's wgmmas: one array for both
    // made the compiler copy the squeeze's out of the wgmma registers, which serializes every
    // wgmma of the kernel (ptxas C7514).
    float sq_acc[kSqueezeBlocks * kSqueezeAcc];
#pragma unroll
    for (int i = 0; i < kSqueezeBlocks * kSqueezeAcc; ++i) sq_acc[i] = 0.f;
    for (int chunk = 0, t = item * a.chunks; chunk < a.chunks; ++chunk, ++t) {
      const int stage = t % a.stages;
      full[stage].wait((t / a.stages) & 1);
      const uint32_t x_base = smem_base + a.stages_at + stage * kStageBytes;
      const uint32_t w_base = x_base + kXBytes;
      FenceAcc(sq_acc);
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < kChunkC / 16; ++kk) {
        // w_sq: MN-major, 8-row (input channel) groups 512 bytes apart; x: K-major, 8 pixels
        // per 512 bytes (LBO unused by swizzled K-major layouts).
        const uint64_t dw = Desc(w_base + kk * 16 * kRowBytes, kWsqBytes, 8 * kRowBytes,
                                 kSwizzle64B);
        const ScaleOut scale = (chunk > 0 || kk > 0) ? ScaleOut::One : ScaleOut::Zero;
#pragma unroll
        for (int blk = 0; blk < kSqueezeBlocks; ++blk)
          Fma<SqueezeOp>(Desc(x_base + blk * 64 * kRowBytes + kk * 32, 16, 8 * kRowBytes,
                              kSwizzle64B),
                         dw, &sq_acc[kSqueezeAcc * blk], scale,
                         std::make_integer_sequence<int, kSqueezeAcc>{});
      }
      cute::warpgroup_commit_batch();
      if (chunk == a.chunks - 1 && release_lane) order->arrive();
      // The stage goes back as soon as its few wgmmas are done: holding it until the next
      // chunk arrived cost every tile a third DRAM round trip (the stages hold half a tile).
      cute::warpgroup_wait<0>();
      if (release_lane) empty[stage].arrive();
    }
    FenceAcc(sq_acc);
    const Tile tile = TileOf(a, blockIdx.x + item * gridDim.x);
    // The previous item's expand wgmmas (which read s_tile) are complete: each block waited.
    StoreSqueeze<T>(a, tile, s_tile, sq_bias, sq_acc);
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by wgmma
    cutlass::arch::NamedBarrier::sync(128, consumer);

    // 2-3. Every 64-channel block of the expands, stored into its slice of y.
    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
    auto store = [&](int n0) {
      if (leader) cute::tma_store_wait<0>();  // the previous block's store has read y_tile
      cutlass::arch::NamedBarrier::sync(128, consumer);
      StoreBlock<T>(bias + n0, y_tile, acc);
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(128, consumer);
      if (leader) {
        cute::SM90_TMA_STORE_4D::copy(&y_map, y_tile_ptr, n0, tile.ow0, tile.oh0, tile.img);
        cute::tma_store_arrive();
      }
    };
    // Tap (r, s) of weights w_tap: the s tile viewed from halo pixel (r, s) on, one 10-pixel
    // halo row per conv row (SBO).
    auto mma_tap = [&](uint32_t w_tap, int r, int s, bool first) {
#pragma unroll
      for (int kk = 0; kk < kSqueeze / 16; ++kk) {
        const uint64_t dw = Desc(w_tap + kk * 16 * 128, kSqueeze * 128, 8 * 128, kSwizzle128B);
        const uint64_t ds =
            Desc(s_tile + (r * kHaloW + s) * kRowBytes + kk * 32, 16, kHaloW * kRowBytes,
                 kSwizzle64B);
        Fma<ExpandOp>(dw, ds, acc, (first && kk == 0) ? ScaleOut::Zero : ScaleOut::One,
                      std::make_integer_sequence<int, kAcc>{});
      }
    };
    for (int b = 0; b < a.blocks1; ++b) {
      FenceAcc(acc);
      cute::warpgroup_arrive();
      mma_tap(smem_base + b * kTapBytes, 1, 1, true);  // the 1x1: the centre tap alone
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      FenceAcc(acc);
      store(64 * b);
    }
    for (int b = 0; b < a.blocks3; ++b) {
      const uint32_t w = smem_base + a.w3 + b * kTaps * kTapBytes;
      FenceAcc(acc);
      cute::warpgroup_arrive();
#pragma unroll
      for (int tap = 0; tap < kTaps; ++tap)
        mma_tap(w + tap * kTapBytes, tap / 3, tap % 3, tap == 0);
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      FenceAcc(acc);
      store(a.E1 + 64 * b);
    }
  }
  // Shared memory must outlive the last store's reads.
  if (leader) cute::tma_store_wait<0>();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t WorkOf(const FireParams& p) {
  return p.N * CeilDiv(p.H, kTileH) * CeilDiv(p.W, kTileW);
}

int SmCount() {
  int sms = 0;
  if (CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>(&sms) != cudaSuccess || sms < 1)
    sms = 1;
  return sms;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
constexpr CUtensorMapDataType kTmaType = std::is_same_v<T, __nv_bfloat16>
                                             ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;

// Tensor maps (innermost dimension first, strides in bytes for dimensions 1..):
//   x [N][H][W][C], box = one chunk of the halo tile, 64B swizzle;
//   w_sq [C][S], box = 32 rows (input channels) x 32, 64B swizzle;
//   w_e1 [S][E1], w_e3 [9 S][E3], box = S rows x 64 output channels, 128B swizzle;
//   y [N][H][W][E1 + E3], box = 64 channels of the 28x8 tile, 128B swizzle.
template <typename T>
cudaError_t EncodeMaps(const FireParams& p, const FireBuffers<T>& b, CUtensorMap* x_map,
                       CUtensorMap* wsq_map, CUtensorMap* w1_map, CUtensorMap* w3_map,
                       CUtensorMap* y_map) {
  const EncodeTiledFn encode = TensorMapEncoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  constexpr cuuint64_t e = sizeof(T);
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  auto image = [&](CUtensorMap* map, const T* ptr, int64_t channels, cuuint32_t box_c,
                   cuuint32_t box_w, cuuint32_t box_h, CUtensorMapSwizzle swizzle,
                   CUtensorMapL2promotion promotion) {
    const cuuint64_t dims[4] = {static_cast<cuuint64_t>(channels), static_cast<cuuint64_t>(p.W),
                                static_cast<cuuint64_t>(p.H), static_cast<cuuint64_t>(p.N)};
    const cuuint64_t strides[3] = {channels * e, p.W * channels * e, p.H * p.W * channels * e};
    const cuuint32_t box[4] = {box_c, box_w, box_h, 1};
    return encode(map, kTmaType<T>, 4, const_cast<T*>(ptr), dims, strides, box, unit,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  auto matrix = [&](CUtensorMap* map, const T* ptr, int64_t cols, int64_t rows, cuuint32_t box_c,
                    cuuint32_t box_r, CUtensorMapSwizzle swizzle) {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {cols * e};
    const cuuint32_t box[2] = {box_c, box_r};
    return encode(map, kTmaType<T>, 2, const_cast<T*>(ptr), dims, strides, box, unit,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  const CUresult results[5] = {
      image(x_map, b.x, p.C, kChunkC, kHaloW, kHaloH, CU_TENSOR_MAP_SWIZZLE_64B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_128B),
      matrix(wsq_map, b.w_sq, p.S, p.C, kSqueeze, kChunkC, CU_TENSOR_MAP_SWIZZLE_64B),
      matrix(w1_map, b.w_e1, p.E1, p.S, 64, kSqueeze, CU_TENSOR_MAP_SWIZZLE_128B),
      matrix(w3_map, b.w_e3, p.E3, kTaps * p.S, 64, kSqueeze, CU_TENSOR_MAP_SWIZZLE_128B),
      image(y_map, b.y, p.E1 + p.E3, 64, kTileW, kTileH, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_NONE)};
  for (CUresult r : results)
    if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  return cudaSuccess;
}

// Shared memory per CTA (0 where the expand weights leave no room for two stages).
int64_t SmemBytes(const FireParams& p) {
  const Layout l = LayoutOf(p);
  return l.stages >= 2 ? l.bytes : 0;
}

// Persistent CTAs: one per SM.
int64_t Grid(const FireParams& p) { return std::min<int64_t>(WorkOf(p), SmCount()); }

}  // namespace

const char* UnsupportedReason(const FireParams& p, int dtype_bytes, bool is_float, const void* x,
                              const void* w_sq, const void* w_e1, const void* w_e3,
                              const void* y, const DeviceLimits* device) {
  if (is_float || dtype_bytes != 2) return "fused wgmma fire: bfloat16 / float16 only";
  if (p.S != kSqueeze) return "fused wgmma fire: 32 squeeze channels only";
  if (p.C <= 0 || p.C % kChunkC != 0) return "fused wgmma fire: C must be a multiple of 32";
  if (p.E1 <= 0 || p.E3 <= 0 || p.E1 % 64 != 0 || p.E3 % 64 != 0)
    return "fused wgmma fire: expand1 and expand3 channels must be positive multiples of 64";
  if (LayoutOf(p).stages < 2)
    return "fused wgmma fire: the expand weights leave no room for two pipeline stages";
  if (!Aligned16(x) || !Aligned16(w_sq) || !Aligned16(w_e1) || !Aligned16(w_e3) || !Aligned16(y))
    return "fused wgmma fire: x, y and the weights must be 16-byte aligned";
  if (WorkOf(p) > std::numeric_limits<int32_t>::max())
    return "fused wgmma fire: more than 2^31 - 1 tiles";
  const char* not_hopper = "fused wgmma fire: needs an sm_90 (Hopper) device";
  const char* no_smem = "fused wgmma fire: not enough shared memory per block";
  if (device != nullptr) return HopperDeviceUnsupportedReason(*device, SmemBytes(p), not_hopper, no_smem);
  if (TensorMapEncoder() == nullptr)
    return "fused wgmma fire: the driver has no cuTensorMapEncodeTiled";
  return HopperDeviceUnsupportedReason(SmemBytes(p), not_hopper, no_smem);
}

template <typename T>
cudaError_t Launch(const FireParams& p, const FireBuffers<T>& b, cudaStream_t stream) {
  const Layout l = LayoutOf(p);
  if (l.stages < 2) return cudaErrorInvalidValue;
  Args a{};
  a.b_sq = b.b_sq, a.b1 = b.b_e1, a.b3 = b.b_e3;
  a.H = static_cast<int>(p.H), a.W = static_cast<int>(p.W), a.E1 = static_cast<int>(p.E1);
  a.E3 = static_cast<int>(p.E3);
  a.chunks = static_cast<int>(p.C / kChunkC);
  a.tiles_h = static_cast<int>(CeilDiv(p.H, kTileH));
  a.tiles_w = static_cast<int>(CeilDiv(p.W, kTileW));
  a.work = static_cast<int>(WorkOf(p));
  a.blocks1 = l.blocks1, a.blocks3 = l.blocks3;
  a.w3 = l.w3, a.y = l.y, a.s = l.s, a.stages_at = l.stages_at, a.barriers = l.barriers;
  a.biases = l.biases;
  a.stages = l.stages;
  CUtensorMap x_map{}, wsq_map{}, w1_map{}, w3_map{}, y_map{};
  cudaError_t status = EncodeMaps<T>(p, b, &x_map, &wsq_map, &w1_map, &w3_map, &y_map);
  if (status != cudaSuccess) return status;
  auto kernel = fire_fused_wgmma_kernel<T>;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, l.bytes);
  if (status != cudaSuccess) return status;
  kernel<<<static_cast<unsigned>(Grid(p)), kKernelThreads, l.bytes, stream>>>(
      x_map, wsq_map, w1_map, w3_map, y_map, a);
  return cudaGetLastError();
}

template cudaError_t Launch<__nv_bfloat16>(const FireParams&, const FireBuffers<__nv_bfloat16>&,
                                           cudaStream_t);
template cudaError_t Launch<__half>(const FireParams&, const FireBuffers<__half>&, cudaStream_t);

}  // namespace fire_fused_wgmma
}  // namespace jaxcnn
