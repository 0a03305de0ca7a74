// XLA FFI handler for the layout transform: decode, validate, launch.
#include <cstdint>
#include <string>

#include "common/ffi_common.h"
#include "layout/layout_transform.h"

namespace jaxcnn {
namespace {

const char* LayoutName(int64_t code) {
  switch (code) {
    case 0: return "NHWC";
    case 1: return "NCHW";
    case 2: return "CHWN";
  }
  return "?";
}

ffi::Error Invalid(const std::string& message) {
  return InvalidArgumentFor("layout_transform", message);
}

ffi::Error LayoutTransformImpl(cudaStream_t stream, ffi::AnyBuffer x,
                               ffi::Result<ffi::AnyBuffer> y,
                               int64_t src_layout, int64_t dst_layout) {
  if (!is_valid_layout(src_layout))
    return Invalid("src_layout must be 0 (NHWC), 1 (NCHW) or 2 (CHWN), got " +
                   std::to_string(src_layout));
  if (!is_valid_layout(dst_layout))
    return Invalid("dst_layout must be 0 (NHWC), 1 (NCHW) or 2 (CHWN), got " +
                   std::to_string(dst_layout));
  const auto x_dims = x.dimensions();
  const auto y_dims = y->dimensions();
  if (x_dims.size() != 4)
    return Invalid(std::string("x must be rank 4 (") + LayoutName(src_layout) +
                   "), got shape " + DimsToString(x_dims));
  if (y->element_type() != x.element_type())
    return Invalid("output y dtype must equal x dtype");
  const size_t element_bytes = ffi::ByteWidth(x.element_type());

  const auto src = static_cast<TensorLayout>(src_layout);
  const auto dst = static_cast<TensorLayout>(dst_layout);
  // Logical N, C, H, W from x's shape in the source layout.
  int64_t N, C, H, W;
  switch (src) {
    case TensorLayout::kNHWC: N = x_dims[0]; H = x_dims[1]; W = x_dims[2]; C = x_dims[3]; break;
    case TensorLayout::kNCHW: N = x_dims[0]; C = x_dims[1]; H = x_dims[2]; W = x_dims[3]; break;
    default: C = x_dims[0]; H = x_dims[1]; W = x_dims[2]; N = x_dims[3]; break;
  }
  int64_t want[4];
  layout_dims(dst, N, C, H, W, want);
  bool shape_ok = y_dims.size() == 4;
  for (int k = 0; shape_ok && k < 4; ++k) shape_ok = y_dims[k] == want[k];
  if (!shape_ok)
    return Invalid(std::string("output y shape ") + DimsToString(y_dims) +
                   " must be x " + DimsToString(x_dims) + " (" +
                   LayoutName(src_layout) + ") in " + LayoutName(dst_layout));
  if (const char* reason =
          layout_transform_unsupported_reason(src, dst, N, C, H, W, element_bytes))
    return Invalid(std::string(reason) + " (x " + DimsToString(x_dims) +
                   ", dtype width " + std::to_string(element_bytes) + " bytes)");

  JAXCNN_RETURN_IF_CUDA_ERROR(
      launch_layout_transform(x.untyped_data(), y->untyped_data(),
                              element_bytes, src, dst, N, C, H, W, stream),
      "layout_transform launch");
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxcnn

// Graph-safe: a kernel launch or a device-to-device cudaMemcpyAsync on the given stream,
// nothing else.
JAXCNN_FFI_HANDLER(JaxcnnLayoutTransform, jaxcnn::LayoutTransformImpl,
                   jaxcnn::Int64Attrs(jaxcnn::BindBuffers<1, 1>(),  // x in src layout -> y in dst layout
                                      "src_layout", "dst_layout"));
