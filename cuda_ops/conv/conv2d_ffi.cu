// XLA FFI handlers for conv2d forward: decode, validate, launch, report.
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "common/ffi_common.h"
#include "conv/conv2d_direct.h"

namespace jaxcnn {
namespace {

constexpr const char* kOpName = "conv2d";

std::string DimsToString(ffi::AnyBuffer::Dimensions dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(dims[i]);
  }
  return out + "]";
}

ffi::Error Invalid(const std::string& message) {
  return ffi::Error::InvalidArgument(std::string("jaxcnn: conv2d: ") + message);
}

bool FitsInt(int64_t v) {
  return v >= std::numeric_limits<int>::min() &&
         v <= std::numeric_limits<int>::max();
}

bool IsEmpty(const ffi::AnyBuffer& buffer) {
  for (int64_t d : buffer.dimensions())
    if (d == 0) return true;
  return false;
}

// `bias` is null for the no-bias handler.
ffi::Error Conv2dFwdImpl(cudaStream_t stream, const ffi::AnyBuffer& x,
                         const ffi::AnyBuffer& w, const ffi::AnyBuffer* bias,
                         ffi::AnyBuffer& y, int64_t stride_h, int64_t stride_w,
                         int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                         int64_t dilation_w, int64_t groups,
                         int64_t activation) {
  const auto x_dims = x.dimensions();
  const auto w_dims = w.dimensions();
  const auto y_dims = y.dimensions();
  if (x_dims.size() != 4)
    return Invalid("x must be rank 4 (NHWC), got shape " +
                   DimsToString(x_dims));
  if (w_dims.size() != 4)
    return Invalid("w must be rank 4 (HWIO), got shape " +
                   DimsToString(w_dims));
  if (bias != nullptr && bias->dimensions().size() != 1)
    return Invalid("bias must be rank 1 [K], got shape " +
                   DimsToString(bias->dimensions()));
  if (y_dims.size() != 4)
    return Invalid("output y must be rank 4 (NHWC), got shape " +
                   DimsToString(y_dims));

  const ffi::DataType dtype = x.element_type();
  if (!IsSupportedFloatType(dtype))
    return Invalid("x dtype must be float32, bfloat16 or float16");
  if (w.element_type() != dtype) return Invalid("w dtype must equal x dtype");
  if (bias != nullptr && bias->element_type() != dtype)
    return Invalid("bias dtype must equal x dtype");
  if (y.element_type() != dtype)
    return Invalid("output y dtype must equal x dtype");

  if (stride_h < 1 || stride_w < 1 || !FitsInt(stride_h) || !FitsInt(stride_w))
    return Invalid("stride_h/stride_w must be >= 1, got (" +
                   std::to_string(stride_h) + ", " + std::to_string(stride_w) +
                   ")");
  if (dilation_h < 1 || dilation_w < 1 || !FitsInt(dilation_h) ||
      !FitsInt(dilation_w))
    return Invalid("dilation_h/dilation_w must be >= 1, got (" +
                   std::to_string(dilation_h) + ", " +
                   std::to_string(dilation_w) + ")");
  if (pad_h < 0 || pad_w < 0 || !FitsInt(pad_h) || !FitsInt(pad_w))
    return Invalid("pad_h/pad_w must be >= 0, got (" + std::to_string(pad_h) +
                   ", " + std::to_string(pad_w) + ")");
  if (groups < 1 || !FitsInt(groups))
    return Invalid("groups must be >= 1, got " + std::to_string(groups));
  if (activation != 0 && activation != 1)
    return Invalid("activation must be 0 (none) or 1 (relu), got " +
                   std::to_string(activation));

  const int64_t N = x_dims[0], H = x_dims[1], W = x_dims[2], C = x_dims[3];
  const int64_t R = w_dims[0], S = w_dims[1], w_in = w_dims[2], K = w_dims[3];
  const int64_t P = y_dims[1], Q = y_dims[2];
  if (C % groups != 0)
    return Invalid("input channels C=" + std::to_string(C) +
                   " not divisible by groups=" + std::to_string(groups));
  if (w_in * groups != C)
    return Invalid("w dim 2 (" + std::to_string(w_in) + ") * groups (" +
                   std::to_string(groups) + ") must equal input channels C=" +
                   std::to_string(C));
  if (K % groups != 0)
    return Invalid("output channels K=" + std::to_string(K) +
                   " not divisible by groups=" + std::to_string(groups));
  if (bias != nullptr && bias->dimensions()[0] != K)
    return Invalid("bias length " + std::to_string(bias->dimensions()[0]) +
                   " must equal output channels K=" + std::to_string(K));
  if (y_dims[0] != N)
    return Invalid("output y batch " + std::to_string(y_dims[0]) +
                   " must equal x batch " + std::to_string(N));
  if (y_dims[3] != K)
    return Invalid("output y channels " + std::to_string(y_dims[3]) +
                   " must equal w output channels K=" + std::to_string(K));

  // Nothing to write. A non-empty y with an empty x or window still launches:
  // the result is then bias (+ReLU), as in lax.
  if (IsEmpty(y)) return ffi::Error::Success();
  if (P < 1 || Q < 1)
    return Invalid("output spatial dims P, Q must be >= 1, got shape " +
                   DimsToString(y_dims));

  Conv2dParams params;
  params.N = N;
  params.H = H;
  params.W = W;
  params.C = C;
  params.R = R;
  params.S = S;
  params.K = K;
  params.P = P;
  params.Q = Q;
  params.stride_h = static_cast<int>(stride_h);
  params.stride_w = static_cast<int>(stride_w);
  params.pad_h = static_cast<int>(pad_h);
  params.pad_w = static_cast<int>(pad_w);
  params.dil_h = static_cast<int>(dilation_h);
  params.dil_w = static_cast<int>(dilation_w);
  params.groups = static_cast<int>(groups);
  params.relu = activation == 1;
  if (const char* reason = conv2d_direct_unsupported_reason(params))
    return Invalid(std::string("unsupported shape: ") + reason +
                   " (x " + DimsToString(x_dims) + ", w " +
                   DimsToString(w_dims) + ", y " + DimsToString(y_dims) + ")");

  return DispatchFloatType(dtype, kOpName, [&](auto traits) -> ffi::Error {
    using T = typename decltype(traits)::type;
    const T* bias_data =
        bias != nullptr ? static_cast<const T*>(bias->untyped_data()) : nullptr;
    // The launcher returns cudaGetLastError() after the launch.
    JAXCNN_RETURN_IF_CUDA_ERROR(
        launch_conv2d_direct<T>(static_cast<const T*>(x.untyped_data()),
                                static_cast<const T*>(w.untyped_data()),
                                bias_data, static_cast<T*>(y.untyped_data()),
                                params, stream),
        "conv2d_fwd launch");
    return ffi::Error::Success();
  });
}

ffi::Error Conv2dFwdWithBias(cudaStream_t stream, ffi::AnyBuffer x,
                             ffi::AnyBuffer w, ffi::AnyBuffer bias,
                             ffi::Result<ffi::AnyBuffer> y, int64_t stride_h,
                             int64_t stride_w, int64_t pad_h, int64_t pad_w,
                             int64_t dilation_h, int64_t dilation_w,
                             int64_t groups, int64_t activation) {
  return Conv2dFwdImpl(stream, x, w, &bias, *y, stride_h, stride_w, pad_h,
                       pad_w, dilation_h, dilation_w, groups, activation);
}

ffi::Error Conv2dFwdNoBias(cudaStream_t stream, ffi::AnyBuffer x,
                           ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> y,
                           int64_t stride_h, int64_t stride_w, int64_t pad_h,
                           int64_t pad_w, int64_t dilation_h,
                           int64_t dilation_w, int64_t groups,
                           int64_t activation) {
  return Conv2dFwdImpl(stream, x, w, nullptr, *y, stride_h, stride_w, pad_h,
                       pad_w, dilation_h, dilation_w, groups, activation);
}

}  // namespace
}  // namespace jaxcnn

// Re-declared with default visibility so -fvisibility=hidden builds export them.
extern "C" JAXCNN_EXPORT XLA_FFI_Error* JaxcnnConv2dFwd(XLA_FFI_CallFrame*);
extern "C" JAXCNN_EXPORT XLA_FFI_Error* JaxcnnConv2dFwdNoBias(
    XLA_FFI_CallFrame*);

// Command-buffer (CUDA graph) compatible: the handler only launches a kernel
// on the given stream; no sync, no allocation, no device queries.
namespace jaxcnn {
// The conv attributes both handlers decode, in the order the implementations take them.
template <typename Binding>
auto WithConvAttrs(Binding binding) {
  return std::move(binding).template Attr<int64_t>("stride_h")
      .template Attr<int64_t>("stride_w")
      .template Attr<int64_t>("pad_h")
      .template Attr<int64_t>("pad_w")
      .template Attr<int64_t>("dilation_h")
      .template Attr<int64_t>("dilation_w")
      .template Attr<int64_t>("groups")
      .template Attr<int64_t>("activation");
}
}  // namespace jaxcnn

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcnnConv2dFwd, jaxcnn::Conv2dFwdWithBias,
                              jaxcnn::WithConvAttrs(ffi::Ffi::Bind()
                                                        .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                                        .Arg<ffi::AnyBuffer>()  // x [N,H,W,C]
                                                        .Arg<ffi::AnyBuffer>()  // w [R,S,C/G,K]
                                                        .Arg<ffi::AnyBuffer>()  // bias [K]
                                                        .Ret<ffi::AnyBuffer>()),  // y [N,P,Q,K]
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcnnConv2dFwdNoBias, jaxcnn::Conv2dFwdNoBias,
                              jaxcnn::WithConvAttrs(ffi::Ffi::Bind()
                                                        .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                                        .Arg<ffi::AnyBuffer>()  // x [N,H,W,C]
                                                        .Arg<ffi::AnyBuffer>()  // w [R,S,C/G,K]
                                                        .Ret<ffi::AnyBuffer>()),  // y [N,P,Q,K]
                              {ffi::Traits::kCmdBufferCompatible});
