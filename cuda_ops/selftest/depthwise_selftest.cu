// Standalone check of launch_conv2d_depthwise against a float64 CPU reference:
// every layout and dtype, strides 1/2, dilation 2, multipliers 1/2, 3x3/5x5/7x7,
// odd sizes, N=1, bias/no bias, ReLU, a misaligned input (scalar fallback) and
// NaN propagation. Outputs are NaN-poisoned so unwritten elements fail. Small
// shapes so it finishes in seconds under compute-sanitizer (memcheck /
// racecheck / initcheck). Exit status: 0 all pass, 1 a case failed, 2 CUDA error.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "depthwise/conv2d_depthwise.h"
#include "selftest/selftest_util.h"

namespace {

using selftest::DType;
using selftest::DTypeName;
using selftest::LayoutName;
using selftest::LayoutOffset;
using selftest::Tolerance;
using selftest::ToFloat;
using selftest::FromFloat;
using selftest::Lcg;
using selftest::OutSize;

using jaxcnn::Conv2dParams;
using jaxcnn::TensorLayout;

constexpr TensorLayout NHWC = TensorLayout::kNHWC;
constexpr TensorLayout NCHW = TensorLayout::kNCHW;
constexpr TensorLayout CHWN = TensorLayout::kCHWN;

struct Case {
  const char* name;
  DType dtype;
  TensorLayout layout;
  int64_t N, H, W, C, mult, R, S;
  int stride_h, stride_w;
  int pad_top, pad_bottom, pad_left, pad_right;
  int dil_h, dil_w;
  bool bias;
  bool relu;
  bool misalign;  // x and y start one element past an aligned address
  int nan_inputs;  // number of input elements set to NaN
};

// Float64 reference on the already-rounded T inputs; NaN propagates, and
// ReLU keeps NaN (like jnp.maximum).
void Reference(const std::vector<float>& x, const std::vector<float>& w,
               const std::vector<float>& bias, const Conv2dParams& p,
               bool has_bias, std::vector<double>* y) {
  const int64_t mult = p.K / p.C;
  y->assign(p.N * p.P * p.Q * p.K, 0.0);
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t oh = 0; oh < p.P; ++oh)
      for (int64_t ow = 0; ow < p.Q; ++ow)
        for (int64_t k = 0; k < p.K; ++k) {
          const int64_t c = k / mult;
          double acc = has_bias ? bias[k] : 0.0;
          for (int64_t r = 0; r < p.R; ++r) {
            const int64_t ih = oh * p.stride_h - p.pad_h + r * p.dil_h;
            if (ih < 0 || ih >= p.H) continue;
            for (int64_t s = 0; s < p.S; ++s) {
              const int64_t iw = ow * p.stride_w - p.pad_w + s * p.dil_w;
              if (iw < 0 || iw >= p.W) continue;
              acc += static_cast<double>(
                         x[LayoutOffset(p.layout, p.N, p.C, p.H, p.W, n, c, ih, iw)]) *
                     w[(r * p.S + s) * p.K + k];
            }
          }
          if (p.epilogue.act == jaxcnn::Activation::kRelu && acc < 0.0) acc = 0.0;
          (*y)[LayoutOffset(p.layout, p.N, p.K, p.P, p.Q, n, k, oh, ow)] = acc;
        }
}

template <typename T>
bool RunCase(const Case& tc, uint64_t seed) {
  Conv2dParams p{};
  p.N = tc.N; p.H = tc.H; p.W = tc.W; p.C = tc.C;
  p.R = tc.R; p.S = tc.S; p.K = tc.C * tc.mult;
  p.P = OutSize(tc.H, tc.R, tc.stride_h, tc.pad_top, tc.pad_bottom, tc.dil_h);
  p.Q = OutSize(tc.W, tc.S, tc.stride_w, tc.pad_left, tc.pad_right, tc.dil_w);
  p.stride_h = tc.stride_h; p.stride_w = tc.stride_w;
  p.pad_h = tc.pad_top; p.pad_w = tc.pad_left;
  p.dil_h = tc.dil_h; p.dil_w = tc.dil_w;
  p.groups = static_cast<int>(tc.C);
  p.epilogue.act = tc.relu ? jaxcnn::Activation::kRelu : jaxcnn::Activation::kNone;
  p.layout = tc.layout;

  const char* reason = jaxcnn::conv2d_depthwise_unsupported_reason(p);
  if (reason != nullptr) {
    std::printf("%-4s unexpectedly unsupported: %s  FAIL\n", tc.name, reason);
    return false;
  }

  const size_t x_count = p.N * p.H * p.W * p.C;
  const size_t w_count = p.R * p.S * p.K;
  const size_t y_count = p.N * p.P * p.Q * p.K;
  const size_t shift = tc.misalign ? 1 : 0;

  Lcg rng{seed};
  std::vector<T> x_host(x_count), w_host(w_count), b_host(p.K);
  std::vector<float> x_ref(x_count), w_ref(w_count), b_ref(p.K);
  for (size_t i = 0; i < x_count; ++i) {
    x_host[i] = FromFloat<T>(rng.next());
    x_ref[i] = ToFloat(x_host[i]);
  }
  for (int i = 0; i < tc.nan_inputs; ++i) {
    const size_t at = static_cast<size_t>((rng.next() + 1.0f) * 0.5f * x_count) % x_count;
    x_host[at] = FromFloat<T>(NAN);
    x_ref[at] = NAN;
  }
  for (size_t i = 0; i < w_count; ++i) {
    w_host[i] = FromFloat<T>(rng.next());
    w_ref[i] = ToFloat(w_host[i]);
  }
  for (int64_t i = 0; i < p.K; ++i) {
    b_host[i] = FromFloat<T>(rng.next());
    b_ref[i] = ToFloat(b_host[i]);
  }

  T *x_alloc = nullptr, *w_dev = nullptr, *b_dev = nullptr, *y_alloc = nullptr;
  CHECK_CUDA(cudaMalloc(&x_alloc, (x_count + shift) * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&w_dev, w_count * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&b_dev, p.K * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&y_alloc, (y_count + shift) * sizeof(T)));
  T* x_dev = x_alloc + shift;
  T* y_dev = y_alloc + shift;
  CHECK_CUDA(cudaMemcpy(x_dev, x_host.data(), x_count * sizeof(T),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(w_dev, w_host.data(), w_count * sizeof(T),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b_dev, b_host.data(), p.K * sizeof(T),
                        cudaMemcpyHostToDevice));
  // 0xFF bytes are NaN in f32/bf16/f16: any unwritten output is caught.
  CHECK_CUDA(cudaMemset(y_alloc, 0xFF, (y_count + shift) * sizeof(T)));

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  CHECK_CUDA(jaxcnn::launch_conv2d_depthwise<T>(
      x_dev, w_dev, tc.bias ? b_dev : nullptr, y_dev, p, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaStreamDestroy(stream));

  std::vector<T> y_host(y_count);
  CHECK_CUDA(cudaMemcpy(y_host.data(), y_dev, y_count * sizeof(T),
                        cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(x_alloc));
  CHECK_CUDA(cudaFree(w_dev));
  CHECK_CUDA(cudaFree(b_dev));
  CHECK_CUDA(cudaFree(y_alloc));

  std::vector<double> y_ref;
  Reference(x_ref, w_ref, b_ref, p, tc.bias, &y_ref);
  double max_ref = 0.0, max_abs_err = 0.0;
  size_t nan_mismatch = 0, nan_expected = 0;
  for (size_t i = 0; i < y_count; ++i) {
    const double got = ToFloat(y_host[i]);
    const bool ref_nan = std::isnan(y_ref[i]);
    nan_expected += ref_nan;
    if (std::isnan(got) != ref_nan) {
      ++nan_mismatch;
      continue;
    }
    if (ref_nan) continue;
    max_ref = std::fmax(max_ref, std::fabs(y_ref[i]));
    max_abs_err = std::fmax(max_abs_err, std::fabs(got - y_ref[i]));
  }
  const double rel_err = max_abs_err / std::fmax(max_ref, 1e-30);
  const bool pass = nan_mismatch == 0 && rel_err <= Tolerance(tc.dtype) &&
                    (tc.nan_inputs == 0 || nan_expected > 0);
  std::printf(
      "%-4s %-4s %-4s N=%lld H=%lld W=%lld C=%lld K=%lld RxS=%lldx%lld s=%d,%d "
      "pad=%d/%d,%d/%d d=%d,%d bias=%d relu=%d misalign=%d -> P=%lld Q=%lld  "
      "max_rel_err=%.3e nan_expected=%zu nan_mismatch=%zu  %s\n",
      tc.name, DTypeName(tc.dtype), LayoutName(tc.layout), (long long)p.N,
      (long long)p.H, (long long)p.W, (long long)p.C, (long long)p.K,
      (long long)p.R, (long long)p.S, tc.stride_h, tc.stride_w, tc.pad_top,
      tc.pad_bottom, tc.pad_left, tc.pad_right, tc.dil_h, tc.dil_w, tc.bias,
      tc.relu, tc.misalign, (long long)p.P, (long long)p.Q, rel_err,
      nan_expected, nan_mismatch, pass ? "PASS" : "FAIL");
  return pass;
}

// Non-depthwise params must be refused, without launching.
bool CheckRejectsBadParams() {
  bool pass = true;
  Conv2dParams p{};
  p.N = 1; p.H = 4; p.W = 4; p.C = 6; p.R = 3; p.S = 3; p.K = 6;
  p.P = 2; p.Q = 2;
  p.stride_h = p.stride_w = 1;
  p.dil_h = p.dil_w = 1;
  p.groups = 3;  // grouped, not depthwise
  pass &= jaxcnn::conv2d_depthwise_unsupported_reason(p) != nullptr;
  pass &= jaxcnn::launch_conv2d_depthwise<float>(nullptr, nullptr, nullptr,
                                                 nullptr, p, 0) ==
          cudaErrorInvalidValue;
  p.groups = 6;
  p.K = 9;  // not a multiple of C
  pass &= jaxcnn::conv2d_depthwise_unsupported_reason(p) != nullptr;
  p.K = 12;
  pass &= jaxcnn::conv2d_depthwise_unsupported_reason(p) == nullptr;
  (void)cudaGetLastError();
  std::printf("bad-params rejected (groups != C, K %% C != 0): %s\n",
              pass ? "PASS" : "FAIL");
  return pass;
}

}  // namespace

int main() {
  int device_count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&device_count));
  if (device_count < 1) {
    std::fprintf(stderr, "no CUDA device\n");
    return 2;
  }

  using D = DType;
  // name, dtype, layout, N,H,W,C,mult,R,S, stride h/w, pads t/b/l/r, dil h/w,
  // bias, relu, misalign, nan_inputs
  const Case cases[] = {
      // NHWC, vectorized fast paths (3x3 stride 1 / 2), several slices.
      {"d01", D::kF32, NHWC, 2, 17, 17, 32, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, true, true, false, 0},
      {"d02", D::kBF16, NHWC, 3, 20, 19, 96, 1, 3, 3, 2, 2, 0, 1, 0, 1, 1, 1, true, true, false, 0},
      {"d03", D::kF16, NHWC, 1, 15, 13, 144, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, true, false, false, 0},
      {"d04", D::kBF16, NHWC, 4, 7, 7, 960, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, true, true, false, 0},
      {"d05", D::kBF16, NHWC, 1, 28, 28, 144, 1, 3, 3, 2, 2, 0, 1, 0, 1, 1, 1, true, true, false, 0},
      // NHWC generic: 5x5, 7x7 stride 2, dilation 2, VALID.
      {"d06", D::kBF16, NHWC, 2, 11, 11, 24, 1, 5, 5, 1, 1, 2, 2, 2, 2, 1, 1, false, false, false, 0},
      {"d07", D::kF32, NHWC, 1, 13, 16, 8, 1, 7, 7, 2, 2, 3, 3, 3, 3, 1, 1, false, true, false, 0},
      {"d08", D::kBF16, NHWC, 2, 12, 12, 16, 1, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, true, false, false, 0},
      {"d09", D::kF32, NHWC, 2, 13, 11, 12, 1, 3, 3, 2, 1, 0, 0, 0, 0, 2, 2, true, true, false, 0},
      // NHWC scalar fallback: multiplier 2, C % 4 != 0, misaligned pointers.
      {"d10", D::kF32, NHWC, 2, 9, 10, 6, 2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, true, false, false, 0},
      {"d11", D::kBF16, NHWC, 1, 10, 9, 5, 1, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, true, true, false, 0},
      {"d12", D::kF16, NHWC, 2, 8, 8, 3, 2, 5, 5, 2, 2, 2, 2, 2, 2, 1, 1, true, false, false, 0},
      {"d13", D::kBF16, NHWC, 2, 9, 9, 32, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, true, true, true, 0},
      // NCHW plane kernel: fast 3x3 s1/s2, generic 5x5/7x7, dilation, mult 2,
      // small planes packed several per CTA.
      {"d14", D::kF32, NCHW, 2, 17, 18, 5, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, true, true, false, 0},
      {"d15", D::kBF16, NCHW, 3, 15, 14, 8, 1, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, false, false, false, 0},
      {"d16", D::kF16, NCHW, 1, 13, 11, 4, 2, 5, 5, 1, 1, 2, 2, 2, 2, 1, 1, true, false, false, 0},
      {"d17", D::kBF16, NCHW, 2, 16, 16, 6, 1, 7, 7, 2, 2, 3, 3, 3, 3, 1, 1, false, true, false, 0},
      {"d18", D::kF32, NCHW, 1, 12, 12, 3, 1, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, true, false, false, 0},
      {"d19", D::kBF16, NCHW, 2, 7, 7, 32, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, true, true, false, 0},
      // CHWN: vectorized over N, multiplier, scalar N, N == 1 (plane kernel).
      {"d20", D::kF32, CHWN, 8, 11, 12, 6, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, true, true, false, 0},
      {"d21", D::kBF16, CHWN, 4, 13, 13, 8, 1, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, false, false, false, 0},
      {"d22", D::kF16, CHWN, 4, 9, 9, 3, 2, 5, 5, 1, 1, 2, 2, 2, 2, 1, 1, true, false, false, 0},
      {"d23", D::kBF16, CHWN, 3, 10, 10, 4, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, false, true, false, 0},
      {"d24", D::kF32, CHWN, 1, 12, 12, 5, 1, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, true, false, false, 0},
      // NaN inputs must give NaN outputs (through ReLU too) in every layout.
      {"n01", D::kBF16, NHWC, 2, 12, 12, 16, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, true, true, false, 5},
      {"n02", D::kF32, NCHW, 2, 12, 12, 4, 1, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, true, true, false, 5},
      {"n03", D::kF16, CHWN, 4, 10, 10, 4, 1, 5, 5, 1, 1, 2, 2, 2, 2, 1, 1, true, true, false, 5},
  };

  int failures = 0;
  uint64_t seed = 4242;
  for (const Case& tc : cases) {
    bool pass = false;
    switch (tc.dtype) {
      case DType::kF32: pass = RunCase<float>(tc, seed); break;
      case DType::kBF16: pass = RunCase<__nv_bfloat16>(tc, seed); break;
      case DType::kF16: pass = RunCase<__half>(tc, seed); break;
    }
    if (!pass) ++failures;
    seed += 7919;
  }
  if (!CheckRejectsBadParams()) ++failures;

  std::printf("%s: %d failure(s)\n", failures == 0 ? "ALL PASS" : "FAILED",
              failures);
  return failures == 0 ? 0 : 1;
}
