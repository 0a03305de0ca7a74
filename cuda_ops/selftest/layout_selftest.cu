// Standalone check of launch_layout_transform against a host transpose: all 6
// directions, element sizes 1/2/4/8 bytes, odd extents, size-1 axes, and
// buffers off 16-byte alignment (the scalar fallbacks). Each case runs twice,
// with the output pre-filled with 0x00 and with 0xFF bytes, so an unwritten
// element fails one of the runs whatever its expected value.
// Small shapes so it finishes in seconds under compute-sanitizer.
// Exit status: 0 all pass, 1 a case failed, 2 CUDA error.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "layout/layout_transform.h"
#include "selftest/selftest_util.h"

namespace {

using jaxcnn::TensorLayout;
using selftest::LayoutName;
using selftest::LayoutOffset;

const char* KindName(jaxcnn::LayoutTransformPlan::Kind kind) {
  using Kind = jaxcnn::LayoutTransformPlan::Kind;
  switch (kind) {
    case Kind::kEmpty: return "empty";
    case Kind::kCopy: return "copy";
    case Kind::kTranspose: return "transpose";
    case Kind::kUnsupported: return "unsupported";
  }
  return "?";
}

// `misalign` shifts both device buffers by that many elements.
bool RunCase(TensorLayout src, TensorLayout dst, size_t bytes, int64_t N,
             int64_t C, int64_t H, int64_t W, int misalign) {
  const int64_t count = N * C * H * W;
  std::vector<uint8_t> x(count * bytes), want(count * bytes);
  uint64_t state = 0x9E3779B97F4A7C15ULL ^ (count * 31 + bytes);
  for (auto& b : x) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    b = static_cast<uint8_t>(state >> 56);
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w)
          std::memcpy(&want[LayoutOffset(dst, N, C, H, W, n, c, h, w) * bytes],
                      &x[LayoutOffset(src, N, C, H, W, n, c, h, w) * bytes], bytes);

  const size_t pad = misalign * bytes;
  uint8_t *x_dev = nullptr, *y_dev = nullptr;
  CHECK_CUDA(cudaMalloc(&x_dev, count * bytes + pad + 1));
  CHECK_CUDA(cudaMalloc(&y_dev, count * bytes + pad + 1));
  CHECK_CUDA(cudaMemcpy(x_dev + pad, x.data(), count * bytes, cudaMemcpyHostToDevice));
  bool pass = true;
  for (int poison : {0x00, 0xFF}) {
    CHECK_CUDA(cudaMemset(y_dev, poison, count * bytes + pad + 1));
    CHECK_CUDA(jaxcnn::launch_layout_transform(x_dev + pad, y_dev + pad, bytes,
                                               src, dst, N, C, H, W, 0));
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<uint8_t> got(count * bytes + pad + 1);
    CHECK_CUDA(cudaMemcpy(got.data(), y_dev, got.size(), cudaMemcpyDeviceToHost));
    pass = pass && std::memcmp(got.data() + pad, want.data(), count * bytes) == 0;
    // Nothing written outside the output.
    for (size_t i = 0; i < pad; ++i) pass = pass && got[i] == poison;
    pass = pass && got[pad + count * bytes] == poison;
  }
  CHECK_CUDA(cudaFree(x_dev));
  CHECK_CUDA(cudaFree(y_dev));
  const auto plan = jaxcnn::plan_layout_transform(src, dst, N, C, H, W);
  std::printf("%s->%s %zuB N=%lld C=%lld H=%lld W=%lld misalign=%d  %s B=%lld I=%lld J=%lld%s  %s\n",
              LayoutName(src), LayoutName(dst), bytes, (long long)N, (long long)C,
              (long long)H, (long long)W, misalign, KindName(plan.kind),
              (long long)plan.B, (long long)plan.I, (long long)plan.J,
              plan.batch_middle ? " (batch middle)" : "", pass ? "PASS" : "FAIL");
  return pass;
}

}  // namespace

int main() {
  selftest::RequireCudaDevice();
  const TensorLayout layouts[] = {TensorLayout::kNHWC, TensorLayout::kNCHW,
                                  TensorLayout::kCHWN};
  // Logical N, C, H, W.
  const int64_t shapes[][4] = {
      {1, 1, 1, 1}, {2, 3, 5, 7}, {5, 1, 7, 3},   {1, 8, 1, 1},  {3, 17, 9, 13},
      {2, 130, 3, 3}, {65, 33, 1, 1}, {8, 16, 4, 4}, {64, 3, 7, 7}, {2, 3, 32, 32},
      {16, 64, 8, 8}, {33, 24, 13, 11}, {0, 3, 4, 4},
      // Packed-word kernel (16-byte vectors both sides, extents >= 128 bytes):
      // partial tiles for 1/2/4-byte elements, batch outermost and in the middle.
      {2, 144, 16, 9}, {144, 128, 1, 16}, {2, 200, 12, 16}, {3, 64, 16, 20},
  };
  int failures = 0, cases = 0;
  for (const auto& s : shapes)
    for (TensorLayout src : layouts)
      for (TensorLayout dst : layouts) {
        if (src == dst) continue;
        for (size_t bytes : {1, 2, 4, 8})
          for (int misalign : {0, 1}) {
            ++cases;
            if (!RunCase(src, dst, bytes, s[0], s[1], s[2], s[3], misalign)) ++failures;
          }
      }
  // Bad arguments are refused without launching.
  const bool refused =
      jaxcnn::launch_layout_transform(nullptr, nullptr, 3, TensorLayout::kNHWC,
                                      TensorLayout::kNCHW, 1, 1, 1, 1, 0) ==
      cudaErrorInvalidValue;
  std::printf("3-byte elements refused: %s\n", refused ? "PASS" : "FAIL");
  if (!refused) ++failures;
  return selftest::Finish(failures, cases + 1);
}
