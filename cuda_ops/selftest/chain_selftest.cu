// Standalone check of the straight conv chains (chain/chain.h) against a host float64
// reference: launch_conv3x3_conv1x1 and launch_conv1x1_depthwise, bf16 and fp16, on odd
// spatial sizes (1x1, 7x9, 13x13, 17x31, thin images), N = 1..3, channel counts from 8 to the
// limits (M = 384 for 3x3->1x1, C = 256 for 1x1->dw) including ones off 16/64 (24, 40, 72,
// 136), depthwise stride 1 and 2 on even and odd sizes, every activation pair; then the
// refused parameters (unsupported_reason set and launch returning cudaErrorInvalidValue
// without writing y), a missing pointer and an empty batch.
// Inputs are fresh per case and nonzero; outputs are poisoned (0xFF bytes: NaN in bf16/fp16)
// before each launch, with guard regions before and after y that must stay untouched.
// The reference rounds the intermediate t to T as the kernels do; an element passes when
//   |y - ref| <= tol * (max(|ref|, rms(ref)) + 2 * max_k |t_k w_k|) + n * 2^-24 * sum_k |t_k w_k|
// with tol = 2^-7 (bf16) / 2^-10 (fp16): the output rounding, a couple of intermediates
// rounded the other way (fp32 vs float64 sums) and the fp32 accumulation of the second conv.
// That bound cannot see an unrounded t (its error is below the output's rounding), so at most
// 20% of the outputs not clamped by act2 may differ from the reference rounded to T
// ("round_miss", on cases with >= 500 of them).
// Build: nvcc -std=c++17 -O3 -arch=sm_90a -I cuda_ops cuda_ops/selftest/chain_selftest.cu
//        build/cp*/libjaxcnn_kernels.a -o chain_selftest
// Usage: chain_selftest [--small]   (a few small cases; for compute-sanitizer)
// Exit status: 0 all pass, 1 a case failed, 2 CUDA error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "chain/chain.h"
#include "selftest/selftest_util.h"

namespace {

using jaxcnn::ChainActivation;
using jaxcnn::Conv1x1DepthwiseParams;
using jaxcnn::Conv3x3Conv1x1Params;
using selftest::DTypeOf;

// At most this fraction of the unclamped y may differ from the reference rounded to T (on
// cases with at least kMissMinOutputs of them, where the rate is a stable statistic).
constexpr double kMissMaxFraction = 0.2;
constexpr int64_t kMissMinOutputs = 500;
constexpr float kInputScale = 3.0f;  // t and y reach past 6 now and then: relu6 clamps
cudaStream_t g_stream = nullptr;
uint64_t g_seed = 0xC4A1'0000ULL;  // advanced per case: fresh inputs every time

const char* ActName(int a) { return a == 0 ? "none" : a == 1 ? "relu" : "relu6"; }

double Act(double v, int a) {
  if (a == 0) return v;
  v = v > 0 ? v : 0.0;
  return a == 2 ? std::fmin(v, 6.0) : v;
}

template <typename T>
double Round(double v) {  // through fp32 to T, as the kernels round their fp32 sums
  return selftest::ToFloat(selftest::FromFloat<T>(static_cast<float>(v)));
}

template <typename T>
double Tol() {
  return DTypeOf<T>() == selftest::DType::kBF16 ? 1.0 / 128 : 1.0 / 1024;
}

// A host tensor rounded to T, with its float64 values for the reference; never zero, so a
// dropped term always shows.
template <typename T>
struct Tensor {
  std::vector<T> h;
  std::vector<double> f;
  Tensor(int64_t n, double scale, selftest::Lcg& rng) : h(n), f(n) {
    for (int64_t i = 0; i < n; ++i) {
      do {
        h[i] = selftest::FromFloat<T>(static_cast<float>(rng.next() * scale));
        f[i] = selftest::ToFloat(h[i]);
      } while (f[i] == 0.0);
    }
  }
};

template <typename T>
T* Upload(const Tensor<T>& t) {
  T* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, std::max<size_t>(t.h.size(), 1) * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(d, t.h.data(), t.h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// Reference output with each element's error allowance beyond tol * max(|ref|, rms).
struct Reference {
  std::vector<double> y, slack;
};

// One term list of a second-stage sum: tracks what the allowance needs.
struct Terms {
  double max_abs = 0.0, abs_sum = 0.0;
  void add(double v) {
    max_abs = std::fmax(max_abs, std::fabs(v));
    abs_sum += std::fabs(v);
  }
  template <typename T>
  double slack(int64_t n) const {
    return Tol<T>() * 2.0 * max_abs + n * std::ldexp(1.0, -24) * abs_sum;
  }
};

// Launches into a poisoned output, compares with the reference, prints the case line.
template <typename T>
bool Check(const char* desc, const Reference& ref,
           const std::function<cudaError_t(T*)>& launch, const char* unsupported) {
  const selftest::PoisonedOutput<T> out(ref.y.size());
  bool pass = unsupported == nullptr;
  if (pass) {
    CHECK_CUDA(launch(out.y()));
    CHECK_CUDA(cudaStreamSynchronize(g_stream));
  }
  std::vector<T> got;
  const bool guard_ok = out.Read(&got);
  double rms = 0.0, max_ref = 0.0, max_err = 0.0, worst = 0.0;
  for (double v : ref.y) rms += v * v, max_ref = std::fmax(max_ref, std::fabs(v));
  rms = std::sqrt(rms / std::max<size_t>(ref.y.size(), 1));
  int64_t nonfinite = 0, bad = 0, miss = 0, live = 0;
  for (size_t i = 0; i < ref.y.size(); ++i) {
    const double v = selftest::ToFloat(got[i]);
    if (!std::isfinite(v)) {
      ++nonfinite;
      continue;
    }
    if (ref.y[i] != 0.0 && ref.y[i] != 6.0) {  // not clamped by act2 (those match trivially)
      ++live;
      miss += v != Round<T>(ref.y[i]);
    }
    const double err = std::fabs(v - ref.y[i]);
    const double bound = Tol<T>() * std::fmax(std::fabs(ref.y[i]), rms) + ref.slack[i];
    max_err = std::fmax(max_err, err);
    worst = std::fmax(worst, err / bound);
    if (err > bound) ++bad;
  }
  // Unclamped outputs off the correctly rounded reference: up to ~7% (fp16, large C and M)
  // when t is rounded as specified, ~40% when it is not (an error within tol: only the rate
  // shows it).
  const bool miss_ok = live < kMissMinOutputs || miss <= kMissMaxFraction * live;
  pass = pass && guard_ok && nonfinite == 0 && bad == 0 && miss_ok;
  std::printf("%-4s %s  max_abs_err=%.2e max_rel_err=%.2e err/bound=%.2f bad=%lld "
              "round_miss=%.1f%%%s nonfinite=%lld guard=%s%s%s  %s\n",
              selftest::DTypeName(DTypeOf<T>()), desc, max_err,
              max_err / std::fmax(max_ref, 1e-30), worst, (long long)bad,
              100.0 * miss / std::max<int64_t>(live, 1), miss_ok ? "" : "(TOO MANY)",
              (long long)nonfinite,
              guard_ok ? "ok" : "CLOBBERED", unsupported ? "  unsupported: " : "",
              unsupported ? unsupported : "", pass ? "PASS" : "FAIL");
  return pass;
}

// Uploads a chain's five operands (x, the two weights and biases, in launch order), checks
// launch(device operands, y) against `ref` with Check, frees the operands.
template <typename T>
bool CheckUploaded(const char* desc, const Reference& ref, const char* unsupported,
                   const std::array<const Tensor<T>*, 5>& operands,
                   const std::function<cudaError_t(T* const*, T*)>& launch) {
  T* d[5];
  for (size_t i = 0; i < operands.size(); ++i) d[i] = Upload(*operands[i]);
  const bool pass = Check<T>(desc, ref, [&](T* y) { return launch(d, y); }, unsupported);
  for (T* operand : d) CHECK_CUDA(cudaFree(operand));
  return pass;
}

struct Chain33 {  // 3x3 -> 1x1
  int64_t N, H, W, C, M, K;
  int a1, a2;
};
struct ChainDw {  // 1x1 -> depthwise 3x3
  int64_t N, H, W, C, M;
  int stride, a1, a2;
};

Conv3x3Conv1x1Params Params(const Chain33& c) {
  return {c.N, c.H, c.W, c.C, c.M, c.K, ChainActivation(c.a1), ChainActivation(c.a2)};
}
Conv1x1DepthwiseParams Params(const ChainDw& c) {
  return {c.N, c.H, c.W, c.C, c.M, c.stride, ChainActivation(c.a1), ChainActivation(c.a2)};
}

template <typename T>
bool Run(const Chain33& c) {
  selftest::Lcg rng{g_seed++ * 0x9E3779B97F4A7C15ULL};
  const int64_t N = c.N, H = c.H, W = c.W, C = c.C, M = c.M, K = c.K;
  const Tensor<T> x(N * H * W * C, kInputScale, rng), w3(9 * C * M, std::sqrt(6.0 / (9 * C)), rng),
      b3(M, 0.2, rng), w1(M * K, std::sqrt(6.0 / M), rng), b1(K, 0.2, rng);
  Reference ref;
  ref.y.resize(N * H * W * K);
  ref.slack.resize(ref.y.size());
  std::vector<double> t(H * W * M), acc(M);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W; ++w) {
        std::copy(b3.f.begin(), b3.f.end(), acc.begin());
        for (int tap = 0; tap < 9; ++tap) {
          const int64_t hh = h + tap / 3 - 1, ww = w + tap % 3 - 1;
          if (hh < 0 || hh >= H || ww < 0 || ww >= W) continue;
          const double* xp = &x.f[((n * H + hh) * W + ww) * C];
          for (int64_t ci = 0; ci < C; ++ci) {
            const double* wp = &w3.f[(tap * C + ci) * M];
            for (int64_t m = 0; m < M; ++m) acc[m] += xp[ci] * wp[m];
          }
        }
        for (int64_t m = 0; m < M; ++m) t[(h * W + w) * M + m] = Round<T>(Act(acc[m], c.a1));
      }
    for (int64_t pix = 0; pix < H * W; ++pix)
      for (int64_t k = 0; k < K; ++k) {
        double sum = b1.f[k];
        Terms terms;
        for (int64_t m = 0; m < M; ++m) {
          const double v = t[pix * M + m] * w1.f[m * K + k];
          sum += v;
          terms.add(v);
        }
        const int64_t i = (n * H * W + pix) * K + k;
        ref.y[i] = Act(sum, c.a2);
        ref.slack[i] = terms.slack<T>(M);
      }
  }
  const Conv3x3Conv1x1Params p = Params(c);
  char desc[160];
  std::snprintf(desc, sizeof desc, "3x3->1x1 N=%lld H=%lld W=%lld C=%lld M=%lld K=%lld act=%s,%s",
                (long long)N, (long long)H, (long long)W, (long long)C, (long long)M,
                (long long)K, ActName(c.a1), ActName(c.a2));
  return CheckUploaded<T>(desc, ref, jaxcnn::conv3x3_conv1x1_unsupported_reason(p),
                         {&x, &w3, &b3, &w1, &b1}, [&](T* const* d, T* y) {
                           return jaxcnn::launch_conv3x3_conv1x1<T>(p, d[0], d[1], d[2], d[3],
                                                                    d[4], y, g_stream);
                         });
}

template <typename T>
bool Run(const ChainDw& c) {
  selftest::Lcg rng{g_seed++ * 0x9E3779B97F4A7C15ULL};
  const int64_t N = c.N, H = c.H, W = c.W, C = c.C, M = c.M;
  const int64_t P = (H - 1) / c.stride + 1, Q = (W - 1) / c.stride + 1;
  const Tensor<T> x(N * H * W * C, kInputScale, rng), w1(C * M, std::sqrt(6.0 / C), rng),
      b1(M, 0.2, rng), wd(9 * M, std::sqrt(6.0 / 9), rng), bd(M, 0.2, rng);
  Reference ref;
  ref.y.resize(N * P * Q * M);
  ref.slack.resize(ref.y.size());
  std::vector<double> t(H * W * M);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t pix = 0; pix < H * W; ++pix) {
      double* tp = &t[pix * M];
      std::copy(b1.f.begin(), b1.f.end(), tp);
      const double* xp = &x.f[(n * H * W + pix) * C];
      for (int64_t ci = 0; ci < C; ++ci)
        for (int64_t m = 0; m < M; ++m) tp[m] += xp[ci] * w1.f[ci * M + m];
      for (int64_t m = 0; m < M; ++m) tp[m] = Round<T>(Act(tp[m], c.a1));
    }
    for (int64_t p = 0; p < P; ++p)
      for (int64_t q = 0; q < Q; ++q)
        for (int64_t m = 0; m < M; ++m) {
          double sum = bd.f[m];
          Terms terms;
          for (int tap = 0; tap < 9; ++tap) {
            const int64_t h = p * c.stride + tap / 3 - 1, w = q * c.stride + tap % 3 - 1;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            const double v = t[(h * W + w) * M + m] * wd.f[tap * M + m];
            sum += v;
            terms.add(v);
          }
          const int64_t i = ((n * P + p) * Q + q) * M + m;
          ref.y[i] = Act(sum, c.a2);
          ref.slack[i] = terms.slack<T>(9);
        }
  }
  const Conv1x1DepthwiseParams p = Params(c);
  char desc[160];
  std::snprintf(desc, sizeof desc, "1x1->dw   N=%lld H=%lld W=%lld C=%lld M=%lld stride=%d act=%s,%s",
                (long long)N, (long long)H, (long long)W, (long long)C, (long long)M, c.stride,
                ActName(c.a1), ActName(c.a2));
  return CheckUploaded<T>(desc, ref, jaxcnn::conv1x1_depthwise_unsupported_reason(p),
                         {&x, &w1, &b1, &wd, &bd}, [&](T* const* d, T* y) {
                           return jaxcnn::launch_conv1x1_depthwise<T>(p, d[0], d[1], d[2], d[3],
                                                                      d[4], y, g_stream);
                         });
}

// Zero-filled device buffer of n elements (at least one), for the refusal checks.
template <typename T>
T* Zeros(int64_t n) {
  T* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, std::max<int64_t>(n, 1) * sizeof(T)));
  CHECK_CUDA(cudaMemset(d, 0, std::max<int64_t>(n, 1) * sizeof(T)));
  return d;
}

// A launch on full-size buffers must return `want` and leave y (and its guards) poisoned;
// `reason` is the unsupported_reason, which must be set exactly when want is InvalidValue
// for a shape reason (missing pointers and empty batches are not shape reasons).
template <typename T>
bool CheckLaunchResult(const char* desc, int64_t y_count, const char* reason, bool want_reason,
                       cudaError_t want, const std::function<cudaError_t(T*)>& launch) {
  const selftest::PoisonedOutput<T> out(y_count);
  const cudaError_t got = launch(out.y());
  CHECK_CUDA(cudaStreamSynchronize(g_stream));
  const cudaError_t sticky = cudaGetLastError();
  std::vector<T> y;
  bool untouched = out.Read(&y);
  for (const T& v : y) untouched = untouched && std::isnan(selftest::ToFloat(v));
  const bool pass = got == want && sticky == cudaSuccess && untouched &&
                    (reason != nullptr) == want_reason;
  std::printf("%-4s %s  reason=\"%s\" launch=%s y=%s  %s\n", selftest::DTypeName(DTypeOf<T>()),
              desc, reason ? reason : "(none)", cudaGetErrorName(got),
              untouched ? "untouched" : "WRITTEN", pass ? "PASS" : "FAIL");
  return pass;
}

template <typename T>
bool Refused(const Chain33& c, const char* why, cudaError_t want = cudaErrorInvalidValue,
             bool null_w1 = false) {
  const Conv3x3Conv1x1Params p = Params(c);
  T *x = Zeros<T>(c.N * c.H * c.W * c.C), *w3 = Zeros<T>(9 * c.C * c.M), *b3 = Zeros<T>(c.M),
    *w1 = Zeros<T>(c.M * c.K), *b1 = Zeros<T>(c.K);
  const char* reason = jaxcnn::conv3x3_conv1x1_unsupported_reason(p);
  char desc[160];
  std::snprintf(desc, sizeof desc, "3x3->1x1 refuse %-14s N=%lld C=%lld M=%lld K=%lld", why,
                (long long)c.N, (long long)c.C, (long long)c.M, (long long)c.K);
  const bool pass = CheckLaunchResult<T>(
      desc, c.N * c.H * c.W * c.K, reason, want == cudaErrorInvalidValue && !null_w1, want,
      [&](T* y) {
        return jaxcnn::launch_conv3x3_conv1x1<T>(p, x, w3, b3, null_w1 ? nullptr : w1, b1, y,
                                                 g_stream);
      });
  for (T* d : {x, w3, b3, w1, b1}) CHECK_CUDA(cudaFree(d));
  return pass;
}

template <typename T>
bool Refused(const ChainDw& c, const char* why, cudaError_t want = cudaErrorInvalidValue,
             bool null_wd = false) {
  const Conv1x1DepthwiseParams p = Params(c);
  const int64_t s = std::max(c.stride, 1);
  const int64_t y_count = c.N * ((c.H - 1) / s + 1) * ((c.W - 1) / s + 1) * c.M;
  T *x = Zeros<T>(c.N * c.H * c.W * c.C), *w1 = Zeros<T>(c.C * c.M), *b1 = Zeros<T>(c.M),
    *wd = Zeros<T>(9 * c.M), *bd = Zeros<T>(c.M);
  const char* reason = jaxcnn::conv1x1_depthwise_unsupported_reason(p);
  char desc[160];
  std::snprintf(desc, sizeof desc, "1x1->dw   refuse %-14s N=%lld C=%lld M=%lld stride=%d", why,
                (long long)c.N, (long long)c.C, (long long)c.M, c.stride);
  const bool pass = CheckLaunchResult<T>(
      desc, y_count, reason, want == cudaErrorInvalidValue && !null_wd, want, [&](T* y) {
        return jaxcnn::launch_conv1x1_depthwise<T>(p, x, w1, b1, null_wd ? nullptr : wd, bd, y,
                                                   g_stream);
      });
  for (T* d : {x, w1, b1, wd, bd}) CHECK_CUDA(cudaFree(d));
  return pass;
}

// {N, H, W, C, M, K, act1, act2}
const Chain33 kSmall33[] = {
    {1, 1, 1, 8, 8, 8, 0, 0}, {1, 7, 9, 16, 24, 40, 1, 1}, {2, 5, 3, 72, 136, 24, 2, 1}};
const Chain33 kFull33[] = {
    {3, 1, 1, 16, 16, 16, 2, 0},      {2, 13, 13, 24, 40, 72, 2, 0},
    {3, 17, 31, 40, 72, 136, 1, 2},   {1, 17, 31, 136, 72, 8, 0, 2},
    {1, 1, 17, 24, 48, 32, 1, 2},     {2, 19, 1, 8, 16, 24, 2, 1},
    {1, 13, 13, 64, 64, 256, 1, 0},   {2, 7, 9, 128, 384, 64, 2, 2},  // M at its limit
    {1, 9, 7, 8, 384, 384, 0, 1},     {1, 5, 3, 384, 8, 16, 1, 1},
    {1, 14, 14, 256, 256, 1024, 1, 0},  // ResNet-50 conv4 bottleneck conv2 -> conv3
    {1, 28, 28, 128, 128, 512, 1, 0},   // conv3
    {2, 11, 23, 128, 128, 128, 1, 1},
};
// {N, H, W, C, M, stride, act1, act2}
const ChainDw kSmallDw[] = {{1, 1, 1, 8, 8, 1, 0, 0},
                            {1, 7, 9, 16, 24, 2, 2, 2},
                            {2, 8, 10, 24, 40, 2, 1, 0},
                            {1, 7, 9, 40, 72, 1, 1, 2}};
const ChainDw kFullDw[] = {
    {1, 1, 1, 8, 16, 2, 2, 1},        {1, 2, 2, 8, 8, 2, 1, 2},
    {3, 13, 13, 40, 72, 1, 0, 1},     {2, 13, 13, 72, 136, 2, 1, 1},
    {1, 1, 17, 24, 48, 2, 1, 1},      {1, 31, 1, 24, 48, 2, 2, 0},
    {1, 17, 31, 136, 256, 1, 2, 0},   {1, 17, 31, 256, 96, 2, 0, 2},  // C at its limit
    {2, 16, 16, 256, 384, 1, 2, 2},   {1, 12, 12, 32, 192, 2, 2, 2},
    {2, 14, 14, 96, 576, 2, 2, 2},    {1, 7, 7, 160, 960, 1, 2, 2},  // MobileNetV2
    {1, 56, 56, 24, 144, 2, 2, 2},    {1, 28, 28, 32, 192, 1, 2, 2},
};

template <typename T>
void RunAll(bool small, int& cases, int& passed) {
  auto count = [&](bool pass) {
    ++cases;
    passed += pass;
  };
  for (const Chain33& c : kSmall33) count(Run<T>(c));
  for (const ChainDw& c : kSmallDw) count(Run<T>(c));
  if (!small) {
    for (const Chain33& c : kFull33) count(Run<T>(c));
    for (const ChainDw& c : kFullDw) count(Run<T>(c));
    for (int a1 = 0; a1 < 3; ++a1)  // every activation pair
      for (int a2 = 0; a2 < 3; ++a2) {
        count(Run<T>(Chain33{1, 7, 9, 16, 24, 40, a1, a2}));
        count(Run<T>(ChainDw{1, 9, 7, 24, 40, 2, a1, a2}));
      }
  }
  count(Refused<T>(Chain33{1, 4, 5, 12, 16, 16, 1, 1}, "C=12"));
  count(Refused<T>(Chain33{1, 4, 5, 16, 392, 16, 1, 1}, "M=392"));
  count(Refused<T>(ChainDw{1, 4, 5, 264, 16, 1, 1, 1}, "C=264"));
  count(Refused<T>(ChainDw{1, 7, 7, 16, 16, 3, 1, 1}, "stride=3"));
  count(Refused<T>(Chain33{1, 4, 5, 16, 16, 16, 1, 1}, "null w1", cudaErrorInvalidValue, true));
  count(Refused<T>(ChainDw{1, 4, 5, 16, 16, 1, 1, 1}, "null wd", cudaErrorInvalidValue, true));
  count(Refused<T>(Chain33{0, 4, 5, 16, 16, 16, 1, 1}, "empty N=0", cudaSuccess));
  count(Refused<T>(ChainDw{0, 4, 5, 16, 16, 2, 1, 1}, "empty N=0", cudaSuccess));
}

}  // namespace

int main(int argc, char** argv) {
  bool small = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--small") == 0) {
      small = true;
    } else {
      std::fprintf(stderr, "usage: %s [--small]\n", argv[0]);
      return 2;
    }
  }
  selftest::RequireCudaDevice();
  CHECK_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  int cases = 0, passed = 0;
  RunAll<__nv_bfloat16>(small, cases, passed);
  RunAll<__half>(small, cases, passed);
  CHECK_CUDA(cudaStreamDestroy(g_stream));
  std::printf("%d/%d passed\n", passed, cases);
  return passed == cases ? 0 : 1;
}
