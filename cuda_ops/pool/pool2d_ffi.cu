// XLA FFI handlers for 2-D max/avg pooling: decode, validate, launch, report.
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "common/ffi_common.h"
#include "pool/pool2d.h"

namespace jaxcnn {
namespace {

bool FitsInt(int64_t v) {
  return v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max();
}

// Logical (N, H, W, C) positions of each layout's dims.
struct AxisMap {
  int n, h, w, c;
};

bool LayoutAxes(int64_t layout, AxisMap* axes) {
  switch (layout) {
    case static_cast<int64_t>(TensorLayout::kNHWC):
      *axes = {0, 1, 2, 3};
      return true;
    case static_cast<int64_t>(TensorLayout::kNCHW):
      *axes = {0, 2, 3, 1};
      return true;
    case static_cast<int64_t>(TensorLayout::kCHWN):
      *axes = {3, 1, 2, 0};
      return true;
    default:
      return false;
  }
}

ffi::Error Pool2dImpl(const char* op, PoolMode mode, cudaStream_t stream,
                      const ffi::AnyBuffer& x, ffi::AnyBuffer& y, int64_t layout,
                      int64_t window_h, int64_t window_w, int64_t stride_h,
                      int64_t stride_w, int64_t pad_top, int64_t pad_bottom,
                      int64_t pad_left, int64_t pad_right, int64_t count_include_pad) {
  auto invalid = [op](const std::string& message) { return InvalidArgumentFor(op, message); };
  const auto x_dims = x.dimensions();
  const auto y_dims = y.dimensions();
  AxisMap ax;
  if (!LayoutAxes(layout, &ax))
    return invalid("layout must be 0 (NHWC), 1 (NCHW) or 2 (CHWN), got " +
                   std::to_string(layout));
  if (x_dims.size() != 4) return invalid("x must be rank 4, got shape " + DimsToString(x_dims));
  if (y_dims.size() != 4)
    return invalid("output y must be rank 4, got shape " + DimsToString(y_dims));
  const ffi::DataType dtype = x.element_type();
  if (!IsSupportedFloatType(dtype))
    return invalid("x dtype must be float32, bfloat16 or float16");
  if (y.element_type() != dtype) return invalid("output y dtype must equal x dtype");
  if (window_h < 1 || window_w < 1 || !FitsInt(window_h) || !FitsInt(window_w))
    return invalid("window must be >= 1, got (" + std::to_string(window_h) + ", " +
                   std::to_string(window_w) + ")");
  if (stride_h < 1 || stride_w < 1 || !FitsInt(stride_h) || !FitsInt(stride_w))
    return invalid("stride must be >= 1, got (" + std::to_string(stride_h) + ", " +
                   std::to_string(stride_w) + ")");
  if (pad_top < 0 || pad_bottom < 0 || pad_left < 0 || pad_right < 0 || !FitsInt(pad_top) ||
      !FitsInt(pad_bottom) || !FitsInt(pad_left) || !FitsInt(pad_right))
    return invalid("pads must be >= 0 and fit int32");
  if (count_include_pad != 0 && count_include_pad != 1)
    return invalid("count_include_pad must be 0 or 1, got " +
                   std::to_string(count_include_pad));

  Pool2dParams params;
  params.N = x_dims[ax.n];
  params.H = x_dims[ax.h];
  params.W = x_dims[ax.w];
  params.C = x_dims[ax.c];
  params.P = y_dims[ax.h];
  params.Q = y_dims[ax.w];
  // The output shape must be the one the pads and window give (as lax.reduce_window).
  const int64_t padded_h = params.H + pad_top + pad_bottom;
  const int64_t padded_w = params.W + pad_left + pad_right;
  const int64_t want_p = padded_h < window_h ? 0 : (padded_h - window_h) / stride_h + 1;
  const int64_t want_q = padded_w < window_w ? 0 : (padded_w - window_w) / stride_w + 1;
  if (y_dims[ax.n] != params.N || y_dims[ax.c] != params.C || params.P != want_p ||
      params.Q != want_q)
    return invalid("output y shape " + DimsToString(y_dims) + " does not match x " +
                   DimsToString(x_dims) + " pooled to (" + std::to_string(want_p) + ", " +
                   std::to_string(want_q) + ")");
  params.window_h = static_cast<int>(window_h);
  params.window_w = static_cast<int>(window_w);
  params.stride_h = static_cast<int>(stride_h);
  params.stride_w = static_cast<int>(stride_w);
  params.pad_top = static_cast<int>(pad_top);
  params.pad_left = static_cast<int>(pad_left);
  params.mode = mode;
  params.count_include_pad = count_include_pad == 1;
  params.layout = static_cast<TensorLayout>(layout);
  if (const char* reason = pool2d_unsupported_reason(params))
    return invalid(std::string("unsupported shape: ") + reason + " (x " +
                   DimsToString(x_dims) + ", y " + DimsToString(y_dims) + ")");

  return DispatchFloatType(dtype, op, [&](auto traits) -> ffi::Error {
    using T = typename decltype(traits)::type;
    JAXCNN_RETURN_IF_CUDA_ERROR(
        launch_pool2d<T>(static_cast<const T*>(x.untyped_data()),
                         static_cast<T*>(y.untyped_data()), params, stream),
        "pool2d launch");
    return ffi::Error::Success();
  });
}

ffi::Error MaxPool2dFwd(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                        int64_t layout, int64_t window_h, int64_t window_w, int64_t stride_h,
                        int64_t stride_w, int64_t pad_top, int64_t pad_bottom,
                        int64_t pad_left, int64_t pad_right) {
  return Pool2dImpl("max_pool2d", PoolMode::kMax, stream, x, *y, layout, window_h, window_w,
                    stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right, 1);
}

ffi::Error AvgPool2dFwd(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                        int64_t layout, int64_t window_h, int64_t window_w, int64_t stride_h,
                        int64_t stride_w, int64_t pad_top, int64_t pad_bottom,
                        int64_t pad_left, int64_t pad_right, int64_t count_include_pad) {
  return Pool2dImpl("avg_pool2d", PoolMode::kAvg, stream, x, *y, layout, window_h, window_w,
                    stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right,
                    count_include_pad);
}

// The attributes both handlers decode, in the order the implementations take them.
template <typename Binding>
auto WithPoolAttrs(Binding binding) {
  return Int64Attrs(std::move(binding), "layout", "window_h", "window_w", "stride_h", "stride_w", "pad_top",
                    "pad_bottom", "pad_left", "pad_right");
}

}  // namespace
}  // namespace jaxcnn

// Graph-safe: the handlers only launch a kernel on the given stream; no sync, no allocation,
// no device queries.
JAXCNN_FFI_HANDLER(JaxcnnMaxPool2dFwd, jaxcnn::MaxPool2dFwd,
                   jaxcnn::WithPoolAttrs(jaxcnn::BindBuffers<1, 1>()));  // x -> y

JAXCNN_FFI_HANDLER(JaxcnnAvgPool2dFwd, jaxcnn::AvgPool2dFwd,
                   jaxcnn::Int64Attrs(jaxcnn::WithPoolAttrs(jaxcnn::BindBuffers<1, 1>()),  // x -> y
                                      "count_include_pad"));
