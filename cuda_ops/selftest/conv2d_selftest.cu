// Standalone check of launch_conv2d_direct against a float64 CPU reference,
// every case in every activation layout (NHWC, NCHW, CHWN: the reference runs
// in NHWC, inputs and outputs are converted on the host).
// Small shapes so it finishes in seconds under compute-sanitizer
// (memcheck / racecheck). Exit status: 0 all pass, 1 a case failed, 2 CUDA error.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "conv/conv2d_direct.h"
#include "selftest/selftest_util.h"

namespace {

using selftest::DType;
using selftest::LayoutOffset;

using jaxcnn::Conv2dParams;
using jaxcnn::TensorLayout;

// Copies `in` (laid out as `from`) into `out` laid out as `to`.
template <typename V>
void ConvertLayout(const std::vector<V>& in, TensorLayout from, TensorLayout to,
                   int64_t N, int64_t C, int64_t H, int64_t W,
                   std::vector<V>* out) {
  out->resize(in.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w)
          (*out)[LayoutOffset(to, N, C, H, W, n, c, h, w)] =
              in[LayoutOffset(from, N, C, H, W, n, c, h, w)];
}

struct Case {
  const char* name;
  DType dtype;
  int64_t N, H, W, C, R, S, K;
  int stride_h, stride_w;
  int pad_top, pad_bottom, pad_left, pad_right;
  int dil_h, dil_w;
  int groups;
  bool bias;
  bool relu;
};

template <typename T>
bool RunCase(const Case& tc, TensorLayout layout, uint64_t seed) {
  const Conv2dParams p = selftest::CaseParams(tc, tc.K, tc.groups, layout);

  const size_t x_count = p.N * p.H * p.W * p.C;
  const size_t w_count = p.R * p.S * (p.C / p.groups) * p.K;
  const size_t y_count = p.N * p.P * p.Q * p.K;

  selftest::Lcg rng{seed};
  std::vector<T> x_host, w_host, b_host;
  std::vector<float> x_ref, w_ref, b_ref;
  selftest::RandomFill(&rng, x_count, &x_host, &x_ref);
  selftest::RandomFill(&rng, w_count, &w_host, &w_ref);
  selftest::RandomFill(&rng, p.K, &b_host, &b_ref);

  T *x_dev = nullptr, *w_dev = nullptr, *b_dev = nullptr, *y_dev = nullptr;
  CHECK_CUDA(cudaMalloc(&x_dev, x_count * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&w_dev, w_count * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&b_dev, p.K * sizeof(T)));
  CHECK_CUDA(cudaMalloc(&y_dev, y_count * sizeof(T)));
  // x_host is NHWC (the reference's layout); the kernel reads p.layout.
  std::vector<T> x_in_layout;
  ConvertLayout(x_host, TensorLayout::kNHWC, layout, p.N, p.C, p.H, p.W,
                &x_in_layout);
  CHECK_CUDA(cudaMemcpy(x_dev, x_in_layout.data(), x_count * sizeof(T),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(w_dev, w_host.data(), w_count * sizeof(T),
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b_dev, b_host.data(), p.K * sizeof(T),
                        cudaMemcpyHostToDevice));
  // 0xFF bytes are NaN in f32/bf16/f16: any unwritten output is caught.
  CHECK_CUDA(cudaMemset(y_dev, 0xFF, y_count * sizeof(T)));

  CHECK_CUDA(jaxcnn::launch_conv2d_direct<T>(
      x_dev, w_dev, tc.bias ? b_dev : nullptr, y_dev, p, /*stream=*/0));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaGetLastError());

  std::vector<T> y_in_layout(y_count), y_host;
  CHECK_CUDA(cudaMemcpy(y_in_layout.data(), y_dev, y_count * sizeof(T),
                        cudaMemcpyDeviceToHost));
  ConvertLayout(y_in_layout, layout, TensorLayout::kNHWC, p.N, p.K, p.P, p.Q,
                &y_host);
  CHECK_CUDA(cudaFree(x_dev));
  CHECK_CUDA(cudaFree(w_dev));
  CHECK_CUDA(cudaFree(b_dev));
  CHECK_CUDA(cudaFree(y_dev));

  // The reference runs in NHWC (x_host's layout; y_host was converted back).
  std::vector<double> y_ref;
  selftest::ConvReference(x_ref, w_ref, b_ref, p, tc.bias, TensorLayout::kNHWC, &y_ref);
  selftest::RelError err;
  for (size_t i = 0; i < y_count; ++i) err.Add(selftest::ToFloat(y_host[i]), y_ref[i]);
  const double rel_err = err.rel();
  const bool pass = err.nonfinite == 0 && rel_err <= selftest::Tolerance(tc.dtype);
  std::printf(
      "%-4s %-5s %s N=%lld H=%lld W=%lld C=%lld RxS=%lldx%lld K=%lld s=%d,%d "
      "pad=%d/%d,%d/%d d=%d,%d G=%d bias=%d relu=%d -> P=%lld Q=%lld  "
      "max_rel_err=%.3e nonfinite=%lld  %s\n",
      tc.name, selftest::DTypeName(tc.dtype), selftest::LayoutName(layout), (long long)p.N, (long long)p.H,
      (long long)p.W, (long long)p.C, (long long)p.R, (long long)p.S,
      (long long)p.K, tc.stride_h, tc.stride_w, tc.pad_top, tc.pad_bottom,
      tc.pad_left, tc.pad_right, tc.dil_h, tc.dil_w, tc.groups, tc.bias,
      tc.relu, (long long)p.P, (long long)p.Q, rel_err, (long long)err.nonfinite,
      pass ? "PASS" : "FAIL");
  return pass;
}

// The launcher must refuse inconsistent params without launching.
bool CheckRejectsBadParams() {
  const Conv2dParams p = selftest::ValidConvParams(1, 4, 4, 6, 3, 3, 4, /*groups=*/4);  // 4 !| C
  const cudaError_t status = jaxcnn::launch_conv2d_direct<float>(
      nullptr, nullptr, nullptr, nullptr, p, 0);
  (void)cudaGetLastError();
  const bool pass = status == cudaErrorInvalidValue;
  std::printf("bad-params rejected (groups !| C): %s\n", pass ? "PASS" : "FAIL");
  return pass;
}

}  // namespace

int main() {
  selftest::RequireCudaDevice();

  // name, dtype, N,H,W,C,R,S,K, stride, pads t/b/l/r, dil, groups, bias, relu
  const Case cases[] = {
      {"c01", DType::kF32, 1, 7, 7, 3, 3, 3, 16, 1, 1, 1, 1, 1, 1, 1, 1, 1, true, true},
      {"c02", DType::kF32, 3, 13, 11, 5, 5, 5, 70, 2, 2, 2, 2, 2, 2, 1, 1, 1, true, false},
      {"c03", DType::kF32, 2, 9, 9, 20, 3, 3, 33, 1, 1, 2, 2, 2, 2, 2, 2, 1, false, false},
      {"c04", DType::kF32, 3, 8, 8, 64, 1, 1, 128, 1, 1, 0, 0, 0, 0, 1, 1, 1, true, true},
      {"c05", DType::kF32, 1, 23, 23, 3, 7, 7, 64, 2, 2, 3, 3, 3, 3, 1, 1, 1, true, true},
      {"c06", DType::kF32, 3, 10, 10, 12, 3, 3, 20, 1, 1, 1, 1, 1, 1, 1, 1, 2, true, false},
      {"c07", DType::kF32, 1, 15, 15, 32, 3, 3, 32, 1, 1, 1, 1, 1, 1, 1, 1, 32, true, true},
      {"c08", DType::kF32, 1, 31, 29, 1, 11, 11, 8, 4, 4, 2, 2, 2, 2, 1, 1, 1, false, true},
      // SAME-style asymmetric padding: top/left 0, bottom/right 1.
      {"c09", DType::kF32, 2, 10, 12, 7, 3, 3, 9, 2, 2, 0, 1, 0, 1, 1, 1, 1, true, false},
      {"c10", DType::kBF16, 3, 11, 9, 24, 3, 3, 48, 1, 1, 1, 1, 1, 1, 1, 1, 1, true, true},
      {"c11", DType::kBF16, 1, 12, 12, 16, 5, 5, 32, 2, 2, 2, 2, 2, 2, 1, 1, 16, true, false},
      {"c12", DType::kBF16, 2, 9, 9, 40, 3, 3, 72, 2, 1, 2, 2, 2, 2, 2, 2, 4, false, true},
      {"c13", DType::kF16, 3, 17, 17, 3, 7, 7, 24, 2, 2, 3, 3, 3, 3, 1, 1, 1, false, true},
      {"c14", DType::kF16, 1, 9, 9, 10, 1, 1, 6, 2, 2, 0, 0, 0, 0, 1, 1, 2, true, false},
      {"c15", DType::kF16, 2, 13, 15, 40, 3, 3, 72, 2, 2, 2, 2, 2, 2, 2, 2, 1, true, true},
      {"c16", DType::kF16, 3, 8, 8, 24, 3, 3, 24, 1, 1, 1, 1, 1, 1, 1, 1, 24, false, false},
      // Batches past one M tile: CHWN rows run over n first, so tiles mix
      // images and output pixels; NCHW tiles cross image rows.
      {"c17", DType::kF32, 67, 5, 6, 8, 3, 3, 12, 1, 1, 1, 1, 1, 1, 1, 1, 1, true, true},
      {"c18", DType::kBF16, 33, 7, 5, 6, 3, 3, 10, 2, 2, 1, 1, 1, 1, 1, 1, 2, false, true},
      {"c19", DType::kF16, 70, 4, 4, 3, 2, 2, 5, 1, 1, 0, 1, 0, 1, 1, 1, 1, true, false},
  };
  const TensorLayout layouts[] = {TensorLayout::kNHWC, TensorLayout::kNCHW,
                                  TensorLayout::kCHWN};

  int failures = 0;
  uint64_t seed = 12345;
  for (const Case& tc : cases) {
    for (TensorLayout layout : layouts) {
      const bool pass = selftest::WithStorageType(tc.dtype, [&](auto t) {
        return RunCase<decltype(t)>(tc, layout, seed);
      });
      if (!pass) ++failures;
    }
    seed += 7919;
  }
  if (!CheckRejectsBadParams()) ++failures;

  return selftest::Finish(failures);
}
