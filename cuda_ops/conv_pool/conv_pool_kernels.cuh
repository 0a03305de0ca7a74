// Fused conv + bias + ReLU + max-pool kernels (see conv_pool.h for the math).
//
// conv_pool_tc_kernel (sm_80+): implicit GEMM on mma.sync, fp32 accumulate: m16n8k16 for
// bf16/fp16 (ldmatrix fragments), m16n8k8 TF32 for float at precision "default" (the inputs
// rounded to TF32 as XLA's DEFAULT does; scalar fragment loads from bank-conflict-free rows). One CTA owns a 2-D block of TH x TW = 128 conv outputs of one image (GEMM M)
// times kBlockK output channels (GEMM N, 64 or 128), placed so that the block covers whole pool
// windows: pooled_h x pooled_w pooled outputs, their windows' conv rows/columns all inside the
// block (overlapping pools recompute the shared rows/columns in the neighbouring CTA).
//   mainloop  GEMM-K = (32-channel chunk, r, s) steps through a 4-stage cp.async pipeline: the
//             A stage is the block's 128 input pixels shifted by (r, s) (zero-filled outside
//             the image: the conv padding; via L1, which serves the R x S shifted re-reads of a
//             chunk), the B stage 32 x kBlockK weights of HWIO; warps
//             2 (M) x kWarpsN (N), each a 64 x 32 accumulator tile, ldmatrix(.trans) operands.
//   flat-K    (kFlatK: C not a multiple of 16 bytes, or C < 16, e.g. a C=3 RGB stem) GEMM-K is
//             HWIO's flattened (r, s, c) index, 32 per step, ceil(R*S*C / 32) steps: the A
//             stage gathers its elements one by one (plain loads: cp.async has no 2-byte
//             form), so no 32-channel chunk is mostly padding and x needs no alignment; the
//             B stage is still 16-byte cp.async (HWIO row kf is contiguous). Same MMAs and
//             epilogue.
//   epilogue  bias + ReLU in fp32 registers, one rounding to T (monotonic, so pooling the
//             rounded values equals rounding the pooled ones: the reference's semantics) into
//             a shared-memory tile that reuses the pipeline's buffers; then each thread takes
//             (pooled pixel, 8 channels), reduces its window from shared memory (positions
//             outside the conv output are the pool's -inf padding) and stores 16 bytes of y.
//   Only pooled values are written: the 128 x kBlockK pre-pool tile lives in shared memory.
// Shared-memory rows are padded so that 8 consecutive rows start in 8 different 16-byte bank
// groups (row bytes / 16 odd): ldmatrix and the epilogue's fragment stores are conflict-free.
//
// conv_pool_direct_kernel (any dtype, any shape, any alignment): CUDA-core fp32 FMA, one
// thread per (pooled pixel, 4 output channels); each window position's conv output is computed
// in registers, biased, ReLU'd, rounded to T and max-reduced. It is the fp32-accurate path
// (precision "highest") and the fallback where the tensor-core kernel's constraints do not hold.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/float_convert.cuh"
#include "common/mma_sm80.cuh"
#include "common/vector_io.cuh"

namespace jaxcnn {
namespace conv_pool {

// ------------------------------------------------------------------ tensor-core kernel
constexpr int kTileM = 128;  // conv outputs per CTA (GEMM M)
constexpr int kBlockC = 32;  // GEMM-K per pipeline stage (input channels; flat-K: (r, s, c))

// Row stride (elements of a 16-bit type) for `cols` columns: rows 16-byte aligned and
// row_bytes / 16 odd (conflict-free ldmatrix over 8 consecutive rows).
__host__ __device__ constexpr int PaddedStride(int cols) {
  return (((cols + 7) / 8) % 2 == 1 ? (cols + 7) / 8 : (cols + 7) / 8 + 1) * 8;
}

// Tile shapes per storage type T (bf16/fp16: m16n8k16 from ldmatrix fragments; float: TF32
// m16n8k8 from 32-bit shared loads) and warps along N.
template <typename T, int kWarpsN>
struct TcShape {
  static constexpr bool kTf32 = sizeof(T) == 4;
  static constexpr int kThreads = 64 * kWarpsN;  // 2 warps along M, kWarpsN along N
  static constexpr int kBlockK = 32 * kWarpsN;   // output channels per CTA
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per 16 bytes
  static constexpr int kStages = kTf32 ? 3 : 4;  // cp.async pipeline depth
  // Row strides: 16-bit rows for ldmatrix (row bytes / 16 odd); fp32 rows for the TF32
  // fragments' scalar loads: A (row g, column q) hits bank 4g + q with a stride = 4 (mod 32),
  // B (row q, column g) and the epilogue's float2 stores hit 8q + g with a stride = 8 (mod 32).
  static constexpr int kAStride = kTf32 ? kBlockC + 4 : PaddedStride(kBlockC);
  static constexpr int kBStride = kTf32 ? kBlockK + 8 : PaddedStride(kBlockK);
  static constexpr int kOutStride = kTf32 ? kBlockK + 8 : PaddedStride(kBlockK);  // epilogue tile
  static constexpr int kAElems = kTileM * kAStride;
  static constexpr int kBElems = kBlockC * kBStride;
  static constexpr int kStageElems = kAElems + kBElems;
  static constexpr int kPipeBytes = kStages * kStageElems * static_cast<int>(sizeof(T));
  static constexpr int kOutBytes = kTileM * kOutStride * static_cast<int>(sizeof(T));
  static constexpr int kSmemBytes = kPipeBytes > kOutBytes ? kPipeBytes : kOutBytes;
  // CTAs per SM the shared memory allows of Hopper's 227 KB (16-bit: 3 x 59 KB, 2 x 76 KB;
  // fp32: 2 x 83 KB, 2 x 108 KB): the register budget ptxas may use without lowering that.
  static constexpr int kMinBlocks = (!kTf32 && kWarpsN == 2) ? 3 : 2;
};

// Everything the kernel needs, computed by the launcher (conv_pool.cu).
struct TcArgs {
  int H, W, C, K, S;
  int stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
  int P, Q;
  int pool_h, pool_w, pool_stride_h, pool_stride_w, pool_pad_top, pool_pad_left;
  int PH, PW;
  int pooled_h, pooled_w;      // pooled outputs per CTA block
  int tiles_h, tiles_w;        // CTA blocks per image
  int k_blocks;                // ceil(K / kBlockK)
  int c_chunks;                // ceil(C / kBlockC)
  int taps;                    // R * S
  int steps;                   // c_chunks * taps; flat-K: ceil(taps * C / kBlockC)
};

// cp.async / ldmatrix / mma.sync helpers (common/mma_sm80.cuh).
using mma::CpAsync16;
using mma::CpAsync16L1;
using mma::CpAsyncCommit;
using mma::CpAsyncWait;
using mma::LdMatrixX4;
using mma::LdMatrixX4Trans;
using mma::Mma;
using mma::PackPair;
using mma::SmemAddr;

// fp32 -> TF32 (round to nearest, ties away: what cuBLAS/cuDNN's TF32 paths do).
__device__ __forceinline__ uint32_t ToTf32(float v) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
  return r;
}

// d += a * b on one m16n8k8 TF32 tile, fp32 accumulate.
__device__ __forceinline__ void MmaTf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ReLU that keeps NaN (like jnp.maximum(v, 0)); fmaxf would turn NaN into 0.
__device__ __forceinline__ float Relu(float v) { return v < 0.0f ? 0.0f : v; }

// Epilogue 1 of the mma.sync kernels: a warp's kMT x kNT m16n8 accumulator tiles (rows
// row0 + 16 mt + g | + 8, columns col0 + 8 nt + 2q | + 1), biased and ReLU'd in fp32 and rounded
// once to T, into the shared conv tile (row stride `stride` elements). K % 16-byte vector == 0,
// so column k < K implies k + 1 < K.
template <typename T, int kMT, int kNT>
__device__ __forceinline__ void StoreBiasRelu(T* tile, int stride, int row0, int col0, int k0,
                                              const float (&acc)[kMT][kNT][4],
                                              const T* __restrict__ bias, int K) {
  const int g = (threadIdx.x % 32) / 4, q = threadIdx.x % 4;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const int col = col0 + nt * 8 + 2 * q;
    const int k = k0 + col;
    const float b0 = (bias != nullptr && k < K) ? to_float(bias[k]) : 0.0f;
    const float b1 = (bias != nullptr && k < K) ? to_float(bias[k + 1]) : 0.0f;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      const float(&d)[4] = acc[mt][nt];
      const int row = row0 + mt * 16 + g;
      if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float2*>(tile + row * stride + col) =
            make_float2(Relu(d[0] + b0), Relu(d[1] + b1));
        *reinterpret_cast<float2*>(tile + (row + 8) * stride + col) =
            make_float2(Relu(d[2] + b0), Relu(d[3] + b1));
      } else {
        *reinterpret_cast<uint32_t*>(tile + row * stride + col) =
            PackPair<T>(Relu(d[0] + b0), Relu(d[1] + b1));
        *reinterpret_cast<uint32_t*>(tile + (row + 8) * stride + col) =
            PackPair<T>(Relu(d[2] + b0), Relu(d[3] + b1));
      }
    }
  }
}

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

// Epilogue 2 of the mma.sync kernels: each thread takes (pooled pixel, 16 bytes of channels)
// of the tile's pooled_h x pooled_w block (tile row th, column tw of image n), max-reduces its
// window from the shared conv tile (tile_w conv outputs a row, row stride kOutStride; conv
// output (oh0, ow0) at its origin; positions outside the conv output are the pool's -inf
// padding) and stores 16 bytes of y. Args: TcArgs or StemArgs (same pool fields).
template <typename T, int kBlockK, int kOutStride, int kThreads, typename Args>
__device__ __forceinline__ void PoolTileToY(const Args& a, const T* tile, int tile_w, int th,
                                            int tw, int64_t n, int oh0, int ow0, int k0, T* y) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kVecs = kBlockK / kVec;
  const int items = a.pooled_h * a.pooled_w * kVecs;
  for (int it = threadIdx.x; it < items; it += kThreads) {
    const int v = it % kVecs, pix = it / kVecs;
    const int i = pix / a.pooled_w, j = pix - i * a.pooled_w;
    const int ph = th * a.pooled_h + i, pw = tw * a.pooled_w + j, k = k0 + v * kVec;
    if (ph >= a.PH || pw >= a.PW || k >= a.K) continue;
    uint4 best = NegInf16<T>();
    for (int dy = 0; dy < a.pool_h; ++dy) {
      const int lr = i * a.pool_stride_h + dy;
      if (static_cast<unsigned>(oh0 + lr) >= static_cast<unsigned>(a.P)) continue;
      for (int dx = 0; dx < a.pool_w; ++dx) {
        const int lc = j * a.pool_stride_w + dx;
        if (static_cast<unsigned>(ow0 + lc) >= static_cast<unsigned>(a.Q)) continue;
        MaxNan16<T>(best, *reinterpret_cast<const uint4*>(tile + (lr * tile_w + lc) * kOutStride +
                                                          v * kVec));
      }
    }
    *reinterpret_cast<uint4*>(y + ((n * a.PH + ph) * a.PW + pw) * a.K + k) = best;
  }
}

template <typename T, int TW, int kWarpsN, bool kFlatK>
__global__ void __launch_bounds__(TcShape<T, kWarpsN>::kThreads, TcShape<T, kWarpsN>::kMinBlocks)
    conv_pool_tc_kernel(TcArgs a, const T* __restrict__ x, const T* __restrict__ w,
                        const T* __restrict__ bias, T* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Shape = TcShape<T, kWarpsN>;
  constexpr int kThreads = Shape::kThreads;
  constexpr int kBlockK = Shape::kBlockK;
  constexpr int kAStride = Shape::kAStride;
  constexpr int kBStride = Shape::kBStride;
  constexpr int kVec = Shape::kVec;
  constexpr int kStages = Shape::kStages;
  static_assert(kTileM % TW == 0, "the conv block is TH x TW = 128 outputs");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int warp_m = warp % 2, warp_n = warp / 2;
  const int g = lane / 4, q = lane % 4;  // MMA fragment row group and column pair

  // CTA -> (image, block row, block column, channel block); channel blocks of one pixel
  // block are neighbours, so their shared input tile is read from L2.
  int64_t bid = blockIdx.x;
  const int kb = static_cast<int>(bid % a.k_blocks);
  bid /= a.k_blocks;
  const int tw = static_cast<int>(bid % a.tiles_w);
  bid /= a.tiles_w;
  const int th = static_cast<int>(bid % a.tiles_h);
  const int64_t n = bid / a.tiles_h;
  const int k0 = kb * kBlockK;
  // First conv output row/column of the block (negative inside the pool's padding).
  const int oh0 = th * a.pooled_h * a.pool_stride_h - a.pool_pad_top;
  const int ow0 = tw * a.pooled_w * a.pool_stride_w - a.pool_pad_left;

  // Input row/column of conv-block pixel m at filter tap (0, 0); outside [0, H) x [0, W)
  // is the conv's zero padding.
  auto in_row = [&](int m) { return (oh0 + m / TW) * a.stride_h - a.pad_top; };
  auto in_col = [&](int m) { return (ow0 + m % TW) * a.stride_w - a.pad_left; };
  auto inside = [&](int ih, int iw) {
    return static_cast<unsigned>(ih) < static_cast<unsigned>(a.H) &&
           static_cast<unsigned>(iw) < static_cast<unsigned>(a.W);
  };
  // A loads: thread owns columns a_col .. a_col + kAPerLoad - 1 of pixels
  // tid / kALoads + j * kPixStep (a 16-byte vector of channels; flat-K: one element).
  constexpr int kAPerLoad = kFlatK ? 1 : kVec;
  constexpr int kALoads = kBlockC / kAPerLoad;  // loads per pixel and stage
  constexpr int kPixStep = kThreads / kALoads;
  constexpr int kAPixels = kTileM / kPixStep;
  static_assert(kAPixels * kPixStep == kTileM, "A stage split evenly");
  const int a_col = (tid % kALoads) * kAPerLoad;
  const int a_pix = tid / kALoads;
  // Normal mode keeps its few pixels' positions in registers; flat-K (16-32 pixels per
  // thread) recomputes them each step instead.
  int in_h[kFlatK ? 1 : kAPixels], in_w[kFlatK ? 1 : kAPixels];
  if constexpr (!kFlatK) {
#pragma unroll
    for (int j = 0; j < kAPixels; ++j) {
      in_h[j] = in_row(a_pix + j * kPixStep);
      in_w[j] = in_col(a_pix + j * kPixStep);
    }
  }
  const T* x_img = x + n * a.H * a.W * a.C;
  constexpr int kBVecsPerRow = kBlockK / kVec;
  constexpr int kBPerThread = kBlockC * kBVecsPerRow / kThreads;
  static_assert(kBPerThread * kThreads == kBlockC * kBVecsPerRow, "B stage split evenly");

  auto issue = [&](int step) {
    T* as = smem + (step % kStages) * Shape::kStageElems;
    T* bs = as + Shape::kAElems;
    // This stage's B rows are HWIO rows b_row0 .. b_row0 + kBlockC - 1, the first b_rows valid.
    int b_row0, b_rows;
    if constexpr (kFlatK) {
      // Column kf = (r * S + s) * C + c of GEMM-K. Plain loads and stores: the __syncthreads
      // at the top of the mainloop iteration consuming this stage makes them visible.
      const int sc = a.S * a.C, rsc = a.taps * a.C;  // GEMM-K per filter row, in all
      const int kf = step * kBlockC + a_col;
      const int r = kf / sc, s = (kf - r * sc) / a.C;
      const int c = kf - r * sc - s * a.C;
      const bool k_valid = kf < rsc;
      const int dh = r * a.dilation_h, dw = s * a.dilation_w;
      using Elem = RawVecOf<T, 1>;  // moved as raw bits: zero bits are +0 in every T
      const Elem* x_elems = reinterpret_cast<const Elem*>(x_img);
      Elem* a_elems = reinterpret_cast<Elem*>(as);
#pragma unroll
      for (int j = 0; j < kAPixels; ++j) {
        const int m = a_pix + j * kPixStep;
        const int ih = in_row(m) + dh, iw = in_col(m) + dw;
        a_elems[m * kAStride + a_col] =
            k_valid && inside(ih, iw) ? x_elems[(ih * a.W + iw) * a.C + c] : Elem{0};
      }
      b_row0 = step * kBlockC;
      b_rows = rsc - b_row0;
    } else {
      // Channel chunk outer, filter tap inner: consecutive steps re-read the same input
      // pixels (shifted), which stay in L1.
      const int chunk = step / a.taps;
      const int rs = step - chunk * a.taps;
      const int c0 = chunk * kBlockC;
      const int r = rs / a.S, s = rs - r * a.S;
      const int c = c0 + a_col;
#pragma unroll
      for (int j = 0; j < kAPixels; ++j) {
        const int m = a_pix + j * kPixStep;
        const int ih = in_h[j] + r * a.dilation_h, iw = in_w[j] + s * a.dilation_w;
        const bool valid = c < a.C && inside(ih, iw);
        const T* src = valid ? x_img + (static_cast<int64_t>(ih) * a.W + iw) * a.C + c : x;
        CpAsync16L1(as + m * kAStride + a_col, src, valid);
      }
      b_row0 = rs * a.C + c0;
      b_rows = a.C - c0;
    }
#pragma unroll
    for (int j = 0; j < kBPerThread; ++j) {
      const int i = tid + j * kThreads;
      const int row = i / kBVecsPerRow, v = i % kBVecsPerRow;
      const int kk = k0 + v * kVec;
      const bool valid = row < b_rows && kk < a.K;
      const T* src = valid ? w + static_cast<int64_t>(b_row0 + row) * a.K + kk : w;
      CpAsync16(bs + row * kBStride + v * kVec, src, valid);
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.0f;

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < a.steps) issue(st);
    CpAsyncCommit();
  }
  for (int step = 0; step < a.steps; ++step) {
    CpAsyncWait<kStages - 2>();  // this step's group has landed (for this thread) ...
    __syncthreads();             // ... and for every thread; the oldest buffer is free
    if (step + kStages - 1 < a.steps) issue(step + kStages - 1);
    CpAsyncCommit();
    const T* as = smem + (step % kStages) * Shape::kStageElems;
    const T* bs = as + Shape::kAElems;
    if constexpr (Shape::kTf32) {
#pragma unroll
      for (int ks = 0; ks < kBlockC / 8; ++ks) {
        // m16n8k8 TF32 fragments: A (row g | g + 8, column q | q + 4), B (row q | q + 4,
        // column g); rounded to TF32 as they are read.
        uint32_t af[4][4];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          const T* ap = as + (warp_m * 64 + mt * 16 + g) * kAStride + ks * 8 + q;
          af[mt][0] = ToTf32(ap[0]);
          af[mt][1] = ToTf32(ap[8 * kAStride]);
          af[mt][2] = ToTf32(ap[4]);
          af[mt][3] = ToTf32(ap[8 * kAStride + 4]);
        }
        uint32_t bf[4][2];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const T* bp = bs + (ks * 8 + q) * kBStride + warp_n * 32 + nt * 8 + g;
          bf[nt][0] = ToTf32(bp[0]);
          bf[nt][1] = ToTf32(bp[4 * kBStride]);
        }
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) MmaTf32(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < kBlockC / 16; ++ks) {
        uint32_t af[4][4];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
          LdMatrixX4(af[mt], as + (warp_m * 64 + mt * 16 + lane % 16) * kAStride + ks * 16 +
                                 (lane / 16) * 8);
        uint32_t bf[4][2];
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t r[4];
          LdMatrixX4Trans(r, bs + (ks * 16 + lane % 16) * kBStride + warp_n * 32 + np * 16 +
                                 (lane / 16) * 8);
          bf[2 * np][0] = r[0], bf[2 * np][1] = r[1];
          bf[2 * np + 1][0] = r[2], bf[2 * np + 1][1] = r[3];
        }
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) Mma<T>(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // every warp is done with the pipeline buffers: reuse them for the tile

  // Epilogue 1: bias + ReLU in fp32, rounded to T, into the [128][kBlockK] shared tile.
  constexpr int kOutStride = Shape::kOutStride;
  T* tile = smem;
  StoreBiasRelu(tile, kOutStride, warp_m * 64, warp_n * 32, k0, acc, bias, a.K);
  __syncthreads();

  // Epilogue 2: max over each pool window from shared memory; 16-byte stores of y.
  PoolTileToY<T, kBlockK, kOutStride, kThreads>(a, tile, TW, th, tw, n, oh0, ow0, k0, y);
#endif
}

// ------------------------------------------------------------------ CUDA-core kernel
constexpr int kDirectThreads = 256;
constexpr int kDirectChannels = 4;  // output channels per thread

struct DirectArgs {
  int64_t N;
  int H, W, C, K, R, S;
  int stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;
  int P, Q;
  int pool_h, pool_w, pool_stride_h, pool_stride_w, pool_pad_top, pool_pad_left;
  int PH, PW;
  int k_groups;  // ceil(K / kDirectChannels)
};

template <typename T>
__global__ void __launch_bounds__(kDirectThreads)
    conv_pool_direct_kernel(DirectArgs a, const T* __restrict__ x, const T* __restrict__ w,
                            const T* __restrict__ bias, T* __restrict__ y) {
  // Thread -> (image, pooled row, pooled column, channel group); neighbouring threads take
  // neighbouring channel groups of one pixel: weight reads coalesce, input reads broadcast.
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kDirectThreads + threadIdx.x;
  if (idx >= a.N * a.PH * a.PW * a.k_groups) return;
  int64_t rest = idx;
  const int kg = static_cast<int>(rest % a.k_groups);
  rest /= a.k_groups;
  const int pw = static_cast<int>(rest % a.PW);
  rest /= a.PW;
  const int ph = static_cast<int>(rest % a.PH);
  const int64_t n = rest / a.PH;
  const int k_base = kg * kDirectChannels;
  int kk[kDirectChannels];  // clamped channel indices: loads stay in bounds, extras unused
  float b[kDirectChannels], best[kDirectChannels];
#pragma unroll
  for (int t = 0; t < kDirectChannels; ++t) {
    kk[t] = min(k_base + t, a.K - 1);
    b[t] = bias != nullptr ? to_float(bias[kk[t]]) : 0.0f;
    best[t] = neg_inf();
  }
  for (int dy = 0; dy < a.pool_h; ++dy) {
    const int oh = ph * a.pool_stride_h - a.pool_pad_top + dy;
    if (oh < 0 || oh >= a.P) continue;  // the pool's -inf padding
    for (int dx = 0; dx < a.pool_w; ++dx) {
      const int ow = pw * a.pool_stride_w - a.pool_pad_left + dx;
      if (ow < 0 || ow >= a.Q) continue;
      float acc[kDirectChannels] = {};
      for (int r = 0; r < a.R; ++r) {
        const int ih = oh * a.stride_h - a.pad_top + r * a.dilation_h;
        if (ih < 0 || ih >= a.H) continue;  // the conv's zero padding
        for (int s = 0; s < a.S; ++s) {
          const int iw = ow * a.stride_w - a.pad_left + s * a.dilation_w;
          if (iw < 0 || iw >= a.W) continue;
          const T* xp = x + ((n * a.H + ih) * a.W + iw) * a.C;
          const T* wp = w + static_cast<int64_t>(r * a.S + s) * a.C * a.K;
          for (int c = 0; c < a.C; ++c) {
            const float xv = to_float(xp[c]);
#pragma unroll
            for (int t = 0; t < kDirectChannels; ++t)
              acc[t] = fmaf(xv, to_float(wp[static_cast<int64_t>(c) * a.K + kk[t]]), acc[t]);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kDirectChannels; ++t)
        best[t] = max_nan(best[t], to_float(from_float<T>(Relu(acc[t] + b[t]))));
    }
  }
  T* yp = y + ((n * a.PH + ph) * a.PW + pw) * a.K;
#pragma unroll
  for (int t = 0; t < kDirectChannels; ++t)
    if (k_base + t < a.K) yp[k_base + t] = from_float<T>(best[t]);
}

}  // namespace conv_pool
}  // namespace jaxcnn
