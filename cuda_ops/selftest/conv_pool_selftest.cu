// Standalone check of launch_conv_pool (fused conv + bias + ReLU + max-pool) against a host
// float64 reference: odd spatial sizes, N = 1, strides, dilation, asymmetric and pool padding,
// overlapping (3x3/2) and non-square pools, channel counts off the 16-byte multiple (flat-K
// tensor cores; CUDA-core fallback where K is off it), several channel blocks, bf16 / fp16 on
// tensor cores and on the CUDA-core kernel, fp32 on TF32 tensor cores and on the CUDA-core
// kernel, misaligned buffers (auto falls back to CUDA cores, forced tensor cores are refused;
// flat-K takes any x), flat-K stems (C=3: SqueezeNet, ResNet, AlexNet) and small C (1-12) on
// every dtype, then VGG-19 c1_2 and AlexNet conv2 at full size (checked on one image) and
// cudaEvent timings of VGG-19's, AlexNet's and the stems' pooled layers at N = 64, bf16 and
// fp32 (TF32).
// Outputs are poisoned (0xFF bytes: NaN in every dtype) before each launch and a guard region
// past y must stay untouched, so an unwritten or stray element fails.
// Build alone: nvcc -std=c++17 -O3 -arch=sm_90a -I cuda_ops cuda_ops/selftest/conv_pool_selftest.cu
//              cuda_ops/conv_pool/conv_pool.cu -o conv_pool_selftest
// Usage: conv_pool_selftest [--skip-large]   (skips the full-size layers and timings; for
//        sanitizers)
// Exit status: 0 all pass, 1 a case failed, 2 CUDA error.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "conv_pool/conv_pool.h"
#include "conv_pool/conv_pool_wgmma.h"
#include "selftest/selftest_util.h"

namespace {

using jaxcnn::ConvPoolAlgorithm;
using jaxcnn::ConvPoolBuffers;
using jaxcnn::ConvPoolParams;
using selftest::DType;

const char* AlgoName(ConvPoolAlgorithm a) {
  switch (a) {
    case ConvPoolAlgorithm::kAuto: return "auto";
    case ConvPoolAlgorithm::kTensorCore: return "tensor_core";
    case ConvPoolAlgorithm::kDirect: return "direct";
    case ConvPoolAlgorithm::kStem: return "stem";
    case ConvPoolAlgorithm::kWgmma: return "wgmma";
  }
  return "?";
}

using selftest::DTypeOf;

// A layer: x [N,H,W,C], w [R,S,C,K]; conv stride/pad (top, bottom, left, right)/dilation;
// pool window/stride/pad (top, bottom, left, right).
struct Layer {
  const char* name;
  int64_t N, H, W, C, R, S, K;
  int sh, sw, pt, pb, pl, pr, dh, dw;
  int wh, ww, psh, psw, qt, qb, ql, qr;
};

ConvPoolParams ToParams(const Layer& l) {
  ConvPoolParams p{};
  p.N = l.N, p.H = l.H, p.W = l.W, p.C = l.C, p.R = l.R, p.S = l.S, p.K = l.K;
  p.stride_h = l.sh, p.stride_w = l.sw, p.pad_top = l.pt, p.pad_left = l.pl;
  p.dilation_h = l.dh, p.dilation_w = l.dw;
  p.P = selftest::OutSize(l.H, l.R, l.sh, l.pt, l.pb, l.dh);
  p.Q = selftest::OutSize(l.W, l.S, l.sw, l.pl, l.pr, l.dw);
  p.pool_h = l.wh, p.pool_w = l.ww, p.pool_stride_h = l.psh, p.pool_stride_w = l.psw;
  p.pool_pad_top = l.qt, p.pool_pad_left = l.ql;
  p.PH = (p.P + l.qt + l.qb - l.wh) / l.psh + 1;
  p.PW = (p.Q + l.ql + l.qr - l.ww) / l.psw + 1;
  return p;
}

// Host tensors of one case, already rounded to T (float copies for the reference).
template <typename T>
struct Case {
  ConvPoolParams p;
  std::vector<T> x, w, b;
  std::vector<float> xf, wf, bf;
};

template <typename T>
Case<T> MakeCase(const ConvPoolParams& p, uint64_t seed) {
  Case<T> c;
  c.p = p;
  selftest::Lcg rng{seed};
  // Uniform scales that keep activations O(1); a bias around -0.1 leaves many ReLU zeros.
  selftest::RandomFill(&rng, p.N * p.H * p.W * p.C, &c.x, &c.xf);
  selftest::RandomFill(&rng, p.R * p.S * p.C * p.K, &c.w, &c.wf, std::sqrt(6.0f / (p.R * p.S * p.C)));
  selftest::RandomFill(&rng, p.K, &c.b, &c.bf, 0.3f, -0.1f);
  return c;
}

// Pooled output of image n, [PH][PW][K], in float64.
template <typename T>
std::vector<double> Reference(const Case<T>& c, int64_t n) {
  const ConvPoolParams& p = c.p;
  std::vector<double> conv(p.P * p.Q * p.K);
  std::vector<double> acc(p.K);
  const selftest::ConvWindow win{p.H, p.W, p.R, p.S, p.stride_h, p.stride_w,
                                 p.pad_top, p.pad_left, p.dilation_h, p.dilation_w};
  for (int64_t oh = 0; oh < p.P; ++oh)
    for (int64_t ow = 0; ow < p.Q; ++ow) {
      for (int64_t k = 0; k < p.K; ++k) acc[k] = c.bf[k];
      selftest::ForEachTap(win, oh, ow, [&](int64_t r, int64_t s, int64_t ih, int64_t iw) {
        const float* xp = &c.xf[((n * p.H + ih) * p.W + iw) * p.C];
        for (int64_t ci = 0; ci < p.C; ++ci) {
          const double xv = xp[ci];
          const float* wp = &c.wf[((r * p.S + s) * p.C + ci) * p.K];
          for (int64_t k = 0; k < p.K; ++k) acc[k] += xv * wp[k];
        }
      });
      for (int64_t k = 0; k < p.K; ++k)
        conv[(oh * p.Q + ow) * p.K + k] = acc[k] > 0 ? acc[k] : 0.0;
    }
  std::vector<double> y(p.PH * p.PW * p.K, -INFINITY);
  for (int64_t i = 0; i < p.PH; ++i)
    for (int64_t j = 0; j < p.PW; ++j)
      for (int a = 0; a < p.pool_h; ++a) {
        const int64_t oh = i * p.pool_stride_h - p.pool_pad_top + a;
        if (oh < 0 || oh >= p.P) continue;
        for (int b = 0; b < p.pool_w; ++b) {
          const int64_t ow = j * p.pool_stride_w - p.pool_pad_left + b;
          if (ow < 0 || ow >= p.Q) continue;
          for (int64_t k = 0; k < p.K; ++k)
            y[(i * p.PW + j) * p.K + k] =
                std::fmax(y[(i * p.PW + j) * p.K + k], conv[(oh * p.Q + ow) * p.K + k]);
        }
      }
  return y;
}

// Elements by which x and y start past a 16-byte boundary; a plain int misaligns both.
struct Misalign {
  Misalign(int both = 0) : x(both), y(both) {}
  Misalign(int x_elems, int y_elems) : x(x_elems), y(y_elems) {}
  int x, y;
};

// A wgmma configuration forced on the cases that run while it is set (ForcedConfig), else -1:
// every configuration on the odd shapes and timed on the VGG layers, not just the one the
// launcher picks.
int g_wgmma_config = -1;
struct ForcedConfig {
  explicit ForcedConfig(int config) { g_wgmma_config = config; }
  ~ForcedConfig() { g_wgmma_config = -1; }
};

template <typename T>
cudaError_t Launch(const ConvPoolParams& p, const ConvPoolBuffers<T>& b, ConvPoolAlgorithm algo) {
  if constexpr (sizeof(T) == 2)  // the wgmma kernel is 16-bit only
    if (g_wgmma_config >= 0 && algo == ConvPoolAlgorithm::kWgmma)
      return jaxcnn::conv_pool_wgmma::LaunchConfig<T>(p, b, g_wgmma_config, 0);
  return jaxcnn::launch_conv_pool<T>(p, b, algo, 0);
}

// Runs one case: poison, launch, compare images `check` (all when empty) with the float64
// reference; returns pass. expect_refused: the plan must refuse (forced tensor cores on an
// unsupported case). With time_iters > 0 it also prints the mean cudaEvent time.
template <typename T>
bool RunCase(const Layer& layer, ConvPoolAlgorithm algo, Misalign misalign = {},
             bool expect_refused = false, std::vector<int64_t> check = {}, int time_iters = 0,
             bool tf32 = false) {
  ConvPoolParams p = ToParams(layer);
  p.allow_tf32 = tf32;
  const Case<T> c = MakeCase<T>(p, 0x5EED0000ULL + p.N * 7 + p.H * 131 + p.C * 31 + p.K);
  const int64_t y_count = p.N * p.PH * p.PW * p.K;
  ConvPoolBuffers<T> b;
  b.x = selftest::Upload(c.x, misalign.x);
  b.w = selftest::Upload(c.w);
  b.bias = selftest::Upload(c.b);
  const selftest::PoisonedOutput<T> out(y_count, misalign.y * sizeof(T));
  b.y = out.y();

  const jaxcnn::ConvPoolPlan plan = jaxcnn::plan_conv_pool<T>(p, b, algo);
  bool pass;
  double rel = 0.0, ms = 0.0;
  int64_t bad = 0;
  if (expect_refused) {
    pass = plan.unsupported != nullptr &&
           Launch<T>(p, b, algo) == cudaErrorInvalidValue;
  } else {
    pass = plan.unsupported == nullptr;
    if (pass) {
      CHECK_CUDA(Launch<T>(p, b, algo));
      CHECK_CUDA(cudaDeviceSynchronize());
    }
    std::vector<T> got;
    pass = out.Read(&got) && pass;
    // Every element must be written (no poison left), checked images or not.
    for (int64_t i = 0; pass && i < y_count; ++i)
      if (!std::isfinite(selftest::ToFloat(got[i]))) ++bad;
    selftest::RelError err;
    if (check.empty())
      for (int64_t n = 0; n < p.N; ++n) check.push_back(n);
    if (pass && bad == 0) {
      for (int64_t n : check) {
        const std::vector<double> want = Reference(c, n);
        const T* g = got.data() + n * p.PH * p.PW * p.K;
        for (size_t i = 0; i < want.size(); ++i) err.Add(selftest::ToFloat(g[i]), want[i]);
      }
    }
    rel = err.rel();
    // TF32 rounds every input to 10 mantissa bits (XLA's DEFAULT for fp32 does the same).
    const double tolerance = tf32 ? 5e-3 : selftest::Tolerance(DTypeOf<T>());
    pass = pass && bad == 0 && rel <= tolerance;
    if (pass && time_iters > 0) {
      cudaEvent_t start, stop;
      CHECK_CUDA(cudaEventCreate(&start));
      CHECK_CUDA(cudaEventCreate(&stop));
      for (int i = 0; i < 3; ++i) CHECK_CUDA(Launch<T>(p, b, algo));
      CHECK_CUDA(cudaEventRecord(start));
      for (int i = 0; i < time_iters; ++i) CHECK_CUDA(Launch<T>(p, b, algo));
      CHECK_CUDA(cudaEventRecord(stop));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float total = 0.0f;
      CHECK_CUDA(cudaEventElapsedTime(&total, start, stop));
      ms = total / time_iters;
      CHECK_CUDA(cudaEventDestroy(start));
      CHECK_CUDA(cudaEventDestroy(stop));
    }
  }
  const char* kernel = plan.unsupported != nullptr ? "refused" : AlgoName(plan.kernel);
  const int wgmma_config = plan.unsupported == nullptr && plan.kernel == ConvPoolAlgorithm::kWgmma
                               ? (g_wgmma_config >= 0 ? g_wgmma_config
                                                      : jaxcnn::conv_pool_wgmma::ChosenConfig(p))
                               : -1;
  std::printf("%-4s %-24s %-11s%s N=%lld %lldx%lldx%lld -> %lldx%lldx%lld  kernel=%s", pass ? "ok" : "FAIL",
              layer.name, AlgoName(algo), tf32 ? "+tf32" : "", static_cast<long long>(p.N),
              static_cast<long long>(p.H), static_cast<long long>(p.W),
              static_cast<long long>(p.C), static_cast<long long>(p.PH),
              static_cast<long long>(p.PW), static_cast<long long>(p.K), kernel);
  if (plan.kernel != ConvPoolAlgorithm::kDirect && plan.unsupported == nullptr)
    std::printf(" block=%dx%d pooled=%dx%d block_k=%d flat_k=%d tma=%d grid=%lld smem=%lld",
                plan.tile_h, plan.tile_w, plan.pooled_h, plan.pooled_w, plan.block_k,
                plan.flat_k ? 1 : 0, plan.tma ? 1 : 0, static_cast<long long>(plan.grid),
                static_cast<long long>(plan.smem_bytes));
  if (wgmma_config >= 0)
    std::printf(" config=%s%s", jaxcnn::conv_pool_wgmma::ConfigName(wgmma_config),
                g_wgmma_config >= 0 ? " (forced)" : "");
  if (!expect_refused) std::printf(" rel_err=%.2e unwritten=%lld", rel, static_cast<long long>(bad));
  if (ms > 0.0) {
    const double flops = 2.0 * p.N * p.P * p.Q * p.K * p.R * p.S * p.C;
    std::printf(" time=%.4f ms (%.0f TFLOP/s on the conv)", ms, flops / (ms * 1e-3) / 1e12);
  }
  if (plan.unsupported != nullptr) std::printf(" (%s)", plan.unsupported);
  std::printf("\n");
  CHECK_CUDA(cudaFree(const_cast<T*>(b.x) - misalign.x));
  CHECK_CUDA(cudaFree(const_cast<T*>(b.w)));
  CHECK_CUDA(cudaFree(const_cast<T*>(b.bias)));
  return pass;
}

// Small layers: every one runs on each dtype and algorithm.
const Layer kSmall[] = {
    // name                 N   H   W   C  R  S   K  sh sw pt pb pl pr dh dw  wh ww psh psw qt qb ql qr
    {"2x2/2 tiny",          1,  7,  9,  8, 3, 3,   8, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0},
    {"3x3/2 overlap",       2, 13, 11, 16, 3, 3,  24, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 2, 2, 0, 0, 0, 0},
    {"2x2/2 K=72 odd",      3, 17, 33, 40, 3, 3,  72, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0},
    {"5x5 3x3/2 poolpad",   1, 31, 29, 64, 5, 5, 136, 1, 1, 2, 2, 2, 2, 1, 1, 3, 3, 2, 2, 1, 1, 1, 1},
    {"stride2 dil2 pool2/1",2, 20, 21, 24, 3, 3,  16, 2, 2, 1, 2, 0, 1, 2, 2, 2, 2, 1, 1, 0, 0, 0, 0},
    {"asym pool 2x3/(1,2)", 1, 12, 19, 32, 3, 3,  40, 1, 1, 0, 2, 1, 0, 1, 1, 2, 3, 1, 2, 0, 1, 2, 0},
    {"no pool 1x1/1",       2,  9, 10, 16, 1, 1,  24, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0},
    {"C=12 K=20 K%8 != 0",  2, 11, 10, 12, 3, 3,  20, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 2, 2, 0, 0, 0, 0},
    {"C=20 flat-K 16-bit",  2, 14, 15, 20, 3, 3,  32, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0},
    {"alexnet c1-like C=3", 1, 35, 35,  3, 11, 11, 16, 4, 4, 2, 2, 2, 2, 1, 1, 3, 3, 2, 2, 0, 0, 0, 0},
    {"pool 16x1 tall",      1, 33,  9,  8, 3, 3,   8, 1, 1, 1, 1, 1, 1, 1, 1, 16, 1, 8, 1, 0, 0, 0, 0},
    {"pool 5x17 > blocks",  1, 20, 40,  8, 3, 3,   8, 1, 1, 1, 1, 1, 1, 1, 1, 5, 17, 3, 5, 0, 0, 0, 0},
};

// Flat-K layers on every dtype (C below 16 or off the 16-byte multiple): RGB stems at reduced
// size and small channel counts; GEMM-K = R*S*C below, at and above multiples of 32.
const Layer kFlatK[] = {
    // name                 N   H   W   C  R  S   K  sh sw pt pb pl pr dh dw  wh ww psh psw qt qb ql qr
    {"sq1.1 stem 3x3/2",    2, 37, 37,  3, 3, 3,  64, 2, 2, 0, 0, 0, 0, 1, 1, 3, 3, 2, 2, 0, 0, 0, 0},
    {"resnet stem 7x7/2",   2, 45, 45,  3, 7, 7,  64, 2, 2, 3, 3, 3, 3, 1, 1, 3, 3, 2, 2, 1, 1, 1, 1},
    {"alexnet stem 11x11/4",2, 67, 67,  3, 11, 11, 96, 4, 4, 2, 2, 2, 2, 1, 1, 3, 3, 2, 2, 0, 0, 0, 0},
    {"sq1.0 stem 7x7/2 ceil",1, 41, 39, 3, 7, 7,  96, 2, 2, 0, 0, 0, 0, 1, 1, 3, 3, 2, 2, 0, 1, 0, 1},
    {"C=1 K=8",             2, 15, 13,  1, 3, 3,   8, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0},
    {"C=2 4x4 RSC=32",      1, 18, 18,  2, 4, 4,   8, 2, 2, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0},
    {"C=5 dil2 poolpad",    1, 23, 26,  5, 5, 5,  24, 1, 1, 4, 4, 4, 4, 2, 2, 3, 3, 2, 2, 1, 1, 1, 1},
    {"C=8 asym 2x3/(1,2)",  2, 19, 17,  8, 3, 3,  16, 1, 2, 0, 2, 1, 0, 1, 1, 2, 3, 1, 2, 0, 1, 2, 0},
    {"C=12 K=136 3 blocks", 1, 21, 18, 12, 3, 3, 136, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 2, 2, 0, 0, 0, 0},
};

// Pooled layers of VGG-19 (conv before each 2x2/2 pool), AlexNet (3x3/2 pools) and the C=3
// stems (flat-K): SqueezeNet 1.1 and 1.0, ResNet (7x7/2 pad 3, pool pad 1), AlexNet (11x11/4).
// The wgmma kernel's family (3x3/1 SAME conv, 2x2/2 VALID pool, C % 32, K % 64): partial
// tiles, odd extents, one and several channel blocks and chunks, and more chunks than pipeline
// stages with several work items per CTA (the ping-pong consumers' ordering barrier), and the
// unpooled conv (a 1x1/1 pool: conv2d's algorithm "wgmma"). Each
// runs on every configuration that takes it; images `check` are compared (all when empty).
struct WgmmaLayer {
  Layer layer;
  std::vector<int64_t> check;
};
const WgmmaLayer kWgmma[] = {
    // name                 N   H   W   C  R  S   K  sh sw pt pb pl pr dh dw  wh ww psh psw qt qb ql qr
    {{"wgmma 16x16 one tile", 2, 16, 16, 32, 3, 3,  64, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0}, {}},
    {{"wgmma odd 13x13",      2, 13, 13, 32, 3, 3,  64, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0}, {}},
    {{"wgmma 30x22 K=128",    3, 30, 22, 64, 3, 3, 128, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0}, {}},
    {{"wgmma 17x33 K=192",    1, 17, 33, 64, 3, 3, 192, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0}, {}},
    {{"wgmma 3x41 C=128",     2,  3, 41, 128, 3, 3, 128, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0}, {}},
    {{"wgmma many tiles K=192", 24, 28, 28, 64, 3, 3, 192, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0}, {0, 13, 23}},
    {{"wgmma K=64 C=128",     4, 56, 56, 128, 3, 3,  64, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0}, {0, 3}},
    {{"wgmma C=256 K=64 x100", 100, 28, 28, 256, 3, 3, 64, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0}, {0, 37, 99}},
    {{"wgmma 42x26 C=96 K=256", 6, 42, 26, 96, 3, 3, 256, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0}, {0, 5}},
    // No pool (1x1/1): conv2d's algorithm "wgmma" stores the conv output itself.
    {{"wgmma conv only K=128", 3, 30, 22, 64, 3, 3, 128, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0}, {}},
    {{"wgmma conv only 13x13", 2, 13, 13, 96, 3, 3,  64, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0}, {}},
    {{"wgmma conv only 9x41",  2,  9, 41, 32, 3, 3, 192, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0}, {}},
};

const Layer kNetworks[] = {
    {"vgg19 c1_2",     64, 224, 224,  64, 3, 3,  64, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0},
    {"vgg19 c2_2",     64, 112, 112, 128, 3, 3, 128, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0},
    {"vgg19 c3_4",     64,  56,  56, 256, 3, 3, 256, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0},
    {"vgg19 c4_4",     64,  28,  28, 512, 3, 3, 512, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0},
    {"vgg19 c5_4",     64,  14,  14, 512, 3, 3, 512, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0},
    {"alexnet conv2",  64,  27,  27,  64, 5, 5, 192, 1, 1, 2, 2, 2, 2, 1, 1, 3, 3, 2, 2, 0, 0, 0, 0},
    {"alexnet conv5",  64,  13,  13, 256, 3, 3, 256, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 2, 2, 0, 0, 0, 0},
    {"sq1.1 conv1",    64, 224, 224,   3, 3, 3,  64, 2, 2, 0, 0, 0, 0, 1, 1, 3, 3, 2, 2, 0, 0, 0, 0},
    {"sq1.0 conv1",    64, 224, 224,   3, 7, 7,  96, 2, 2, 0, 0, 0, 0, 1, 1, 3, 3, 2, 2, 0, 0, 0, 0},
    {"resnet conv1",   64, 224, 224,   3, 7, 7,  64, 2, 2, 3, 3, 3, 3, 1, 1, 3, 3, 2, 2, 1, 1, 1, 1},
    {"alexnet conv1",  64, 224, 224,   3, 11, 11, 64, 4, 4, 2, 2, 2, 2, 1, 1, 3, 3, 2, 2, 0, 0, 0, 0},
};

// The auto plan for `layer` with a 16-byte aligned w and x, y misaligned by `misalign` (only the
// addresses' alignment reaches the plan).
template <typename T>
jaxcnn::ConvPoolPlan AutoPlan(const Layer& layer, bool tf32, Misalign misalign) {
  ConvPoolParams p = ToParams(layer);
  p.allow_tf32 = tf32;
  T* aligned = reinterpret_cast<T*>(uintptr_t{256});
  const ConvPoolBuffers<T> buffers{aligned + misalign.x, aligned, aligned, aligned + misalign.y};
  return jaxcnn::plan_conv_pool<T>(p, buffers, ConvPoolAlgorithm::kAuto);
}

// Whether the stem kernel runs `l` in T: GEMM-K = R*S*C <= 512, K a whole number of 16-byte
// vectors, and its smallest tile (one pool window) fitting the kernel's M (256 outputs, 128 with
// 128-channel blocks) and the 227 KB of shared memory of a Hopper CTA: weights, conv tile
// (StemShape's padded strides) and input tile.
template <typename T>
bool StemRuns(const Layer& l) {
  const int64_t vec = 16 / sizeof(T), elem = sizeof(T);
  const int64_t block_k = (l.K + 127) / 128 * 128 <= (l.K + 63) / 64 * 64 ? 128 : 64;
  const int64_t max_m = block_k == 128 ? 128 : 256;
  const int64_t stride = block_k + 8;  // StemShape::kBStride in every dtype
  const int64_t kf_pad = (l.R * l.S * l.C + 31) / 32 * 32;
  const int64_t in = ((l.wh - 1) * l.sh + (l.R - 1) * l.dh + 1) *
                     ((l.ww - 1) * l.sw + (l.S - 1) * l.dw + 1) * l.C;
  const int64_t smem = (kf_pad + max_m) * stride * elem + (max_m + kf_pad) * 4 + in * elem + 16;
  return l.K % vec == 0 && l.R * l.S * l.C <= 512 && l.wh * l.ww <= max_m && smem <= 232448;
}

// A small-C layer in one dtype (fp32 as TF32): auto must plan the stem kernel where it runs,
// else the tensor-core kernel's flat-K mode (a CUDA-core fallback would pass the reference as
// well); auto, forced stem (or its refusal) and forced flat-K tensor cores must match the
// reference. Returns the failures.
template <typename T>
int RunFlatK(const Layer& layer, bool tf32, Misalign misalign = {}) {
  const jaxcnn::ConvPoolPlan plan = AutoPlan<T>(layer, tf32, misalign);
  const bool stem = StemRuns<T>(layer);
  const bool planned = plan.unsupported == nullptr &&
                       (stem ? plan.kernel == ConvPoolAlgorithm::kStem
                             : plan.kernel == ConvPoolAlgorithm::kTensorCore && plan.flat_k);
  if (!planned)
    std::printf("FAIL %-24s auto plan is not the %s (%s)\n", layer.name,
                stem ? "stem kernel" : "flat-K tensor-core kernel",
                plan.unsupported != nullptr ? plan.unsupported : plan.why);
  return !planned + !RunCase<T>(layer, ConvPoolAlgorithm::kAuto, misalign, false, {}, 0, tf32) +
         !RunCase<T>(layer, ConvPoolAlgorithm::kStem, misalign, !stem, {}, 0, tf32) +
         !RunCase<T>(layer, ConvPoolAlgorithm::kTensorCore, misalign, false, {}, 0, tf32);
}

}  // namespace

int main(int argc, char** argv) {
  const bool skip_large = argc > 1 && std::strcmp(argv[1], "--skip-large") == 0;
  selftest::RequireCudaDevice();
  int failures = 0;
  const ConvPoolAlgorithm algos[] = {ConvPoolAlgorithm::kAuto, ConvPoolAlgorithm::kTensorCore,
                                     ConvPoolAlgorithm::kDirect};
  for (const Layer& l : kSmall) {
    // A conv block (16x8, 8x16 or 4x32) must hold a pool window.
    const bool fits = l.wh <= 16 && l.ww <= 32 && !(l.wh > 8 && l.ww > 8) &&
                      !(l.wh > 4 && l.ww > 16);
    // Any C (flat-K where C is small or off the 16-byte multiple); K in 16-byte vectors.
    const bool tc_ok = l.K % 8 == 0 && fits;
    const bool tf32_ok = l.K % 4 == 0 && fits;
    for (ConvPoolAlgorithm a : algos) {
      const bool refused = a == ConvPoolAlgorithm::kTensorCore && !tc_ok;
      failures += !RunCase<__nv_bfloat16>(l, a, 0, refused);
      failures += !RunCase<__half>(l, a, 0, refused);
    }
    failures += !RunCase<float>(l, ConvPoolAlgorithm::kAuto);
    failures += !RunCase<float>(l, ConvPoolAlgorithm::kTensorCore, 0, /*expect_refused=*/true);
    failures += !RunCase<float>(l, ConvPoolAlgorithm::kAuto, 0, false, {}, 0, /*tf32=*/true);
    failures += !RunCase<float>(l, ConvPoolAlgorithm::kTensorCore, 0, !tf32_ok, {}, 0, true);
    // The stem kernel forced on every small layer (any C); refused where it cannot run.
    failures += !RunCase<__nv_bfloat16>(l, ConvPoolAlgorithm::kStem, 0, !StemRuns<__nv_bfloat16>(l));
    failures += !RunCase<__half>(l, ConvPoolAlgorithm::kStem, 0, !StemRuns<__half>(l));
    failures += !RunCase<float>(l, ConvPoolAlgorithm::kStem, 0, !StemRuns<float>(l), {}, 0, true);
    failures += !RunCase<float>(l, ConvPoolAlgorithm::kStem, 0, /*expect_refused=*/true);
  }
  // The wgmma kernel forced (sm_90 only; refused elsewhere and for float), and auto on it.
  int major = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  for (const WgmmaLayer& wl : kWgmma) {
    const Layer& l = wl.layer;
    failures += !RunCase<__nv_bfloat16>(l, ConvPoolAlgorithm::kWgmma, 0, major != 9, wl.check);
    failures += !RunCase<__half>(l, ConvPoolAlgorithm::kWgmma, 0, major != 9, wl.check);
    failures += !RunCase<__nv_bfloat16>(l, ConvPoolAlgorithm::kAuto, 0, false, wl.check);
    failures += !RunCase<float>(l, ConvPoolAlgorithm::kWgmma, 0, /*expect_refused=*/true, {}, 0,
                                true);
    if (major != 9) continue;
    for (int config = 0; config < jaxcnn::conv_pool_wgmma::kConfigs; ++config) {
      if (!jaxcnn::conv_pool_wgmma::ConfigTakes(config, ToParams(l))) continue;
      ForcedConfig forced(config);
      failures += !RunCase<__nv_bfloat16>(l, ConvPoolAlgorithm::kWgmma, 0, false, wl.check);
      failures += !RunCase<__half>(l, ConvPoolAlgorithm::kWgmma, 0, false, wl.check);
    }
  }
  // Outside the family (a 3x3/2 pool, K % 64 != 0): forced wgmma is refused.
  failures += !RunCase<__nv_bfloat16>(kSmall[1], ConvPoolAlgorithm::kWgmma, 0, true);
  failures += !RunCase<__nv_bfloat16>(kSmall[2], ConvPoolAlgorithm::kWgmma, 0, true);
  // Misaligned x and y: auto falls back to the CUDA-core kernel, forced tensor cores are refused.
  failures += !RunCase<__nv_bfloat16>(kSmall[1], ConvPoolAlgorithm::kAuto, 1);
  failures += !RunCase<__nv_bfloat16>(kSmall[1], ConvPoolAlgorithm::kTensorCore, 1, true);
  // Flat-K on every dtype; fp32 at precision "highest" stays off tensor cores.
  for (const Layer& l : kFlatK) {
    failures += RunFlatK<__nv_bfloat16>(l, false);
    failures += RunFlatK<__half>(l, false);
    failures += RunFlatK<float>(l, true);
    failures += !RunCase<float>(l, ConvPoolAlgorithm::kTensorCore, 0, /*expect_refused=*/true);
    failures += !RunCase<float>(l, ConvPoolAlgorithm::kStem, 0, /*expect_refused=*/true);
  }
  // N = 1 stems: few tiles, so the plan picks small ones to fill the GPU.
  for (const Layer* l : {&kFlatK[0], &kFlatK[2]}) {
    Layer one = *l;
    one.N = 1;
    failures += RunFlatK<__nv_bfloat16>(one, false);
  }
  // Flat-K gathers x element by element: any alignment of x runs on tensor cores.
  failures += RunFlatK<__nv_bfloat16>(kFlatK[0], false, {1, 0});
  failures += RunFlatK<float>(kFlatK[1], true, {1, 0});

  if (!skip_large) {
    // Full-size layers, checked on one image (the float64 reference is slow).
    Layer c12 = kNetworks[0];
    c12.N = 2;
    failures += !RunCase<__nv_bfloat16>(c12, ConvPoolAlgorithm::kAuto, 0, false, {1});
    Layer a2 = kNetworks[5];
    a2.N = 4;
    failures += !RunCase<__half>(a2, ConvPoolAlgorithm::kAuto, 0, false, {3});
    failures += !RunCase<float>(a2, ConvPoolAlgorithm::kAuto, 0, false, {0});
    failures += !RunCase<float>(a2, ConvPoolAlgorithm::kAuto, 0, false, {1}, 0, true);
    // Timings at N = 64, bf16 and fp32 as TF32 (image 0 of each checked too); the VGG layers
    // (wgmma under auto on Hopper) also on the mma.sync kernel.
    for (const Layer& l : kNetworks)
      failures += !RunCase<__nv_bfloat16>(l, ConvPoolAlgorithm::kAuto, 0, false, {0}, 20);
    for (int i = 0; i <= 4; ++i)
      failures +=
          !RunCase<__nv_bfloat16>(kNetworks[i], ConvPoolAlgorithm::kTensorCore, 0, false, {0}, 10);
    // Every wgmma configuration on VGG's pooled layers (the data behind ConfigFor's choice).
    for (int i = 0; i <= 4 && major == 9; ++i)
      for (int config = 0; config < jaxcnn::conv_pool_wgmma::kConfigs; ++config) {
        if (!jaxcnn::conv_pool_wgmma::ConfigTakes(config, ToParams(kNetworks[i]))) continue;
        ForcedConfig forced(config);
        failures += !RunCase<__nv_bfloat16>(kNetworks[i], ConvPoolAlgorithm::kWgmma, 0, false,
                                            {0}, 20);
      }
    for (const Layer& l : kNetworks)
      failures += !RunCase<float>(l, ConvPoolAlgorithm::kAuto, 0, false, {0}, 10, true);
    // The SqueezeNet 1.1 stem on the CUDA-core kernel, its only option before flat-K, and the
    // stems on the mma.sync kernel's flat-K mode, their kernel before the stem kernel.
    failures +=
        !RunCase<__nv_bfloat16>(kNetworks[7], ConvPoolAlgorithm::kDirect, 0, false, {0}, 20);
    for (int i = 7; i <= 10; ++i)
      failures +=
          !RunCase<__nv_bfloat16>(kNetworks[i], ConvPoolAlgorithm::kTensorCore, 0, false, {0}, 20);
    // N = 1 stems (timed): SqueezeNet 1.1, AlexNet.
    for (int i : {7, 10}) {
      Layer one = kNetworks[i];
      one.N = 1;
      failures += !RunCase<__nv_bfloat16>(one, ConvPoolAlgorithm::kAuto, 0, false, {0}, 50);
      failures += !RunCase<__nv_bfloat16>(one, ConvPoolAlgorithm::kTensorCore, 0, false, {0}, 50);
    }
  }
  return selftest::Finish(failures);
}
