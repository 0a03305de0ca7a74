// XLA FFI handler for softmax / log-softmax over the last axis: decode, validate, launch.
#include <cstdint>
#include <string>

#include "common/ffi_common.h"
#include "softmax/softmax.h"

namespace jaxcnn {
namespace {

ffi::Error Invalid(const std::string& message) {
  return InvalidArgumentFor("softmax", message);
}

ffi::Error SoftmaxFwd(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                      int64_t log) {
  const auto x_dims = x.dimensions();
  const auto y_dims = y->dimensions();
  if (x_dims.size() < 1) return Invalid("x must have rank >= 1");
  if (y_dims.size() != x_dims.size()) return Invalid("output y must have x's rank");
  for (size_t i = 0; i < x_dims.size(); ++i)
    if (x_dims[i] != y_dims[i]) return Invalid("output y shape must equal x shape");
  const ffi::DataType dtype = x.element_type();
  if (!IsSupportedFloatType(dtype))
    return Invalid("x dtype must be float32, bfloat16 or float16");
  if (y->element_type() != dtype) return Invalid("output y dtype must equal x dtype");
  if (log != 0 && log != 1) return Invalid("log must be 0 or 1, got " + std::to_string(log));

  SoftmaxParams params;
  params.cols = x_dims.back();
  params.rows = 1;
  for (size_t i = 0; i + 1 < x_dims.size(); ++i) params.rows *= x_dims[i];
  if (params.cols == 0) params.rows = 0;  // empty: nothing to write (and no 0 * overflow)
  params.log = log == 1;
  if (const char* reason = softmax_unsupported_reason(params))
    return Invalid(std::string("unsupported shape: ") + reason);

  return DispatchFloatType(dtype, "softmax", [&](auto traits) -> ffi::Error {
    using T = typename decltype(traits)::type;
    JAXCNN_RETURN_IF_CUDA_ERROR(
        launch_softmax<T>(static_cast<const T*>(x.untyped_data()),
                          static_cast<T*>(y->untyped_data()), params, stream),
        "softmax launch");
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jaxcnn

JAXCNN_FFI_HANDLER(JaxcnnSoftmaxFwd, jaxcnn::SoftmaxFwd,
                   jaxcnn::Int64Attrs(jaxcnn::BindBuffers<1, 1>(), "log"));  // x [..., cols] -> y, same shape
