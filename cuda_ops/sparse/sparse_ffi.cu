// XLA FFI handler of the zero-skipping conv (+ fused ReLU/max-pool): decode, validate,
// launch, report. The kernels' scratch (the walk kernel's nonzero bitmasks, the tile kernel's
// split partial sums) is the call's second result, sized by jaxcnn_sparse_conv_scratch_bytes:
// XLA allocates it, the handler allocates nothing and is CUDA-graph safe.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/ffi_common.h"
#include "sparse/sparse_conv.h"

namespace jaxcnn {
namespace {

ffi::Error Invalid(const std::string& message) {
  return InvalidArgumentFor("sparse_conv2d", message);
}

ffi::Error SparseConv2dFwd(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w,
                           ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> y,
                           ffi::Result<ffi::AnyBuffer> scratch, int64_t stride_h,
                           int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                           int64_t dilation_w, int64_t activation, int64_t pool_window_h,
                           int64_t pool_window_w, int64_t pool_stride_h, int64_t pool_stride_w,
                           int64_t pool_pad_h, int64_t pool_pad_w,
                           int64_t conv_out_h, int64_t conv_out_w) {
  const auto x_dims = x.dimensions();
  const auto w_dims = w.dimensions();
  const auto y_dims = y->dimensions();
  if (x_dims.size() != 4) return Invalid("x must be rank 4 (NHWC), got " + DimsToString(x_dims));
  if (w_dims.size() != 4) return Invalid("w must be rank 4 (HWIO), got " + DimsToString(w_dims));
  if (y_dims.size() != 4) return Invalid("y must be rank 4 (NHWC), got " + DimsToString(y_dims));
  const ffi::DataType dtype = x.element_type();
  if (!IsSupportedFloatType(dtype)) return Invalid("x dtype must be float32, bfloat16 or float16");
  if (w.element_type() != dtype || bias.element_type() != dtype || y->element_type() != dtype)
    return Invalid("w, bias and y dtypes must equal x dtype");

  SparseConvParams p;
  p.N = x_dims[0], p.H = x_dims[1], p.W = x_dims[2], p.C = x_dims[3];
  p.R = w_dims[0], p.S = w_dims[1], p.K = w_dims[3];
  if (w_dims[2] != p.C)
    return Invalid("w input channels (" + std::to_string(w_dims[2]) + ") must equal x channels (" +
                   std::to_string(p.C) + ")");
  if (bias.dimensions().size() != 1 || bias.dimensions()[0] != p.K)
    return Invalid("bias must have shape [" + std::to_string(p.K) + "], got " +
                   DimsToString(bias.dimensions()));
  p.stride_h = stride_h, p.stride_w = stride_w, p.pad_h = pad_h, p.pad_w = pad_w;
  p.dilation_h = dilation_h, p.dilation_w = dilation_w, p.activation = activation;
  p.elem_bytes = dtype == ffi::DataType::F32 ? 4 : 2;
  if (stride_h < 1 || stride_w < 1 || dilation_h < 1 || dilation_w < 1)
    return Invalid("stride and dilation must be >= 1");
  p.pool_h = pool_window_h, p.pool_w = pool_window_w;
  p.pool_stride_h = pool_stride_h, p.pool_stride_w = pool_stride_w;
  p.pool_pad_h = pool_pad_h, p.pool_pad_w = pool_pad_w;
  // The conv output size is an attribute: with a pool it is no result's shape. The high
  // paddings are implied by it (the kernel bounds-checks every input tap).
  p.P = conv_out_h, p.Q = conv_out_w;
  if (p.pooled()) {
    p.PP = y_dims[1], p.PQ = y_dims[2];
  } else if (y_dims[1] != p.P || y_dims[2] != p.Q) {
    return Invalid("y must have the conv output size [" + std::to_string(p.P) + ", " +
                   std::to_string(p.Q) + "] in dims 1, 2, got " + DimsToString(y_dims));
  }
  if (y_dims[0] != p.N || y_dims[3] != p.K)
    return Invalid("y must have batch " + std::to_string(p.N) + " and " + std::to_string(p.K) +
                   " channels, got " + DimsToString(y_dims));
  if (const char* reason = sparse_conv_unsupported_reason(p))
    return Invalid(std::string("unsupported: ") + reason + " (x " + DimsToString(x_dims) +
                   ", w " + DimsToString(w_dims) + ")");
  const int64_t scratch_bytes = static_cast<int64_t>(scratch->size_bytes());
  if (const char* reason = plan_sparse_conv(p, scratch_bytes).unsupported)
    return Invalid(std::string(reason) + " (scratch " + std::to_string(scratch_bytes) +
                   " bytes, the plan uses " + std::to_string(sparse_conv_scratch_bytes(p)) + ")");
  return DispatchFloatType(dtype, "sparse_conv2d", [&](auto traits) -> ffi::Error {
    using T = typename decltype(traits)::type;
    JAXCNN_RETURN_IF_CUDA_ERROR(
        launch_sparse_conv<T>(p, static_cast<const T*>(x.untyped_data()),
                              static_cast<const T*>(w.untyped_data()),
                              static_cast<const T*>(bias.untyped_data()),
                              static_cast<T*>(y->untyped_data()),
                              scratch->untyped_data(), scratch_bytes, stream),
        "sparse_conv2d launch");
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jaxcnn

JAXCNN_FFI_HANDLER(JaxcnnSparseConv2dFwd, jaxcnn::SparseConv2dFwd,
                   // x [N, H, W, C], w [R, S, C, K], bias [K] -> y [N, P, Q, K] or [N, PP, PQ, K], scratch u8
                   jaxcnn::Int64Attrs(jaxcnn::BindBuffers<3, 2>(), "stride_h", "stride_w", "pad_h", "pad_w",
                                      "dilation_h", "dilation_w", "activation", "pool_window_h", "pool_window_w",
                                      "pool_stride_h", "pool_stride_w", "pool_pad_h", "pool_pad_w", "conv_out_h",
                                      "conv_out_w"));

namespace {

constexpr int64_t kParamFields = 25;

// SparseConvParams from the flat array the Python side passes (SparseConvParams field order).
jaxcnn::SparseConvParams ParamsFromArray(const int64_t* params) {
  jaxcnn::SparseConvParams p;
  int64_t* fields[kParamFields] = {&p.N, &p.H, &p.W, &p.C, &p.R, &p.S, &p.K, &p.P, &p.Q,
                                   &p.stride_h, &p.stride_w, &p.pad_h, &p.pad_w, &p.dilation_h,
                                   &p.dilation_w, &p.activation, &p.pool_h, &p.pool_w,
                                   &p.pool_stride_h, &p.pool_stride_w, &p.pool_pad_h,
                                   &p.pool_pad_w, &p.PP, &p.PQ, &p.elem_bytes};
  for (int64_t i = 0; i < kParamFields; ++i) *fields[i] = params[i];
  return p;
}

}  // namespace

// The plan the handler will launch for these params on the current device, as one line
// ("kernel=tile tile=4x8 k_per_lane=4 warps=2x4 region=8x32 chunk=16 splits=1 grid=14x2
// smem=206848 scratch=0" or
// "kernel=walk k_per_lane=4 pixels_per_warp=8 taps_per_stage=3 grid=98x4 smem=49152
// scratch=..."), for benchmarks. Returns the text's length (truncated to out_len - 1), or -1
// when the params cannot run (out then holds the reason).
extern "C" JAXCNN_EXPORT int64_t jaxcnn_sparse_conv_plan(const int64_t* params, int64_t count,
                                                         char* out, int64_t out_len) {
  std::string text;
  int64_t rc = 0;
  if (count != kParamFields) {
    text = "expected " + std::to_string(kParamFields) + " params";
    rc = -1;
  } else {
    const jaxcnn::SparseConvPlan plan = jaxcnn::plan_sparse_conv(ParamsFromArray(params));
    const std::string grid = " grid=" + std::to_string(plan.grid_x) + "x" + std::to_string(plan.grid_y);
    if (plan.unsupported != nullptr) {
      text = plan.unsupported;
      rc = -1;
    } else if (plan.kernel == jaxcnn::SparseKernel::kTile) {
      text = "kernel=tile tile=" + std::to_string(plan.tile_h) + "x" + std::to_string(plan.tile_w) +
             " k_per_lane=" + std::to_string(plan.k_per_lane) + " warps=" +
             std::to_string(plan.warps_y) + "x" + std::to_string(plan.warps_x) + " region=" +
             std::to_string(plan.region_h) + "x" + std::to_string(plan.region_w) + " chunk=" +
             std::to_string(plan.chunk_channels) + " splits=" + std::to_string(plan.splits) +
             grid + " smem=" + std::to_string(plan.smem_bytes) +
             " scratch=" + std::to_string(plan.scratch_bytes);
    } else {
      text = "kernel=walk k_per_lane=" + std::to_string(plan.k_per_lane) +
             " pixels_per_warp=" + std::to_string(plan.pixels_per_warp) +
             " taps_per_stage=" + std::to_string(plan.taps_per_stage) + grid +
             " smem=" + std::to_string(plan.smem_bytes) +
             " scratch=" + std::to_string(plan.scratch_bytes);
    }
  }
  if (out != nullptr && out_len > 0) {
    const size_t n = std::min<size_t>(text.size(), static_cast<size_t>(out_len - 1));
    std::memcpy(out, text.data(), n);
    out[n] = '\0';
  }
  return rc < 0 ? rc : static_cast<int64_t>(text.size());
}

// Scratch bytes to allocate for these params on the current device (the handler's second
// result), or -1 when the count is wrong. Unsupported params size the walk kernel's masks; the
// handler reports them.
extern "C" JAXCNN_EXPORT int64_t jaxcnn_sparse_conv_scratch_bytes(const int64_t* params, int64_t count) {
  if (count != kParamFields) return -1;
  const jaxcnn::SparseConvParams p = ParamsFromArray(params);
  const jaxcnn::SparseConvPlan plan = jaxcnn::plan_sparse_conv(p);
  return plan.unsupported != nullptr ? jaxcnn::sparse_conv_mask_bytes(p) : plan.scratch_bytes;
}
