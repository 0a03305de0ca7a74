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

// The device attributes the launchers' plans read: the current device's (CurrentDeviceLimits)
// or a described GPU's (jaxcnn_fire_plan_for_device: the cost model plans for a GPU it does not
// run on).
struct DeviceLimits {
  int sm_count = 0;
  int smem_optin = 0;   // cudaDevAttrMaxSharedMemoryPerBlockOptin
  int smem_per_sm = 0;  // cudaDevAttrMaxSharedMemoryPerMultiprocessor
  int major = 0;        // compute capability major
  int cooperative = 0;  // cudaDevAttrCooperativeLaunch
};

// The current device's DeviceLimits (each attribute cached).
inline cudaError_t CurrentDeviceLimits(DeviceLimits* info) {
  cudaError_t status;
  if ((status = CurrentDeviceAttribute<cudaDevAttrMultiProcessorCount>(&info->sm_count)) !=
          cudaSuccess ||
      (status = CurrentDeviceAttribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(
           &info->smem_optin)) != cudaSuccess ||
      (status = CurrentDeviceAttribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>(
           &info->smem_per_sm)) != cudaSuccess)
    return status;
  if ((status = CurrentDeviceAttribute<cudaDevAttrComputeCapabilityMajor>(&info->major)) !=
      cudaSuccess)
    return status;
  return CurrentDeviceAttribute<cudaDevAttrCooperativeLaunch>(&info->cooperative);
}

// The device checks a Hopper wgmma/TMA kernel makes last, on `dev`: `not_hopper` unless it is
// sm_90, `no_smem` unless it has `smem_bytes` of opt-in shared memory per block, else nullptr.
inline const char* HopperDeviceUnsupportedReason(const DeviceLimits& dev, int64_t smem_bytes,
                                                 const char* not_hopper, const char* no_smem) {
  if (dev.major != 9) return not_hopper;
  if (dev.smem_optin < smem_bytes) return no_smem;
  return nullptr;
}

// The same checks on the current device (a failed query counts as failing its check).
inline const char* HopperDeviceUnsupportedReason(int64_t smem_bytes, const char* not_hopper,
                                                 const char* no_smem) {
  DeviceLimits dev;
  if (CurrentDeviceAttribute<cudaDevAttrComputeCapabilityMajor>(&dev.major) != cudaSuccess)
    return not_hopper;
  if (dev.major == 9 &&
      CurrentDeviceAttribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(&dev.smem_optin) !=
          cudaSuccess)
    return no_smem;
  return HopperDeviceUnsupportedReason(dev, smem_bytes, not_hopper, no_smem);
}

}  // namespace jaxcnn
