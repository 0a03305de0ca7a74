// Build/ABI facts the Python side can query through ctypes before registering
// handlers (e.g. to refuse a library built against a different FFI major).
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <string>

#include "xla/ffi/api/c_api.h"

#if defined(_WIN32)
#define JAXCNN_INFO_EXPORT __declspec(dllexport)
#else
#define JAXCNN_INFO_EXPORT __attribute__((visibility("default")))
#endif

#define JAXCNN_STRINGIFY_IMPL(x) #x
#define JAXCNN_STRINGIFY(x) JAXCNN_STRINGIFY_IMPL(x)

// The CMake build defines both; a build without them reports "unknown".
#if !defined(JAXCNN_JAXLIB_VERSION)
#define JAXCNN_JAXLIB_VERSION unknown
#endif
#if !defined(JAXCNN_CUDA_ARCHS)
#define JAXCNN_CUDA_ARCHS unknown
#endif

namespace {

// The build may pass the macros quoted or bare; stringify and drop the quotes
// so both spellings give the same text.
std::string UnquoteMacroText(const char* text) {
  std::string out;
  for (const char* p = text; *p != '\0'; ++p) {
    if (*p != '"') out.push_back(*p);
  }
  return out;
}

std::string MakeBuildInfo() {
  std::string info = "cuda_runtime=";
  info += std::to_string(CUDART_VERSION / 1000) + "." +
          std::to_string((CUDART_VERSION % 1000) / 10);
  info += " jaxlib=" + UnquoteMacroText(JAXCNN_STRINGIFY(JAXCNN_JAXLIB_VERSION));
  info += " cuda_archs=" + UnquoteMacroText(JAXCNN_STRINGIFY(JAXCNN_CUDA_ARCHS));
  info += " xla_ffi_api=" + std::to_string(XLA_FFI_API_MAJOR) + "." +
          std::to_string(XLA_FFI_API_MINOR);
  return info;
}

}  // namespace

extern "C" {

JAXCNN_INFO_EXPORT int jaxcnn_ffi_api_version_major() {
  return XLA_FFI_API_MAJOR;
}

JAXCNN_INFO_EXPORT int jaxcnn_ffi_api_version_minor() {
  return XLA_FFI_API_MINOR;
}

JAXCNN_INFO_EXPORT const char* jaxcnn_build_info() {
  static const std::string info = MakeBuildInfo();
  return info.c_str();
}

// -1 instead of aborting: no driver / no device must be reportable from Python.
JAXCNN_INFO_EXPORT int jaxcnn_cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later runtime calls are clean
    return -1;
  }
  return count;
}

// Brackets the calls `ncu --profile-from-start off` measures (scripts/ncu_layer.py), so
// XLA's compile-time autotuning kernels stay out of the counters. 0 on success.
JAXCNN_INFO_EXPORT int jaxcnn_cuda_profiler_start() {
  return static_cast<int>(cudaProfilerStart());
}

JAXCNN_INFO_EXPORT int jaxcnn_cuda_profiler_stop() {
  return static_cast<int>(cudaProfilerStop());
}

}  // extern "C"
