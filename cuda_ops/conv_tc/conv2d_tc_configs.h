// Internal interface between the launcher (conv2d_tensorcore.cu, no CUTLASS
// includes) and the CUTLASS kernel instantiations (conv2d_tc_<dtype>_{a,b}_sm90a.cu,
// two files per dtype so they compile in parallel).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace jaxcnn {
namespace conv_tc {

// Everything a kernel instantiation needs, already mapped to what the CUTLASS
// conv sees: `C` is the channel count of the GEMM-K (3*C for the 3xTF32
// path), H_eff/W_eff the input rows/cols any window touches (rows past them
// are cut off so the implied bottom/right pad is >= 0, as TMA needs), the
// activation strides are those of the real (possibly larger) tensor.
struct TcProblem {
  const void* x = nullptr;  // [N, H, W, C] with the strides below
  const void* w = nullptr;  // KRSC [K, R, S, C], packed
  const void* bias = nullptr;  // [K] or null
  // [N, P, Q, K] packed, or null; only the residual kernel variants take one.
  const void* residual = nullptr;
  void* y = nullptr;           // [N, P, Q, K], pixels y_stride_pixel elements apart
  int64_t y_stride_pixel = 0;
  int N = 0, H_eff = 0, W_eff = 0, C = 0;
  int64_t x_stride_n = 0, x_stride_h = 0, x_stride_w = 0;  // elements
  int R = 0, S = 0, K = 0, P = 0, Q = 0;
  int stride_h = 1, stride_w = 1;
  int pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int dil_h = 1, dil_w = 1;
  int act = 0;  // common/epilogue.cuh Activation code
  float alpha = 0.0f;
  int device = 0;    // for per-device kernel attributes
  int sm_count = 0;  // persistent grid size
};

// Config table, identical for every dtype (TK is 64 elements for 16-bit,
// 32 for TF32: 128-byte swizzled rows; the small-C config uses 32 bytes).
//   0 coop_128x256_c2  cooperative (2 consumer warpgroups), tile 128x256, 2x1 cluster
//                      (weights multicast): big compute-bound layers, K >= 256.
//   1 coop_256x128_c2  cooperative, tile 256x128, 2x1 cluster: big layers, K = 128.
//   2 pp_128x128_c1    ping-pong (epilogue of one warpgroup overlaps the other's
//                      mainloop), tile 128x128: mid-size / short-K (1x1) layers.
//   3 pp_128x64_c1     ping-pong, tile 128x64: K <= 64 outputs, memory-bound layers.
//   4 pp_64x64_c1      ping-pong, tile 64x64: few output pixels (batch 1).
//   5 pp_128x64_smallc ping-pong, tile 128x64, 32-byte K tile (16 bf16/fp16,
//                      8 fp32): few channels (C*bytes <= 32 in bf16/fp16, <= 64 in
//                      fp32); TMA zero-fills the channels past C, which would be
//                      most of a 128-byte K tile.
//   6 pp_128x128_k64   ping-pong, tile 128x128, 64-byte K tile (32 bf16/fp16, 16
//                      fp32): 64-byte channel rows (bf16 C = 32, the fire's 3x3
//                      expand), where a 128-byte tile is half fill and a 32-byte
//                      one moves tiny TMA boxes.
enum TcConfig : int {
  kCoop128x256C2 = 0,
  kCoop256x128C2 = 1,
  kPingpong128x128 = 2,
  kPingpong128x64 = 3,
  kPingpong64x64 = 4,
  kPingpong128x64SmallC = 5,
  kPingpong128x128K64 = 6,
  kNumConfigs = 7,
};

struct TcConfigInfo {
  const char* name;
  int tile_m, tile_n;
  int tile_k_bytes;  // GEMM-K tile in bytes of the element type
  int cluster_m;
};

// The 3xTF32 family (fp32 kHighest) keeps two accumulator fragments per
// thread (two-level accumulation, see conv2d_tc_cutlass.cuh), so its tiles are
// capped at 64x128 fp32 accumulators per consumer warpgroup (64 registers,
// 128 with the copy; the 128-register tiles of configs 0-2 would spill):
//   0 coop_128x128_c2  cooperative, tile 128x128, 2x1 cluster: big layers.
//   1 coop_256x64_c2   cooperative, tile 256x64, 2x1 cluster: big layers, K <= 64.
//   2 pp_64x128_c1     ping-pong, tile 64x128: mid-size layers.
//   3-5                as above (their accumulators are small enough).
//   6 pp_64x128_k64    ping-pong, tile 64x128, 64-byte K tile.
inline const TcConfigInfo& config_info(int c, bool split3 = false) {
  static const TcConfigInfo kInfo[kNumConfigs] = {
      {"coop_128x256_c2", 128, 256, 128, 2}, {"coop_256x128_c2", 256, 128, 128, 2},
      {"pp_128x128_c1", 128, 128, 128, 1},   {"pp_128x64_c1", 128, 64, 128, 1},
      {"pp_64x64_c1", 64, 64, 128, 1},       {"pp_128x64_smallc", 128, 64, 32, 1},
      {"pp_128x128_k64", 128, 128, 64, 1},
  };
  static const TcConfigInfo kInfoSplit3[kNumConfigs] = {
      {"coop_128x128_c2", 128, 128, 128, 2}, {"coop_256x64_c2", 256, 64, 128, 2},
      {"pp_64x128_c1", 64, 128, 128, 1},     {"pp_128x64_c1", 128, 64, 128, 1},
      {"pp_64x64_c1", 64, 64, 128, 1},       {"pp_128x64_smallc", 128, 64, 32, 1},
      {"pp_64x128_k64", 64, 128, 64, 1},
  };
  return split3 ? kInfoSplit3[c] : kInfo[c];
}

// bf16/fp16 kernels read the weights straight from HWIO (MN-major wgmma B).
// false: they read a KRSC copy the launcher makes per call, like fp32 does
// (a one-line switch back, should the HWIO path misbehave on some shape).
constexpr bool kHalfBFromHwio = true;

// GEMM-K elements the 3xTF32 wgmmas sum before each promotion into the fp32
// accumulator (4 k-tiles of 32; 16 of the small-C config's 8).
constexpr int kSplit3PromoteK = 128;

// One kernel instantiation: its extra CUTLASS workspace and its launch.
// `run` returns cudaErrorInvalidValue if CUTLASS refuses the problem.
struct TcKernelOps {
  size_t (*workspace_bytes)(const TcProblem&);
  cudaError_t (*run)(const TcProblem&, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream);
};

// Defined in conv2d_tc_{bf16,f16,tf32}_{a,b}_sm90a.cu: configs 0-2 (A) and 3-6 (B).
// These files are compiled for sm_90a only (wgmma/TMA kernels).
extern const TcKernelOps kBf16KernelsA[3];
extern const TcKernelOps kBf16KernelsB[4];
extern const TcKernelOps kF16KernelsA[3];
extern const TcKernelOps kF16KernelsB[4];
extern const TcKernelOps kTf32KernelsA[3];
extern const TcKernelOps kTf32KernelsB[4];
// fp32 kHighest (3xTF32, two-level accumulation): conv2d_tc_tf32x3_{a,b}_sm90a.cu.
extern const TcKernelOps kTf32x3KernelsA[3];
extern const TcKernelOps kTf32x3KernelsB[4];

// The residual variants (the epilogue reads the residual as its source tensor), each a whole
// extra instantiation, so only for a few configs: kResidualConfigs[i] is the config of entry
// i, and bf16/fp16 have the first kNumResidualConfigsHalf of them (pp_128x128, pp_128x64),
// fp32 (TF32 and 3xTF32) the last one only (pp_128x64, whose tile is the same in both
// tables). conv2d_tc_residual_{half,tf32}_sm90a.cu.
constexpr int kResidualConfigs[2] = {kPingpong128x128, kPingpong128x64};
constexpr int kNumResidualConfigsHalf = 2;
extern const TcKernelOps kBf16KernelsResidual[2];
extern const TcKernelOps kF16KernelsResidual[2];
extern const TcKernelOps kTf32KernelsResidual[1];    // config kPingpong128x64
extern const TcKernelOps kTf32x3KernelsResidual[1];  // config kPingpong128x64

}  // namespace conv_tc
}  // namespace jaxcnn
