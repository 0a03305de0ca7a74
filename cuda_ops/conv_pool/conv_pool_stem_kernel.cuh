// Stem kernel of the fused conv + bias + ReLU + max-pool: the network's first layer, whose few
// input channels (an RGB image: C = 3) make GEMM-K = R * S * C small (27 to ~500). There the
// mma.sync kernel (conv_pool_tc_kernel, flat-K mode) is mostly latency: every CTA gathers its
// 128 x 32 im2col elements one by one from global memory for a single pipeline step.
//
// conv_pool_stem_kernel (sm_80+; TMA loads on sm_90), persistent: each CTA loads its kBlockK
// columns of the weights (GEMM-K x kBlockK, zero rows up to a multiple of 32) into shared
// memory once, then walks output tiles. A tile is pooled_h x pooled_w pooled outputs of one
// image; it needs a conv tile of conv_h x conv_w outputs (<= kMaxM: overlapping pools' shared
// rows/columns are recomputed by the neighbour tile) and an input tile of in_h rows of
// in_w * C contiguous NHWC elements.
//   load      the input tile, double buffered: with TMA (x viewed as [N][H][W * C]; zero fill
//             outside the image is the conv padding; boxes start on 16-byte boundaries, so a
//             row lands up to 15 bytes in) the next tiles load while this one computes; else
//             (rows not 16-byte multiples, or no TMA) element-wise loads.
//   mainloop  mma.sync (warps kWarpsM (M) x kWarpsN (N), each 32 x 64) whose A fragments are
//             gathered straight from the input tile: im2col element (m, kf) sits at
//             moff(m) + kofs[kf], a row offset per conv output (registers) plus a column
//             offset per GEMM-K index (a table built once per CTA). m16n8k16 bf16/fp16 (B by
//             ldmatrix), or m16n8k8 TF32 for float at precision "default" (inputs rounded to
//             TF32, as XLA's DEFAULT does).
//   epilogue  the accumulators start from the bias (kept in shared memory as fp32); the
//             activation (ReLU for pooled layers: one cvt.relu per pair; any code of
//             common/epilogue.cuh for conv2d's unpooled use) and one rounding to T into the
//             conv tile in shared memory,
//             then each thread max-reduces a (pooled pixel, 16 bytes of channels) window from
//             it (positions outside the conv output are the pool's -inf padding; NaN
//             propagates) and stores 16 bytes of y. The conv tile never reaches DRAM.
// A tile is a few hundred conv outputs of K = 27..160, so per-tile bookkeeping costs as much as
// the MMAs: tile indices are 32-bit (the launcher caps the tile count), each thread keeps one
// 16-byte channel slice for every pool item, and 3x3 / 2x2 windows of tiles away from the
// image border are unrolled without bounds checks.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; the launcher encodes it)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/epilogue.cuh"
#include "conv_pool/conv_pool_kernels.cuh"

namespace jaxcnn {
namespace conv_pool {

constexpr int kStemThreads = 256;  // 8 warps
constexpr int kStemChunk = 32;     // GEMM-K rows of the weights are padded to this multiple
constexpr int kStemMinBlocks = 2;  // CTAs per SM the register budget is set for
constexpr int kStemInAlign = 128;  // input buffers' alignment (TMA destinations)

template <typename T, int kWarpsN>
struct StemShape {
  static constexpr bool kTf32 = sizeof(T) == 4;
  static constexpr int kWarpsM = 8 / kWarpsN;
  static constexpr int kBlockK = 64 * kWarpsN;  // output channels per CTA (8 n8 tiles a warp)
  static constexpr int kMaxM = kWarpsM * 32;    // conv outputs per tile (2 m16 tiles a warp)
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  // Same bank arguments as TcShape: 16-bit rows for ldmatrix (row bytes / 16 odd); fp32 rows
  // for the TF32 B fragments' scalar loads and the epilogue's float2 stores (stride = 8 mod 32).
  static constexpr int kBStride = kTf32 ? kBlockK + 8 : PaddedStride(kBlockK);
  static constexpr int kOutStride = kBStride;
  static constexpr int kOutBytes = kMaxM * kOutStride * static_cast<int>(sizeof(T));
};

// Elements of one input buffer: in_h rows of in_stride, rounded up to kStemInAlign bytes.
template <typename T>
__host__ __device__ constexpr int64_t StemInBufElems(int64_t in_h, int64_t in_stride) {
  constexpr int64_t per = kStemInAlign / static_cast<int64_t>(sizeof(T));
  return (in_h * in_stride + per - 1) / per * per;
}

// Shared memory of one CTA: weights [kf_pad][kBStride], conv tile, GEMM-K offsets (kf_pad
// ints), the channel block's bias (kBlockK floats), two input buffers, two mbarriers; each part
// 128-byte aligned.
template <typename T, int kWarpsN>
__host__ __device__ constexpr int64_t StemSmemBytes(int64_t kf_pad, int64_t in_buf_elems) {
  using Shape = StemShape<T, kWarpsN>;
  auto up = [](int64_t b) { return (b + kStemInAlign - 1) / kStemInAlign * kStemInAlign; };
  return up(kf_pad * Shape::kBStride * static_cast<int64_t>(sizeof(T))) + up(Shape::kOutBytes) +
         up(kf_pad * 4) + up(Shape::kBlockK * 4) +
         2 * in_buf_elems * static_cast<int64_t>(sizeof(T)) + 16;
}

// Everything the kernel needs, computed by the launcher (conv_pool.cu).
struct StemArgs {
  int H, W, C, K, S;
  int stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
  int P, Q;
  int pool_h, pool_w, pool_stride_h, pool_stride_w, pool_pad_top, pool_pad_left;
  int PH, PW;
  int pooled_h, pooled_w;  // pooled outputs per tile
  int conv_h, conv_w;      // conv outputs per tile: (pooled - 1) * pool stride + pool window
  int in_h, in_row;        // input tile: rows, elements per row ((in_w) * C)
  int in_stride;           // elements between input-tile rows in shared memory (>= in_row)
  int64_t in_buf_elems;    // elements per input buffer
  int tiles_h, tiles_w;    // tiles per image
  int64_t tiles;           // N * tiles_h * tiles_w (the launcher keeps it below 2^31)
  int rsc;                 // GEMM-K = R * S * C
  int kf_pad;              // rsc rounded up to kStemChunk
  int use_tma;             // 1: input tiles by TMA (x_map); 0: element-wise loads
  EpilogueActivation act;  // after the bias (ReLU for every pooled layer)
};

// ---- mbarrier + TMA (sm_90; the launcher sets use_tma only there): the input tile's
// asynchronous load.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define JAXCNN_STEM_TMA 1
#endif
__device__ __forceinline__ void MbarInit(uint64_t* bar, int count) {
#ifdef JAXCNN_STEM_TMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mma::SmemAddr(bar)), "r"(count));
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void MbarExpectTx(uint64_t* bar, uint32_t bytes) {
#ifdef JAXCNN_STEM_TMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mma::SmemAddr(bar)),
               "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
#ifdef JAXCNN_STEM_TMA
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "STEM_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra STEM_WAIT;\n"
      "}\n" ::"r"(mma::SmemAddr(bar)),
      "r"(parity)
      : "memory");
#endif
}
// Input tile (rows ih0.., elements col0.. of image n) -> dst, completing on bar.
__device__ __forceinline__ void TmaLoadInputTile(void* dst, const CUtensorMap* map, int col0,
                                                 int ih0, int n, uint64_t* bar) {
#ifdef JAXCNN_STEM_TMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // after generic reads of dst
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(mma::SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col0), "r"(ih0), "r"(n), "r"(mma::SmemAddr(bar))
      : "memory");
#endif
}

// Two fp32 values ReLU'd and rounded to T, packed (lo in the low half); NaN stays NaN.
template <typename T>
__device__ __forceinline__ uint32_t PackRelu(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.relu.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Two fp32 values through the activation, rounded to T and packed (lo in the low half).
template <typename T>
__device__ __forceinline__ uint32_t PackAct(float lo, float hi, const EpilogueActivation& act) {
  if (act.act == Activation::kRelu) return PackRelu<T>(lo, hi);
  return PackPair<T>(ApplyActivation(act, lo), ApplyActivation(act, hi));
}

// Epilogue 1: the warp's 2 x 8 m16n8 accumulator tiles (bias already in them) through the
// activation and rounded to T into the conv tile (rows row0 + 16 mt + g | + 8, columns
// col0 + 8 nt + 2q | + 1).
template <typename T, int kOutStride>
__device__ __forceinline__ void StemStoreAct(T* tile, int row0, int col0,
                                             const float (&acc)[2][8][4],
                                             const EpilogueActivation& act) {
  const int g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    T* lo = tile + (row0 + mt * 16 + g) * kOutStride + col0 + 2 * q;
    T* hi = lo + 8 * kOutStride;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float(&d)[4] = acc[mt][nt];
      if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float2*>(lo + nt * 8) =
            make_float2(ApplyActivation(act, d[0]), ApplyActivation(act, d[1]));
        *reinterpret_cast<float2*>(hi + nt * 8) =
            make_float2(ApplyActivation(act, d[2]), ApplyActivation(act, d[3]));
      } else {
        *reinterpret_cast<uint32_t*>(lo + nt * 8) = PackAct<T>(d[0], d[1], act);
        *reinterpret_cast<uint32_t*>(hi + nt * 8) = PackAct<T>(d[2], d[3], act);
      }
    }
  }
}

// Epilogue 2: pooled outputs of the tile from the conv tile `ct` (conv_w outputs a row; conv
// output (oh0, ow0) at its origin), 16-byte stores of y. Thread `tid` always takes channel slice
// tid % kVecs (kStemThreads is a multiple of kVecs) and every (kStemThreads / kVecs)-th pixel.
// kWinH x kWinW > 0: that window at compile time (unrolled; no bounds checks when `interior`,
// i.e. every window lies inside the conv output); 0: a.pool_h x a.pool_w at run time.
template <typename T, int kBlockK, int kOutStride, int kWinH, int kWinW>
__device__ __forceinline__ void StemPoolTile(const StemArgs& a, const T* ct, int n, int th, int tw,
                                             int oh0, int ow0, int k0, T* y) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kVecs = kBlockK / kVec;
  static_assert(kStemThreads % kVecs == 0, "a thread keeps one channel slice");
  constexpr int kPixStep = kStemThreads / kVecs;
  const int v = threadIdx.x % kVecs, k = k0 + v * kVec;
  if (k >= a.K) return;
  const bool interior = kWinH > 0 && oh0 >= 0 && ow0 >= 0 && oh0 + a.conv_h <= a.P &&
                        ow0 + a.conv_w <= a.Q;
  const int pixels = a.pooled_h * a.pooled_w;
  for (int pix = threadIdx.x / kVecs; pix < pixels; pix += kPixStep) {
    const int i = pix / a.pooled_w, j = pix - i * a.pooled_w;
    const int ph = th * a.pooled_h + i, pw = tw * a.pooled_w + j;
    if (ph >= a.PH || pw >= a.PW) continue;
    const int lr0 = i * a.pool_stride_h, lc0 = j * a.pool_stride_w;
    const T* base = ct + (lr0 * a.conv_w + lc0) * kOutStride + v * kVec;
    uint4 best = NegInf16<T>();
    if constexpr (kWinH > 0) {
      if (interior) {
#pragma unroll
        for (int dy = 0; dy < kWinH; ++dy)
#pragma unroll
          for (int dx = 0; dx < kWinW; ++dx)
            MaxNan16<T>(best, *reinterpret_cast<const uint4*>(base + (dy * a.conv_w + dx) * kOutStride));
      }
    }
    if (!interior) {
      const int win_h = kWinH > 0 ? kWinH : a.pool_h, win_w = kWinW > 0 ? kWinW : a.pool_w;
      for (int dy = 0; dy < win_h; ++dy) {
        if (static_cast<unsigned>(oh0 + lr0 + dy) >= static_cast<unsigned>(a.P)) continue;
        for (int dx = 0; dx < win_w; ++dx) {
          if (static_cast<unsigned>(ow0 + lc0 + dx) >= static_cast<unsigned>(a.Q)) continue;
          MaxNan16<T>(best, *reinterpret_cast<const uint4*>(base + (dy * a.conv_w + dx) * kOutStride));
        }
      }
    }
    *reinterpret_cast<uint4*>(y + ((static_cast<int64_t>(n) * a.PH + ph) * a.PW + pw) * a.K + k) = best;
  }
}

template <typename T, int kWarpsN>
__global__ void __launch_bounds__(kStemThreads, kStemMinBlocks)
    conv_pool_stem_kernel(const __grid_constant__ StemArgs a,
                          const __grid_constant__ CUtensorMap x_map, const T* __restrict__ x,
                          const T* __restrict__ w, const T* __restrict__ bias,
                          T* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Shape = StemShape<T, kWarpsN>;
  using Elem = RawVecOf<T, 1>;  // raw bits: +0 is all-zero bits in every T
  constexpr bool kTf32 = Shape::kTf32;
  constexpr int kWarpsM = Shape::kWarpsM;
  constexpr int kBlockK = Shape::kBlockK;
  constexpr int kVec = Shape::kVec;
  constexpr int kBStride = Shape::kBStride;
  constexpr int kOutStride = Shape::kOutStride;
  auto up = [](int64_t b) { return (b + kStemInAlign - 1) / kStemInAlign * kStemInAlign; };
  extern __shared__ __align__(128) unsigned char stem_smem[];
  unsigned char* cursor = stem_smem;
  T* bs = reinterpret_cast<T*>(cursor);
  cursor += up(static_cast<int64_t>(a.kf_pad) * kBStride * sizeof(T));
  T* ct = reinterpret_cast<T*>(cursor);  // conv tile [m][kOutStride]
  cursor += up(Shape::kOutBytes);
  int* kofs = reinterpret_cast<int*>(cursor);
  cursor += up(static_cast<int64_t>(a.kf_pad) * 4);
  float* bias_s = reinterpret_cast<float*>(cursor);  // [kBlockK]: 0 past K or without bias
  cursor += up(kBlockK * 4);
  Elem* in_s = reinterpret_cast<Elem*>(cursor);  // two buffers of in_buf_elems
  cursor += 2 * a.in_buf_elems * sizeof(T);
  uint64_t* bars = reinterpret_cast<uint64_t*>(cursor);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp % kWarpsM, warp_n = warp / kWarpsM;
  const int g = lane / 4, q = lane % 4;  // MMA fragment row group and column pair
  const int k0 = blockIdx.y * kBlockK;
  const int m_tile = a.conv_h * a.conv_w;
  const bool warp_rows = warp_m * 32 < m_tile;  // this warp's conv rows hold outputs

  // Once per CTA: this channel block's weights (rows past GEMM-K and channels past K are
  // zeros; float stored as TF32), the GEMM-K column offsets (-1: padding, reads as zero) and
  // this thread's four A-fragment row offsets (rows past the tile read element 0: finite,
  // never pooled).
  constexpr int kBVecs = kBlockK / kVec;
  for (int i = tid; i < a.kf_pad * kBVecs; i += kStemThreads) {
    const int row = i / kBVecs, v = i % kBVecs, kk = k0 + v * kVec;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row < a.rsc && kk < a.K)
      val = __ldg(reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row) * a.K + kk));
    if constexpr (kTf32) {
      val.x = ToTf32(__uint_as_float(val.x)), val.y = ToTf32(__uint_as_float(val.y));
      val.z = ToTf32(__uint_as_float(val.z)), val.w = ToTf32(__uint_as_float(val.w));
    }
    *reinterpret_cast<uint4*>(bs + row * kBStride + v * kVec) = val;
  }
  for (int kf = tid; kf < a.kf_pad; kf += kStemThreads) {
    int off = -1;
    if (kf < a.rsc) {
      const int rs = kf / a.C, c = kf - rs * a.C;
      const int r = rs / a.S, s = rs - r * a.S;
      off = r * a.dilation_h * a.in_stride + s * a.dilation_w * a.C + c;
    }
    kofs[kf] = off;
  }
  for (int c = tid; c < kBlockK; c += kStemThreads)
    bias_s[c] = bias != nullptr && k0 + c < a.K ? to_float(bias[k0 + c]) : 0.0f;
  int moff[2][2];  // [m16 tile][row g, row g + 8]
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = warp_m * 32 + mt * 16 + h * 8 + g;
      moff[mt][h] = m < m_tile ? (m / a.conv_w) * a.stride_h * a.in_stride +
                                     (m % a.conv_w) * a.stride_w * a.C
                               : 0;
    }
  const bool tma = a.use_tma != 0;
  if (tma && tid == 0) {
    MbarInit(&bars[0], 1);
    MbarInit(&bars[1], 1);
  }
  __syncthreads();  // weights, tables and barriers are ready

  // Tile -> (image, tile row, tile column); first conv output row/column of the tile
  // (negative inside the pool's padding) and first input row / element column (negative
  // inside the conv's padding).
  struct TilePos {
    int n, th, tw, oh0, ow0, ih0, col0;
  };
  auto locate = [&](int tile) {
    TilePos t;
    const int row = tile / a.tiles_w;
    t.tw = tile - row * a.tiles_w;
    t.n = row / a.tiles_h;
    t.th = row - t.n * a.tiles_h;
    t.oh0 = t.th * a.pooled_h * a.pool_stride_h - a.pool_pad_top;
    t.ow0 = t.tw * a.pooled_w * a.pool_stride_w - a.pool_pad_left;
    t.ih0 = t.oh0 * a.stride_h - a.pad_top;
    t.col0 = (t.ow0 * a.stride_w - a.pad_left) * a.C;
    return t;
  };
  const uint32_t tile_bytes = static_cast<uint32_t>(a.in_h * a.in_stride * sizeof(T));
  // A TMA box starts on a 16-byte boundary of the row: the tile's elements sit `lead`
  // elements into its buffer rows (the launcher sizes in_stride for the worst lead).
  auto lead = [&](int col0) { return tma ? col0 & (kVec - 1) : 0; };
  auto issue = [&](int tile, int buf) {  // one thread: TMA of `tile`'s input into buf
    const TilePos t = locate(tile);
    MbarExpectTx(&bars[buf], tile_bytes);
    TmaLoadInputTile(in_s + buf * a.in_buf_elems, &x_map, t.col0 - lead(t.col0), t.ih0, t.n,
                     &bars[buf]);
  };
  const int tiles = static_cast<int>(a.tiles), grid = static_cast<int>(gridDim.x);
  if (tma && tid == 0) {
    if (static_cast<int>(blockIdx.x) < tiles) issue(blockIdx.x, 0);
    if (static_cast<int>(blockIdx.x) + grid < tiles) issue(blockIdx.x + grid, 1);
  }
  // This thread's accumulator columns' bias (the accumulators start from it).
  float2 bias_acc[8];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
    bias_acc[nt] = *reinterpret_cast<const float2*>(bias_s + warp_n * 64 + nt * 8 + 2 * q);

  const int x_row = a.W * a.C;
  const Elem* x_elems = reinterpret_cast<const Elem*>(x);
  int iter = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += grid, ++iter) {
    const int buf = iter & 1;
    const TilePos t = locate(tile);
    const Elem* in_b = in_s + buf * a.in_buf_elems + lead(t.col0);
    if (tma) {
      MbarWait(&bars[buf], (iter >> 1) & 1);
    } else {
      // Element-wise: row iy of the tile is x row ih0 + iy, elements col0 .. col0 + in_row.
      const Elem* x_img = x_elems + static_cast<int64_t>(t.n) * a.H * x_row;
      Elem* dst = in_s + buf * a.in_buf_elems;
      for (int e = tid; e < a.in_h * a.in_row; e += kStemThreads) {
        const int iy = e / a.in_row, cx = e - iy * a.in_row;
        const int ih = t.ih0 + iy, col = t.col0 + cx;
        Elem v = 0;
        if (static_cast<unsigned>(ih) < static_cast<unsigned>(a.H) &&
            static_cast<unsigned>(col) < static_cast<unsigned>(x_row))
          v = x_img[static_cast<int64_t>(ih) * x_row + col];
        dst[iy * a.in_stride + cx] = v;
      }
      __syncthreads();
    }

    float acc[2][8][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[i][j][k] = k % 2 == 0 ? bias_acc[j].x : bias_acc[j].y;
    if (warp_rows) {
      // Fragment element (conv row offset mo, GEMM-K offset kof): zero for padding columns.
      auto elem = [&](int mo, int kof) -> uint32_t { return kof >= 0 ? in_b[mo + kof] : 0u; };
      for (int kc = 0; kc < a.kf_pad; kc += kStemChunk) {
        const T* bk = bs + static_cast<int64_t>(kc) * kBStride + warp_n * 64;
        if constexpr (kTf32) {
          const uint32_t* bu = reinterpret_cast<const uint32_t*>(bk);
#pragma unroll
          for (int ks = 0; ks < kStemChunk / 8; ++ks) {
            // m16n8k8 A: (row g | g + 8, column q | q + 4).
            const int kof0 = kofs[kc + ks * 8 + q], kof1 = kofs[kc + ks * 8 + q + 4];
            uint32_t af[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              af[mt][0] = ToTf32(__uint_as_float(elem(moff[mt][0], kof0)));
              af[mt][1] = ToTf32(__uint_as_float(elem(moff[mt][1], kof0)));
              af[mt][2] = ToTf32(__uint_as_float(elem(moff[mt][0], kof1)));
              af[mt][3] = ToTf32(__uint_as_float(elem(moff[mt][1], kof1)));
            }
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
              const uint32_t* bp = bu + (ks * 8 + q) * kBStride + nt * 8 + g;
              const uint32_t b0 = bp[0], b1 = bp[4 * kBStride];
#pragma unroll
              for (int mt = 0; mt < 2; ++mt) MmaTf32(acc[mt][nt], af[mt], b0, b1);
            }
          }
        } else {
#pragma unroll
          for (int ks = 0; ks < kStemChunk / 16; ++ks) {
            // m16n8k16 A: (row g | g + 8, columns 2q, 2q + 1 | 2q + 8, 2q + 9), low half first.
            const int* kp = kofs + kc + ks * 16 + 2 * q;
            const int kof0 = kp[0], kof1 = kp[1], kof2 = kp[8], kof3 = kp[9];
            uint32_t af[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              af[mt][0] = elem(moff[mt][0], kof0) | elem(moff[mt][0], kof1) << 16;
              af[mt][1] = elem(moff[mt][1], kof0) | elem(moff[mt][1], kof1) << 16;
              af[mt][2] = elem(moff[mt][0], kof2) | elem(moff[mt][0], kof3) << 16;
              af[mt][3] = elem(moff[mt][1], kof2) | elem(moff[mt][1], kof3) << 16;
            }
#pragma unroll
            for (int np = 0; np < 4; ++np) {
              uint32_t r[4];
              LdMatrixX4Trans(r, bk + (ks * 16 + lane % 16) * kBStride + np * 16 + (lane / 16) * 8);
#pragma unroll
              for (int mt = 0; mt < 2; ++mt) {
                Mma<T>(acc[mt][2 * np], af[mt], r[0], r[1]);
                Mma<T>(acc[mt][2 * np + 1], af[mt], r[2], r[3]);
              }
            }
          }
        }
      }
    }
    // Every warp is done with this input buffer (TMA may refill it) and with the previous
    // tile's conv tile (the pool reads below).
    __syncthreads();
    if (tma && tid == 0 && tile + 2 * grid < tiles) issue(tile + 2 * grid, buf);

    // Epilogue 1: the activation, rounded to T, into the [m][kBlockK] conv tile.
    if (warp_rows) StemStoreAct<T, kOutStride>(ct, warp_m * 32, warp_n * 64, acc, a.act);
    __syncthreads();

    // Epilogue 2: max over each pool window from the conv tile; 16-byte stores of y.
    if (a.pool_h == 3 && a.pool_w == 3)
      StemPoolTile<T, kBlockK, kOutStride, 3, 3>(a, ct, t.n, t.th, t.tw, t.oh0, t.ow0, k0, y);
    else if (a.pool_h == 2 && a.pool_w == 2)
      StemPoolTile<T, kBlockK, kOutStride, 2, 2>(a, ct, t.n, t.th, t.tw, t.oh0, t.ow0, k0, y);
    else
      StemPoolTile<T, kBlockK, kOutStride, 0, 0>(a, ct, t.n, t.th, t.tw, t.oh0, t.ow0, k0, y);
  }
#endif
}

}  // namespace conv_pool
}  // namespace jaxcnn
