// Per-device attributes queried once: launchers call this on every launch, and a launch must
// stay free of device queries so that XLA can capture it into a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace jaxcnn {

// `kAttr` of the current device (cached per device; every attribute used is > 0, so 0 marks
// "not queried yet").
template <cudaDeviceAttr kAttr>
cudaError_t CurrentDeviceAttribute(int* value) {
  constexpr int kMaxDevices = 64;
  static int cache[kMaxDevices] = {};
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const bool cacheable = device >= 0 && device < kMaxDevices;
  if (cacheable && cache[device] > 0) {
    *value = cache[device];
    return cudaSuccess;
  }
  int queried = 0;
  status = cudaDeviceGetAttribute(&queried, kAttr, device);
  if (status != cudaSuccess) return status;
  if (cacheable) cache[device] = queried;
  *value = queried;
  return cudaSuccess;
}

// The device checks a Hopper wgmma/TMA kernel makes last: `not_hopper` unless the current device
// is sm_90, `no_smem` unless it has `smem_bytes` of opt-in shared memory per block (a failed
// query counts as either), else nullptr.
inline const char* HopperDeviceUnsupportedReason(int64_t smem_bytes, const char* not_hopper,
                                                 const char* no_smem) {
  int major = 0, smem_max = 0;
  if (CurrentDeviceAttribute<cudaDevAttrComputeCapabilityMajor>(&major) != cudaSuccess ||
      major != 9)
    return not_hopper;
  if (CurrentDeviceAttribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(&smem_max) !=
          cudaSuccess ||
      smem_max < smem_bytes)
    return no_smem;
  return nullptr;
}

}  // namespace jaxcnn
