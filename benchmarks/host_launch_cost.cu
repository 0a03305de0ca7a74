// Host time per enqueue (no sync in the timed loop) of jaxcnn launchers vs bare launches.
// Build against the installed library and run on the GPU machine:
//   nvcc -std=c++17 -O2 -arch=sm_90a -I cuda_ops benchmarks/host_launch_cost.cu -L jaxcnn/_lib \
//     -ljaxcnn_cuda -Xlinker -rpath,'$ORIGIN/jaxcnn/_lib' -o host_launch_cost && ./host_launch_cost
#include <chrono>
#include <cstdio>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "fusion/fire.h"
using namespace jaxcnn;
using bf = __nv_bfloat16;
__global__ void empty_kernel(int) {}
template <class F> double per_call_us(F f, int iters = 2000) {
  for (int i = 0; i < 50; ++i) f();
  cudaDeviceSynchronize();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) f();
    auto t1 = std::chrono::steady_clock::now();
    cudaDeviceSynchronize();
    best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
  }
  return best;
}
int main() {
  cudaStream_t s; cudaStreamCreate(&s);
  void* buf; cudaMalloc(&buf, 1 << 30); cudaMemset(buf, 0, 1 << 30);
  bf* base = (bf*)buf;
  auto bufs = [&](const FireParams& p, size_t ws) {
    FireBuffers<bf> b{base, base + (64 << 20), base + (66 << 20), base + (67 << 20), base + (68 << 20),
                      base + (69 << 20), base + (70 << 20), base + (80 << 20), base + (400 << 20), ws};
    return b;
  };
  printf("empty <<<>>>            %.2f us\n", per_call_us([&] { empty_kernel<<<1, 32, 0, s>>>(0); }));
  printf("empty FuncSetAttribute  %.2f us\n", per_call_us([&] {
    cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000); }));
  printf("empty carveout attr     %.2f us\n", per_call_us([&] {
    cudaFuncSetAttribute(empty_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100); }));
  cudaLaunchAttribute coop{}; coop.id = cudaLaunchAttributeCooperative; coop.val.cooperative = 1;
  printf("empty cooperative Ex    %.2f us\n", per_call_us([&] {
    cudaLaunchConfig_t c{}; c.gridDim = dim3(264); c.blockDim = dim3(256); c.stream = s; c.attrs = &coop; c.numAttrs = 1;
    cudaLaunchKernelEx(&c, empty_kernel, 0); }));
  printf("empty plain Ex          %.2f us\n", per_call_us([&] {
    cudaLaunchConfig_t c{}; c.gridDim = dim3(264); c.blockDim = dim3(256); c.stream = s;
    cudaLaunchKernelEx(&c, empty_kernel, 0); }));
  FireParams f9{1, 13, 13, 512, 64, 256, 256};
  FirePlan pl = plan_fire<bf>(f9, bufs(f9, 64 << 20), FireAlgorithm::kTwoPhase);
  printf("plan two_phase fire9    %.2f us (%s)\n", per_call_us([&] { plan_fire<bf>(f9, bufs(f9, 64 << 20), FireAlgorithm::kTwoPhase); }), pl.why);
  printf("launch two_phase fire9  %.2f us err=%d\n", per_call_us([&] { launch_fire<bf>(f9, bufs(f9, 64 << 20), FireAlgorithm::kTwoPhase, s); }, 500), (int)cudaGetLastError());
  FireParams f2{64, 55, 55, 128, 16, 64, 64};
  printf("launch wgmma fire2 N64  %.2f us err=%d\n", per_call_us([&] { launch_fire<bf>(f2, bufs(f2, 64 << 20), FireAlgorithm::kWgmma, s); }, 200), (int)cudaGetLastError());
  FireParams f2s{64, 13, 13, 128, 16, 64, 64};
  printf("launch wgmma small N64  %.2f us err=%d\n", per_call_us([&] { launch_fire<bf>(f2s, bufs(f2s, 64 << 20), FireAlgorithm::kWgmma, s); }, 500), (int)cudaGetLastError());
  printf("launch tc fire small    %.2f us err=%d\n", per_call_us([&] { launch_fire<bf>(f2s, bufs(f2s, 64 << 20), FireAlgorithm::kTensorCore, s); }, 500), (int)cudaGetLastError());
  return 0;
}
