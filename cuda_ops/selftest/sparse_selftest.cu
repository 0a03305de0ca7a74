// Standalone check of launch_sparse_conv (zero-skipping conv, plain and with the fused
// ReLU + max-pool epilogue) against a host float64 reference, over shapes x sparsity levels
// (no zeros, 50%, 90%, 99%, all zeros) x fp32/bf16/fp16: odd spatial sizes, N = 1, stride 2,
// padding, dilation, C and K off multiples of 32, 1x1 / 3x3 / 5x5 / 11x11 windows, both kernels
// and every plan (tile: 4x8 / 8x8 tiles, channel splits, and the unsplit fallback when the
// scratch is short; walk: channels per lane 1/2/4, 4 or 8 pixels per warp, pooled windows 2x2,
// 3x3 stride 2, 4x4 in rounds). Outputs are poisoned (0xFF bytes: NaN in every dtype) before each launch and a guard
// region past y must stay untouched, so an unwritten or stray element fails. Large layers
// (VGG-19 / AlexNet shapes) and cudaEvent timings per sparsity run unless --skip-large.
// Build alone: nvcc -std=c++17 -O3 -arch=sm_90a -I cuda_ops cuda_ops/selftest/sparse_selftest.cu
//              cuda_ops/sparse/sparse_conv.cu -o sparse_selftest
// Usage: sparse_selftest [--skip-large]   (skip large layers and timings; for sanitizers)
//        sparse_selftest --time-only [--only NAME]  (timings only; NAME: a substring of the
//                                         timed shapes' names, e.g. for ncu's --launch-skip)
// Exit status: 0 all pass, 1 a case failed, 2 CUDA error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "selftest/selftest_util.h"
#include "sparse/sparse_conv.h"

namespace {

using jaxcnn::SparseConvParams;
using selftest::DType;

constexpr unsigned char kPoison = 0xFF;  // the scratch's: NaN bytes, as the output's

using selftest::DTypeOf;

// A layer: conv (+ optional pool). pool_* = 0: plain conv.
struct Shape {
  const char* name;
  int64_t N, H, W, C, K, R, S, stride, pad, dilation, activation;
  int64_t pool = 0, pool_stride = 0, pool_pad = 0;
};

SparseConvParams MakeParams(const Shape& s, int64_t elem_bytes = 4) {
  SparseConvParams p;
  p.elem_bytes = elem_bytes;
  p.N = s.N, p.H = s.H, p.W = s.W, p.C = s.C, p.K = s.K, p.R = s.R, p.S = s.S;
  p.stride_h = p.stride_w = s.stride;
  p.pad_h = p.pad_w = s.pad;
  p.dilation_h = p.dilation_w = s.dilation;
  p.activation = s.activation;
  p.P = selftest::OutSize(s.H, s.R, s.stride, s.pad, s.pad, s.dilation);
  p.Q = selftest::OutSize(s.W, s.S, s.stride, s.pad, s.pad, s.dilation);
  if (s.pool > 0) {
    p.pool_h = p.pool_w = s.pool;
    p.pool_stride_h = p.pool_stride_w = s.pool_stride;
    p.pool_pad_h = p.pool_pad_w = s.pool_pad;
    p.PP = selftest::OutSize(p.P, s.pool, s.pool_stride, s.pool_pad, s.pool_pad, 1);
    p.PQ = selftest::OutSize(p.Q, s.pool, s.pool_stride, s.pool_pad, s.pool_pad, 1);
  }
  return p;
}

// Reference output and, per element, the sum of |products| + |bias| (the scale fp32
// summation error is bounded by).
void Reference(const SparseConvParams& p, const std::vector<float>& x, const std::vector<float>& w,
               const std::vector<float>& b, std::vector<double>& out, std::vector<double>& scale) {
  std::vector<double> conv(p.N * p.P * p.Q * p.K), conv_scale(conv.size());
  const selftest::ConvWindow win{p.H, p.W, p.R, p.S, p.stride_h, p.stride_w,
                                 p.pad_h, p.pad_w, p.dilation_h, p.dilation_w};
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t oh = 0; oh < p.P; ++oh)
      for (int64_t ow = 0; ow < p.Q; ++ow)
        for (int64_t k = 0; k < p.K; ++k) {
          double acc = b[k], mag = std::fabs(b[k]);
          selftest::ForEachTap(win, oh, ow, [&](int64_t r, int64_t s, int64_t h, int64_t wx) {
            const float* xp = &x[((n * p.H + h) * p.W + wx) * p.C];
            const float* wp = &w[(r * p.S + s) * p.C * p.K + k];
            for (int64_t c = 0; c < p.C; ++c) {
              if (xp[c] == 0.0f) continue;  // exact: a zero adds nothing (inputs are finite)
              const double prod = static_cast<double>(xp[c]) * wp[c * p.K];
              acc += prod;
              mag += std::fabs(prod);
            }
          });
          const bool relu = p.pooled() || p.activation == 1;
          const int64_t i = ((n * p.P + oh) * p.Q + ow) * p.K + k;
          conv[i] = relu ? std::max(acc, 0.0) : acc;
          conv_scale[i] = mag;
        }
  if (!p.pooled()) {
    out = conv;
    scale = conv_scale;
    return;
  }
  out.assign(p.N * p.PP * p.PQ * p.K, -INFINITY);
  scale.assign(out.size(), 0.0);
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t ph = 0; ph < p.PP; ++ph)
      for (int64_t pw = 0; pw < p.PQ; ++pw)
        for (int64_t k = 0; k < p.K; ++k) {
          const int64_t o = ((n * p.PP + ph) * p.PQ + pw) * p.K + k;
          for (int64_t i = 0; i < p.pool_h; ++i)
            for (int64_t j = 0; j < p.pool_w; ++j) {
              const int64_t h = ph * p.pool_stride_h - p.pool_pad_h + i;
              const int64_t wx = pw * p.pool_stride_w - p.pool_pad_w + j;
              if (h < 0 || h >= p.P || wx < 0 || wx >= p.Q) continue;
              const int64_t c = ((n * p.P + h) * p.Q + wx) * p.K + k;
              out[o] = std::max(out[o], conv[c]);
              scale[o] = std::max(scale[o], conv_scale[c]);
            }
        }
}

template <typename T>
struct DeviceCase {
  T *x = nullptr, *w = nullptr, *b = nullptr, *y = nullptr;
  void* scratch = nullptr;
  int64_t scratch_bytes = 0, y_elems = 0;
  ~DeviceCase() {
    cudaFree(x), cudaFree(w), cudaFree(b), cudaFree(y), cudaFree(scratch);
  }
};

// Host inputs: x with a fraction `sparsity` of exact zeros (the rest |v| >= 1/64, never 0),
// He-scaled weights, small biases; all rounded to T.
template <typename T>
void MakeInputs(const SparseConvParams& p, double sparsity, uint64_t seed, std::vector<T>& x,
                std::vector<T>& w, std::vector<T>& b, std::vector<float>& xf,
                std::vector<float>& wf, std::vector<float>& bf) {
  selftest::Lcg rng{seed};
  const int64_t nx = p.N * p.H * p.W * p.C, nw = p.R * p.S * p.C * p.K;
  x.resize(nx), xf.resize(nx), w.resize(nw), wf.resize(nw), b.resize(p.K), bf.resize(p.K);
  for (int64_t i = 0; i < nx; ++i) {
    const double u = 0.5 * (rng.next() + 1.0);
    float v = 0.0f;
    if (u >= sparsity) {
      v = rng.next();
      if (std::fabs(v) < 1.0f / 64) v = v < 0 ? -1.0f / 64 : 1.0f / 64;
    }
    x[i] = selftest::FromFloat<T>(v);
    xf[i] = selftest::ToFloat(x[i]);
  }
  const float wscale = std::sqrt(6.0f / static_cast<float>(p.R * p.S * p.C));
  for (int64_t i = 0; i < nw; ++i) {
    w[i] = selftest::FromFloat<T>(rng.next() * wscale);
    wf[i] = selftest::ToFloat(w[i]);
  }
  for (int64_t i = 0; i < p.K; ++i) {
    b[i] = selftest::FromFloat<T>(0.1f * rng.next());
    bf[i] = selftest::ToFloat(b[i]);
  }
}

// scratch_limit < 0: the full scratch the plan asks for; else that many bytes (the tile kernel
// then splits less).
template <typename T>
bool RunCase(const Shape& shape, double sparsity, bool with_bias, uint64_t seed,
             int64_t scratch_limit = -1) {
  const SparseConvParams p = MakeParams(shape, sizeof(T));
  const int64_t scratch_bytes =
      scratch_limit < 0 ? jaxcnn::sparse_conv_scratch_bytes(p) : scratch_limit;
  const jaxcnn::SparseConvPlan plan = jaxcnn::plan_sparse_conv(p, scratch_bytes);
  const char* dtype = selftest::DTypeName(DTypeOf<T>());
  if (plan.unsupported != nullptr) {
    std::printf("FAIL %-14s %-4s sparsity %.2f: unsupported: %s\n", shape.name, dtype, sparsity,
                plan.unsupported);
    return false;
  }
  std::vector<T> x, w, b;
  std::vector<float> xf, wf, bf;
  MakeInputs<T>(p, sparsity, seed, x, w, b, xf, wf, bf);
  if (!with_bias) std::fill(bf.begin(), bf.end(), 0.0f);

  DeviceCase<T> d;
  d.y_elems = p.pooled() ? p.N * p.PP * p.PQ * p.K : p.N * p.P * p.Q * p.K;
  CHECK_CUDA(cudaMalloc(&d.x, x.size() * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&d.w, w.size() * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&d.b, b.size() * sizeof(T)));
  const selftest::PoisonedOutput<T> out(d.y_elems);
  d.scratch_bytes = scratch_bytes;
  CHECK_CUDA(cudaMalloc(&d.scratch, std::max<int64_t>(scratch_bytes, 16)));
  CHECK_CUDA(cudaMemcpy(d.x, x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d.w, w.data(), w.size() * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d.b, b.data(), b.size() * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(d.scratch, kPoison, std::max<int64_t>(scratch_bytes, 16)));
  CHECK_CUDA(jaxcnn::launch_sparse_conv<T>(p, d.x, d.w, with_bias ? d.b : nullptr, out.y(), d.scratch,
                                           d.scratch_bytes, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());

  std::vector<T> y;
  const bool guard_ok = out.Read(&y);
  std::vector<double> ref, scale;
  Reference(p, xf, wf, bf, ref, scale);

  const double tol = selftest::Tolerance(DTypeOf<T>());
  int64_t bad = 0, first_bad = -1;
  double worst = 0.0;
  for (int64_t i = 0; i < d.y_elems; ++i) {
    const double got = selftest::ToFloat(y[i]);
    // fp32 summation error ~ eps * sum|products|; one rounding to T ~ tol * |ref|.
    const double bound = tol * (std::fabs(ref[i]) + scale[i]) + 1e-6;
    const double err = std::fabs(got - ref[i]);
    const bool ok = std::isfinite(got) ? err <= bound : got == ref[i];
    if (!ok) {
      if (first_bad < 0) first_bad = i;
      ++bad;
    }
    if (std::isfinite(got)) worst = std::max(worst, err / (std::fabs(ref[i]) + scale[i] + 1e-30));
  }
  const bool pass = bad == 0 && guard_ok;
  std::printf("%s %-14s %-4s sparsity %.2f bias %d: plan %s kpl=%d ppw=%d taps=%d tile=%dx%d "
              "splits=%d grid=%lldx%lld  max scaled err %.2e (tol %.0e)%s\n",
              pass ? "ok  " : "FAIL", shape.name, dtype, sparsity, with_bias ? 1 : 0,
              plan.kernel == jaxcnn::SparseKernel::kTile ? "tile" : "walk", plan.k_per_lane,
              plan.pixels_per_warp, plan.taps_per_stage, plan.tile_h, plan.tile_w, plan.splits,
              static_cast<long long>(plan.grid_x), static_cast<long long>(plan.grid_y), worst, tol,
              guard_ok ? "" : "  GUARD OVERWRITTEN");
  if (bad > 0)
    std::printf("     %lld bad elements; first at %lld: got %g want %g\n",
                static_cast<long long>(bad), static_cast<long long>(first_bad),
                static_cast<double>(selftest::ToFloat(y[first_bad])), ref[first_bad]);
  return pass;
}

const char* g_time_only_name = nullptr;  // --only: time just the shapes whose name holds it

// cudaEvent time of the encode + conv launches (median of 20) at each sparsity.
template <typename T>
void Time(const Shape& shape) {
  if (g_time_only_name != nullptr && std::strstr(shape.name, g_time_only_name) == nullptr) return;
  const SparseConvParams p = MakeParams(shape, sizeof(T));
  for (double sparsity : {0.0, 0.5, 0.9, 0.99}) {
    std::vector<T> x, w, b;
    std::vector<float> xf, wf, bf;
    MakeInputs<T>(p, sparsity, 7, x, w, b, xf, wf, bf);
    DeviceCase<T> d;
    d.y_elems = p.pooled() ? p.N * p.PP * p.PQ * p.K : p.N * p.P * p.Q * p.K;
    CHECK_CUDA(cudaMalloc(&d.x, x.size() * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&d.w, w.size() * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&d.b, b.size() * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&d.y, d.y_elems * sizeof(T)));
    d.scratch_bytes = jaxcnn::sparse_conv_scratch_bytes(p);
    CHECK_CUDA(cudaMalloc(&d.scratch, std::max<int64_t>(d.scratch_bytes, 16)));
    CHECK_CUDA(cudaMemcpy(d.x, x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d.w, w.data(), w.size() * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d.b, b.data(), b.size() * sizeof(T), cudaMemcpyHostToDevice));
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    std::vector<float> ms;
    for (int it = 0; it < 23; ++it) {
      CHECK_CUDA(cudaEventRecord(start));
      CHECK_CUDA(jaxcnn::launch_sparse_conv<T>(p, d.x, d.w, d.b, d.y, d.scratch, d.scratch_bytes,
                                               nullptr));
      CHECK_CUDA(cudaEventRecord(stop));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float t = 0;
      CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
      if (it >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double flops = 2.0 * p.N * p.P * p.Q * p.K * p.R * p.S * p.C;
    const jaxcnn::SparseConvPlan plan = jaxcnn::plan_sparse_conv(p, d.scratch_bytes);
    std::printf("time %-14s %-4s sparsity %.2f: %.3f ms median (%.1f dense-equivalent TFLOP/s) "
                "plan %s warps=%dx%d splits=%d grid=%lldx%lld\n",
                shape.name, selftest::DTypeName(DTypeOf<T>()), sparsity, ms[ms.size() / 2],
                flops / (ms[ms.size() / 2] * 1e-3) / 1e12,
                plan.kernel == jaxcnn::SparseKernel::kTile ? "tile" : "walk", plan.warps_y,
                plan.warps_x, plan.splits, static_cast<long long>(plan.grid_x),
                static_cast<long long>(plan.grid_y));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool skip_large = false, time_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--skip-large") == 0) {
      skip_large = true;
    } else if (std::strcmp(argv[i], "--time-only") == 0) {
      time_only = true;
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      g_time_only_name = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--skip-large | --time-only [--only NAME]]\n", argv[0]);
      return 2;
    }
  }
  // name, N, H, W, C, K, R, S, stride, pad, dilation, relu, pool, pool_stride, pool_pad
  const Shape small[] = {
      {"3x3_c40_k24", 2, 9, 7, 40, 24, 3, 3, 1, 1, 1, 1},
      {"3x3_c64_k128", 1, 13, 11, 64, 128, 3, 3, 1, 1, 1, 0},
      {"3x3_s2_c33_k70", 2, 15, 12, 33, 70, 3, 3, 2, 1, 1, 1},
      {"1x1_c96_k200", 3, 5, 6, 96, 200, 1, 1, 1, 0, 1, 1},
      {"5x5_c7_k16", 1, 10, 9, 7, 16, 5, 5, 1, 2, 1, 0},
      {"3x3_dil2", 1, 12, 12, 32, 64, 3, 3, 1, 2, 2, 1},
      {"11x11_s4_c3", 1, 35, 33, 3, 48, 11, 11, 4, 2, 1, 1},
      {"1x1_c1_k1", 1, 3, 3, 1, 1, 1, 1, 1, 0, 1, 0},
      {"valid_3x3_n1", 1, 8, 5, 17, 33, 3, 3, 1, 0, 1, 1},
      {"3x3_c300_split", 1, 9, 10, 300, 36, 3, 3, 1, 1, 1, 1},
      {"5x5_c70_k130", 2, 11, 17, 70, 130, 5, 5, 1, 2, 1, 0},
      {"1x1_c257_k300", 1, 7, 9, 257, 300, 1, 1, 1, 0, 1, 1},
      // Widths that 8-wide tiles cover best (most shapes above run 7-wide tiles).
      {"3x3_w16_c40_k24", 2, 9, 16, 40, 24, 3, 3, 1, 1, 1, 1},
      {"3x3_w8_c300_split", 1, 9, 8, 300, 130, 3, 3, 1, 1, 1, 1},
      {"5x5_w16_c70_k130", 1, 11, 16, 70, 130, 5, 5, 1, 2, 1, 0},
      {"1x1_w8_c96_k200", 3, 5, 8, 96, 200, 1, 1, 1, 0, 1, 1},
      {"pool2_c64", 2, 12, 10, 64, 96, 3, 3, 1, 1, 1, 1, 2, 2, 0},
      {"pool2_odd", 1, 13, 11, 40, 24, 3, 3, 1, 1, 1, 1, 2, 2, 0},
      {"pool3s2", 2, 13, 13, 48, 130, 3, 3, 1, 1, 1, 1, 3, 2, 0},
      {"pool3s2_pad1", 1, 14, 9, 20, 40, 3, 3, 1, 1, 1, 1, 3, 2, 1},
      {"pool4_rounds", 1, 12, 12, 16, 32, 3, 3, 1, 1, 1, 1, 4, 4, 0},
      {"pool2_s2conv", 1, 17, 15, 35, 64, 3, 3, 2, 1, 1, 1, 2, 2, 0},
  };
  const Shape large[] = {
      {"vgg_c1_2", 1, 224, 224, 64, 64, 3, 3, 1, 1, 1, 1},
      {"vgg_c3_2", 1, 56, 56, 256, 256, 3, 3, 1, 1, 1, 1},
      {"vgg_c5_2", 1, 14, 14, 512, 512, 3, 3, 1, 1, 1, 1},
      {"alexnet_c2", 2, 27, 27, 64, 192, 5, 5, 1, 2, 1, 1},
      {"alexnet_c1", 2, 224, 224, 3, 64, 11, 11, 4, 2, 1, 1},
      {"vgg_c2_2_pool", 1, 112, 112, 128, 128, 3, 3, 1, 1, 1, 1, 2, 2, 0},
      {"alex_c5_pool3s2", 2, 13, 13, 256, 256, 3, 3, 1, 1, 1, 1, 3, 2, 0},
  };
  const double sparsities[] = {0.0, 0.5, 0.9, 0.99, 1.0};
  int failures = 0, cases = 0;
  uint64_t seed = 1;
  for (const Shape& s : small)
    for (double sp : sparsities) {
      if (time_only) break;
      failures += !RunCase<float>(s, sp, true, seed++);
      failures += !RunCase<__nv_bfloat16>(s, sp, true, seed++);
      failures += !RunCase<__half>(s, sp, (seed & 1) != 0, seed++);
      cases += 3;
    }
  // The tile kernel with scratch too small to split: the unsplit plan must still be exact.
  for (const Shape& s : small)
    if (time_only) {
    } else if (jaxcnn::plan_sparse_conv(MakeParams(s)).splits > 1 ||
        jaxcnn::plan_sparse_conv(MakeParams(s, 2)).splits > 1) {
      failures += !RunCase<float>(s, 0.5, true, seed++, 0);
      failures += !RunCase<__nv_bfloat16>(s, 0.9, true, seed++, 0);
      cases += 2;
    }
  if (!skip_large) {
    for (const Shape& s : large)
      for (double sp : {0.0, 0.9}) {
        if (time_only) break;
        failures += !RunCase<float>(s, sp, true, seed++);
        failures += !RunCase<__nv_bfloat16>(s, sp, true, seed++);
        cases += 2;
      }
    Time<float>({"vgg_c3_2_n1", 1, 56, 56, 256, 256, 3, 3, 1, 1, 1, 1});
    Time<float>({"vgg_c3_2_n64", 64, 56, 56, 256, 256, 3, 3, 1, 1, 1, 1});
    Time<float>({"vgg_c3_2_n8", 8, 56, 56, 256, 256, 3, 3, 1, 1, 1, 1});
    Time<__nv_bfloat16>({"vgg_c3_2_n8", 8, 56, 56, 256, 256, 3, 3, 1, 1, 1, 1});
    Time<float>({"vgg_c2_1_n64", 64, 112, 112, 64, 128, 3, 3, 1, 1, 1, 1});
    // VGG conv4_2: the layer furthest from 2x XLA HIGHEST (cuDNN's FFT conv) at N = 64.
    Time<float>({"vgg_c4_2_n64", 64, 28, 28, 512, 512, 3, 3, 1, 1, 1, 1});
    Time<float>({"alex_c3_n1", 1, 13, 13, 192, 384, 3, 3, 1, 1, 1, 1});
    Time<float>({"alex_c3_n64", 64, 13, 13, 192, 384, 3, 3, 1, 1, 1, 1});
    // The tile kernel's other shapes: K <= 64 (2 channels a lane) and 1x1.
    Time<float>({"vgg_c1_2_n4", 4, 224, 224, 64, 64, 3, 3, 1, 1, 1, 1});
    Time<float>({"res_1x1_k64_n16", 16, 56, 56, 256, 64, 1, 1, 1, 0, 1, 1});
    Time<float>({"res_1x1_k256_n16", 16, 56, 56, 64, 256, 1, 1, 1, 0, 1, 1});
    // Shapes whose channel-split count the partial-sum cost in the plan changes.
    Time<float>({"vgg_c1_2_n1", 1, 224, 224, 64, 64, 3, 3, 1, 1, 1, 1});
    Time<float>({"vgg_c2_2_n1", 1, 112, 112, 128, 128, 3, 3, 1, 1, 1, 1});
    Time<float>({"vgg_c3_2_n16", 16, 56, 56, 256, 256, 3, 3, 1, 1, 1, 1});
    Time<float>({"alex_c3_n16", 16, 13, 13, 192, 384, 3, 3, 1, 1, 1, 1});
    Time<float>({"res_1x1_k64_n64", 64, 56, 56, 256, 64, 1, 1, 1, 0, 1, 1});
  }
  std::printf("%s: %d of %d cases failed\n", failures ? "FAILED" : "PASSED", failures, cases);
  return failures ? 1 : 0;
}
