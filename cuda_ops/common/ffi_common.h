// Shared glue for the XLA FFI handlers: CUDA error -> ffi::Error, dtype traits,
// and a dtype dispatch helper. Only the stable xla::ffi C++ API (ffi.h) is used.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <string>
#include <type_traits>
#include <utility>

// ffi.h trips nvcc/gcc warnings of its own (switches without a trailing
// return, unused parameters); keep them out of our builds.
#if defined(__NVCC__)
#pragma nv_diagnostic push
#pragma nv_diag_suppress 940
#pragma nv_diag_suppress 2473
#endif
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wreturn-type"
#endif
#include "xla/ffi/api/ffi.h"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#if defined(__NVCC__)
#pragma nv_diagnostic pop
#endif

namespace ffi = xla::ffi;

// Handlers must stay visible even if the library is built with
// -fvisibility=hidden; jax looks them up by name.
#if defined(_WIN32)
#define JAXCNN_EXPORT __declspec(dllexport)
#else
#define JAXCNN_EXPORT __attribute__((visibility("default")))
#endif

namespace jaxcnn {

// "[2, 56, 56, 64]": shapes in error messages.
inline std::string DimsToString(ffi::AnyBuffer::Dimensions dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(dims[i]);
  }
  return out + "]";
}

// InvalidArgument error prefixed with the op, e.g. "jaxcnn: conv2d: ...".
inline ffi::Error InvalidArgumentFor(const char* op, const std::string& message) {
  return ffi::Error::InvalidArgument(std::string("jaxcnn: ") + op + ": " + message);
}

inline ffi::Error CudaErrorToFfi(cudaError_t status, const char* where) {
  if (status == cudaSuccess) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInternal, std::string("jaxcnn: ") + where +
                                                   ": " +
                                                   cudaGetErrorString(status));
}

// ffi::Ffi::Bind() with the CUDA stream context, kArgs AnyBuffer operands and kRets AnyBuffer
// results: the start of most handlers' bindings (each handler names its operands in a comment).
// Bindings cannot be copied or moved by us (their constructors are private): every step
// returns the builder's own prvalue.
template <int kArgs, int kRets, typename Binding>
auto WithBuffers(Binding&& binding) {
  static_assert(kArgs + kRets > 0, "a binding of no buffers is ffi::Ffi::Bind() itself");
  if constexpr (kArgs > 0) {
    if constexpr (kArgs + kRets == 1) {
      return std::move(binding).template Arg<ffi::AnyBuffer>();
    } else {
      return WithBuffers<kArgs - 1, kRets>(std::move(binding).template Arg<ffi::AnyBuffer>());
    }
  } else if constexpr (kRets == 1) {
    return std::move(binding).template Ret<ffi::AnyBuffer>();
  } else {
    return WithBuffers<0, kRets - 1>(std::move(binding).template Ret<ffi::AnyBuffer>());
  }
}
template <int kArgs, int kRets>
auto BindBuffers() {
  return WithBuffers<kArgs, kRets>(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>());
}

// The helper builds exactly the chain it stands for (the binding's type is the handler's
// decoding: arguments, then results, in order).
static_assert(std::is_same_v<decltype(BindBuffers<2, 1>()),
                             decltype(ffi::Ffi::Bind()
                                          .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                          .Arg<ffi::AnyBuffer>()
                                          .Arg<ffi::AnyBuffer>()
                                          .Ret<ffi::AnyBuffer>())>,
              "BindBuffers<2, 1> must be the stream context, two AnyBuffer operands, one AnyBuffer result");

// `binding` followed by one int64 attribute per name, in order.
template <typename Binding, typename... Names>
auto Int64Attrs(Binding&& binding, const char* name, Names... more) {
  if constexpr (sizeof...(more) == 0) {
    return std::move(binding).template Attr<int64_t>(name);
  } else {
    return Int64Attrs(std::move(binding).template Attr<int64_t>(name), more...);
  }
}

// Defines the exported XLA FFI handler `symbol` (jax looks it up by name: default visibility
// even in -fvisibility=hidden builds) binding `impl` as the ffi::Ffi::Bind() chain that
// follows. Every handler is command-buffer (CUDA graph) compatible: it only launches kernels on
// the stream XLA gives it (JAXCNN_COMMAND_BUFFERS=0 registers them without the trait).
#define JAXCNN_FFI_HANDLER(symbol, impl, ...)                            \
  extern "C" JAXCNN_EXPORT XLA_FFI_Error* symbol(XLA_FFI_CallFrame*);   \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(symbol, impl, __VA_ARGS__, {ffi::Traits::kCmdBufferCompatible})

// Returns an ffi::Error from the enclosing handler if `expr` is not cudaSuccess.
#define JAXCNN_RETURN_IF_CUDA_ERROR(expr, where)                   \
  do {                                                             \
    const cudaError_t jaxcnn_cuda_status_ = (expr);                \
    if (jaxcnn_cuda_status_ != cudaSuccess)                        \
      return ::jaxcnn::CudaErrorToFfi(jaxcnn_cuda_status_, where); \
  } while (0)

// Maps a floating ffi::DataType to its CUDA storage type (conversions: float_convert.cuh).
template <ffi::DataType dtype>
struct DTypeTraits;

template <>
struct DTypeTraits<ffi::DataType::F32> {
  using type = float;
  static constexpr const char* kName = "float32";
};

template <>
struct DTypeTraits<ffi::DataType::BF16> {
  using type = __nv_bfloat16;
  static constexpr const char* kName = "bfloat16";
};

template <>
struct DTypeTraits<ffi::DataType::F16> {
  using type = __half;
  static constexpr const char* kName = "float16";
};

inline bool IsSupportedFloatType(ffi::DataType dtype) {
  return dtype == ffi::DataType::F32 || dtype == ffi::DataType::BF16 ||
         dtype == ffi::DataType::F16;
}

// Calls fn(DTypeTraits<dtype>{}) for F32/BF16/F16; fn returns ffi::Error.
// Usage: DispatchFloatType(dt, "conv2d", [&](auto traits) {
//          using T = typename decltype(traits)::type; ... });
template <typename Fn>
ffi::Error DispatchFloatType(ffi::DataType dtype, const char* op_name, Fn&& fn) {
  switch (dtype) {
    case ffi::DataType::F32:
      return std::forward<Fn>(fn)(DTypeTraits<ffi::DataType::F32>{});
    case ffi::DataType::BF16:
      return std::forward<Fn>(fn)(DTypeTraits<ffi::DataType::BF16>{});
    case ffi::DataType::F16:
      return std::forward<Fn>(fn)(DTypeTraits<ffi::DataType::F16>{});
    default:
      return ffi::Error::InvalidArgument(
          std::string("jaxcnn: ") + op_name +
          ": unsupported dtype (expected float32, bfloat16 or float16)");
  }
}

}  // namespace jaxcnn
