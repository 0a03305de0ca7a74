// Host-side helpers every standalone selftest uses: CUDA error exit, fp32 <->
// storage conversions, a fixed-seed LCG and random inputs, conv output sizes and
// filter taps, poisoned device outputs, the error against a float64 reference.
// Header-only; the selftests are separate programs (cuda_ops/selftest is not
// part of the library).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/conv2d_params.h"

// Exit status 2 on any CUDA error, with where and what.
#define CHECK_CUDA(expr)                                                  \
  do {                                                                    \
    const cudaError_t status_ = (expr);                                   \
    if (status_ != cudaSuccess) {                                         \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n",                \
                   cudaGetErrorName(status_), __FILE__, __LINE__, #expr); \
      std::fprintf(stderr, "  %s\n", cudaGetErrorString(status_));        \
      std::exit(2);                                                       \
    }                                                                     \
  } while (0)

namespace selftest {

// Prints the selftest's last line and returns its exit status: 0 when no case
// failed, 1 otherwise (cases < 0: the count of cases is not printed).
inline int Finish(int failures, int cases = -1) {
  const char* verdict = failures == 0 ? "ALL PASS" : "FAILED";
  if (cases < 0)
    std::printf("%s: %d failure(s)\n", verdict, failures);
  else
    std::printf("%s: %d of %d case(s) failed\n", verdict, failures, cases);
  return failures == 0 ? 0 : 1;
}

// Exits with status 2 (as for a CUDA error) where no CUDA device is visible.
inline void RequireCudaDevice() {
  int device_count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&device_count));
  if (device_count < 1) {
    std::fprintf(stderr, "no CUDA device\n");
    std::exit(2);
  }
}

inline float ToFloat(float v) { return v; }
inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float ToFloat(__half v) { return __half2float(v); }
template <typename T> T FromFloat(float v);
template <> inline float FromFloat<float>(float v) { return v; }
template <> inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> inline __half FromFloat<__half>(float v) { return __float2half_rn(v); }

// Fixed-seed LCG: the same inputs on every run; next() is uniform in [-1, 1).
struct Lcg {
  uint64_t state;
  uint64_t next_u64() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state;
  }
  float next() {
    return static_cast<float>((next_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f -
           1.0f;
  }
};

// count values rng->next() * scale + shift rounded to T in *host, and in *ref
// the float each rounded to: the reference computes on exactly the kernel's
// inputs. Draws count values from rng, in order.
template <typename T>
void RandomFill(Lcg* rng, int64_t count, std::vector<T>* host,
                std::vector<float>* ref, float scale = 1.0f, float shift = 0.0f) {
  host->resize(count);
  ref->resize(count);
  for (int64_t i = 0; i < count; ++i) {
    (*host)[i] = FromFloat<T>(rng->next() * scale + shift);
    (*ref)[i] = ToFloat((*host)[i]);
  }
}

// Output extent of a (dilated) window sliding over a padded input.
inline int64_t OutSize(int64_t in, int64_t window, int stride, int pad_lo,
                       int pad_hi, int dil) {
  const int64_t span = dil * (window - 1) + 1;
  return (in + pad_lo + pad_hi - span) / stride + 1;
}

// Conv2dParams of a case-table row (fields N, H, W, C, R, S, stride_h/w,
// pad_top/bottom/left/right, dil_h/w, relu) with K outputs in `groups` groups.
template <typename Case>
jaxcnn::Conv2dParams CaseParams(const Case& tc, int64_t K, int groups,
                                jaxcnn::TensorLayout layout) {
  jaxcnn::Conv2dParams p{};
  p.N = tc.N; p.H = tc.H; p.W = tc.W; p.C = tc.C;
  p.R = tc.R; p.S = tc.S; p.K = K;
  p.P = OutSize(tc.H, tc.R, tc.stride_h, tc.pad_top, tc.pad_bottom, tc.dil_h);
  p.Q = OutSize(tc.W, tc.S, tc.stride_w, tc.pad_left, tc.pad_right, tc.dil_w);
  p.stride_h = tc.stride_h; p.stride_w = tc.stride_w;
  p.pad_h = tc.pad_top; p.pad_w = tc.pad_left;
  p.dil_h = tc.dil_h; p.dil_w = tc.dil_w;
  p.groups = groups;
  p.epilogue.act = tc.relu ? jaxcnn::Activation::kRelu : jaxcnn::Activation::kNone;
  p.layout = layout;
  return p;
}

// Conv2dParams of a stride-1, unpadded, undilated conv (the launchers' argument
// checks).
inline jaxcnn::Conv2dParams ValidConvParams(int64_t N, int64_t H, int64_t W, int64_t C,
                                            int64_t R, int64_t S, int64_t K, int groups) {
  jaxcnn::Conv2dParams p{};
  p.N = N; p.H = H; p.W = W; p.C = C; p.R = R; p.S = S; p.K = K;
  p.P = H - R + 1; p.Q = W - S + 1;
  p.stride_h = p.stride_w = 1;
  p.dil_h = p.dil_w = 1;
  p.groups = groups;
  return p;
}

// A conv's window over an H x W input: R x S taps, stride, leading (top, left)
// padding and dilation.
struct ConvWindow {
  int64_t H, W, R, S;
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
};

// Calls tap(r, s, ih, iw) for each filter tap (r, s) of output pixel (oh, ow)
// that reads inside the input (taps on padding are skipped); r outer, s inner,
// so a reference sums in one fixed order.
template <typename F>
void ForEachTap(const ConvWindow& win, int64_t oh, int64_t ow, F&& tap) {
  for (int64_t r = 0; r < win.R; ++r) {
    const int64_t ih = oh * win.stride_h - win.pad_h + r * win.dil_h;
    if (ih < 0 || ih >= win.H) continue;
    for (int64_t s = 0; s < win.S; ++s) {
      const int64_t iw = ow * win.stride_w - win.pad_w + s * win.dil_w;
      if (iw < 0 || iw >= win.W) continue;
      tap(r, s, ih, iw);
    }
  }
}

// max |got - want| / max |want| over the compared elements; a non-finite got
// (an unwritten, NaN-poisoned element among them) is counted, not compared.
struct RelError {
  double max_err = 0.0, max_ref = 0.0;
  int64_t nonfinite = 0;
  void Add(double got, double want) {
    if (!std::isfinite(got)) {
      ++nonfinite;
      return;
    }
    max_err = std::fmax(max_err, std::fabs(got - want));
    max_ref = std::fmax(max_ref, std::fabs(want));
  }
  double rel() const { return max_err / std::fmax(max_ref, 1e-30); }
};

// A device copy of v starting `misalign` elements past cudaMalloc's alignment
// (one spare element: an empty v still gets a pointer). Free with
// cudaFree(ptr - misalign).
template <typename T>
T* Upload(const std::vector<T>& v, int misalign = 0) {
  T* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, (v.size() + misalign + 1) * sizeof(T)));
  if (!v.empty())
    CHECK_CUDA(cudaMemcpy(d + misalign, v.data(), v.size() * sizeof(T),
                          cudaMemcpyHostToDevice));
  return d + misalign;
}

// A device output of `count` T between two guard regions, all poisoned with
// 0xFF bytes (NaN in f32, bf16 and f16): an element the kernel does not write
// stays NaN, a write outside the output changes a guard byte. The output
// starts `lead` bytes past a 256-byte boundary (a misaligned-buffer case).
template <typename T>
class PoisonedOutput {
 public:
  static constexpr size_t kGuardBytes = 256;
  static constexpr unsigned char kPoison = 0xFF;

  explicit PoisonedOutput(int64_t count, size_t lead = 0)
      : bytes_(count * sizeof(T)), lead_(lead) {
    CHECK_CUDA(cudaMalloc(&raw_, total()));
    CHECK_CUDA(cudaMemset(raw_, kPoison, total()));
  }
  ~PoisonedOutput() { CHECK_CUDA(cudaFree(raw_)); }
  PoisonedOutput(const PoisonedOutput&) = delete;
  PoisonedOutput& operator=(const PoisonedOutput&) = delete;

  T* y() const { return reinterpret_cast<T*>(raw_ + kGuardBytes + lead_); }

  // Copies the output to *got; false if a guard byte changed.
  bool Read(std::vector<T>* got) const {
    std::vector<unsigned char> host(total());
    CHECK_CUDA(cudaMemcpy(host.data(), raw_, host.size(), cudaMemcpyDeviceToHost));
    got->resize(bytes_ / sizeof(T));
    const size_t start = kGuardBytes + lead_;
    if (bytes_ > 0) std::memcpy(got->data(), host.data() + start, bytes_);
    for (size_t i = 0; i < kGuardBytes + lead_; ++i)
      if (host[i] != kPoison) return false;
    for (size_t i = start + bytes_; i < host.size(); ++i)
      if (host[i] != kPoison) return false;
    return true;
  }

 private:
  size_t total() const { return kGuardBytes + lead_ + bytes_ + kGuardBytes; }
  unsigned char* raw_ = nullptr;
  size_t bytes_, lead_;
};

// Storage types of the conv selftests and their max-rel-error bounds vs float64.
enum class DType { kF32, kBF16, kF16 };

// The DType of a storage type.
template <typename T> DType DTypeOf();
template <> inline DType DTypeOf<float>() { return DType::kF32; }
template <> inline DType DTypeOf<__nv_bfloat16>() { return DType::kBF16; }
template <> inline DType DTypeOf<__half>() { return DType::kF16; }

// f(T{}) with T the storage type of d: runs a case templated on T for a DType
// chosen at run time.
template <typename F>
auto WithStorageType(DType d, F&& f) {
  switch (d) {
    case DType::kBF16: return f(__nv_bfloat16{});
    case DType::kF16: return f(__half{});
    case DType::kF32: break;
  }
  return f(float{});
}

inline const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
  }
  return "?";
}

inline double Tolerance(DType d) {
  switch (d) {
    case DType::kF32: return 1e-5;
    case DType::kBF16: return 2e-2;
    case DType::kF16: return 2e-3;
  }
  return 0.0;
}

inline const char* LayoutName(jaxcnn::TensorLayout layout) {
  switch (layout) {
    case jaxcnn::TensorLayout::kNHWC: return "NHWC";
    case jaxcnn::TensorLayout::kNCHW: return "NCHW";
    case jaxcnn::TensorLayout::kCHWN: return "CHWN";
  }
  return "?";
}

// Offset of logical (n, c, h, w) in a [N, C, H, W] tensor laid out as `layout`.
inline int64_t LayoutOffset(jaxcnn::TensorLayout layout, int64_t N, int64_t C,
                            int64_t H, int64_t W, int64_t n, int64_t c,
                            int64_t h, int64_t w) {
  switch (layout) {
    case jaxcnn::TensorLayout::kNHWC: return ((n * H + h) * W + w) * C + c;
    case jaxcnn::TensorLayout::kNCHW: return ((n * C + c) * H + h) * W + w;
    case jaxcnn::TensorLayout::kCHWN: return ((c * H + h) * W + w) * N + n;
  }
  return 0;
}

// Float64 grouped conv (+ bias where has_bias, + ReLU per p.epilogue) of the
// already-rounded inputs: x [N, C, H, W] and y [N, K, P, Q] laid out as
// `layout`, w HWIO [R, S, C / groups, K] (depthwise: groups = C). NaN
// propagates, and ReLU keeps NaN (like jnp.maximum).
inline void ConvReference(const std::vector<float>& x, const std::vector<float>& w,
                          const std::vector<float>& bias, const jaxcnn::Conv2dParams& p,
                          bool has_bias, jaxcnn::TensorLayout layout,
                          std::vector<double>* y) {
  const int64_t Cg = p.C / p.groups, Kg = p.K / p.groups;
  const ConvWindow win{p.H, p.W, p.R, p.S, p.stride_h, p.stride_w,
                       p.pad_h, p.pad_w, p.dil_h, p.dil_w};
  y->assign(p.N * p.P * p.Q * p.K, 0.0);
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t oh = 0; oh < p.P; ++oh)
      for (int64_t ow = 0; ow < p.Q; ++ow)
        for (int64_t k = 0; k < p.K; ++k) {
          const int64_t g = k / Kg;
          double acc = has_bias ? bias[k] : 0.0;
          ForEachTap(win, oh, ow, [&](int64_t r, int64_t s, int64_t ih, int64_t iw) {
            for (int64_t c = 0; c < Cg; ++c)
              acc += static_cast<double>(
                         x[LayoutOffset(layout, p.N, p.C, p.H, p.W, n, g * Cg + c, ih, iw)]) *
                     w[((r * p.S + s) * Cg + c) * p.K + k];
          });
          if (p.epilogue.act == jaxcnn::Activation::kRelu && acc < 0.0) acc = 0.0;
          (*y)[LayoutOffset(layout, p.N, p.K, p.P, p.Q, n, k, oh, ow)] = acc;
        }
}

}  // namespace selftest
