// Launcher for the fused fire module: validate, plan (tensor cores or CUDA cores, which
// weights stay in shared memory), launch.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "fusion/fire.h"
#include "fusion/fire_kernels.cuh"

namespace jaxcnn {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int kMaxDevices = 64;

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Per-device attributes, queried once: launches stay free of device queries (CUDA graphs).
struct DeviceInfo {
  int sm_count = 0;
  int smem_optin = 0;
  int major = 0;
};

cudaError_t CurrentDeviceInfo(DeviceInfo* info) {
  static DeviceInfo cache[kMaxDevices];
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  if (device >= 0 && device < kMaxDevices && cache[device].sm_count > 0) {
    *info = cache[device];
    return cudaSuccess;
  }
  DeviceInfo d;
  if ((status = cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device)) !=
          cudaSuccess ||
      (status = cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                       device)) != cudaSuccess ||
      (status = cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device)) !=
          cudaSuccess)
    return status;
  if (device >= 0 && device < kMaxDevices) cache[device] = d;
  *info = d;
  return cudaSuccess;
}

int SqueezeK(int64_t S) { return static_cast<int>(CeilDiv(S, 16) * 16); }

// Shared-memory layout of the tensor-core kernel for one (resident, chunk) choice.
fire::TcArgs TcLayout(const FireParams& p, bool sq_resident, bool ex_resident, int ex_chunk) {
  using namespace fire;
  TcArgs a{};
  a.N = static_cast<int>(p.N), a.H = static_cast<int>(p.H), a.W = static_cast<int>(p.W);
  a.C = static_cast<int>(p.C), a.S = static_cast<int>(p.S);
  a.E1 = static_cast<int>(p.E1), a.E3 = static_cast<int>(p.E3);
  a.tiles_h = static_cast<int>(CeilDiv(p.H, kTileH));
  a.tiles_w = static_cast<int>(CeilDiv(p.W, kTileW));
  a.num_tiles = static_cast<int>(p.N * a.tiles_h * a.tiles_w);
  a.in_chunks = static_cast<int>(CeilDiv(p.C, kInChunk));
  const int sk = SqueezeK(p.S);
  a.sq_stride = PaddedStride(sk);
  a.ex_chunk = ex_chunk;
  a.ex_stride = PaddedStride(ex_chunk);
  a.e1_chunks = static_cast<int>(CeilDiv(p.E1, ex_chunk));
  a.e3_chunks = static_cast<int>(CeilDiv(p.E3, ex_chunk));
  a.sq_resident = sq_resident;
  a.ex_resident = ex_resident;
  a.x_buf_elems = kHaloRows * PaddedStride(kInChunk);
  a.wsq_chunk_elems = kInChunk * a.sq_stride;
  a.wex_e1_elems = sk * a.ex_stride;
  a.wex_e3_elems = 9 * sk * a.ex_stride;
  int off = 0;
  a.off_x = off;
  off += 2 * a.x_buf_elems;
  a.off_wsq = off;
  off += (sq_resident ? a.in_chunks : 2) * a.wsq_chunk_elems;
  a.off_s = off;
  off += kHaloRows * a.sq_stride;
  a.off_wex = off;
  off += ex_resident ? a.e1_chunks * a.wex_e1_elems + a.e3_chunks * a.wex_e3_elems
                     : a.wex_e3_elems;  // one slot, sized for a 3x3 chunk
  a.off_stage = off;
  off += kTilePixels * a.ex_stride;
  return a;
}

int64_t TcSmemBytes(const fire::TcArgs& a) {
  return (int64_t{a.off_stage} + int64_t{fire::kTilePixels} * a.ex_stride) * 2;
}

// Why the tensor-core kernel cannot run these params/buffers, or nullptr.
template <typename T>
const char* TcUnsupportedReason(const FireParams& p, const FireBuffers<T>& b) {
  if constexpr (std::is_same_v<T, float>) {
    return "tensor-core fire kernel is bf16/fp16 only (float32 runs the CUDA-core kernel)";
  } else {
    if (p.C % 8 != 0 || p.S % 8 != 0 || p.E1 % 8 != 0 || p.E3 % 8 != 0)
      return "tensor-core fire kernel needs C, squeeze, expand1 and expand3 channels that are "
             "multiples of 8";
    if (p.S == 0 || p.S > 64)
      return "tensor-core fire kernel supports 8 to 64 squeeze channels";
    if (!Aligned16(b.x) || !Aligned16(b.y) || !Aligned16(b.w_sq) || !Aligned16(b.w_e1) ||
        !Aligned16(b.w_e3))
      return "tensor-core fire kernel needs 16-byte aligned x, y and weights";
    return nullptr;
  }
}

}  // namespace

const char* fire_unsupported_reason(const FireParams& p) {
  if (p.N < 0 || p.H < 0 || p.W < 0 || p.C < 0 || p.S < 0 || p.E1 < 0 || p.E3 < 0)
    return "negative dimension";
  if (p.N > kInt32Max || p.H > kInt32Max || p.W > kInt32Max || p.C > kInt32Max ||
      p.S > kInt32Max || p.E1 > kInt32Max || p.E3 > kInt32Max)
    return "a dimension exceeds int32";
  if (p.S > 0 && (p.C == 0)) return "input channels must be >= 1";
  // Tile indices are int32 in the kernels.
  if (p.N * CeilDiv(p.H, fire::kFmaTile) * CeilDiv(p.W, fire::kFmaTile) > kInt32Max)
    return "too many output tiles for int32 indices";
  // The CUDA-core kernel keeps the 10x10 squeeze tile in fp32 shared memory.
  if (p.S * fire::kFmaHalo * fire::kFmaHalo * 4 > 200 * 1024)
    return "squeeze channels too many for the CUDA-core kernel's shared-memory tile (> 512)";
  return nullptr;
}

template <typename T>
FirePlan plan_fire(const FireParams& p, const FireBuffers<T>& b, FireAlgorithm algorithm) {
  FirePlan plan;
  if (const char* reason = fire_unsupported_reason(p)) {
    plan.unsupported = reason;
    return plan;
  }
  if (algorithm == FireAlgorithm::kFma) {
    plan.kernel = FireAlgorithm::kFma;
    plan.why = "requested";
    return plan;
  }
  const char* tc_reason = TcUnsupportedReason(p, b);
  DeviceInfo dev;
  if (tc_reason == nullptr) {
    if (CurrentDeviceInfo(&dev) != cudaSuccess) {
      tc_reason = "cannot query the current CUDA device";
    } else if (dev.major < 8) {
      tc_reason = "tensor-core fire kernel needs sm_80 or newer (mma.sync bf16/fp16)";
    }
  }
  if (tc_reason == nullptr) {
    // Keep as many weights resident as fit: squeeze and expand, then expand streamed, then
    // both streamed; 64-channel expand chunks when 128 do not fit.
    struct Choice {
      bool sq, ex;
      int chunk;
    };
    const Choice choices[] = {{true, true, 128}, {true, false, 128}, {false, false, 128},
                              {true, false, 64}, {false, false, 64}};
    for (const Choice& c : choices) {
      const fire::TcArgs a = TcLayout(p, c.sq, c.ex, c.chunk);
      const int64_t bytes = TcSmemBytes(a);
      if (bytes <= dev.smem_optin) {
        plan.kernel = FireAlgorithm::kTensorCore;
        plan.why = "bf16/fp16 with channel counts multiple of 8";
        plan.smem_bytes = bytes;
        plan.squeeze_weights_resident = c.sq;
        plan.expand_weights_resident = c.ex;
        plan.expand_chunk = c.chunk;
        return plan;
      }
    }
    tc_reason = "tensor-core fire kernel's tiles do not fit in this GPU's shared memory";
  }
  if (algorithm == FireAlgorithm::kTensorCore) {
    plan.unsupported = tc_reason;
    return plan;
  }
  plan.kernel = FireAlgorithm::kFma;
  plan.why = tc_reason;
  return plan;
}

namespace {

template <typename T, int SK>
cudaError_t LaunchTc(const FireParams& p, const FireBuffers<T>& b, const FirePlan& plan,
                     cudaStream_t stream) {
  const fire::TcArgs a = TcLayout(p, plan.squeeze_weights_resident,
                                  plan.expand_weights_resident, plan.expand_chunk);
  DeviceInfo dev;
  cudaError_t status = CurrentDeviceInfo(&dev);
  if (status != cudaSuccess) return status;
  auto kernel = fire::fire_tc_kernel<T, SK>;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(plan.smem_bytes));
  if (status != cudaSuccess) return status;
  const int grid = std::max(1, std::min(a.num_tiles, dev.sm_count));
  kernel<<<grid, fire::kThreads, plan.smem_bytes, stream>>>(a, b.x, b.w_sq, b.b_sq, b.w_e1,
                                                            b.b_e1, b.w_e3, b.b_e3, b.y);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchFma(const FireParams& p, const FireBuffers<T>& b, cudaStream_t stream) {
  fire::FmaArgs a{};
  a.N = static_cast<int>(p.N), a.H = static_cast<int>(p.H), a.W = static_cast<int>(p.W);
  a.C = static_cast<int>(p.C), a.S = static_cast<int>(p.S);
  a.E1 = static_cast<int>(p.E1), a.E3 = static_cast<int>(p.E3);
  a.tiles_h = static_cast<int>(CeilDiv(p.H, fire::kFmaTile));
  a.tiles_w = static_cast<int>(CeilDiv(p.W, fire::kFmaTile));
  const int64_t blocks = p.N * a.tiles_h * a.tiles_w;
  const size_t smem = static_cast<size_t>(p.S) * fire::kFmaHalo * fire::kFmaHalo * sizeof(float);
  auto kernel = fire::fire_fma_kernel<T>;
  if (smem > 48 * 1024) {
    const cudaError_t status = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (status != cudaSuccess) return status;
  }
  kernel<<<static_cast<unsigned>(blocks), fire::kThreads, smem, stream>>>(
      a, b.x, b.w_sq, b.b_sq, b.w_e1, b.b_e1, b.w_e3, b.b_e3, b.y);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t launch_fire(const FireParams& p, const FireBuffers<T>& b, FireAlgorithm algorithm,
                        cudaStream_t stream) {
  if (fire_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  // Nothing to write. (S == 0 with outputs: y = relu(bias), still launched.)
  if (p.N == 0 || p.H == 0 || p.W == 0 || p.E1 + p.E3 == 0) return cudaSuccess;
  const FirePlan plan = plan_fire(p, b, algorithm);
  if (plan.unsupported != nullptr) return cudaErrorInvalidValue;
  if (plan.kernel == FireAlgorithm::kFma) return LaunchFma(p, b, stream);
  if constexpr (std::is_same_v<T, float>) {
    return cudaErrorInvalidValue;  // plan_fire never picks tensor cores for fp32
  } else {
    switch (SqueezeK(p.S)) {
      case 16: return LaunchTc<T, 16>(p, b, plan, stream);
      case 32: return LaunchTc<T, 32>(p, b, plan, stream);
      case 48: return LaunchTc<T, 48>(p, b, plan, stream);
      case 64: return LaunchTc<T, 64>(p, b, plan, stream);
      default: return LaunchFma(p, b, stream);  // S == 0: no squeeze channels
    }
  }
}

template FirePlan plan_fire<float>(const FireParams&, const FireBuffers<float>&, FireAlgorithm);
template FirePlan plan_fire<__nv_bfloat16>(const FireParams&, const FireBuffers<__nv_bfloat16>&,
                                           FireAlgorithm);
template FirePlan plan_fire<__half>(const FireParams&, const FireBuffers<__half>&, FireAlgorithm);
template cudaError_t launch_fire<float>(const FireParams&, const FireBuffers<float>&,
                                        FireAlgorithm, cudaStream_t);
template cudaError_t launch_fire<__nv_bfloat16>(const FireParams&,
                                                const FireBuffers<__nv_bfloat16>&, FireAlgorithm,
                                                cudaStream_t);
template cudaError_t launch_fire<__half>(const FireParams&, const FireBuffers<__half>&,
                                         FireAlgorithm, cudaStream_t);

}  // namespace jaxcnn
