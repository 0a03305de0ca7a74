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

template <typename T>
bool RunCase(const Case& tc, uint64_t seed) {
  const Conv2dParams p =
      selftest::CaseParams(tc, tc.C * tc.mult, static_cast<int>(tc.C), tc.layout);

  const char* reason = jaxcnn::conv2d_depthwise_unsupported_reason(p);
  if (reason != nullptr) {
    std::printf("%-4s unexpectedly unsupported: %s  FAIL\n", tc.name, reason);
    return false;
  }

  const size_t x_count = p.N * p.H * p.W * p.C;
  const size_t w_count = p.R * p.S * p.K;
  const size_t y_count = p.N * p.P * p.Q * p.K;
  const size_t shift = tc.misalign ? 1 : 0;

  selftest::Lcg rng{seed};
  std::vector<T> x_host, w_host, b_host;
  std::vector<float> x_ref, w_ref, b_ref;
  selftest::RandomFill(&rng, x_count, &x_host, &x_ref);
  for (int i = 0; i < tc.nan_inputs; ++i) {
    const size_t at = static_cast<size_t>((rng.next() + 1.0f) * 0.5f * x_count) % x_count;
    x_host[at] = selftest::FromFloat<T>(NAN);
    x_ref[at] = NAN;
  }
  selftest::RandomFill(&rng, w_count, &w_host, &w_ref);
  selftest::RandomFill(&rng, p.K, &b_host, &b_ref);

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
  selftest::ConvReference(x_ref, w_ref, b_ref, p, tc.bias, p.layout, &y_ref);
  // NaN must reach exactly the outputs the reference's NaN reaches.
  selftest::RelError err;
  size_t nan_missing = 0, nan_expected = 0;
  for (size_t i = 0; i < y_count; ++i) {
    const double got = selftest::ToFloat(y_host[i]);
    if (std::isnan(y_ref[i])) {
      ++nan_expected;
      nan_missing += !std::isnan(got);
    } else {
      err.Add(got, y_ref[i]);
    }
  }
  const size_t nan_mismatch = nan_missing + err.nonfinite;
  const double rel_err = err.rel();
  const bool pass = nan_mismatch == 0 && rel_err <= selftest::Tolerance(tc.dtype) &&
                    (tc.nan_inputs == 0 || nan_expected > 0);
  std::printf(
      "%-4s %-4s %-4s N=%lld H=%lld W=%lld C=%lld K=%lld RxS=%lldx%lld s=%d,%d "
      "pad=%d/%d,%d/%d d=%d,%d bias=%d relu=%d misalign=%d -> P=%lld Q=%lld  "
      "max_rel_err=%.3e nan_expected=%zu nan_mismatch=%zu  %s\n",
      tc.name, selftest::DTypeName(tc.dtype), selftest::LayoutName(tc.layout), (long long)p.N,
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
  Conv2dParams p = selftest::ValidConvParams(1, 4, 4, 6, 3, 3, 6, /*groups=*/3);  // not depthwise
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
  selftest::RequireCudaDevice();

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
    const bool pass = selftest::WithStorageType(
        tc.dtype, [&](auto t) { return RunCase<decltype(t)>(tc, seed); });
    if (!pass) ++failures;
    seed += 7919;
  }
  if (!CheckRejectsBadParams()) ++failures;

  return selftest::Finish(failures);
}
