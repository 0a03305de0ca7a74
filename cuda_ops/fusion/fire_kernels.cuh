// Fused fire module kernels (see fire.h for the math).
//
// fire_tc_kernel (bf16/fp16, sm_80+): persistent CTAs of 8 warps. The output is cut into
// tiles of TH x 16 pixels (TH = 8, or 4 for small images) and the expand output channels into
// `split` slices (each slice a share of the E1 and of the E3 channels); CTA b owns slice
// b % split and walks the tiles b / split, + walkers, ... Per tile:
//   1. squeeze: the (TH+2) x 18 input halo tile is an implicit GEMM [halo px x C] x [C x S] on
//      mma.sync m16n8k16 (fp32 accumulate), C streamed in chunks of 64 channels through two
//      cp.async buffers two chunks ahead (the next tile's first two chunks load during this
//      tile's expands); bias + ReLU, rounded to T, zero outside the image (the 3x3's
//      padding), kept in smem. Every slice recomputes its tile's squeeze: it is ~10% of the
//      FLOPs, and the second slice's input reads hit L2.
//   2. expands: the slice's 1x1 (K = S) and 3x3 (K = 9 S, nine shifted views of the same smem
//      tile: ldmatrix takes one row address per lane, so the shift is free) channels as
//      implicit GEMMs. Work item = (1 or 2 output rows, 64 channels), dealt round-robin to the
//      warps over the whole slice; bias (fp32, from smem) + ReLU on the fragments, stored
//      straight into the item's channel slice of y (no concatenate, no staging, no
//      block-wide barrier between items).
//   The slice's expand weights (and the squeeze weights when they fit) stay in smem for the
//   CTA's lifetime, loaded once with cp.async; the launcher picks `split` so that they fit.
// Shared-memory rows are padded so that 8 consecutive rows start in 8 different 16-byte bank
// groups (row bytes / 16 odd): ldmatrix is then conflict-free.
//
// fire_fma_kernel (any dtype, any channel counts, any alignment): the same fusion on CUDA
// cores in fp32 (8x8 output tiles, squeeze tile in fp32 smem). It is the fp32 path and the
// fallback where the tensor-core kernel's constraints do not hold.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/float_convert.cuh"
#include "common/mma_sm80.cuh"

namespace jaxcnn {
namespace fire {

// ------------------------------------------------------------------ tensor-core kernel
constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kTileW = 16;  // output columns per tile = one m16 MMA tile
constexpr int kHaloW = kTileW + 2;
constexpr int kInChunk = 64;      // input channels per squeeze chunk
constexpr int kExpandBlock = 64;  // output channels per warp work item
constexpr int kMaxExpandChunk = 128;  // widest expand chunk kept as one weight matrix

// Halo geometry of a tile of `tile_h` output rows.
__host__ __device__ constexpr int HaloPixels(int tile_h) { return (tile_h + 2) * kHaloW; }
__host__ __device__ constexpr int HaloRows(int tile_h) {  // whole m16 tiles
  return (HaloPixels(tile_h) + 15) / 16 * 16;
}
__host__ __device__ constexpr int TilePixels(int tile_h) { return tile_h * kTileW; }

// Row stride (elements of a 16-bit type) for `cols` columns: padded so rows are 16-byte
// aligned and row_bytes / 16 is odd (conflict-free ldmatrix over 8 consecutive rows).
__host__ __device__ constexpr int PaddedStride(int cols) {
  const int vecs = (cols + 7) / 8;
  return ((vecs % 2 == 1) ? vecs + 2 : vecs + 1) * 8;
}


// Everything the kernel needs, computed by the launcher (fire.cu).
struct TcArgs {
  int N, H, W, C, S, E1, E3;
  int tile_h;              // = the kernel's TH
  int tiles_h, tiles_w, num_tiles;
  int split;               // expand channel slices; CTA b owns slice b % split
  int ctas_per_sm;         // = the kernel's kBlocks
  int walkers;             // CTAs per slice: gridDim.x = walkers * split
  int e1_slice, e3_slice;  // channels of E1 / E3 per slice (multiples of 8; last may be short)
  int in_chunks;           // ceil(C / kInChunk)
  int sq_stride;           // smem row stride of the squeeze weights and the s tile
  int ex_chunk;            // output channels per expand weight chunk (<= kMaxExpandChunk)
  int ex_stride;           // PaddedStride(ex_chunk)
  int e1_chunks, e3_chunks;  // chunks per slice
  bool sq_resident;
  // Element offsets (T units) of the smem regions.
  int off_x, off_wsq, off_s, off_wex;
  int off_stage;  // per-warp output staging rows: kWarps x [kTileW][PaddedStride(kExpandBlock)]
  int off_bias;  // fp32 biases [S | E1 | E3] (an even T offset, 16-byte aligned)
  int x_buf_elems;      // one input-chunk buffer
  int wsq_chunk_elems;  // one chunk of squeeze weights (kInChunk rows)
  int wex_e1_elems;     // one 1x1 expand weight chunk (SK rows)
  int wex_e3_elems;     // one 3x3 expand weight chunk (9 SK rows)
};

// cp.async / ldmatrix / mma.sync helpers (common/mma_sm80.cuh).
using mma::CpAsync16;
using mma::CpAsyncCommit;
using mma::CpAsyncWait;
using mma::LdMatrixX4;
using mma::LdMatrixX4Trans;
using mma::Mma;
using mma::PackPair;
using mma::SmemAddr;
using mma::StMatrixX4;

// Issues (no wait) the cp.asyncs of rows [0, rows) x columns [0, cols_pad) of a
// [rows][stride] smem matrix from a row-major global matrix; columns >= cols_valid and rows
// >= rows_valid are zero-filled. All of a CTA's weights are in flight at once.
template <typename T>
__device__ __forceinline__ void IssueMatrix(T* dst, int stride, const T* src, int64_t src_ld,
                                            int rows, int rows_valid, int cols_pad,
                                            int cols_valid) {
  const int vecs = cols_pad / 8;
  for (int i = threadIdx.x; i < rows * vecs; i += kThreads) {
    const int r = i / vecs, v = i % vecs;
    const bool valid = r < rows_valid && v * 8 < cols_valid;
    CpAsync16(dst + r * stride + v * 8, valid ? src + r * src_ld + v * 8 : src, valid);
  }
}

struct TileCoord {
  int n, h0, w0;  // image, first output row and column
};

template <int TH>
__device__ __forceinline__ TileCoord TileAt(const TcArgs& a, int tile) {
  const int per_image = a.tiles_h * a.tiles_w;
  const int n = tile / per_image;
  const int rem = tile - n * per_image;
  const int th = rem / a.tiles_w;
  return {n, th * TH, (rem - th * a.tiles_w) * kTileW};
}

// Issues (no wait) the cp.asyncs of input chunk `chunk` of the tile at `t` into buffer `buf`:
// the halo tile's channels [chunk*64, chunk*64+64), zero outside the image and past C; with
// streamed squeeze weights, also their rows of this chunk.
template <typename T, int TH>
__device__ __forceinline__ void IssueInputChunk(const TcArgs& a, const T* __restrict__ x,
                                                const T* __restrict__ w_sq, T* smem,
                                                const TileCoord& t, int chunk, int buf) {
  constexpr int kVecs = kInChunk / 8;
  constexpr int kStride = PaddedStride(kInChunk);
  T* xs = smem + a.off_x + buf * a.x_buf_elems;
  const int c0 = chunk * kInChunk;
  // Each thread copies one 16-byte vector (channels c .. c + 7) of every 32nd halo pixel.
  static_assert(kThreads % kVecs == 0, "a thread keeps its channel vector");
  const int v = threadIdx.x % kVecs;
  const int c = c0 + v * 8;
  const bool c_ok = c < a.C;
  const T* const x_img = x + static_cast<int64_t>(t.n) * a.H * a.W * a.C + c;
#pragma unroll
  for (int p = threadIdx.x / kVecs; p < HaloPixels(TH); p += kThreads / kVecs) {
    const int py = p / kHaloW;
    const int gy = t.h0 - 1 + py, gx = t.w0 - 1 + (p - py * kHaloW);
    const bool valid = c_ok && static_cast<unsigned>(gy) < static_cast<unsigned>(a.H) &&
                       static_cast<unsigned>(gx) < static_cast<unsigned>(a.W);
    const T* src = valid ? x_img + (static_cast<int64_t>(gy) * a.W + gx) * a.C : x;
    CpAsync16(xs + p * kStride + v * 8, src, valid);
  }
  if (!a.sq_resident) {
    const int vecs = a.sq_stride / 8;  // includes the padding columns: zero-filled
    T* ws = smem + a.off_wsq + buf * a.wsq_chunk_elems;
    for (int i = threadIdx.x; i < kInChunk * vecs; i += kThreads) {
      const int r = i / vecs, v = i % vecs;
      const bool valid = c0 + r < a.C && v * 8 < a.S;
      const T* src = valid ? w_sq + static_cast<int64_t>(c0 + r) * a.S + v * 8 : w_sq;
      CpAsync16(ws + r * a.sq_stride + v * 8, src, valid);
    }
  }
}

// The CTA's input pipeline: the (tile, chunk) pairs it consumes, in order; the k-th one
// issued goes to buffer k % 2 and is consumed k-th.
struct InputCursor {
  int tile, chunk, issued;
  TileCoord at;  // TileAt(tile), recomputed only when the tile changes
};

// Issues the next (tile, chunk) of the sequence if any, and always commits a group (possibly
// empty) so that the consumer's wait_group count stays fixed.
template <typename T, int TH>
__device__ __forceinline__ void IssueNext(const TcArgs& a, const T* __restrict__ x,
                                          const T* __restrict__ w_sq, T* smem,
                                          InputCursor& cur) {
  if (cur.tile < a.num_tiles) {
    IssueInputChunk<T, TH>(a, x, w_sq, smem, cur.at, cur.chunk, cur.issued % 2);
    ++cur.issued;
    if (++cur.chunk == a.in_chunks) {
      cur.chunk = 0;
      cur.tile += a.walkers;
      if (cur.tile < a.num_tiles) cur.at = TileAt<TH>(a, cur.tile);
    }
  }
  CpAsyncCommit();
}

// One expand work item: output rows [row0, row0 + kRows) of the tile x channels
// [col0, col0 + 16 * kNp) of the chunk whose weights start at `wx` ([kTaps * SK][ex_stride]),
// accumulated in fp32 over kTaps shifted views of the s tile. Rows and width are template
// parameters so the loop has no branches: the fragments of step k + 1 (ldmatrix) are loaded
// while step k's MMAs run, which hides shared-memory latency with only 2 warps per scheduler.
template <typename T, int SK, int kTaps, int kRows, int kNp, int kAccRows>
__device__ __forceinline__ void ExpandMma(float (&acc)[kAccRows][8][4], const T* s_tile, const T* wx,
                                          int ex_stride, int row0, int col0) {
  constexpr int kSqStride = PaddedStride(SK);
  constexpr int kSteps = kTaps * (SK / 16);
  const int lane = threadIdx.x % 32;
  // Lane-dependent parts of the ldmatrix row addresses; the step parts are constants.
  const T* a_base = s_tile + ((row0 + (kTaps == 9 ? 0 : 1)) * kHaloW + lane % 16 +
                              (kTaps == 9 ? 0 : 1)) * kSqStride + (lane / 16) * 8;
  const T* b_base = wx + (lane % 16) * ex_stride + (lane / 16) * 8 + col0;
  auto load = [&](int step, uint32_t (&af)[kRows][4], uint32_t (&bf)[kNp][4]) {
    const int tap = step / (SK / 16), ks = step % (SK / 16);
    const int dy = kTaps == 9 ? tap / 3 : 0, dx = kTaps == 9 ? tap % 3 : 0;
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      LdMatrixX4(af[i], a_base + ((i + dy) * kHaloW + dx) * kSqStride + ks * 16);
    const T* wrow = b_base + (tap * SK + ks * 16) * ex_stride;
#pragma unroll
    for (int np = 0; np < kNp; ++np) LdMatrixX4Trans(bf[np], wrow + np * 16);
  };
  uint32_t af[2][kRows][4], bf[2][kNp][4];
  load(0, af[0], bf[0]);
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int cur = step % 2;
    if (step + 1 < kSteps) load(step + 1, af[cur ^ 1], bf[cur ^ 1]);
#pragma unroll
    for (int np = 0; np < kNp; ++np)
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        Mma<T>(acc[i][2 * np], af[cur][i], bf[cur][np][0], bf[cur][np][1]);
        Mma<T>(acc[i][2 * np + 1], af[cur][i], bf[cur][np][2], bf[cur][np][3]);
      }
  }
}

// ExpandMma for a run-time row count (1, or 2 when kAccRows is 2) and block width (16, 32,
// 48 or 64 channels).
template <typename T, int SK, int kTaps, int kAccRows>
__device__ __forceinline__ void ExpandItem(float (&acc)[kAccRows][8][4], const T* s_tile,
                                           const T* wx, int ex_stride, int row0, int rows,
                                           int col0, int width) {
  const int np = min(4, (width - col0 + 15) / 16);
  if constexpr (kAccRows == 2) {
    if (rows == 2) {
      if (np == 4) return ExpandMma<T, SK, kTaps, 2, 4>(acc, s_tile, wx, ex_stride, row0, col0);
      if (np == 3) return ExpandMma<T, SK, kTaps, 2, 3>(acc, s_tile, wx, ex_stride, row0, col0);
      if (np == 2) return ExpandMma<T, SK, kTaps, 2, 2>(acc, s_tile, wx, ex_stride, row0, col0);
      return ExpandMma<T, SK, kTaps, 2, 1>(acc, s_tile, wx, ex_stride, row0, col0);
    }
  }
  if (np == 4) return ExpandMma<T, SK, kTaps, 1, 4>(acc, s_tile, wx, ex_stride, row0, col0);
  if (np == 3) return ExpandMma<T, SK, kTaps, 1, 3>(acc, s_tile, wx, ex_stride, row0, col0);
  if (np == 2) return ExpandMma<T, SK, kTaps, 1, 2>(acc, s_tile, wx, ex_stride, row0, col0);
  return ExpandMma<T, SK, kTaps, 1, 1>(acc, s_tile, wx, ex_stride, row0, col0);
}

// SK: squeeze channels rounded up to 16 (the expands' K step); padded channels are zero.
// TH: output rows per tile (8 or 4).
// kBlocks: CTAs per SM (1 or 2). Two CTAs interleave their squeeze, barrier and expand phases
// (8 warps alone leave the MMA and shared-memory latencies exposed), but must fit in 128
// registers: their expand items are one row (half the accumulators, no 2-row weight reuse).
template <typename T, int SK, int TH, int kBlocks>
__global__ void __launch_bounds__(kThreads, kBlocks)
    fire_tc_kernel(TcArgs a, const T* __restrict__ x, const T* __restrict__ w_sq,
                   const T* __restrict__ b_sq, const T* __restrict__ w_e1,
                   const T* __restrict__ b_e1, const T* __restrict__ w_e3,
                   const T* __restrict__ b_e3, T* __restrict__ y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  constexpr int kXStride = PaddedStride(kInChunk);
  constexpr int kSqStride = PaddedStride(SK);  // = a.sq_stride: squeeze weights and s rows
  constexpr int kSqNTiles = SK / 8;
  constexpr int kHaloPixels = HaloPixels(TH);
  constexpr int kHaloRows = HaloRows(TH);
  constexpr int kHaloMTiles = kHaloRows / 16;  // 12 (TH 8) or 7 (TH 4): <= 2 per warp
  static_assert(kHaloMTiles <= 2 * kWarps, "squeeze: at most two m16 tiles per warp");
  static_assert(kBlocks == 1 || kBlocks == 2, "one or two CTAs per SM");
  constexpr int kMaxRows = kBlocks == 1 ? 2 : 1;  // output rows per expand item
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;  // MMA fragment row group and column pair
  const int E = a.E1 + a.E3;
  const int slice = blockIdx.x % a.split;
  // This slice's channels of each expand conv: [*_lo, *_hi) (empty when lo >= hi).
  const int e1_lo = slice * a.e1_slice, e1_hi = min(a.E1, e1_lo + a.e1_slice);
  const int e3_lo = slice * a.e3_slice, e3_hi = min(a.E3, e3_lo + a.e3_slice);

  // Rows past the halo pixels of the input buffers feed only discarded squeeze rows: zero
  // them once so nothing reads uninitialized shared memory.
  constexpr int kPadElems = (kHaloRows - kHaloPixels) * kXStride;
  for (int i = threadIdx.x; i < 2 * kPadElems; i += kThreads)
    smem[a.off_x + (i / kPadElems) * a.x_buf_elems + kHaloPixels * kXStride + i % kPadElems] =
        T(0.0f);
  // Biases as fp32 in shared memory: every tile's accumulators start from them.
  float* const bias_s = reinterpret_cast<float*>(smem + a.off_bias);
  for (int i = threadIdx.x; i < a.S + E; i += kThreads)
    bias_s[i] = to_float(i < a.S ? b_sq[i] : i < a.S + a.E1 ? b_e1[i - a.S] : b_e3[i - a.S - a.E1]);
  __syncthreads();
  // Resident weights: all in flight at once, one cp.async group ahead of the input chunks.
  if (a.sq_resident)
    IssueMatrix(smem + a.off_wsq, a.sq_stride, w_sq, a.S, a.in_chunks * kInChunk, a.C,
                a.sq_stride, a.S);
  for (int ch = 0; ch < a.e1_chunks; ++ch) {
    const int lo = e1_lo + ch * a.ex_chunk, width = min(a.ex_chunk, e1_hi - lo);
    if (width > 0)
      IssueMatrix(smem + a.off_wex + ch * a.wex_e1_elems, a.ex_stride, w_e1 + lo, a.E1, SK, a.S,
                  (width + 15) / 16 * 16, width);
  }
  T* const e3_weights = smem + a.off_wex + a.e1_chunks * a.wex_e1_elems;
  for (int ch = 0; ch < a.e3_chunks; ++ch) {
    const int lo = e3_lo + ch * a.ex_chunk, width = min(a.ex_chunk, e3_hi - lo);
    if (width > 0)
      for (int tap = 0; tap < 9; ++tap)
        IssueMatrix(e3_weights + ch * a.wex_e3_elems + tap * SK * a.ex_stride, a.ex_stride,
                    w_e3 + static_cast<int64_t>(tap) * a.S * a.E3 + lo, a.E3, SK, a.S,
                    (width + 15) / 16 * 16, width);
  }
  CpAsyncCommit();
  // Two input chunks in flight ahead of the one being consumed. (The first wait + barrier
  // of the squeeze loop also publishes the weights and the zeroed rows.)
  InputCursor cursor{static_cast<int>(blockIdx.x) / a.split, 0, 0, {}};
  if (cursor.tile < a.num_tiles) cursor.at = TileAt<TH>(a, cursor.tile);
  IssueNext<T, TH>(a, x, w_sq, smem, cursor);
  IssueNext<T, TH>(a, x, w_sq, smem, cursor);
  int consumed = 0;

  T* const s_tile = smem + a.off_s;
  // This warp's output staging buffer: one row of an item, [kTileW px][kExpandBlock ch].
  constexpr int kStageStride = PaddedStride(kExpandBlock);
  T* const stage = smem + a.off_stage + warp * kTileW * kStageStride;
  for (int tile = static_cast<int>(blockIdx.x) / a.split; tile < a.num_tiles;
       tile += a.walkers) {
    const TileCoord t = TileAt<TH>(a, tile);

    // ---------------- squeeze: [halo rows x C] x [C x SK] ----------------
    // The accumulators start at the bias (fp32; zero past S).
    float acc_s[2][kSqNTiles][4];
#pragma unroll
    for (int j = 0; j < kSqNTiles; ++j) {
      const int c = j * 8 + 2 * q;
      const float b0 = c < a.S ? bias_s[c] : 0.0f, b1 = c < a.S ? bias_s[c + 1] : 0.0f;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        acc_s[i][j][0] = acc_s[i][j][2] = b0;
        acc_s[i][j][1] = acc_s[i][j][3] = b1;
      }
    }

    for (int chunk = 0; chunk < a.in_chunks; ++chunk) {
      const int buf = consumed % 2;
      CpAsyncWait<1>();  // all but the newest group (the chunk after this one) have landed
      __syncthreads();

      const T* xs = smem + a.off_x + buf * a.x_buf_elems;
      const T* ws = smem + a.off_wsq + (a.sq_resident ? chunk : buf) * a.wsq_chunk_elems;
#pragma unroll
      for (int ks = 0; ks < kInChunk / 16; ++ks) {
        uint32_t b[kSqNTiles][2];
#pragma unroll
        for (int np = 0; np < SK / 16; ++np) {
          uint32_t r[4];
          LdMatrixX4Trans(r, ws + (ks * 16 + lane % 16) * kSqStride + np * 16 + (lane / 16) * 8);
          b[2 * np][0] = r[0], b[2 * np][1] = r[1];
          b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int mt = warp + i * kWarps;
          if (mt < kHaloMTiles) {
            uint32_t af[4];
            LdMatrixX4(af, xs + (mt * 16 + lane % 16) * kXStride + ks * 16 + (lane / 16) * 8);
#pragma unroll
            for (int nt = 0; nt < kSqNTiles; ++nt) Mma<T>(acc_s[i][nt], af, b[nt][0], b[nt][1]);
          }
        }
      }
      ++consumed;
      // Buffer `buf` is free once every warp is past this chunk: the chunk two ahead goes
      // there. The tile's last chunk waits for the barrier after the s tile instead.
      if (chunk + 1 < a.in_chunks) {
        __syncthreads();
        IssueNext<T, TH>(a, x, w_sq, smem, cursor);
      }
    }

    // ReLU, rounded to T; zero outside the image (the 3x3's zero padding applies to s).
    // (The previous tile's expands read s_tile before every warp passed the chunk loop's
    // first barrier.)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int mt = warp + i * kWarps;
      if (mt >= kHaloMTiles) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int p = mt * 16 + g + half * 8;
        if (p >= kHaloPixels) continue;
        const int gy = t.h0 - 1 + p / kHaloW, gx = t.w0 - 1 + p % kHaloW;
        const bool inside = static_cast<unsigned>(gy) < static_cast<unsigned>(a.H) &&
                            static_cast<unsigned>(gx) < static_cast<unsigned>(a.W);
#pragma unroll
        for (int nt = 0; nt < kSqNTiles; ++nt) {
          const int c = nt * 8 + 2 * q;
          // Channels past S accumulated zero weights onto a zero bias: ReLU keeps them 0.
          const float v0 = inside ? fmaxf(acc_s[i][nt][2 * half], 0.0f) : 0.0f;
          const float v1 = inside ? fmaxf(acc_s[i][nt][2 * half + 1], 0.0f) : 0.0f;
          *reinterpret_cast<uint32_t*>(s_tile + p * kSqStride + c) = PackPair<T>(v0, v1);
        }
      }
    }
    __syncthreads();  // s is complete, and the last input chunk's buffer is free
    IssueNext<T, TH>(a, x, w_sq, smem, cursor);

    // ---------------- expands: the slice's chunks, items dealt round-robin ----------------
    int item_base = 0;  // items of the earlier chunks of this tile
    const int chunks = a.e1_chunks + a.e3_chunks;
    for (int ch = 0; ch < chunks; ++ch) {
      const bool is3 = ch >= a.e1_chunks;
      const int local = is3 ? ch - a.e1_chunks : ch;
      const int conv_c0 = (is3 ? e3_lo : e1_lo) + local * a.ex_chunk;  // in its conv
      const int width = min(a.ex_chunk, (is3 ? e3_hi : e1_hi) - conv_c0);
      if (width <= 0) continue;
      const float* bias = bias_s + a.S + (is3 ? a.E1 : 0);
      const T* wx = is3 ? e3_weights + local * a.wex_e3_elems
                        : smem + a.off_wex + local * a.wex_e1_elems;
      // Items of 2 rows reuse each weight fragment twice; 1-row items when 2-row ones would
      // leave warps idle.
      const int blocks = (width + kExpandBlock - 1) / kExpandBlock;
      const int rows = kMaxRows == 2 && (TH / 2) * blocks >= kWarps ? 2 : 1;
      const int items = (TH / rows) * blocks;
      const int first = ((warp - item_base) % kWarps + kWarps) % kWarps;
      for (int item = first; item < items; item += kWarps) {
        const int row0 = rows * (item % (TH / rows));
        const int col0 = (item / (TH / rows)) * kExpandBlock;
        // The accumulators start at the bias (fp32), so the epilogue is ReLU + rounding only.
        float acc[kMaxRows][8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int c = col0 + nt * 8 + 2 * q;
          const float2 b = c < width ? *reinterpret_cast<const float2*>(bias + conv_c0 + c)
                                     : make_float2(0.0f, 0.0f);
#pragma unroll
          for (int i = 0; i < kMaxRows; ++i) {
            acc[i][nt][0] = acc[i][nt][2] = b.x;
            acc[i][nt][1] = acc[i][nt][3] = b.y;
          }
        }
        if (is3)
          ExpandItem<T, SK, 9>(acc, s_tile, wx, a.ex_stride, row0, rows, col0, width);
        else
          ExpandItem<T, SK, 1>(acc, s_tile, wx, a.ex_stride, row0, rows, col0, width);

        // ReLU, rounded to T, staged row by row in the warp's [16 px][64 ch] buffer
        // (stmatrix), then written with 16-byte stores: each warp store fills 4 pixels' whole
        // 128-byte channel runs of the item's slice of y (no concatenate, full sectors).
        const int out_c0 = (is3 ? a.E1 : 0) + conv_c0 + col0;
        const int vecs = min(kExpandBlock, width - col0) / 8;  // 16-byte vectors per pixel
        const int rows_left = a.H - t.h0 - row0, cols_left = min(kTileW, a.W - t.w0);
#pragma unroll
        for (int i = 0; i < kMaxRows; ++i) {
          if (i >= rows || i >= rows_left) continue;  // warp-uniform
#pragma unroll
          for (int np = 0; np < 4; ++np) {
            if (col0 + np * 16 >= width) continue;
            const uint32_t r[4] = {
                PackPair<T>(fmaxf(acc[i][2 * np][0], 0.0f), fmaxf(acc[i][2 * np][1], 0.0f)),
                PackPair<T>(fmaxf(acc[i][2 * np][2], 0.0f), fmaxf(acc[i][2 * np][3], 0.0f)),
                PackPair<T>(fmaxf(acc[i][2 * np + 1][0], 0.0f), fmaxf(acc[i][2 * np + 1][1], 0.0f)),
                PackPair<T>(fmaxf(acc[i][2 * np + 1][2], 0.0f), fmaxf(acc[i][2 * np + 1][3], 0.0f))};
            // Matrices: (px 0-7, n-tile 2np), (px 8-15, 2np), (px 0-7, 2np+1), (px 8-15, 2np+1).
            StMatrixX4(stage + ((lane / 8) % 2 * 8 + lane % 8) * kStageStride + np * 16 +
                           (lane / 16) * 8,
                       r);
          }
          __syncwarp();
          // Lane l writes vector l % 8 of pixels l / 8, + 4, + 8, + 12 (32-bit offsets).
          if (lane % 8 < vecs) {
            T* const y_lane = y + ((static_cast<int64_t>(t.n) * a.H + t.h0 + row0 + i) * a.W + t.w0) * E +
                              out_c0 + (lane / 8) * E + (lane % 8) * 8;
            const T* const st_lane = stage + (lane / 8) * kStageStride + (lane % 8) * 8;
#pragma unroll
            for (int j = 0; j < kTileW / 4; ++j)
              if (lane / 8 + 4 * j < cols_left)
                *reinterpret_cast<uint4*>(y_lane + 4 * j * E) =
                    *reinterpret_cast<const uint4*>(st_lane + 4 * j * kStageStride);
          }
          __syncwarp();  // the stage is rewritten by the next row or item
        }
      }
      item_base += items;
    }
  }
  CpAsyncWait<0>();  // no cp.async may outlive the CTA
#else
  __trap();  // the launcher only selects this kernel on sm_80+
#endif
}

// ------------------------------------------------------------------ CUDA-core kernel
constexpr int kFmaTile = 8;  // 8x8 output pixels per CTA
constexpr int kFmaHalo = kFmaTile + 2;

struct FmaArgs {
  int N, H, W, C, S, E1, E3;
  int tiles_h, tiles_w;
};

// One CTA per 8x8 output tile: squeeze of the 10x10 halo into fp32 smem [100][S] (rounded
// to T like the unfused reference), then every output (pixel, channel) of the tile.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    fire_fma_kernel(FmaArgs a, const T* __restrict__ x, const T* __restrict__ w_sq,
                    const T* __restrict__ b_sq, const T* __restrict__ w_e1,
                    const T* __restrict__ b_e1, const T* __restrict__ w_e3,
                    const T* __restrict__ b_e3, T* __restrict__ y) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* s_tile = reinterpret_cast<float*>(smem_raw);
  const int per_image = a.tiles_h * a.tiles_w;
  const int n = blockIdx.x / per_image;
  const int rem = blockIdx.x % per_image;
  const int h0 = (rem / a.tiles_w) * kFmaTile, w0 = (rem % a.tiles_w) * kFmaTile;
  const int E = a.E1 + a.E3;

  for (int i = threadIdx.x; i < kFmaHalo * kFmaHalo * a.S; i += kThreads) {
    const int p = i / a.S, s = i % a.S;
    const int gy = h0 - 1 + p / kFmaHalo, gx = w0 - 1 + p % kFmaHalo;
    float v = 0.0f;
    if (gy >= 0 && gy < a.H && gx >= 0 && gx < a.W) {
      const T* xp = x + ((static_cast<int64_t>(n) * a.H + gy) * a.W + gx) * a.C;
      float sum = 0.0f;
      for (int c = 0; c < a.C; ++c)
        sum = fmaf(to_float(xp[c]), to_float(w_sq[static_cast<int64_t>(c) * a.S + s]), sum);
      v = to_float(from_float<T>(fmaxf(sum + to_float(b_sq[s]), 0.0f)));
    }
    s_tile[p * a.S + s] = v;
  }
  __syncthreads();

  for (int i = threadIdx.x; i < kFmaTile * kFmaTile * E; i += kThreads) {
    const int p = i / E, c = i % E;
    const int oy = h0 + p / kFmaTile, ox = w0 + p % kFmaTile;
    if (oy >= a.H || ox >= a.W) continue;
    const int py = p / kFmaTile, px = p % kFmaTile;  // halo coords of the centre: +1
    float sum;
    if (c < a.E1) {
      sum = to_float(b_e1[c]);
      const float* sp = s_tile + ((py + 1) * kFmaHalo + px + 1) * a.S;
      for (int k = 0; k < a.S; ++k)
        sum = fmaf(sp[k], to_float(w_e1[static_cast<int64_t>(k) * a.E1 + c]), sum);
    } else {
      const int c3 = c - a.E1;
      sum = to_float(b_e3[c3]);
      for (int tap = 0; tap < 9; ++tap) {
        const float* sp = s_tile + ((py + tap / 3) * kFmaHalo + px + tap % 3) * a.S;
        const T* wp = w_e3 + static_cast<int64_t>(tap) * a.S * a.E3 + c3;
        for (int k = 0; k < a.S; ++k)
          sum = fmaf(sp[k], to_float(wp[static_cast<int64_t>(k) * a.E3]), sum);
      }
    }
    y[((static_cast<int64_t>(n) * a.H + oy) * a.W + ox) * E + c] = from_float<T>(fmaxf(sum, 0.0f));
  }
}

}  // namespace fire
}  // namespace jaxcnn
