// Standalone check of launch_fire (fire module: fused kernels and the wgmma convs) against a host float64 reference:
// odd spatial sizes, N = 1, every SqueezeNet 1.0/1.1 channel configuration on 4-row tiles
// (small grids) and on 8-row tiles (batches of 40), which covers the plans: expand channel
// split 1 to 8, squeeze weights resident or streamed, edge tiles and short slices; bf16 / fp16
// on tensor cores and the CUDA-core kernel (fp32 too), a misaligned buffer (falls back to the
// CUDA-core kernel), then the issue's headline shape (checked on three images) and cudaEvent
// timings of every SqueezeNet fire at N=64 bf16.
// Outputs are poisoned (0xFF bytes: NaN in every dtype) before each launch and a guard
// region past y must stay untouched, so an unwritten or stray element fails.
// Build alone: nvcc -std=c++17 -O3 -arch=sm_90a -I cuda_ops cuda_ops/selftest/fire_selftest.cu
//              cuda_ops/fusion/fire.cu -o fire_selftest
// Usage: fire_selftest [--skip-large]   (skips the headline shape and timings; for sanitizers)
// Exit status: 0 all pass, 1 a case failed, 2 CUDA error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <initializer_list>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "fusion/fire.h"
#include "selftest/selftest_util.h"

namespace {

using jaxcnn::FireAlgorithm;
using jaxcnn::FireBuffers;
using jaxcnn::FireParams;
using selftest::DType;

const char* AlgoName(FireAlgorithm a) {
  switch (a) {
    case FireAlgorithm::kAuto: return "auto";
    case FireAlgorithm::kTensorCore: return "tensor_core";
    case FireAlgorithm::kFma: return "fma";
    case FireAlgorithm::kWgmma: return "wgmma";
    case FireAlgorithm::kTwoPhase: return "two_phase";
  }
  return "?";
}

using selftest::DTypeOf;

template <typename T>
double Round(double v) {  // to T and back, as the kernel rounds the squeeze output
  return selftest::ToFloat(selftest::FromFloat<T>(static_cast<float>(v)));
}

// Host tensors of one case, already rounded to T (float copies for the reference).
template <typename T>
struct Case {
  FireParams p;
  std::vector<T> x, wsq, bsq, we1, be1, we3, be3;
  std::vector<float> xf, wsqf, bsqf, we1f, be1f, we3f, be3f;
};

template <typename T>
Case<T> MakeCase(const FireParams& p, uint64_t seed) {
  Case<T> c;
  c.p = p;
  selftest::Lcg rng{seed};
  // Uniform scales that keep activations O(1) (variance-preserving for ReLU nets).
  selftest::RandomFill(&rng, p.N * p.H * p.W * p.C, &c.x, &c.xf);
  selftest::RandomFill(&rng, p.C * p.S, &c.wsq, &c.wsqf, std::sqrt(6.0f / p.C));
  selftest::RandomFill(&rng, p.S, &c.bsq, &c.bsqf, 0.2f);
  selftest::RandomFill(&rng, p.S * p.E1, &c.we1, &c.we1f, std::sqrt(6.0f / p.S));
  selftest::RandomFill(&rng, p.E1, &c.be1, &c.be1f, 0.2f);
  selftest::RandomFill(&rng, 9 * p.S * p.E3, &c.we3, &c.we3f, std::sqrt(6.0f / (9 * p.S)));
  selftest::RandomFill(&rng, p.E3, &c.be3, &c.be3f, 0.2f);
  return c;
}

// Reference of image n: y[h][w][E1 + E3] in float64, the squeeze rounded to T.
template <typename T>
std::vector<double> Reference(const Case<T>& c, int64_t n) {
  const FireParams& p = c.p;
  const int64_t E = p.E1 + p.E3;
  std::vector<double> s(p.H * p.W * p.S);
  for (int64_t h = 0; h < p.H; ++h)
    for (int64_t w = 0; w < p.W; ++w) {
      const float* xp = &c.xf[((n * p.H + h) * p.W + w) * p.C];
      for (int64_t k = 0; k < p.S; ++k) {
        double acc = c.bsqf[k];
        for (int64_t ci = 0; ci < p.C; ++ci) acc += double(xp[ci]) * c.wsqf[ci * p.S + k];
        s[(h * p.W + w) * p.S + k] = Round<T>(acc > 0 ? acc : 0.0);
      }
    }
  std::vector<double> y(p.H * p.W * E);
  for (int64_t h = 0; h < p.H; ++h)
    for (int64_t w = 0; w < p.W; ++w) {
      double* yp = &y[(h * p.W + w) * E];
      const double* sc = &s[(h * p.W + w) * p.S];
      for (int64_t e = 0; e < p.E1; ++e) {
        double acc = c.be1f[e];
        for (int64_t k = 0; k < p.S; ++k) acc += sc[k] * c.we1f[k * p.E1 + e];
        yp[e] = acc > 0 ? acc : 0.0;
      }
      for (int64_t e = 0; e < p.E3; ++e) yp[p.E1 + e] = c.be3f[e];
      for (int tap = 0; tap < 9; ++tap) {
        const int64_t hh = h + tap / 3 - 1, ww = w + tap % 3 - 1;
        if (hh < 0 || hh >= p.H || ww < 0 || ww >= p.W) continue;
        const double* sp = &s[(hh * p.W + ww) * p.S];
        for (int64_t k = 0; k < p.S; ++k) {
          const float* wp = &c.we3f[(tap * p.S + k) * p.E3];
          for (int64_t e = 0; e < p.E3; ++e) yp[p.E1 + e] += sp[k] * wp[e];
        }
      }
      for (int64_t e = 0; e < p.E3; ++e) yp[p.E1 + e] = yp[p.E1 + e] > 0 ? yp[p.E1 + e] : 0.0;
    }
  return y;
}

// Runs one case: poison, launch, compare images `check` (all when empty) with the float64
// reference; returns pass. With time_iters > 0 it also prints the mean cudaEvent time.
template <typename T>
bool RunCase(const FireParams& p, FireAlgorithm algo, int misalign, const char* label,
             std::vector<int64_t> check = {}, int time_iters = 0) {
  const Case<T> c = MakeCase<T>(p, 0x5EED0000ULL + p.N * 7 + p.H * 131 + p.C * 31 + p.S);
  const int64_t E = p.E1 + p.E3;
  const int64_t y_count = p.N * p.H * p.W * E;
  FireBuffers<T> b;
  b.x = selftest::Upload(c.x, misalign);
  b.w_sq = selftest::Upload(c.wsq), b.b_sq = selftest::Upload(c.bsq);
  b.w_e1 = selftest::Upload(c.we1), b.b_e1 = selftest::Upload(c.be1);
  b.w_e3 = selftest::Upload(c.we3), b.b_e3 = selftest::Upload(c.be3);
  const selftest::PoisonedOutput<T> out(y_count, misalign * sizeof(T));
  b.y = out.y();
  // The wgmma path's squeeze output (cudaMalloc is 256-byte aligned); poisoned too.
  b.workspace_bytes = std::max<size_t>(256, (p.N * p.H * p.W * p.S * sizeof(T) + 255) / 256 * 256);
  CHECK_CUDA(cudaMalloc(&b.workspace, b.workspace_bytes));
  CHECK_CUDA(cudaMemset(b.workspace, 0xFF, b.workspace_bytes));

  const jaxcnn::FirePlan plan = jaxcnn::plan_fire<T>(p, b, algo);
  bool pass = plan.unsupported == nullptr;
  if (pass) {
    CHECK_CUDA(jaxcnn::launch_fire<T>(p, b, algo, 0));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  std::vector<T> got;
  pass = out.Read(&got) && pass;

  selftest::RelError err;
  int64_t bad = 0;
  if (check.empty())
    for (int64_t n = 0; n < p.N; ++n) check.push_back(n);
  // Images not compared with the reference must still be fully written (no poison left).
  for (int64_t i = 0; pass && i < y_count; ++i)
    if (!std::isfinite(selftest::ToFloat(got[i]))) ++bad;
  if (pass) {
    for (int64_t n : check) {
      const std::vector<double> want = Reference(c, n);
      const T* g = got.data() + n * p.H * p.W * E;
      for (size_t i = 0; i < want.size(); ++i) err.Add(selftest::ToFloat(g[i]), want[i]);
    }
  }
  bad += err.nonfinite;
  const double rel = err.rel();
  pass = pass && bad == 0 && rel <= selftest::Tolerance(DTypeOf<T>());

  double ms = 0.0;
  if (pass && time_iters > 0) {
    // Timed as one CUDA graph of time_iters launches, as XLA's command buffers run them: no
    // host launch cost between kernels, and the capture checks that the launch (the
    // two-phase kernel's cooperative one included) is graph-safe.
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int i = 0; i < 3; ++i) CHECK_CUDA(jaxcnn::launch_fire<T>(p, b, algo, stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < time_iters; ++i) CHECK_CUDA(jaxcnn::launch_fire<T>(p, b, algo, stream));
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    CHECK_CUDA(cudaEventRecord(start, stream));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float total = 0.0f;
    CHECK_CUDA(cudaEventElapsedTime(&total, start, stop));
    ms = total / time_iters;
    CHECK_CUDA(cudaEventDestroy(start));
    CHECK_CUDA(cudaEventDestroy(stop));
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaStreamDestroy(stream));
  }

  std::printf("%-22s %-4s %-11s N=%lld H=%lld W=%lld C=%lld S=%lld E=%lld+%lld misalign=%d  "
              "kernel=%s launches=%d tile=%dx%d split=%d grid=%lld ctas/sm=%d smem=%lld res(sq,ex)=(%d,%d) chunk=%d  "
              "max_rel_err=%.2e nonfinite=%lld",
              label, selftest::DTypeName(DTypeOf<T>()), AlgoName(algo), (long long)p.N,
              (long long)p.H, (long long)p.W, (long long)p.C, (long long)p.S, (long long)p.E1,
              (long long)p.E3, misalign,
              plan.unsupported ? plan.unsupported : AlgoName(plan.kernel),
              plan.wgmma_launches, plan.tile_h,
              plan.tile_w, plan.split, (long long)plan.grid, plan.ctas_per_sm,
              (long long)plan.smem_bytes,
              plan.squeeze_weights_resident, plan.expand_weights_resident, plan.expand_chunk, rel,
              (long long)bad);
  if (ms > 0.0) {
    const double bytes = double(p.N * p.H * p.W * (p.C + E)) * sizeof(T);
    std::printf("  %.4f ms  %.0f GB/s  floor(3.97TB/s) %.4f ms", ms, bytes / ms * 1e-6,
                bytes / 3.97e12 * 1e3);
  }
  std::printf("  %s\n", pass ? "PASS" : "FAIL");

  CHECK_CUDA(cudaFree(const_cast<T*>(b.x) - misalign));
  const T* weights[] = {b.w_sq, b.b_sq, b.w_e1, b.b_e1, b.w_e3, b.b_e3};
  for (const T* d : weights) CHECK_CUDA(cudaFree(const_cast<T*>(d)));
  CHECK_CUDA(cudaFree(b.workspace));
  return pass;
}

struct Fire {
  const char* name;
  int64_t hw, C, S, E;
};

// One element type x kernel that a group of cases runs.
struct Variant {
  selftest::DType dtype;
  FireAlgorithm algo;
};

// RunCase with the storage type of v.dtype (aligned buffers, default checks, untimed).
bool RunVariant(const FireParams& p, const Variant& v, const char* label) {
  switch (v.dtype) {
    case selftest::DType::kF32: return RunCase<float>(p, v.algo, 0, label);
    case selftest::DType::kBF16: return RunCase<__nv_bfloat16>(p, v.algo, 0, label);
    case selftest::DType::kF16: return RunCase<__half>(p, v.algo, 0, label);
  }
  return false;
}

// Every fire module of SqueezeNet 1.0 and 1.1 (torchvision) at 224x224 input.
const Fire kSqueezeNetFires[] = {
    {"sq1.0 fire2", 55, 96, 16, 64},   {"sq1.0 fire3", 55, 128, 16, 64},
    {"sq1.0 fire4", 55, 128, 32, 128}, {"sq1.0 fire5", 27, 256, 32, 128},
    {"sq1.0 fire6", 27, 256, 48, 192}, {"sq1.0 fire7", 27, 384, 48, 192},
    {"sq1.0 fire8", 27, 384, 64, 256}, {"sq1.0 fire9", 13, 512, 64, 256},
    {"sq1.1 fire2", 55, 64, 16, 64},   {"sq1.1 fire3", 55, 128, 16, 64},
    {"sq1.1 fire4", 27, 128, 32, 128}, {"sq1.1 fire5", 27, 256, 32, 128},
    {"sq1.1 fire6", 13, 256, 48, 192}, {"sq1.1 fire7", 13, 384, 48, 192},
    {"sq1.1 fire8", 13, 384, 64, 256}, {"sq1.1 fire9", 13, 512, 64, 256},
};

}  // namespace

int main(int argc, char** argv) {
  const bool skip_large = argc > 1 && std::strcmp(argv[1], "--skip-large") == 0;
  selftest::RequireCudaDevice();
  int failures = 0, cases = 0;
  auto count = [&](bool pass) {
    ++cases;
    if (!pass) ++failures;
  };
  const FireAlgorithm tc = FireAlgorithm::kTensorCore, fma = FireAlgorithm::kFma,
                      automatic = FireAlgorithm::kAuto, wgmma = FireAlgorithm::kWgmma,
                      two = FireAlgorithm::kTwoPhase;
  constexpr selftest::DType f32 = selftest::DType::kF32, bf16 = selftest::DType::kBF16,
                            f16 = selftest::DType::kF16;

  // Odd sizes, edge tiles, N = 1, partial input chunks (C = 72, 136), S = 8/24/40 (padded K),
  // expand widths not multiples of 16 or 64 (40, 200).
  const FireParams odd[] = {
      {1, 1, 1, 8, 8, 8, 8},      {1, 7, 5, 16, 16, 16, 16}, {2, 9, 17, 72, 24, 40, 56},
      {1, 13, 13, 136, 40, 200, 8}, {3, 19, 33, 64, 16, 64, 64}, {1, 8, 16, 128, 32, 128, 128},
      {2, 11, 23, 96, 64, 128, 256},
  };
  const Variant odd_variants[] = {{bf16, tc},        {f16, tc},    {bf16, fma},
                                  {f32, automatic}, {bf16, wgmma}, {f16, wgmma},
                                  {bf16, two},      {f16, two}};
  for (const FireParams& p : odd)
    for (const Variant& v : odd_variants) count(RunVariant(p, v, "odd"));
  // The one-launch wgmma kernel (S = 32): 1 to 8 input chunks, 2 to 4 pipeline stages (the
  // expand weights' size), E1 != E3, edge tiles in both directions, a 1x1 image.
  const FireParams fused[] = {{1, 1, 1, 32, 32, 64, 64},       {3, 57, 9, 96, 32, 192, 64},
                              {2, 30, 17, 256, 32, 64, 64},    {5, 29, 31, 160, 32, 128, 128},
                              {1, 55, 55, 128, 32, 128, 128}};
  const Variant fused_variants[] = {{bf16, wgmma}, {f16, wgmma}};
  for (const FireParams& p : fused)
    for (const Variant& v : fused_variants) count(RunVariant(p, v, "fused"));
  // No 1x1 expand (E1 = 0): the straight squeeze -> 3x3 chain (jaxcnn.conv1x1_conv3x3).
  const FireParams chains[] = {{1, 13, 13, 64, 16, 0, 64}, {2, 9, 21, 72, 24, 0, 40},
                               {3, 27, 27, 128, 32, 0, 128}};
  const Variant chain_variants[] = {
      {bf16, tc}, {f16, fma}, {f32, automatic}, {bf16, wgmma}, {bf16, two}};
  for (const FireParams& p : chains)
    for (const Variant& v : chain_variants) count(RunVariant(p, v, "1x1->3x3"));
  // Channel counts off the tensor-core constraints and misaligned x/y: auto falls back.
  count(RunCase<__nv_bfloat16>({2, 6, 7, 13, 5, 7, 9}, automatic, 0, "odd channels"));
  count(RunCase<__half>({1, 9, 9, 32, 16, 32, 32}, automatic, 1, "misaligned"));
  // A forced tensor-core run of fp32 is refused, not run.
  {
    FireBuffers<float> none{};
    const bool refused =
        jaxcnn::plan_fire<float>({1, 4, 4, 8, 8, 8, 8}, none, tc).unsupported != nullptr;
    std::printf("fp32 tensor_core refused: %s\n", refused ? "PASS" : "FAIL");
    count(refused);
  }
  // Every SqueezeNet fire configuration at a small odd spatial size, N = 2.
  for (const Fire& f : kSqueezeNetFires) {
    const FireParams p{2, 11, 21, f.C, f.S, f.E, f.E};
    for (const Variant& v : {Variant{bf16, tc}, Variant{f16, tc}, Variant{bf16, wgmma},
                             Variant{bf16, two}})
      count(RunVariant(p, v, f.name));
  }

  // 8-row tiles are planned only when 4-row ones would not leave SMs idle: batches of 40
  // small odd images get them (tiles at every edge), alone (split 1) and with the expand
  // channels split over CTAs (S = 64: slices 56 + 64 channels, the last E1 slice short).
  {
    const FireParams wide[] = {
        {40, 9, 17, 72, 24, 40, 56}, {40, 9, 17, 136, 64, 200, 256}, {70, 13, 13, 512, 64, 256, 256},
    };
    for (const FireParams& p : wide) {
      count(RunCase<__nv_bfloat16>(p, tc, 0, "tile8", {0, 17, 39}));
      count(RunCase<__half>(p, tc, 0, "tile8", {1, 39}));
      // Many items per CTA in both phases (weight blocks switching mid-run).
      count(RunCase<__nv_bfloat16>(p, two, 0, "many items", {0, 17, 39}));
    }
    // Every SqueezeNet fire configuration on 8-row tiles (two images compared, all checked
    // for unwritten outputs).
    for (const Fire& f : kSqueezeNetFires) {
      const FireParams p{40, 9, 17, f.C, f.S, f.E, f.E};
      count(RunCase<__nv_bfloat16>(p, tc, 0, f.name, {0, 39}));
    }
  }

  if (!skip_large) {
    // The headline fire module: 55x55, 128 -> 32 -> (128, 128), N = 64 (3 images checked).
    const FireParams head{64, 55, 55, 128, 32, 128, 128};
    count(RunCase<__nv_bfloat16>(head, automatic, 0, "headline", {0, 37, 63}, 50));
    count(RunCase<__half>(head, automatic, 0, "headline", {0, 63}, 50));
    count(RunCase<__nv_bfloat16>(head, fma, 0, "headline", {5}, 5));
    count(RunCase<__nv_bfloat16>(head, tc, 0, "headline", {0, 63}, 50));
    count(RunCase<__nv_bfloat16>(head, wgmma, 0, "headline", {0, 63}, 50));
    // Every SqueezeNet fire at N = 64 (one image checked) and N = 1, timed.
    for (const Fire& f : kSqueezeNetFires) {
      count(RunCase<__nv_bfloat16>({64, f.hw, f.hw, f.C, f.S, f.E, f.E}, automatic, 0, f.name,
                                   {17}, 50));
      count(RunCase<__nv_bfloat16>({64, f.hw, f.hw, f.C, f.S, f.E, f.E}, tc, 0, f.name, {17},
                                   50));
      // N = 1: every kernel, so the auto rule can be checked against them.
      for (FireAlgorithm algo : {automatic, tc, wgmma, two})
        count(RunCase<__nv_bfloat16>({1, f.hw, f.hw, f.C, f.S, f.E, f.E}, algo, 0, f.name, {},
                                     200));
    }
  }
  return selftest::Finish(failures, cases);
}
