// Stem kernel of the fused conv + bias + ReLU + max-pool: the network's first layer, whose few
// input channels (an RGB image: C = 3) make GEMM-K = R * S * C small (27 to ~400), so the
// mma.sync kernel's per-step pipeline (conv_pool_tc_kernel, flat-K mode) is mostly latency:
// each CTA gathers its 128 x 32 im2col elements one by one from global memory, once.
//
// conv_pool_stem_kernel (sm_80+), persistent: each CTA loads its kBlockK columns of the weights
// (GEMM-K x kBlockK, zero-padded to a multiple of 32 rows) into shared memory once, then walks
// output tiles. A tile is pooled_h x pooled_w pooled outputs of one image; it needs a conv tile
// of conv_h x conv_w outputs (<= kMaxM: the overlap rows/columns of overlapping pools are
// recomputed by the neighbour) and an input tile of in_h x in_w x C pixels. Per tile:
//   load      the input tile into shared memory with coalesced loads (each input row's
//             in_w * C elements are contiguous in NHWC), zeros outside the image (the conv
//             padding). Any alignment of x: loads are element-wise.
//   im2col    per 32-column chunk of GEMM-K, the A chunk [conv output m][kf] is gathered from
//             the shared input tile: element (m, kf) = in[moff[m] + kofs[kf]], two offset tables
//             built once per CTA (the tile shape is the same for every tile).
//   mainloop  mma.sync on the chunk (warps kWarpsM (M) x kWarpsN (N), each 32 x 64), m16n8k16
//             bf16/fp16 from ldmatrix, or m16n8k8 TF32 (float at precision "default": inputs
//             rounded to TF32 as XLA's DEFAULT does, when they are written to shared memory).
//   epilogue  bias + ReLU in fp32, one rounding to T into the conv tile (reusing the A chunk's
//             shared memory), then each thread max-reduces (pooled pixel, 16 bytes of channels)
//             windows from it (positions outside the conv output are the pool's -inf padding;
//             NaN propagates) and stores 16 bytes of y. The conv tile never reaches DRAM.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "conv_pool/conv_pool_kernels.cuh"

namespace jaxcnn {
namespace conv_pool {

constexpr int kStemThreads = 256;  // 8 warps
constexpr int kStemChunk = 32;     // GEMM-K columns per im2col chunk
constexpr int kStemMinBlocks = 2;  // CTAs per SM the register budget is set for

template <typename T, int kWarpsN>
struct StemShape {
  static constexpr bool kTf32 = sizeof(T) == 4;
  static constexpr int kWarpsM = 8 / kWarpsN;
  static constexpr int kBlockK = 64 * kWarpsN;  // output channels per CTA (8 n8 tiles a warp)
  static constexpr int kMaxM = kWarpsM * 32;    // conv outputs per tile (2 m16 tiles a warp)
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  // Same bank arguments as TcShape: 16-bit rows for ldmatrix (row bytes / 16 odd); fp32 rows
  // for the TF32 fragments' scalar loads (A stride = 4, B and conv tile stride = 8 (mod 32)).
  static constexpr int kAStride = kTf32 ? kStemChunk + 4 : PaddedStride(kStemChunk);
  static constexpr int kBStride = kTf32 ? kBlockK + 8 : PaddedStride(kBlockK);
  static constexpr int kOutStride = kBStride;
  static constexpr int kWorkBytes =
      kMaxM * (kOutStride > kAStride ? kOutStride : kAStride) * static_cast<int>(sizeof(T));
};

// Shared memory of one CTA: weights [kf_pad][kBStride], the A chunk / conv tile, the offset
// tables (kMaxM + kf_pad ints) and the input tile (in_elems of T), each 16-byte aligned.
template <typename T, int kWarpsN>
__host__ __device__ constexpr int64_t StemSmemBytes(int64_t kf_pad, int64_t in_elems) {
  using Shape = StemShape<T, kWarpsN>;
  return kf_pad * Shape::kBStride * static_cast<int64_t>(sizeof(T)) + Shape::kWorkBytes +
         (Shape::kMaxM + kf_pad) * 4 + (in_elems * static_cast<int64_t>(sizeof(T)) + 15) / 16 * 16;
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
  int in_h, in_w;          // input pixels per tile: (conv - 1) * stride + (window - 1) * dil + 1
  int tiles_h, tiles_w;    // tiles per image
  int64_t tiles;           // N * tiles_h * tiles_w
  int rsc;                 // GEMM-K = R * S * C
  int kf_pad;              // rsc rounded up to kStemChunk
};

// Raw bits of one T (+0 is all-zero bits in every T).
template <typename T>
using StemElem = RawVecOf<T, 1>;

// 16 bytes of T: a = max(a, b) element-wise, NaN-propagating (XLA's max).
template <typename T>
__device__ __forceinline__ void MaxNan16(uint4& a, const uint4& b) {
  uint32_t* av = reinterpret_cast<uint32_t*>(&a);
  const uint32_t* bv = reinterpret_cast<const uint32_t*>(&b);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const __nv_bfloat162 m = __hmax2_nan(*reinterpret_cast<const __nv_bfloat162*>(&av[i]),
                                           *reinterpret_cast<const __nv_bfloat162*>(&bv[i]));
      av[i] = *reinterpret_cast<const uint32_t*>(&m);
    } else if constexpr (std::is_same_v<T, __half>) {
      const __half2 m = __hmax2_nan(*reinterpret_cast<const __half2*>(&av[i]),
                                    *reinterpret_cast<const __half2*>(&bv[i]));
      av[i] = *reinterpret_cast<const uint32_t*>(&m);
    } else {
      av[i] = __float_as_uint(max_nan(__uint_as_float(av[i]), __uint_as_float(bv[i])));
    }
  }
}

// 16 bytes of -inf in T.
template <typename T>
__device__ __forceinline__ uint4 NegInf16() {
  const uint32_t w = std::is_same_v<T, __nv_bfloat16> ? 0xFF80FF80u
                     : std::is_same_v<T, __half>      ? 0xFC00FC00u
                                                      : 0xFF800000u;
  return make_uint4(w, w, w, w);
}

template <typename T, int kWarpsN>
__global__ void __launch_bounds__(kStemThreads, kStemMinBlocks)
    conv_pool_stem_kernel(StemArgs a, const T* __restrict__ x, const T* __restrict__ w,
                          const T* __restrict__ bias, T* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Shape = StemShape<T, kWarpsN>;
  using Elem = StemElem<T>;
  constexpr bool kTf32 = Shape::kTf32;
  constexpr int kWarpsM = Shape::kWarpsM;
  constexpr int kBlockK = Shape::kBlockK;
  constexpr int kMaxM = Shape::kMaxM;
  constexpr int kVec = Shape::kVec;
  constexpr int kAStride = Shape::kAStride;
  constexpr int kBStride = Shape::kBStride;
  constexpr int kOutStride = Shape::kOutStride;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* bs = reinterpret_cast<T*>(smem_raw);
  T* work = bs + static_cast<int64_t>(a.kf_pad) * kBStride;  // A chunk, then the conv tile
  int* moff = reinterpret_cast<int*>(smem_raw + static_cast<int64_t>(a.kf_pad) * kBStride *
                                                    sizeof(T) + Shape::kWorkBytes);
  int* kofs = moff + kMaxM;
  Elem* in_s = reinterpret_cast<Elem*>(kofs + a.kf_pad);
  Elem* a_s = reinterpret_cast<Elem*>(work);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp % kWarpsM, warp_n = warp / kWarpsM;
  const int g = lane / 4, q = lane % 4;  // MMA fragment row group and column pair
  const int k0 = blockIdx.y * kBlockK;
  const int m_tile = a.conv_h * a.conv_w;
  const int m_pad = (m_tile + 31) / 32 * 32;  // whole warp rows: every MMA row is built

  // Once per CTA: this channel block's weights (rows past GEMM-K and channels past K are
  // zeros; float stored as TF32), and the two offset tables of the im2col gather.
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
  for (int m = tid; m < kMaxM; m += kStemThreads)
    moff[m] = m < m_tile ? ((m / a.conv_w) * a.stride_h * a.in_w + (m % a.conv_w) * a.stride_w) * a.C
                         : -1;
  for (int kf = tid; kf < a.kf_pad; kf += kStemThreads) {
    int off = -1;
    if (kf < a.rsc) {
      const int rs = kf / a.C, c = kf - rs * a.C;
      const int r = rs / a.S, s = rs - r * a.S;
      off = (r * a.dilation_h * a.in_w + s * a.dilation_w) * a.C + c;
    }
    kofs[kf] = off;
  }

  const int in_row = a.in_w * a.C;  // elements of one input-tile row (contiguous in x)
  const int x_row = a.W * a.C;
  const Elem* x_elems = reinterpret_cast<const Elem*>(x);
  for (int64_t tile = blockIdx.x; tile < a.tiles; tile += gridDim.x) {
    const int tw = static_cast<int>(tile % a.tiles_w);
    const int th = static_cast<int>((tile / a.tiles_w) % a.tiles_h);
    const int64_t n = tile / (static_cast<int64_t>(a.tiles_w) * a.tiles_h);
    // First conv output row/column of the tile (negative inside the pool's padding), and its
    // first input row/column (negative inside the conv's padding).
    const int oh0 = th * a.pooled_h * a.pool_stride_h - a.pool_pad_top;
    const int ow0 = tw * a.pooled_w * a.pool_stride_w - a.pool_pad_left;
    const int ih0 = oh0 * a.stride_h - a.pad_top;
    const int col0 = (ow0 * a.stride_w - a.pad_left) * a.C;  // element column in an x row

    __syncthreads();  // the previous tile's pool reads are done (first tile: tables are ready)
    const Elem* x_img = x_elems + n * a.H * x_row;
    for (int e = tid; e < a.in_h * in_row; e += kStemThreads) {
      const int iy = e / in_row, col = col0 + (e - iy * in_row);
      const int ih = ih0 + iy;
      Elem v = 0;
      if (static_cast<unsigned>(ih) < static_cast<unsigned>(a.H) &&
          static_cast<unsigned>(col) < static_cast<unsigned>(x_row))
        v = x_img[static_cast<int64_t>(ih) * x_row + col];
      in_s[e] = v;
    }

    float acc[2][8][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.0f;
    const bool warp_rows = warp_m * 32 < m_pad;  // this warp's conv rows hold outputs
    for (int kc = 0; kc < a.kf_pad; kc += kStemChunk) {
      __syncthreads();  // the input tile is stored / the previous chunk's MMAs are done
      // im2col gather: lane = GEMM-K column, warps stride over the conv outputs.
      const int kof = kofs[kc + lane];
      for (int m = warp; m < m_pad; m += kStemThreads / 32) {
        const int mo = moff[m];
        Elem v = 0;
        if (mo >= 0 && kof >= 0) v = in_s[mo + kof];
        if constexpr (kTf32) v = ToTf32(__uint_as_float(v));
        a_s[m * kAStride + lane] = v;
      }
      __syncthreads();
      if (!warp_rows) continue;
      const T* bk = bs + static_cast<int64_t>(kc) * kBStride + warp_n * 64;
      if constexpr (kTf32) {
        const uint32_t* au = reinterpret_cast<const uint32_t*>(work);
        const uint32_t* bu = reinterpret_cast<const uint32_t*>(bk);
#pragma unroll
        for (int ks = 0; ks < kStemChunk / 8; ++ks) {
          uint32_t af[2][4];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            const uint32_t* ap = au + (warp_m * 32 + mt * 16 + g) * kAStride + ks * 8 + q;
            af[mt][0] = ap[0], af[mt][1] = ap[8 * kAStride];
            af[mt][2] = ap[4], af[mt][3] = ap[8 * kAStride + 4];
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
          uint32_t af[2][4];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
            LdMatrixX4(af[mt], work + (warp_m * 32 + mt * 16 + lane % 16) * kAStride + ks * 16 +
                                   (lane / 16) * 8);
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
    __syncthreads();  // every warp is done with the last A chunk: `work` becomes the conv tile

    // Epilogue 1: bias + ReLU in fp32, rounded to T, into the [m][kBlockK] conv tile.
    if (warp_rows) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int col = warp_n * 64 + nt * 8 + 2 * q;
        const int k = k0 + col;  // K % kVec == 0: k < K implies k + 1 < K
        const float b0 = (bias != nullptr && k < a.K) ? to_float(bias[k]) : 0.0f;
        const float b1 = (bias != nullptr && k < a.K) ? to_float(bias[k + 1]) : 0.0f;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const int row = warp_m * 32 + mt * 16 + g;
          if constexpr (kTf32) {
            *reinterpret_cast<float2*>(work + row * kOutStride + col) =
                make_float2(Relu(acc[mt][nt][0] + b0), Relu(acc[mt][nt][1] + b1));
            *reinterpret_cast<float2*>(work + (row + 8) * kOutStride + col) =
                make_float2(Relu(acc[mt][nt][2] + b0), Relu(acc[mt][nt][3] + b1));
          } else {
            *reinterpret_cast<uint32_t*>(work + row * kOutStride + col) =
                PackPair<T>(Relu(acc[mt][nt][0] + b0), Relu(acc[mt][nt][1] + b1));
            *reinterpret_cast<uint32_t*>(work + (row + 8) * kOutStride + col) =
                PackPair<T>(Relu(acc[mt][nt][2] + b0), Relu(acc[mt][nt][3] + b1));
          }
        }
      }
    }
    __syncthreads();

    // Epilogue 2: max over each pool window from the conv tile; 16-byte stores of y.
    constexpr int kVecs = kBlockK / kVec;
    const int items = a.pooled_h * a.pooled_w * kVecs;
    for (int it = tid; it < items; it += kStemThreads) {
      const int v = it % kVecs, pix = it / kVecs;
      const int i = pix / a.pooled_w, j = pix - i * a.pooled_w;
      const int ph = th * a.pooled_h + i, pw = tw * a.pooled_w + j, k = k0 + v * kVec;
      if (ph >= a.PH || pw >= a.PW || k >= a.K) continue;
      uint4 best = NegInf16<T>();
      for (int dy = 0; dy < a.pool_h; ++dy) {
        const int lr = i * a.pool_stride_h + dy;
        if (static_cast<unsigned>(oh0 + lr) >= static_cast<unsigned>(a.P)) continue;  // -inf pad
        for (int dx = 0; dx < a.pool_w; ++dx) {
          const int lc = j * a.pool_stride_w + dx;
          if (static_cast<unsigned>(ow0 + lc) >= static_cast<unsigned>(a.Q)) continue;
          MaxNan16<T>(best, *reinterpret_cast<const uint4*>(
                                work + (lr * a.conv_w + lc) * kOutStride + v * kVec));
        }
      }
      *reinterpret_cast<uint4*>(y + ((n * a.PH + ph) * a.PW + pw) * a.K + k) = best;
    }
  }
#endif
}

}  // namespace conv_pool
}  // namespace jaxcnn
