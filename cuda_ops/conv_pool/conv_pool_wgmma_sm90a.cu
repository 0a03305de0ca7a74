// Hopper fused 3x3 conv + bias + ReLU + 2x2/2 max-pool (see conv_pool_wgmma.h for the idea).
//
// Warp-specialized: one producer thread fills the shared-memory stages by TMA, two consumer
// warpgroups run the wgmmas and the pool epilogue; full/empty mbarriers hand stages over. A
// stage is one chunk of input channels of one tile:
//   x  the input tile with its 1-pixel halo, [halo pixel][kChunkC channels] (one 4-D TMA box;
//      outside the image TMA fills zeros = the conv padding), TMA's 64B (32 channels) or 32B
//      (16 channels) swizzle: a K-major operand whose 8-row groups are 8 consecutive pixels of
//      a halo row. The operand of filter tap (r, s) is the same tile started at pixel (r, s),
//      stepping one halo row per conv row. That start is mid swizzle pattern, which works
//      because wgmma, like TMA, swizzles by absolute shared-memory address bits (base offset
//      0; measured: setting the base offset from the address gives wrong results).
//   w  one tap's weights per 64 output channels, [kChunkC rows][64 channels], 128B swizzle:
//      HWIO rows as they are in memory, an MN-major operand (CUTLASS's usual tile). The
//      no-swizzle layout with 16-byte TMA rows ran the layer at 40% of this speed (half-used
//      L2 sectors).
// Two kinds of configuration (Shape and Config below; ConfigFor picks one per layer):
//   Pixels as M (128-channel blocks): a 16x16 tile is four 8x8 blocks, one m64 wgmma each
//      (x is A, w is B, N = 128); the two warpgroups share each tile (rows 0-7 / 8-15). In the
//      accumulator a thread holds two vertically adjacent outputs; the horizontal neighbour
//      is 4 lanes away: pool = register max + one shuffle.
//   Channels as M (64-channel blocks): D^T = W^T X^T, w is A (M = 64 output channels) and a
//      32x8 (28x8, 14x8) tile's pixels are B (N = 256, 224, 112): one m64n256 wgmma per tap and
//      k16 reads 10 KB
//      of shared memory per 128 cycles where four m64n64 ones read 16 KB (measured on VGG
//      c1_2: 87% of the measured bf16 peak with four m64n64, 96% this way). Each thread holds
//      whole 2x2 pool windows. Warpgroups take alternate tiles ("ping-pong": one's epilogue
//      overlaps the other's wgmmas; an ordering mbarrier keeps their stage waits in item
//      order). Where the whole filter is one 64-channel block of C <= 64 (VGG's c1_2) it is
//      loaded once per CTA and stays; the stages then hold x only.
// Without a pool (a 1x1/1 "pool": conv2d's algorithm "wgmma") the epilogue stores the conv
// output itself, by TMA from shared memory in the channels-as-M configurations.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "common/device_attribute.h"
#include "common/epilogue.cuh"
#include "common/tensor_map.h"
#include "common/wgmma_sm90.cuh"
#include "conv_pool/conv_pool_wgmma.h"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"

namespace jaxcnn {
namespace conv_pool_wgmma {
namespace {

using wgmma_sm90::Desc;
using wgmma_sm90::Fma;
using wgmma_sm90::Major;
using wgmma_sm90::PackPair;
using wgmma_sm90::ScaleOut;
constexpr int kTaps = 9;
constexpr int kSmemMax = 232448;  // 227 KB per CTA

// A kernel configuration.
//   Pixels as M (kChannelsM false): 128 output channels over a 16x16 tile; the consumers
//      share each stage, consumer c computing tile rows 8c..8c+7 (kRows = 8).
//   Channels as M: 64 output channels over consumer tiles of kRows x 8 pixels (wgmma
//      N = 8 * kRows: 32, 28 or 14 rows, so that 224-, 112-, 56-, 28- and 14-row images
//      need no padding rows). kPingPong: the consumers take alternate work items, each a
//      kRows-row tile; else they would share each stage (as pixels-as-M does), consumer c
//      computing rows c*kRows.. of a 2*kRows-row tile.
//   kResidentW (ping-pong, C <= 64): the CTA's filter is loaded once and stays; the stages
//      hold x only. Each CTA runs one 64-channel block (the grid is a multiple of the blocks;
//      VGG's c1_2 has one, a fire expand several); a centre-only block's is one tap per
//      chunk, so any C whose taps fit the region.
//   kStoreTile (unpooled channels-as-M only): the epilogue writes the tile into a 128B-swizzled
//      shared-memory buffer per consumer and one TMA store moves it out. Storing channel
//      pairs straight from the registers (16 of each 32-byte sector per instruction, the
//      consumer waiting on its stores) ran VGG-19's c2_1 at N=64 in 247 us, this way 181 us.
template <bool kChannelsMArg, int kRows, bool kPingPongArg, bool kResidentArg,
          bool kStoreTileArg = false>
struct Shape {
  static constexpr bool kChannelsM = kChannelsMArg;
  static constexpr bool kStoreTile = kStoreTileArg;
  static constexpr bool kPingPong = kPingPongArg;
  static constexpr bool kResidentW = kResidentArg;
  static constexpr int kConsumerRows = kRows;  // conv rows of one consumer's share
  static constexpr int kN = kChannelsM ? 64 : 128;  // output channels per work item
  static constexpr int kTileW = kChannelsM ? 8 : 16;
  static constexpr int kTileH = kPingPong ? kRows : 2 * kRows;
  static constexpr int kMmaN = kChannelsM ? 8 * kRows : 128;  // the wgmma's N
  static constexpr int kHaloW = kTileW + 2;
  static constexpr int kHaloPixels = (kTileH + 2) * kHaloW;
  static constexpr int kChunkC = kChannelsM ? 32 : 16;
  static constexpr int kRowBytes = kChunkC * 2;                 // x: one pixel
  static constexpr int kAtom = 8 * kRowBytes;                   // x: swizzle pattern repeat
  static constexpr uint32_t kXLayout = kRowBytes == 64 ? 2 : 3;  // descriptor: 64B / 32B swizzle
  static constexpr int kXSbo = kHaloW * kRowBytes;  // x: next conv row (next 8 pixels of M / N)
  static constexpr int kXBytesUsed = kHaloPixels * kRowBytes;
  static constexpr int kXBytes = (kXBytesUsed + kAtom - 1) / kAtom * kAtom;
  static constexpr int kWLbo = kChunkC * 128;  // w: next 64 output channels
  static constexpr int kWSbo = 8 * 128;        // w: next 8 input channels
  static constexpr int kWTapBytes = (kN / 64) * kChunkC * 128;
  static constexpr int kWBytes = kTaps * kWTapBytes;  // one chunk's weights
  static constexpr int kResidentChunks = 64 / kChunkC;   // C <= 64
  // All w (stages, or the resident filter) first (1024-byte aligned for the 128B swizzle),
  // then the consumers' output tiles (kStoreTile), the x stages, then the full[kStages],
  // empty[kStages], filter and order mbarriers.
  static constexpr int kWRegion = kResidentW ? kResidentChunks * kWBytes : 0;
  static constexpr int kYTileBytes = kStoreTile ? kTileH * kTileW * kN * 2 : 0;  // one consumer's
  static constexpr int kStageBytes = (kResidentW ? 0 : kWBytes) + kXBytes;
  static constexpr int kStages = (kSmemMax - kWRegion - 2 * kYTileBytes - 256) / kStageBytes;
  static constexpr int kYOffset = kResidentW ? kWRegion : kStages * kWBytes;
  static constexpr int kXOffset = kYOffset + 2 * kYTileBytes;
  static constexpr int kBarrierOffset = kXOffset + kStages * kXBytes;
  static constexpr int kSmemBytes = kBarrierOffset + (2 * kStages + 2) * 8;
  static constexpr int kStageTx = (kResidentW ? 0 : kWBytes) + kXBytesUsed;
  // Accumulators per consumer thread: channels-as-M one m64nN (N / 2); pixels-as-M two
  // m64n128 blocks (64 each), the consumer's half of the tile.
  static constexpr int kBlocks = kChannelsM ? 1 : 2;
  static constexpr int kAcc = kMmaN / 2;
  static_assert(kRows % 2 == 0, "whole pool windows per consumer");
  static_assert(!kResidentW || (kChannelsM && kPingPong), "resident filter: ping-pong only");
  static_assert(!kStoreTile || (kChannelsM && kPingPong && kYTileBytes % 1024 == 0),
                "stored tiles: channels-as-M ping-pong, whole 128B swizzle atoms");
  static_assert(kWTapBytes % 1024 == 0 && kXBytes % kAtom == 0, "TMA / swizzle alignment");
  static_assert(kStages >= 3 && kSmemBytes <= kSmemMax, "pipeline depth / shared memory");
};

// The configurations the launcher picks from (ConfigFor); numbered for LaunchConfig. Measured
// (H100, VGG-19's pooled layers, N=64 bf16) and dropped: both consumers sharing one 56x8 or
// 28x8 tile (the weights loaded once for twice the pixels) ran 1-5% slower than 28x8
// ping-pong where their tiles fit the image, and no faster than the resident filter on c1_2.
enum class Config {
  kPixelsM,             // K % 128 == 0
  kChannels32,          // ping-pong, 32x8 tiles
  kChannels32Resident,  // ping-pong, 32x8 tiles, resident filter (K == 64, C <= 64)
  kChannels28,          // ping-pong, 28x8 tiles
  kChannels14,          // ping-pong, 14x8 tiles
};

// Calls f(S{}) with the Shape of config c; store_tile (an unpooled layer) picks the stored-tile
// epilogue where the configuration has one (not 16x16 tiles, nor 32x8 ones without the
// resident filter: their stages would not leave room for the output tiles).
template <class F>
auto WithShape(Config c, F&& f, bool store_tile = false) {
  switch (c) {
    case Config::kPixelsM: return f(Shape<false, 8, false, false>{});
    case Config::kChannels32: return f(Shape<true, 32, true, false>{});
    case Config::kChannels32Resident:
      return store_tile ? f(Shape<true, 32, true, true, true>{})
                        : f(Shape<true, 32, true, true>{});
    case Config::kChannels28:
      return store_tile ? f(Shape<true, 28, true, false, true>{})
                        : f(Shape<true, 28, true, false>{});
    default:
      return store_tile ? f(Shape<true, 14, true, false, true>{})
                        : f(Shape<true, 14, true, false>{});
  }
}

struct Args {
  const void* bias;
  void* y;
  // Fire expand (LaunchFireExpand): output channels [0, k_center) are a 1x1 conv, the 3x3's
  // centre tap only, with weights from w1_map and bias_center; channels k_center.. are the
  // 3x3 conv (w_map, bias). 0: every channel is the 3x3 conv.
  const void* bias_center;
  int k_center;
  int C, K, PH, PW;
  int tiles_h, tiles_w, n_blocks, chunks;
  int work;  // N * tiles_h * tiles_w * n_blocks
  bool pool;  // 2x2/2 max pool, else none: y is the conv output itself (PH x PW = P x Q)
  // Any activation only without the pool (conv2d's epilogue); the pooled layers ReLU.
  EpilogueActivation act;
};


// A fire expand's 1x1 half (k_center == 0: a plain conv): its output channels come first in y.
template <typename T>
struct CenterBlock {
  int64_t k_center = 0;
  const T* w = nullptr;     // [C][k_center]
  const T* bias = nullptr;  // [k_center] or null
};

// The wgmma of a configuration: pixels-as-M is x (K-major) times w (MN-major), m64n128;
// channels-as-M is w (MN-major) times x (K-major), m64nN with N = 8 * rows of the tile.
template <typename T, class S>
using OpOf = typename wgmma_sm90::WgmmaOp<T, S::kMmaN, S::kChannelsM ? Major::MN : Major::K,
                                          S::kChannelsM ? Major::K : Major::MN>::type;

// max that propagates NaN (as the reference's reduce_window max does).
__device__ __forceinline__ float NanMax(float a, float b) { return (a != a || a > b) ? a : b; }

// bias[n], bias[n + 1] (zeros without a bias), loaded once per use.
// count: the channels bias holds (a centre-only layer's last block runs past K; its extra
// channels are clipped by the TMA store).
template <typename T>
__device__ __forceinline__ float2 BiasPair(const T* bias, int n, int count) {
  return bias == nullptr || n >= count ? make_float2(0.f, 0.f)
                         : make_float2(static_cast<float>(bias[n]), static_cast<float>(bias[n + 1]));
}

// bias, then the activation (common/epilogue.cuh). Pooled: always ReLU, which keeps NaN;
// max(acc) + bias then ReLU equals the pool of ReLU(acc + bias), and rounding once after the
// max equals the max of rounded values (all monotone).
__device__ __forceinline__ float Act(float v, float bias, const EpilogueActivation& act) {
  return ApplyActivation(act, v + bias);
}
__device__ __forceinline__ float BiasRelu(float v, float bias) {
  return ApplyActivation(Activation::kRelu, v + bias, 0.f);
}

struct Item {
  int img, oh0, ow0, n0;
};
template <class S>
__device__ __forceinline__ Item DecodeItem(const Args& a, int item) {
  Item it;
  const int nb = item % a.n_blocks;
  int rest = item / a.n_blocks;  // channel blocks innermost: they share the input tile in L2
  const int tx = rest % a.tiles_w;
  rest /= a.tiles_w;
  it.oh0 = (rest % a.tiles_h) * S::kTileH;
  it.img = rest / a.tiles_h;
  it.ow0 = tx * S::kTileW;
  it.n0 = nb * S::kN;
  return it;
}

// The bias of an item's output channels: bias[c - first] is channel c's.
template <typename T>
struct ItemBias {
  const T* bias;
  int first;
  int count;  // channels [first, first + count) have a bias
};
template <typename T, bool kFire>
__device__ __forceinline__ ItemBias<T> BiasOf(const Args& a, const Item& it) {
  if (kFire && it.n0 < a.k_center) return {static_cast<const T*>(a.bias_center), 0, a.k_center};
  return {static_cast<const T*>(a.bias), a.k_center, a.K - a.k_center};
}

// Pixels as M: pool the warpgroup's two 8x8 blocks (rows 2*warp, 2*warp + 1 of each: one
// pooled row; block blk covers tile columns 8*blk..).
template <typename T, class S>
__device__ __forceinline__ void EpiloguePixelsM(const Args& a, const Item& it,
                                                const ItemBias<T>& ib, int consumer,
                                                float (&acc)[S::kBlocks][S::kAcc]) {
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const T* bias = ib.bias;
  const int n_lane = it.n0 + 2 * (lane % 4);
  if (!a.pool) {
    // Elements 4j + {0, 1} are channels n_lane + 8j, +1 of conv row 2*warp, 4j + {2, 3} of
    // the row below; the column is the lane's quad.
#pragma unroll
    for (int blk = 0; blk < S::kBlocks; ++blk) {
      const int ow = it.ow0 + 8 * blk + lane / 4;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int oh = it.oh0 + S::kConsumerRows * consumer + 2 * warp + half;
        if (oh >= a.PH || ow >= a.PW) continue;
        uint32_t* y = reinterpret_cast<uint32_t*>(
            static_cast<T*>(a.y) +
            ((static_cast<int64_t>(it.img) * a.PH + oh) * a.PW + ow) * a.K + n_lane);
#pragma unroll
        for (int j = 0; j < S::kN / 8; ++j) {
          const float2 b = BiasPair(bias, n_lane + 8 * j - ib.first, ib.count);
          y[4 * j] = PackPair<T>(Act(acc[blk][4 * j + 2 * half], b.x, a.act),
                                 Act(acc[blk][4 * j + 2 * half + 1], b.y, a.act));
        }
      }
    }
    return;
  }
  const int ph = (it.oh0 + S::kConsumerRows * consumer + 2 * warp) / 2;
#pragma unroll
  for (int blk = 0; blk < S::kBlocks; ++blk) {
    const int pw = (it.ow0 + 8 * blk + lane / 4) / 2;
    const bool writer = (lane / 4) % 2 == 0 && ph < a.PH && pw < a.PW;
    uint32_t* y = reinterpret_cast<uint32_t*>(
        static_cast<T*>(a.y) +
        ((static_cast<int64_t>(it.img) * a.PH + ph) * a.PW + pw) * a.K + n_lane);
#pragma unroll
    for (int j = 0; j < S::kN / 8; ++j) {
      float v0 = NanMax(acc[blk][4 * j], acc[blk][4 * j + 2]);  // rows 2*warp, 2*warp + 1
      float v1 = NanMax(acc[blk][4 * j + 1], acc[blk][4 * j + 3]);
      v0 = NanMax(v0, __shfl_xor_sync(0xffffffffu, v0, 4));  // the next column's lane
      v1 = NanMax(v1, __shfl_xor_sync(0xffffffffu, v1, 4));
      if (writer) {
        const float2 b = BiasPair(bias, n_lane + 8 * j - ib.first, ib.count);
        y[4 * j] = PackPair<T>(BiasRelu(v0, b.x), BiasRelu(v1, b.y));  // 8 channels = 4 words
      }
    }
  }
}

// Channels as M: accumulator element 4j + e of lane l in warp w is output channel
// 16w + l/4 (+8 for e >= 2) at tile pixel (row j, column 2(l%4) + e%2), so pooled row pr,
// column l%4 is the max of elements 8pr + {0, 1, 4, 5} (+2 for the upper channel). Lanes
// 4 apart hold neighbouring channels: one exchange gives each lane a channel pair to store
// (even l/4: channels c, c+1; odd: c+7, c+8).
// A consumer of a shared tile holds its rows row0.. (pooled rows row0/2..). y_tile: the
// consumer's output tile in shared memory (S::kStoreTile; the caller stores it by TMA).
template <typename T, class S>
__device__ __forceinline__ void EpilogueChannelsM(const Args& a, const Item& it,
                                                  const ItemBias<T>& ib, int row0,
                                                  uint32_t y_tile,
                                                  float (&acc)[S::kBlocks][S::kAcc]) {
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const T* bias = ib.bias;
  const bool even = (lane / 4) % 2 == 0;
  const int c_lo = it.n0 + 16 * warp + lane / 4;  // this lane's lower channel
  T* y_img = static_cast<T*>(a.y) + static_cast<int64_t>(it.img) * a.PH * a.PW * a.K;
  if (!a.pool) {
    // Row j: elements 4j + {0, 1} are channel c_lo at columns 2(l%4), +1, 4j + {2, 3} channel
    // c_lo + 8. Even lanes trade their right column for the partner's left one: each lane then
    // holds channel pairs of one pixel (even: c_lo, +1 and +8, +9 at the left column; odd:
    // c_lo - 1, c_lo and +7, +8 at the right one).
    const int col = 2 * (lane % 4) + (even ? 0 : 1);
    const int c_pair = even ? c_lo : c_lo - 1;
    const float2 b_lo = BiasPair(bias, c_pair - ib.first, ib.count),
                 b_hi = BiasPair(bias, c_pair + 8 - ib.first, ib.count);
#pragma unroll
    for (int j = 0; j < S::kConsumerRows; ++j) {
      const float* d = &acc[0][4 * j];
      const float r0 = __shfl_xor_sync(0xffffffffu, even ? d[1] : d[0], 4);
      const float r1 = __shfl_xor_sync(0xffffffffu, even ? d[3] : d[2], 4);
      const uint32_t lo = PackPair<T>(Act(even ? d[0] : r0, b_lo.x, a.act),
                                      Act(even ? r0 : d[1], b_lo.y, a.act));
      const uint32_t hi = PackPair<T>(Act(even ? d[2] : r1, b_hi.x, a.act),
                                      Act(even ? r1 : d[3], b_hi.y, a.act));
      if constexpr (S::kStoreTile) {
        // [row][column][64 channels], 128-byte pixels, TMA's 128B swizzle: the 16-byte chunk
        // index XORed with the pixel's index mod 8 (here the column), so the 8 pixels of one
        // store land in different banks.
        const int c = c_pair - it.n0;
        const uint32_t pixel = y_tile + (j * S::kTileW + col) * 128 + (c % 8) * 2;
        asm volatile("st.shared.u32 [%0], %1;" ::"r"(pixel + (((c / 8) ^ col) * 16)), "r"(lo));
        asm volatile("st.shared.u32 [%0], %1;" ::"r"(pixel + (((c / 8 + 1) ^ col) * 16)),
                     "r"(hi));
      } else {
        const int oh = it.oh0 + row0 + j, ow = it.ow0 + col;
        if (oh >= a.PH || ow >= a.PW) continue;
        uint32_t* y = reinterpret_cast<uint32_t*>(
            y_img + (static_cast<int64_t>(oh) * a.PW + ow) * a.K + c_pair);
        y[0] = lo;
        y[4] = hi;  // channels + 8: 4 words on
      }
    }
    return;
  }
  const int c_store = even ? c_lo : c_lo + 7;
  const int pw = it.ow0 / 2 + lane % 4;
  const float2 b = BiasPair(bias, c_store - ib.first, ib.count);
#pragma unroll
  for (int pr = 0; pr < S::kConsumerRows / 2; ++pr) {
    const float* d = &acc[0][8 * pr];
    const float lo = NanMax(NanMax(d[0], d[1]), NanMax(d[4], d[5]));
    const float hi = NanMax(NanMax(d[2], d[3]), NanMax(d[6], d[7]));
    const float other = __shfl_xor_sync(0xffffffffu, even ? hi : lo, 4);
    const int ph = (it.oh0 + row0) / 2 + pr;
    if (ph < a.PH && pw < a.PW) {
      const float v0 = even ? lo : other, v1 = even ? other : hi;
      *reinterpret_cast<uint32_t*>(y_img + (static_cast<int64_t>(ph) * a.PW + pw) * a.K +
                                   c_store) = PackPair<T>(BiasRelu(v0, b.x), BiasRelu(v1, b.y));
    }
  }
}

template <class S>
__device__ __forceinline__ void FenceAcc(float (&acc)[S::kBlocks][S::kAcc]) {
#pragma unroll
  for (int blk = 0; blk < S::kBlocks; ++blk)
#pragma unroll
    for (int i = 0; i < S::kAcc; ++i) cute::warpgroup_fence_operand(acc[blk][i]);
}

// Threads: warpgroup 0 produces (one thread issues the TMA loads), 1 and 2 consume.
constexpr int kKernelThreads = 3 * 128;

// kFire: a fire expand's kernel (Args::k_center > 0 possible); the plain conv's kernels have no
// branch around their wgmmas (ptxas would insert warpgroup fences into them).
template <typename T, class S, bool kFire>
__global__ void __launch_bounds__(kKernelThreads, 1)
    conv_pool_wgmma_kernel(const __grid_constant__ CUtensorMap x_map,
                           const __grid_constant__ CUtensorMap w_map,
                           const __grid_constant__ CUtensorMap y_map,
                           const __grid_constant__ CUtensorMap w1_map, const Args a) {
  using Op = OpOf<T, S>;
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  using EmptyBarrier = cutlass::arch::ClusterBarrier;
  extern __shared__ __align__(1024) uint8_t smem[];
  auto* full = reinterpret_cast<FullBarrier*>(smem + S::kBarrierOffset);
  auto* empty = reinterpret_cast<EmptyBarrier*>(full + S::kStages);
  auto* filter_loaded = reinterpret_cast<FullBarrier*>(empty + S::kStages);
  // Ping-pong: phase i completes once item i's consumer has waited on all its stages. An
  // mbarrier wait knows only the parity of its current phase, so a consumer that started
  // waiting on item i+1's stages earlier could pass a stage two phases ahead of the producer
  // (when an item has at least as many chunks as there are stages).
  auto* order = reinterpret_cast<EmptyBarrier*>(filter_loaded + 1);
  // Warp-uniform for the compiler (a shuffle): a fire expand's branch on its items' kind then
  // does not serialize the wgmmas.
  const int wg = cutlass::canonical_warp_group_idx();
  const int items = a.work > static_cast<int>(blockIdx.x)
                        ? (a.work - 1 - static_cast<int>(blockIdx.x)) / gridDim.x + 1
                        : 0;
  const int steps = items * a.chunks;

  if (threadIdx.x == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      full[s].init(1);
      // One arrival per warp reading the stage: one warpgroup (ping-pong) or both.
      empty[s].init(S::kPingPong ? 4 : 2 * 4);
    }
    filter_loaded->init(1);
    order->init(4);
    cutlass::arch::fence_barrier_init();
    cute::prefetch_tma_descriptor(&x_map);
    cute::prefetch_tma_descriptor(&w_map);
    if (a.k_center > 0) cute::prefetch_tma_descriptor(&w1_map);
    if constexpr (S::kStoreTile) cute::prefetch_tma_descriptor(&y_map);
  }
  __syncthreads();

  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x != 0) return;
    auto load_w = [&](uint8_t* sw, uint64_t* bar, int n0, int c0) {
#pragma unroll
      for (int tap = 0; tap < kTaps; ++tap)
#pragma unroll
        for (int h = 0; h < S::kN / 64; ++h)
          cute::SM90_TMA_LOAD_2D::copy(&w_map, bar, 0,
                                       sw + tap * S::kWTapBytes + h * S::kChunkC * 128,
                                       n0 + 64 * h, tap * a.C + c0);
    };
    if constexpr (S::kResidentW) {
      // The CTA's one channel block (the launcher makes the grid a multiple of the blocks):
      // all its chunks' taps, or for a centre-only block the one tap per chunk, packed.
      const int n0 = DecodeItem<S>(a, blockIdx.x).n0;
      const bool center = kFire && n0 < a.k_center;
      uint64_t* bar = reinterpret_cast<uint64_t*>(filter_loaded);
      filter_loaded->arrive_and_expect_tx(a.chunks * (center ? S::kWTapBytes : S::kWBytes));
      for (int chunk = 0; chunk < a.chunks; ++chunk) {
        if (center)
          cute::SM90_TMA_LOAD_2D::copy(&w1_map, bar, 0, smem + chunk * S::kWTapBytes, n0,
                                       chunk * S::kChunkC);
        else
          load_w(smem + chunk * S::kWBytes, bar, n0 - a.k_center, chunk * S::kChunkC);
      }
    }
    for (int t = 0; t < steps; ++t) {
      const int stage = t % S::kStages;
      empty[stage].wait(((t / S::kStages) & 1) ^ 1);
      const Item it = DecodeItem<S>(a, blockIdx.x + (t / a.chunks) * gridDim.x);
      const int c0 = (t % a.chunks) * S::kChunkC;
      uint64_t* bar = reinterpret_cast<uint64_t*>(&full[stage]);
      // A centre-only item's stage holds one tap of weights.
      const bool center = kFire && !S::kResidentW && it.n0 < a.k_center;
      full[stage].arrive_and_expect_tx(center ? S::kXBytesUsed + S::kWTapBytes : S::kStageTx);
      cute::SM90_TMA_LOAD_4D::copy(&x_map, bar, 0, smem + S::kXOffset + stage * S::kXBytes, c0,
                                   it.ow0 - 1, it.oh0 - 1, it.img);
      if constexpr (!S::kResidentW) {
        if (center) {
#pragma unroll
          for (int h = 0; h < S::kN / 64; ++h)
            cute::SM90_TMA_LOAD_2D::copy(&w1_map, bar, 0,
                                         smem + stage * S::kWBytes + h * S::kChunkC * 128,
                                         it.n0 + 64 * h, c0);
        } else {
          load_w(smem + stage * S::kWBytes, bar, it.n0 - a.k_center, c0);
        }
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<232>();
  const int consumer = wg - 1;
  const bool release_lane = threadIdx.x % 32 == 0;
  // Never zeroed or copied by ordinary code: the first wgmma of a tile overwrites (scale 0),
  // so the compiler need not wait on in-flight wgmmas to move them.
  float acc[S::kBlocks][S::kAcc];
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int first = S::kPingPong ? consumer : 0, stride = S::kPingPong ? 2 : 1;
  // This consumer's conv rows of a shared tile.
  const int row0 = S::kPingPong ? 0 : S::kConsumerRows * consumer;
  if constexpr (S::kResidentW) filter_loaded->wait(0);
  for (int item = first; item < items; item += stride) {
    if (S::kPingPong && item > 0) order->wait((item - 1) & 1);
    // (Decoded again after the mainloop: live across it, the item costs the largest tiles
    // registers they spill.)
    const bool center =
        kFire && DecodeItem<S>(a, blockIdx.x + item * gridDim.x).n0 < a.k_center;
    int held = -1;  // the stage whose wgmmas may still be reading
    for (int chunk = 0, t = item * a.chunks; chunk < a.chunks; ++chunk, ++t) {
      const int stage = t % S::kStages;
      full[stage].wait((t / S::kStages) & 1);
      const uint32_t x_base = smem_base + S::kXOffset + stage * S::kXBytes;
      const uint32_t w_base =
          smem_base + (!S::kResidentW ? stage * S::kWBytes
                                      : chunk * (center ? S::kWTapBytes : S::kWBytes));
      // Tap (r, s) with its weights at w_tap: the tile's view from pixel (r, s) on.
      auto mma_tap = [&](uint32_t w_tap, int r, int s, bool first_tap) {
#pragma unroll
        for (int kk = 0; kk < S::kChunkC / 16; ++kk) {
          const uint64_t dw = Desc(w_tap + kk * 16 * 128, S::kWLbo, S::kWSbo, 1);
          const ScaleOut scale =
              (chunk > 0 || !first_tap || kk > 0) ? ScaleOut::One : ScaleOut::Zero;
          // LBO is unused by swizzled K-major layouts (16 bytes, as CUTLASS sets it).
#pragma unroll
          for (int blk = 0; blk < S::kBlocks; ++blk) {
            const uint64_t dx = Desc(
                x_base + ((row0 + r) * S::kHaloW + 8 * blk + s) * S::kRowBytes + kk * 32, 16,
                S::kXSbo, S::kXLayout);
            if constexpr (S::kChannelsM)
              Fma<Op>(dw, dx, acc[blk], scale, std::make_integer_sequence<int, S::kAcc>{});
            else
              Fma<Op>(dx, dw, acc[blk], scale, std::make_integer_sequence<int, S::kAcc>{});
          }
        }
      };
      FenceAcc<S>(acc);
      cute::warpgroup_arrive();
      if constexpr (kFire) {
        if (center) {
          mma_tap(w_base, 1, 1, true);  // a 1x1 conv: the centre tap alone, its weights first
        } else {
#pragma unroll
          for (int tap = 0; tap < kTaps; ++tap)
            mma_tap(w_base + tap * S::kWTapBytes, tap / 3, tap % 3, tap == 0);
        }
      } else {
#pragma unroll
        for (int tap = 0; tap < kTaps; ++tap)
          mma_tap(w_base + tap * S::kWTapBytes, tap / 3, tap % 3, tap == 0);
      }
      cute::warpgroup_commit_batch();
      // Every lane of this warp is past its last wait of the item (the wgmmas are warp-wide).
      if (S::kPingPong && chunk == a.chunks - 1 && release_lane) order->arrive();
      // Keep this step's wgmmas in flight; the previous step's are done: free its stage.
      cute::warpgroup_wait<1>();
      if (held >= 0 && release_lane) empty[held].arrive();
      held = stage;
    }
    cute::warpgroup_wait<0>();
    FenceAcc<S>(acc);
    if (release_lane) empty[held].arrive();
    const Item it = DecodeItem<S>(a, blockIdx.x + item * gridDim.x);
    const ItemBias<T> ib = BiasOf<T, kFire>(a, it);
    if constexpr (S::kStoreTile) {
      // The consumer's output tile: its previous TMA store must have read it (the issuing
      // thread waits, the named barrier tells the rest); written, it is fenced for the async
      // proxy and stored by one thread. TMA clips the rows and columns past the image.
      const bool leader = threadIdx.x % 128 == 0;
      const uint32_t y_tile = smem_base + S::kYOffset + consumer * S::kYTileBytes;
      if (leader) cute::tma_store_wait<0>();
      cutlass::arch::NamedBarrier::sync(128, consumer);
      EpilogueChannelsM<T, S>(a, it, ib, row0, y_tile, acc);
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(128, consumer);
      if (leader) {
        cute::SM90_TMA_STORE_4D::copy(&y_map, smem + S::kYOffset + consumer * S::kYTileBytes,
                                      it.n0, it.ow0, it.oh0, it.img);
        cute::tma_store_arrive();
      }
    } else if constexpr (S::kChannelsM) {
      EpilogueChannelsM<T, S>(a, it, ib, row0, 0, acc);
    } else {
      EpiloguePixelsM<T, S>(a, it, ib, consumer, acc);
    }
  }
  // Shared memory must outlive the last store's reads.
  if (S::kStoreTile && threadIdx.x % 128 == 0) cute::tma_store_wait<0>();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <class S>
int64_t WorkOf(const ConvPoolParams& p) {
  return p.N * CeilDiv(p.P, S::kTileH) * CeilDiv(p.Q, S::kTileW) * CeilDiv(p.K, S::kN);
}

int SmCount() {
  int sms = 0;
  if (CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>(&sms) != cudaSuccess || sms < 1)
    sms = 1;
  return sms;
}

// The busiest CTA's share of the tensor-core work in conv outputs x output channels: its
// work items (persistent CTAs, one per SM) times the outputs of one, padding included.
template <class S>
int64_t CriticalPath(const ConvPoolParams& p, int sms) {
  return CeilDiv(WorkOf<S>(p), sms) * S::kTileH * S::kTileW * S::kN;
}

// The configuration whose busiest SM has the least work, weighted by how fast each runs its
// work (measured on VGG-19's pooled layers, H100, N=64 bf16: per padded output, 16x16 tiles
// ran 0-8% slower than 28x8 ones and 14x8 tiles (m64n112 wgmmas, half the work per shared-memory
// read of the operand) about 1.4x slower). Ties go to the earlier one.
// A 1x1/1 pool: conv2d's unpooled layer (stored tiles where the configuration has them).
bool Unpooled(const ConvPoolParams& p) { return p.pool_h == 1; }

// fire_expand: channels-as-M only (64-channel blocks never straddle the 1x1 / 3x3 boundary;
// LaunchFireExpand decides on the resident filter itself).
// sms: the SMs to spread the work over (0: the current device's).
Config ConfigFor(const ConvPoolParams& p, bool fire_expand = false, int sms = 0) {
  if (p.K == 64 && p.C <= 64 && !fire_expand) return Config::kChannels32Resident;
  struct Candidate {
    Config config;
    int weight;
  };
  constexpr Candidate kCandidates[] = {{Config::kChannels28, 20},
                                       {Config::kChannels32, 20},
                                       {Config::kPixelsM, 21},
                                       {Config::kChannels14, 28}};
  if (sms <= 0) sms = SmCount();
  Config best = Config::kChannels28;
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  for (const Candidate& c : kCandidates) {
    if (c.config == Config::kPixelsM && (p.K % 128 != 0 || fire_expand)) continue;
    if (c.config == Config::kChannels32 && Unpooled(p)) continue;  // no stored-tile variant
    const int64_t cost =
        c.weight * WithShape(c.config, [&](auto s) { return CriticalPath<decltype(s)>(p, sms); });
    if (cost < best_cost) best = c.config, best_cost = cost;
  }
  return best;
}

// Persistent CTAs: one per SM; with the resident filter a multiple of the channel blocks (each
// CTA keeps to one).
template <class S>
int64_t GridOf(int64_t work, int64_t n_blocks) {
  const int64_t sms = SmCount();
  return std::min<int64_t>(work, S::kResidentW ? std::max<int64_t>(sms / n_blocks, 1) * n_blocks
                                               : sms);
}

int64_t Work(const ConvPoolParams& p) {
  return WithShape(ConfigFor(p), [&](auto s) { return WorkOf<decltype(s)>(p); });
}

template <typename T>
constexpr CUtensorMapDataType kTmaType = std::is_same_v<T, __nv_bfloat16>
                                             ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;

// Tensor maps (innermost dimension first, strides in bytes for dimensions 1..):
//   x: [N][H][W][C], box = one chunk's halo tile, [pixel][kChunkC], 64B / 32B swizzle;
//   w: [R*S*C][K], box = kChunkC rows x 64 output channels, 128B swizzle;
//   y (S::kStoreTile: unpooled, PH x PW = P x Q): [N][P][Q][K], box = one consumer's tile of
//      64 channels, 128B swizzle.
//   w1 (a fire expand's 1x1 weights): [C][k_center], boxes as w's; else a copy of w's map.
template <typename T, class S>
cudaError_t EncodeMaps(const ConvPoolParams& p, const ConvPoolBuffers<T>& b,
                       const CenterBlock<T>& center, CUtensorMap* x_map, CUtensorMap* w_map,
                       CUtensorMap* y_map, CUtensorMap* w1_map) {
  const EncodeTiledFn encode = TensorMapEncoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  constexpr cuuint64_t e = sizeof(T);
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(p.C), static_cast<cuuint64_t>(p.W),
                              static_cast<cuuint64_t>(p.H), static_cast<cuuint64_t>(p.N)};
  const cuuint64_t strides[3] = {p.C * e, p.W * p.C * e, p.H * p.W * p.C * e};
  const cuuint32_t box[4] = {S::kChunkC, S::kTileW + 2, S::kTileH + 2, 1};
  CUresult r = encode(x_map, kTmaType<T>, 4, const_cast<T*>(b.x), dims, strides, box, unit,
                      CU_TENSOR_MAP_INTERLEAVE_NONE,
                      S::kRowBytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_32B,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  // [rows][k] weights, rows of k channels: the 3x3 filter's (its k = K - k_center) or the 1x1's.
  auto encode_w = [&](CUtensorMap* map, const T* w, int64_t k, int64_t rows) {
    const cuuint64_t w_dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
    const cuuint64_t w_strides[1] = {k * e};
    const cuuint32_t w_box[2] = {64, S::kChunkC};
    return encode(map, kTmaType<T>, 2, const_cast<T*>(w), w_dims, w_strides, w_box, unit,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  // Maps a layer does not read are copies of the other (a plain conv has no 1x1 part, a
  // centre-only one no 3x3 part).
  if (center.k_center > 0) {
    r = encode_w(w1_map, center.w, center.k_center, p.C);
    if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  }
  if (p.K > center.k_center) {
    r = encode_w(w_map, b.w, p.K - center.k_center, kTaps * p.C);
    if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  }
  if (center.k_center == 0) *w1_map = *w_map;
  if (p.K == center.k_center) *w_map = *w1_map;
  if constexpr (S::kStoreTile) {
    const cuuint64_t y_dims[4] = {static_cast<cuuint64_t>(p.K), static_cast<cuuint64_t>(p.PW),
                                  static_cast<cuuint64_t>(p.PH), static_cast<cuuint64_t>(p.N)};
    const cuuint64_t y_strides[3] = {p.K * e, p.PW * p.K * e, p.PH * p.PW * p.K * e};
    const cuuint32_t y_box[4] = {64, S::kTileW, S::kTileH, 1};
    r = encode(y_map, kTmaType<T>, 4, b.y, y_dims, y_strides, y_box, unit,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  }
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <typename T, class S, bool kFire = false>
cudaError_t LaunchShape(const ConvPoolParams& p, const ConvPoolBuffers<T>& b,
                        const EpilogueActivation& act,
                        cudaStream_t stream, const CenterBlock<T>& center = {}) {
  Args a{};
  a.pool = p.pool_h == 2;
  a.act = a.pool ? EpilogueActivation{Activation::kRelu, 0.f} : act;
  a.bias = b.bias, a.y = b.y;
  a.bias_center = center.bias;
  a.k_center = static_cast<int>(center.k_center);
  a.C = static_cast<int>(p.C), a.K = static_cast<int>(p.K);
  a.PH = static_cast<int>(p.PH), a.PW = static_cast<int>(p.PW);
  a.tiles_h = static_cast<int>(CeilDiv(p.P, S::kTileH));
  a.tiles_w = static_cast<int>(CeilDiv(p.Q, S::kTileW));
  a.n_blocks = static_cast<int>(CeilDiv(p.K, S::kN));  // a partial block: center-only K < 64
  a.chunks = static_cast<int>(p.C / S::kChunkC);
  a.work = static_cast<int>(WorkOf<S>(p));
  CUtensorMap x_map{}, w_map{}, y_map{}, w1_map{};
  cudaError_t status = EncodeMaps<T, S>(p, b, center, &x_map, &w_map, &y_map, &w1_map);
  if (status != cudaSuccess) return status;
  auto kernel = conv_pool_wgmma_kernel<T, S, kFire>;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                S::kSmemBytes);
  if (status != cudaSuccess) return status;
  const int64_t grid = GridOf<S>(a.work, a.n_blocks);
  kernel<<<static_cast<unsigned>(grid), kKernelThreads, S::kSmemBytes, stream>>>(
      x_map, w_map, y_map, w1_map, a);
  return cudaGetLastError();
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int BlockN(const ConvPoolParams& p) {
  return WithShape(ConfigFor(p), [](auto s) { return decltype(s)::kN; });
}

void TileShape(const ConvPoolParams& p, int* tile_h, int* tile_w) {
  WithShape(ConfigFor(p), [&](auto s) {
    *tile_h = decltype(s)::kTileH, *tile_w = decltype(s)::kTileW;
    return 0;
  });
}

namespace {

// Shared memory per CTA of the configuration ConfigFor picks over `sms` SMs (0: the current
// device's).
int64_t SmemBytesOver(const ConvPoolParams& p, int sms) {
  return WithShape(
      ConfigFor(p, false, sms), [](auto s) { return int64_t{decltype(s)::kSmemBytes}; },
      Unpooled(p));
}

}  // namespace

int64_t SmemBytes(const ConvPoolParams& p) { return SmemBytesOver(p, 0); }

int64_t Grid(const ConvPoolParams& p) { return std::min<int64_t>(Work(p), SmCount()); }

const char* UnsupportedReason(const ConvPoolParams& p, int dtype_bytes, bool is_float,
                              const void* x, const void* w, const void* y,
                              const DeviceLimits* device) {
  if (is_float || dtype_bytes != 2) return "wgmma kernel: bfloat16 / float16 only";
  if (p.R != 3 || p.S != 3 || p.stride_h != 1 || p.stride_w != 1 || p.dilation_h != 1 ||
      p.dilation_w != 1 || p.pad_top != 1 || p.pad_left != 1 || p.P != p.H || p.Q != p.W)
    return "wgmma kernel: 3x3 conv, stride 1, padding 1 (SAME) only";
  const bool no_pool = p.pool_h == 1 && p.pool_w == 1 && p.pool_stride_h == 1 &&
                       p.pool_stride_w == 1 && p.PH == p.P && p.PW == p.Q;
  const bool pool_2x2 = p.pool_h == 2 && p.pool_w == 2 && p.pool_stride_h == 2 &&
                        p.pool_stride_w == 2 && p.PH == p.P / 2 && p.PW == p.Q / 2;
  if ((!no_pool && !pool_2x2) || p.pool_pad_top != 0 || p.pool_pad_left != 0)
    return "wgmma kernel: 2x2 stride-2 unpadded (VALID) pool (or 1x1, none) only";
  if (p.C % kChannelMultiple != 0) return "wgmma kernel: C must be a multiple of 32";
  if (p.K % 64 != 0) return "wgmma kernel: K must be a multiple of 64";
  if (!Aligned16(x) || !Aligned16(w) || !Aligned16(y))
    return "wgmma kernel: x, w and y must be 16-byte aligned";
  if (Work(p) > std::numeric_limits<int32_t>::max())
    return "wgmma kernel: more than 2^31 - 1 work items";
  const char* not_hopper = "wgmma kernel: needs an sm_90 (Hopper) device";
  const char* no_smem = "wgmma kernel: not enough shared memory per block";
  if (device != nullptr)
    return HopperDeviceUnsupportedReason(*device, SmemBytesOver(p, device->sm_count), not_hopper,
                                         no_smem);
  if (TensorMapEncoder() == nullptr) return "wgmma kernel: the driver has no cuTensorMapEncodeTiled";
  return HopperDeviceUnsupportedReason(SmemBytes(p), not_hopper, no_smem);
}

template <typename T>
cudaError_t Launch(const ConvPoolParams& p, const ConvPoolBuffers<T>& b, cudaStream_t stream,
                   const EpilogueActivation& act) {
  return WithShape(
      ConfigFor(p), [&](auto s) { return LaunchShape<T, decltype(s)>(p, b, act, stream); },
      Unpooled(p));
}

const char* ConfigName(int config) {
  static const char* const kNames[kConfigs] = {"16x16 tile, 128 channels", "32x8 ping-pong",
                                               "32x8 ping-pong, resident filter",
                                               "28x8 ping-pong", "14x8 ping-pong"};
  return config >= 0 && config < kConfigs ? kNames[config] : "?";
}

bool ConfigTakes(int config, const ConvPoolParams& p) {
  if (config < 0 || config >= kConfigs) return false;
  const Config c = static_cast<Config>(config);
  if (c == Config::kPixelsM) return p.K % 128 == 0;
  if (c == Config::kChannels32Resident) return p.K == 64 && p.C <= 64;
  return true;
}

int ChosenConfig(const ConvPoolParams& p) { return static_cast<int>(ConfigFor(p)); }

template <typename T>
cudaError_t LaunchConfig(const ConvPoolParams& p, const ConvPoolBuffers<T>& b, int config,
                         cudaStream_t stream, const EpilogueActivation& act) {
  if (!ConfigTakes(config, p)) return cudaErrorInvalidValue;
  return WithShape(
      static_cast<Config>(config), [&](auto s) { return LaunchShape<T, decltype(s)>(p, b, act, stream); }, Unpooled(p));
}

// The fire expand as the kernel's layer: a 3x3 SAME conv of s, unpooled, with every output
// channel (both halves) in K.
ConvPoolParams FireExpandAsConv(const FireExpandParams& f) {
  ConvPoolParams p{};
  p.N = f.N, p.H = f.H, p.W = f.W, p.C = f.S;
  p.R = p.S = 3, p.K = f.E1 + f.E3;
  p.stride_h = p.stride_w = 1, p.pad_top = p.pad_left = 1, p.dilation_h = p.dilation_w = 1;
  p.P = p.PH = f.H, p.Q = p.PW = f.W;
  p.pool_h = p.pool_w = p.pool_stride_h = p.pool_stride_w = 1;
  return p;
}

const char* FireExpandUnsupportedReason(const FireExpandParams& f, int dtype_bytes, bool is_float,
                                        const void* s, const void* w1, const void* w3,
                                        const void* y, const DeviceLimits* device) {
  const bool both = f.E1 > 0 && f.E3 > 0 && f.E1 % 64 == 0 && f.E3 % 64 == 0;
  const bool only_1x1 = f.E3 == 0 && f.E1 > 0 && f.E1 % 8 == 0;
  if (!both && !only_1x1)
    return "wgmma fire expand: expand1 and expand3 channels must be positive multiples of 64 "
           "(or no expand3 and expand1 a multiple of 8)";
  if (!Aligned16(w1)) return "wgmma fire expand: the 1x1 weights must be 16-byte aligned";
  // The 3x3 checks on the layer with K rounded up to whole 64-channel blocks (the last block
  // of a 1x1-only layer is clipped).
  ConvPoolParams p = FireExpandAsConv(f);
  p.K = CeilDiv(p.K, 64) * 64;
  return UnsupportedReason(p, dtype_bytes, is_float, s, only_1x1 ? w1 : w3, y, device);
}

// The fire module ReLUs both expands and its squeeze.
constexpr EpilogueActivation kFireRelu{Activation::kRelu, 0.f};

template <typename T>
cudaError_t LaunchFireExpand(const FireExpandParams& f, const FireExpandBuffers<T>& b,
                             cudaStream_t stream) {
  const ConvPoolParams p = FireExpandAsConv(f);
  const ConvPoolBuffers<T> conv{b.s, b.w3, b.b3, b.y};
  const CenterBlock<T> center{f.E1, b.w1, b.b1};
  // ConfigFor leaves a fire expand (unpooled, channels as M) 28x8 or 14x8 tiles, both with the
  // stored-tile epilogue; each CTA keeps its channel block's filter where it fits. Measured on
  // the headline fire (H100, N = 64, 55x55; squeeze + expand): streaming the filter with every
  // item (3 stages, each consumer holding one; 37 KB of L2 reads per 28 KB tile stored) took
  // 86 us, resident 79 us; 14x8 tiles for either launch 91-106 us; a TMA prefetch into L2 of
  // the x tiles 2-4 items ahead 94-98 us.
  const int chunks = static_cast<int>(p.C / kChannelMultiple);
  auto launch = [&](auto resident, auto streamed) {
    using R = decltype(resident);
    const bool fits = f.E3 == 0 ? chunks * R::kWTapBytes <= R::kWRegion
                                : chunks <= R::kResidentChunks;
    return fits ? LaunchShape<T, R, true>(p, conv, kFireRelu, stream, center)
                : LaunchShape<T, decltype(streamed), true>(p, conv, kFireRelu, stream, center);
  };
  if (ConfigFor(p, /*fire_expand=*/true) == Config::kChannels14)
    return launch(Shape<true, 14, true, true, true>{}, Shape<true, 14, true, false, true>{});
  return launch(Shape<true, 28, true, true, true>{}, Shape<true, 28, true, false, true>{});
}

template cudaError_t LaunchFireExpand<__nv_bfloat16>(const FireExpandParams&,
                                                     const FireExpandBuffers<__nv_bfloat16>&,
                                                     cudaStream_t);
template cudaError_t LaunchFireExpand<__half>(const FireExpandParams&,
                                              const FireExpandBuffers<__half>&, cudaStream_t);
template cudaError_t LaunchConfig<__nv_bfloat16>(const ConvPoolParams&,
                                                 const ConvPoolBuffers<__nv_bfloat16>&, int,
                                                 cudaStream_t, const EpilogueActivation&);
template cudaError_t LaunchConfig<__half>(const ConvPoolParams&, const ConvPoolBuffers<__half>&,
                                          int, cudaStream_t, const EpilogueActivation&);
template cudaError_t Launch<__nv_bfloat16>(const ConvPoolParams&,
                                           const ConvPoolBuffers<__nv_bfloat16>&, cudaStream_t,
                                           const EpilogueActivation&);
template cudaError_t Launch<__half>(const ConvPoolParams&, const ConvPoolBuffers<__half>&,
                                    cudaStream_t, const EpilogueActivation&);

}  // namespace conv_pool_wgmma
}  // namespace jaxcnn
