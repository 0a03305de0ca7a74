// Standalone check of launch_conv2d_tensorcore against a float64 CPU
// reference, in bf16, fp16, fp32 (TF32, kDefault) and fp32 (3xTF32,
// kHighest). Outputs are NaN-poisoned before each launch, so an unwritten
// element fails. Small cases run every kernel config and are checked in full;
// the large layer shapes run the heuristic's config and are checked at
// sampled points (plus a NaN scan of the whole output).
//
//   conv2d_tc_selftest                  all cases
//   conv2d_tc_selftest --skip-large     small cases only (compute-sanitizer)
//   conv2d_tc_selftest --all-configs    every config on the large cases too
//
// Exit status: 0 all pass, 1 a case failed, 2 CUDA error, 3 no Hopper GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "conv_tc/conv2d_tensorcore.h"
#include "selftest/selftest_util.h"


namespace {

using jaxcnn::Conv2dParams;
using jaxcnn::MathPrecision;
using jaxcnn::TcDType;

enum class Mode { kBF16, kF16, kF32Default, kF32Highest };
constexpr Mode kModes[] = {Mode::kBF16, Mode::kF16, Mode::kF32Default,
                           Mode::kF32Highest};

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kBF16: return "bf16";
    case Mode::kF16: return "f16";
    case Mode::kF32Default: return "f32-tf32";
    case Mode::kF32Highest: return "f32-3xtf32";
  }
  return "?";
}

// Max |err| / max |ref| over the checked outputs. bf16/fp16: one output
// rounding (2^-9 / 2^-12) plus fp32 summation order; TF32: inputs keep 10
// mantissa bits; 3xTF32 must be fp32-accurate at any GEMM-K length (the L5/L6
// cases reduce over 4608 and 9600 products).
double Tolerance(Mode m) {
  switch (m) {
    case Mode::kBF16: return 1e-2;
    case Mode::kF16: return 2e-3;
    case Mode::kF32Default: return 1e-2;
    case Mode::kF32Highest: return 2e-6;
  }
  return 0.0;
}



struct Case {
  const char* name;
  int64_t N, H, W, C, R, S, K;
  int stride_h, stride_w;
  int pad_top, pad_bottom, pad_left, pad_right;
  int dil_h, dil_w;
  bool bias;
  bool relu;
  bool large;      // sampled check, heuristic config only (unless --all-configs)
  bool nan_input;  // one NaN in x: the outputs it reaches must be NaN
};


Conv2dParams MakeParams(const Case& tc, Mode mode) {
  Conv2dParams p = selftest::CaseParams(tc, tc.K, /*groups=*/1, jaxcnn::TensorLayout::kNHWC);
  p.precision = mode == Mode::kF32Default ? MathPrecision::kDefault
                                          : MathPrecision::kHighest;
  return p;
}

// Float64 reference of one output element, on the already-rounded inputs.
double RefPoint(const std::vector<float>& x, const std::vector<float>& w,
                const std::vector<float>& bias, const Conv2dParams& p,
                bool has_bias, int64_t n, int64_t oh, int64_t ow, int64_t k) {
  const selftest::ConvWindow win{p.H, p.W, p.R, p.S, p.stride_h, p.stride_w,
                                 p.pad_h, p.pad_w, p.dil_h, p.dil_w};
  double acc = has_bias ? bias[k] : 0.0;
  selftest::ForEachTap(win, oh, ow, [&](int64_t r, int64_t s, int64_t ih, int64_t iw) {
    const float* xr = &x[((n * p.H + ih) * p.W + iw) * p.C];
    const float* wr = &w[(r * p.S + s) * p.C * p.K + k];
    for (int64_t c = 0; c < p.C; ++c)
      acc += static_cast<double>(xr[c]) * static_cast<double>(wr[c * p.K]);
  });
  if (p.epilogue.act == jaxcnn::Activation::kRelu && acc < 0.0) acc = 0.0;  // keeps NaN, like jnp.maximum
  return acc;
}

template <typename T>
struct DeviceCase {
  Conv2dParams p{};
  size_t x_count = 0, w_count = 0, y_count = 0;
  std::vector<T> x_host, w_host, b_host;
  std::vector<float> x_ref, w_ref, b_ref;
  T *x = nullptr, *w = nullptr, *b = nullptr, *y = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;

  DeviceCase(const Case& tc, Mode mode, uint64_t seed) {
    p = MakeParams(tc, mode);
    x_count = p.N * p.H * p.W * p.C;
    w_count = p.R * p.S * p.C * p.K;
    y_count = p.N * p.P * p.Q * p.K;
    selftest::Lcg rng{seed};
    selftest::RandomFill(&rng, x_count, &x_host, &x_ref);
    selftest::RandomFill(&rng, w_count, &w_host, &w_ref);
    selftest::RandomFill(&rng, p.K, &b_host, &b_ref);
    if (tc.nan_input) {
      // Pixel (0, H/2, W/2), channel 1.
      const size_t i = ((0 * p.H + p.H / 2) * p.W + p.W / 2) * p.C + 1;
      x_host[i] = selftest::FromFloat<T>(std::numeric_limits<float>::quiet_NaN());
      x_ref[i] = std::numeric_limits<float>::quiet_NaN();
    }
    CHECK_CUDA(cudaMalloc(&x, x_count * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&w, w_count * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&b, p.K * sizeof(T)));
    CHECK_CUDA(cudaMalloc(&y, y_count * sizeof(T)));
    CHECK_CUDA(cudaMemcpy(x, x_host.data(), x_count * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(w, w_host.data(), w_count * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(b, b_host.data(), p.K * sizeof(T), cudaMemcpyHostToDevice));
    ws_bytes = jaxcnn::conv2d_tensorcore_workspace_bytes(p, jaxcnn::TcDTypeOf<T>::value);
    if (ws_bytes > 0) CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  }
  ~DeviceCase() {
    cudaFree(x); cudaFree(w); cudaFree(b); cudaFree(y);
    if (ws != nullptr) cudaFree(ws);
  }
};

struct CheckResult {
  double rel_err = 0.0;
  size_t checked = 0, bad_nan = 0, missing_nan = 0;
};

template <typename T>
CheckResult Check(const DeviceCase<T>& dc, const Case& tc,
                  const std::vector<T>& y_host, uint64_t seed) {
  const Conv2dParams& p = dc.p;
  CheckResult r;
  selftest::RelError err;
  auto check_point = [&](int64_t n, int64_t oh, int64_t ow, int64_t k) {
    const double ref = RefPoint(dc.x_ref, dc.w_ref, dc.b_ref, p, tc.bias, n, oh, ow, k);
    const double got = selftest::ToFloat(y_host[((n * p.P + oh) * p.Q + ow) * p.K + k]);
    ++r.checked;
    if (std::isnan(ref)) {
      if (!std::isnan(got)) ++r.missing_nan;
      return;
    }
    err.Add(got, ref);
  };
  if (!tc.large) {
    for (int64_t n = 0; n < p.N; ++n)
      for (int64_t oh = 0; oh < p.P; ++oh)
        for (int64_t ow = 0; ow < p.Q; ++ow)
          for (int64_t k = 0; k < p.K; ++k) check_point(n, oh, ow, k);
  } else {
    // Every element must have been written (no NaN from the poison).
    for (size_t i = 0; i < y_host.size(); ++i)
      if (!std::isfinite(selftest::ToFloat(y_host[i]))) ++r.bad_nan;
    // Image corners (all padding cases) for every channel, then random points.
    const int64_t corners[4][2] = {{0, 0}, {0, p.Q - 1}, {p.P - 1, 0}, {p.P - 1, p.Q - 1}};
    for (const auto& cn : corners)
      for (int64_t k = 0; k < p.K; ++k) check_point(p.N - 1, cn[0], cn[1], k);
    selftest::Lcg rng{seed ^ 0x9e3779b97f4a7c15ULL};
    for (int i = 0; i < 20000; ++i) {
      const uint64_t u = rng.next_u64() >> 11;
      const int64_t idx = static_cast<int64_t>(u % dc.y_count);
      const int64_t k = idx % p.K, pix = idx / p.K;
      const int64_t ow = pix % p.Q, oh = (pix / p.Q) % p.P, n = pix / (p.P * p.Q);
      check_point(n, oh, ow, k);
    }
  }
  r.bad_nan += err.nonfinite;
  r.rel_err = err.rel();
  return r;
}

template <typename T>
bool RunOne(DeviceCase<T>& dc, const Case& tc, Mode mode, int config,
            uint64_t seed) {
  // 0xFF bytes are NaN in f32/bf16/f16: any unwritten output is caught.
  CHECK_CUDA(cudaMemset(dc.y, 0xFF, dc.y_count * sizeof(T)));
  CHECK_CUDA(jaxcnn::launch_conv2d_tensorcore<T>(
      dc.x, dc.w, tc.bias ? dc.b : nullptr, dc.y, dc.p, dc.ws, dc.ws_bytes,
      /*stream=*/0, config));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaGetLastError());
  std::vector<T> y_host(dc.y_count);
  CHECK_CUDA(cudaMemcpy(y_host.data(), dc.y, dc.y_count * sizeof(T),
                        cudaMemcpyDeviceToHost));
  const CheckResult r = Check(dc, tc, y_host, seed);
  const bool pass = r.bad_nan == 0 && r.missing_nan == 0 &&
                    r.rel_err <= Tolerance(mode) && r.checked > 0;
  const int picked = config >= 0 ? config
                                 : jaxcnn::conv2d_tensorcore_pick_config(
                                       dc.p, jaxcnn::TcDTypeOf<T>::value);
  std::printf(
      "%-4s %-10s N=%lld H=%lld W=%lld C=%lld RxS=%lldx%lld K=%lld s=%d,%d "
      "pad=%d/%d,%d/%d d=%d,%d bias=%d relu=%d -> P=%lld Q=%lld  cfg=%s%s  "
      "max_rel_err=%.3e checked=%zu bad_nan=%zu missing_nan=%zu  %s\n",
      tc.name, ModeName(mode), (long long)dc.p.N, (long long)dc.p.H,
      (long long)dc.p.W, (long long)dc.p.C, (long long)dc.p.R,
      (long long)dc.p.S, (long long)dc.p.K, tc.stride_h, tc.stride_w,
      tc.pad_top, tc.pad_bottom, tc.pad_left, tc.pad_right, tc.dil_h,
      tc.dil_w, tc.bias, tc.relu, (long long)dc.p.P, (long long)dc.p.Q,
      jaxcnn::conv2d_tensorcore_config_name(picked, dc.p, jaxcnn::TcDTypeOf<T>::value),
      config < 0 ? "(auto)" : "",
      r.rel_err, r.checked, r.bad_nan, r.missing_nan, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  return pass;
}

template <typename T>
int RunCase(const Case& tc, Mode mode, uint64_t seed, bool all_configs) {
  const Conv2dParams p = MakeParams(tc, mode);
  if (const char* why = jaxcnn::conv2d_tensorcore_unsupported_reason(
          p, jaxcnn::TcDTypeOf<T>::value)) {
    std::printf("%-4s %-10s UNSUPPORTED (%s)  FAIL\n", tc.name, ModeName(mode), why);
    return 1;
  }
  DeviceCase<T> dc(tc, mode, seed);
  int failures = RunOne(dc, tc, mode, -1, seed) ? 0 : 1;
  if (!tc.large || all_configs)
    for (int c = 0; c < jaxcnn::conv2d_tensorcore_num_configs(); ++c)
      if (!RunOne(dc, tc, mode, c, seed)) ++failures;
  return failures;
}

// First launch of the process, inside a stream capture: the launch path must
// not allocate, synchronize or otherwise break capture (XLA command buffers).
bool CheckGraphCapture() {
  const Case tc = {"graph", 2, 12, 12, 32, 3, 3, 64, 1, 1, 1, 1, 1, 1, 1, 1,
                   true, true, false, false};
  DeviceCase<__nv_bfloat16> dc(tc, Mode::kBF16, 777);
  CHECK_CUDA(cudaMemset(dc.y, 0xFF, dc.y_count * sizeof(__nv_bfloat16)));
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const cudaError_t launch = jaxcnn::launch_conv2d_tensorcore<__nv_bfloat16>(
      dc.x, dc.w, dc.b, dc.y, dc.p, dc.ws, dc.ws_bytes, stream, -1);
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  bool pass = launch == cudaSuccess && end == cudaSuccess;
  if (pass) {
    cudaGraphExec_t exec = nullptr;
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    std::vector<__nv_bfloat16> y_host(dc.y_count);
    CHECK_CUDA(cudaMemcpy(y_host.data(), dc.y, dc.y_count * sizeof(__nv_bfloat16),
                          cudaMemcpyDeviceToHost));
    const CheckResult r = Check(dc, tc, y_host, 777);
    pass = r.bad_nan == 0 && r.rel_err <= Tolerance(Mode::kBF16);
    CHECK_CUDA(cudaGraphExecDestroy(exec));
  } else {
    (void)cudaGetLastError();
  }
  if (graph != nullptr) CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("graph capture (first launch inside capture): launch=%s end=%s  %s\n",
              cudaGetErrorName(launch), cudaGetErrorName(end), pass ? "PASS" : "FAIL");
  return pass;
}

// Unsupported params are reported and refused without launching.
bool CheckRejects() {
  Conv2dParams p = selftest::ValidConvParams(1, 8, 8, 16, 3, 3, 16, /*groups=*/2);
  bool pass = jaxcnn::conv2d_tensorcore_unsupported_reason(p, TcDType::kBF16) != nullptr;
  pass &= jaxcnn::launch_conv2d_tensorcore<__nv_bfloat16>(
              nullptr, nullptr, nullptr, nullptr, p, nullptr, 0, 0, -1) ==
          cudaErrorInvalidValue;
  p.groups = 1;
  p.C = 3;  // 6-byte rows: zero-padded to 8 channels in the workspace
  pass &= jaxcnn::conv2d_tensorcore_unsupported_reason(p, TcDType::kBF16) == nullptr;
  pass &= jaxcnn::conv2d_tensorcore_unsupported_reason(p, TcDType::kF32) == nullptr;
  pass &= jaxcnn::conv2d_tensorcore_workspace_bytes(p, TcDType::kBF16) > 0;
  p.C = 16;
  p.K = 12;  // output rows: fp32 48 bytes fine, bf16 24 bytes not (TMA store)
  pass &= jaxcnn::conv2d_tensorcore_unsupported_reason(p, TcDType::kF32) == nullptr;
  pass &= jaxcnn::conv2d_tensorcore_unsupported_reason(p, TcDType::kBF16) != nullptr;
  p.K = 16;
  pass &= jaxcnn::launch_conv2d_tensorcore<__nv_bfloat16>(
              nullptr, nullptr, nullptr, nullptr, p, nullptr, 0, 0, 99) ==
          cudaErrorInvalidValue;  // bad config index
  p.N = 0;  // empty output: no-op success
  pass &= jaxcnn::launch_conv2d_tensorcore<__nv_bfloat16>(
              nullptr, nullptr, nullptr, nullptr, p, nullptr, 0, 0, -1) == cudaSuccess;
  (void)cudaGetLastError();
  std::printf("unsupported params rejected, empty output a no-op: %s\n",
              pass ? "PASS" : "FAIL");
  return pass;
}

}  // namespace

int main(int argc, char** argv) {
  bool skip_large = false, all_configs = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--skip-large") == 0) skip_large = true;
    else if (std::strcmp(argv[i], "--all-configs") == 0) all_configs = true;
    else {
      std::fprintf(stderr, "usage: %s [--skip-large] [--all-configs]\n", argv[0]);
      return 2;
    }
  }
  int device = 0, major = 0, minor = 0, count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&count));
  if (count < 1) {
    std::fprintf(stderr, "no CUDA device\n");
    return 3;
  }
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9 || minor != 0) {
    std::fprintf(stderr, "needs a compute capability 9.0 GPU (got %d.%d)\n", major, minor);
    return 3;
  }

  int failures = 0;
  if (!CheckGraphCapture()) ++failures;
  if (!CheckRejects()) ++failures;

  // name, N,H,W,C,R,S,K, stride, pads t/b/l/r, dil, bias, relu, large, nan_input
  const Case cases[] = {
      {"c01", 2, 9, 9, 16, 3, 3, 32, 1, 1, 1, 1, 1, 1, 1, 1, true, true, false, false},
      // Odd sizes, stride 2.
      {"c02", 3, 13, 11, 24, 3, 3, 40, 2, 2, 1, 1, 1, 1, 1, 1, false, false, false, false},
      // Dilation 2.
      {"c03", 2, 15, 17, 32, 3, 3, 48, 1, 1, 2, 2, 2, 2, 2, 2, true, true, false, false},
      // VALID stride 2 on even sizes: the last input row/col is never read.
      {"c04", 2, 16, 16, 32, 3, 3, 64, 2, 2, 0, 0, 0, 0, 1, 1, true, false, false, false},
      // 1x1 (ResNet bottleneck style) and 1x1 stride-2 downsample.
      {"c05", 4, 14, 14, 64, 1, 1, 256, 1, 1, 0, 0, 0, 0, 1, 1, true, true, false, false},
      {"c06", 2, 14, 14, 128, 1, 1, 64, 2, 2, 0, 0, 0, 0, 1, 1, false, true, false, false},
      // 7x7 stride-2 stem with few channels.
      {"c07", 1, 32, 32, 8, 7, 7, 64, 2, 2, 3, 3, 3, 3, 1, 1, true, true, false, false},
      // SAME with asymmetric padding (top/left 0, bottom/right 1).
      {"c08", 2, 10, 12, 16, 3, 3, 16, 2, 2, 0, 1, 0, 1, 1, 1, true, false, false, false},
      // 5x5 dilation 3, wide padding; K not a multiple of any tile.
      {"c09", 1, 20, 20, 16, 5, 5, 24, 1, 1, 6, 6, 6, 6, 3, 3, true, true, false, false},
      // Stride larger than the window.
      {"c10", 2, 20, 19, 8, 2, 2, 8, 3, 3, 0, 0, 0, 0, 1, 1, false, false, false, false},
      // C not a multiple of the K tile, N*P*Q not a multiple of the M tile.
      {"c11", 3, 7, 9, 40, 3, 3, 24, 1, 1, 1, 1, 1, 1, 1, 1, true, false, false, false},
      // NaN in x must reach the outputs it touches, through ReLU.
      {"c12", 1, 8, 8, 16, 3, 3, 16, 1, 1, 1, 1, 1, 1, 1, 1, true, true, false, true},
      // Long reduction (K = 1800, 3xTF32 GEMM-K 5400: a partial last k-tile
      // and promotion group), every config checked in full.
      {"c13", 2, 7, 7, 200, 3, 3, 80, 1, 1, 1, 1, 1, 1, 1, 1, true, false, false, false},
      // Channel counts that are not 16-byte rows (x and w zero-padded to Cp
      // in the workspace): RGB 7x7 stride-2 stem, and C = 5 (fp32 Cp = 8).
      {"c14", 2, 30, 30, 3, 7, 7, 64, 2, 2, 3, 3, 3, 3, 1, 1, true, true, false, false},
      {"c15", 2, 9, 11, 5, 3, 3, 24, 1, 1, 1, 1, 1, 1, 1, 1, true, false, false, true},
      // Layers named in the performance goals (sampled check).
      // SqueezeNet fire expand 3x3.
      {"L1", 64, 55, 55, 16, 3, 3, 64, 1, 1, 1, 1, 1, 1, 1, 1, true, true, true, false},
      // ResNet 3x3, 56x56, 256 channels: batch 64 and batch 1.
      {"L2", 64, 56, 56, 256, 3, 3, 256, 1, 1, 1, 1, 1, 1, 1, 1, true, true, true, false},
      {"L3", 1, 56, 56, 256, 3, 3, 256, 1, 1, 1, 1, 1, 1, 1, 1, true, false, true, false},
      // ResNet 1x1 expand 64 -> 256 at 56x56.
      {"L4", 64, 56, 56, 64, 1, 1, 256, 1, 1, 0, 0, 0, 0, 1, 1, true, true, true, false},
      // Long reductions (3xTF32 accuracy at large GEMM-K): VGG-style 3x3 over
      // 512 channels (K = 4608) and 5x5 over 384 channels (K = 9600).
      // RGB stem at ImageNet size (padded C = 3 -> 8 / 4).
      {"L7", 16, 224, 224, 3, 7, 7, 64, 2, 2, 3, 3, 3, 3, 1, 1, true, true, true, false},
      {"L5", 4, 14, 14, 512, 3, 3, 512, 1, 1, 1, 1, 1, 1, 1, 1, true, false, true, false},
      {"L6", 2, 13, 13, 384, 5, 5, 192, 1, 1, 2, 2, 2, 2, 1, 1, false, false, true, false},
  };

  uint64_t seed = 12345;
  for (const Case& tc : cases) {
    if (tc.large && skip_large) continue;
    for (Mode mode : kModes) {
      switch (mode) {
        case Mode::kBF16:
          failures += RunCase<__nv_bfloat16>(tc, mode, seed, all_configs);
          break;
        case Mode::kF16:
          failures += RunCase<__half>(tc, mode, seed, all_configs);
          break;
        case Mode::kF32Default:
        case Mode::kF32Highest:
          failures += RunCase<float>(tc, mode, seed, all_configs);
          break;
      }
    }
    seed += 7919;
  }

  return selftest::Finish(failures);
}
