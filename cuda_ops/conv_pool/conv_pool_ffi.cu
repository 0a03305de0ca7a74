// XLA FFI handler for the fused conv + bias + ReLU + max-pool: decode, validate, launch, report.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/ffi_common.h"
#include "conv_pool/conv_pool.h"

namespace jaxcnn {
namespace {

ffi::Error Invalid(const std::string& message) { return InvalidArgumentFor("conv2d_pool", message); }

// Output extent of a (dilated) window sliding over a padded extent.
int64_t OutExtent(int64_t in, int64_t pad_lo, int64_t pad_hi, int64_t window, int64_t stride,
                  int64_t dilation) {
  return (in + pad_lo + pad_hi - dilation * (window - 1) - 1) / stride + 1;
}

ffi::Error ConvPoolFwd(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w,
                       ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> y, int64_t stride_h,
                       int64_t stride_w, int64_t pad_top, int64_t pad_bottom, int64_t pad_left,
                       int64_t pad_right, int64_t dilation_h, int64_t dilation_w,
                       int64_t pool_window_h, int64_t pool_window_w, int64_t pool_stride_h,
                       int64_t pool_stride_w, int64_t pool_pad_top, int64_t pool_pad_left,
                       int64_t precision, int64_t algorithm) {
  if (algorithm < 0 || algorithm > 4)
    return Invalid(
        "algorithm must be 0 (auto), 1 (tensor_core), 2 (direct), 3 (stem) or 4 (wgmma), got " +
        std::to_string(algorithm));
  if (precision < 0 || precision > 1)
    return Invalid("precision must be 0 (default) or 1 (highest), got " +
                   std::to_string(precision));
  for (int64_t v : {stride_h, stride_w, dilation_h, dilation_w, pool_window_h, pool_window_w,
                    pool_stride_h, pool_stride_w})
    if (v < 1 || v > (int64_t{1} << 20))
      return Invalid("strides, dilations and pool windows must be in [1, 2^20]");
  for (int64_t v : {pad_top, pad_bottom, pad_left, pad_right, pool_pad_top, pool_pad_left})
    if (v < 0 || v > (int64_t{1} << 20)) return Invalid("padding must be in [0, 2^20]");
  const auto x_dims = x.dimensions();
  const auto w_dims = w.dimensions();
  const auto y_dims = y->dimensions();
  if (x_dims.size() != 4) return Invalid("x must be rank 4 (NHWC), got shape " + DimsToString(x_dims));
  if (w_dims.size() != 4) return Invalid("w must be rank 4 (HWIO), got shape " + DimsToString(w_dims));
  if (y_dims.size() != 4) return Invalid("y must be rank 4 (NHWC), got shape " + DimsToString(y_dims));
  ConvPoolParams p{};
  p.N = x_dims[0], p.H = x_dims[1], p.W = x_dims[2], p.C = x_dims[3];
  p.R = w_dims[0], p.S = w_dims[1], p.K = w_dims[3];
  if (w_dims[2] != p.C)
    return Invalid("w input channels must equal x channels: w " + DimsToString(w_dims) + ", x " +
                   DimsToString(x_dims));
  if (bias.dimensions().size() != 1 || bias.dimensions()[0] != p.K)
    return Invalid("bias must have shape [" + std::to_string(p.K) + "], got " +
                   DimsToString(bias.dimensions()));
  p.stride_h = static_cast<int>(stride_h), p.stride_w = static_cast<int>(stride_w);
  p.pad_top = static_cast<int>(pad_top), p.pad_left = static_cast<int>(pad_left);
  p.dilation_h = static_cast<int>(dilation_h), p.dilation_w = static_cast<int>(dilation_w);
  p.P = OutExtent(p.H, pad_top, pad_bottom, p.R, stride_h, dilation_h);
  p.Q = OutExtent(p.W, pad_left, pad_right, p.S, stride_w, dilation_w);
  p.pool_h = static_cast<int>(pool_window_h), p.pool_w = static_cast<int>(pool_window_w);
  p.pool_stride_h = static_cast<int>(pool_stride_h);
  p.pool_stride_w = static_cast<int>(pool_stride_w);
  p.pool_pad_top = static_cast<int>(pool_pad_top);
  p.pool_pad_left = static_cast<int>(pool_pad_left);
  p.PH = y_dims[1], p.PW = y_dims[2];
  p.allow_tf32 = precision == 0;  // "default": TF32 like XLA's DEFAULT; "highest": fp32 FMA
  if (y_dims[0] != p.N || y_dims[3] != p.K)
    return Invalid("y must have shape [N, PH, PW, K] = [" + std::to_string(p.N) + ", PH, PW, " +
                   std::to_string(p.K) + "], got " + DimsToString(y_dims));
  const ffi::DataType dtype = x.element_type();
  if (!IsSupportedFloatType(dtype)) return Invalid("x dtype must be float32, bfloat16 or float16");
  if (w.element_type() != dtype || bias.element_type() != dtype || y->element_type() != dtype)
    return Invalid("w, bias and y dtypes must equal x dtype");
  if (const char* reason = conv_pool_unsupported_reason(p))
    return Invalid(std::string("unsupported shape: ") + reason + " (x " + DimsToString(x_dims) +
                   ", w " + DimsToString(w_dims) + ", y " + DimsToString(y_dims) + ")");

  return DispatchFloatType(dtype, "conv2d_pool", [&](auto traits) -> ffi::Error {
    using T = typename decltype(traits)::type;
    const ConvPoolBuffers<T> buffers{static_cast<const T*>(x.untyped_data()),
                                     static_cast<const T*>(w.untyped_data()),
                                     static_cast<const T*>(bias.untyped_data()),
                                     static_cast<T*>(y->untyped_data())};
    const auto algo = static_cast<ConvPoolAlgorithm>(algorithm);
    const ConvPoolPlan plan = plan_conv_pool<T>(p, buffers, algo);
    if (plan.unsupported != nullptr)
      return Invalid(std::string("unsupported by the chosen kernel: ") + plan.unsupported +
                     " (x " + DimsToString(x_dims) + ", w " + DimsToString(w_dims) + ")");
    JAXCNN_RETURN_IF_CUDA_ERROR(launch_conv_pool<T>(p, buffers, algo, stream), "conv2d_pool launch");
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jaxcnn

// Graph-safe: the device's compute capability is queried once per device and cached; the
// handler then only sets the kernel's smem attribute and launches.
JAXCNN_FFI_HANDLER(JaxcnnConv2dPoolFwd, jaxcnn::ConvPoolFwd,
                   jaxcnn::Int64Attrs(jaxcnn::BindBuffers<3, 1>(),  // x, w, bias -> y
                                      "stride_h", "stride_w", "pad_top", "pad_bottom", "pad_left", "pad_right",
                                      "dilation_h", "dilation_w", "pool_window_h", "pool_window_w", "pool_stride_h",
                                      "pool_stride_w", "pool_pad_top", "pool_pad_left", "precision", "algorithm"));

namespace {

template <typename T>
jaxcnn::ConvPoolPlan PlanWithAlignedBuffers(const jaxcnn::ConvPoolParams& p,
                                            jaxcnn::ConvPoolAlgorithm algorithm) {
  // XLA's buffers are 16-byte aligned (what the handler will see); only the addresses'
  // alignment matters to the plan.
  const T* aligned = reinterpret_cast<const T*>(uintptr_t{256});
  const jaxcnn::ConvPoolBuffers<T> buffers{aligned, aligned, aligned, const_cast<T*>(aligned)};
  return jaxcnn::plan_conv_pool<T>(p, buffers, algorithm);
}

}  // namespace

// The configuration the handler will launch on the current device for an NHWC layer, as one
// line of text ("kernel=tensor_core block=8x16 pooled=4x8 block_k=64 grid=25088 smem=59392
// recompute=1.00 flat_k=0"; the stem and wgmma kernels: "kernel=stem block=<conv tile> ...",
// "kernel=wgmma block=16x16 ..."), for benchmarks and logs. precision: 0 default, 1 highest (codes of
// conv_args.PRECISIONS). dims: N, H, W, C, R, S, K; conv: stride_h,
// stride_w, pad_top, pad_bottom, pad_left, pad_right, dilation_h, dilation_w; pool: window_h,
// window_w, stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right. Returns the text's
// length (truncated to out_len - 1), or -1 when nothing can run these params (out: the reason).
extern "C" JAXCNN_EXPORT int64_t jaxcnn_conv_pool_plan(const int64_t* dims, const int64_t* conv,
                                                       const int64_t* pool, int64_t dtype,
                                                       int64_t precision, int64_t algorithm,
                                                       char* out, int64_t out_len) {
  jaxcnn::ConvPoolParams p{};
  p.allow_tf32 = precision == 0;
  p.N = dims[0], p.H = dims[1], p.W = dims[2], p.C = dims[3];
  p.R = dims[4], p.S = dims[5], p.K = dims[6];
  p.stride_h = static_cast<int>(conv[0]), p.stride_w = static_cast<int>(conv[1]);
  p.pad_top = static_cast<int>(conv[2]), p.pad_left = static_cast<int>(conv[4]);
  p.dilation_h = static_cast<int>(conv[6]), p.dilation_w = static_cast<int>(conv[7]);
  p.P = (p.H + conv[2] + conv[3] - conv[6] * (p.R - 1) - 1) / std::max<int64_t>(conv[0], 1) + 1;
  p.Q = (p.W + conv[4] + conv[5] - conv[7] * (p.S - 1) - 1) / std::max<int64_t>(conv[1], 1) + 1;
  p.pool_h = static_cast<int>(pool[0]), p.pool_w = static_cast<int>(pool[1]);
  p.pool_stride_h = static_cast<int>(pool[2]), p.pool_stride_w = static_cast<int>(pool[3]);
  p.pool_pad_top = static_cast<int>(pool[4]), p.pool_pad_left = static_cast<int>(pool[6]);
  p.PH = (p.P + pool[4] + pool[5] - pool[0]) / std::max<int64_t>(pool[2], 1) + 1;
  p.PW = (p.Q + pool[6] + pool[7] - pool[1]) / std::max<int64_t>(pool[3], 1) + 1;
  const auto algo = static_cast<jaxcnn::ConvPoolAlgorithm>(algorithm);
  jaxcnn::ConvPoolPlan plan;
  switch (dtype) {  // codes: jaxcnn/_native/codes.py DTYPE_CODES
    case 0: plan = PlanWithAlignedBuffers<float>(p, algo); break;
    case 1: plan = PlanWithAlignedBuffers<__nv_bfloat16>(p, algo); break;
    case 2: plan = PlanWithAlignedBuffers<__half>(p, algo); break;
    default: plan.unsupported = "unknown dtype code"; break;
  }
  std::string text;
  if (plan.unsupported != nullptr) {
    text = plan.unsupported;
  } else if (plan.kernel == jaxcnn::ConvPoolAlgorithm::kDirect) {
    text = std::string("kernel=direct (") + plan.why + ") grid=" + std::to_string(plan.grid);
  } else {
    char recompute[32];
    std::snprintf(recompute, sizeof(recompute), "%.2f", plan.recompute);
    const bool stem = plan.kernel == jaxcnn::ConvPoolAlgorithm::kStem;
    const bool wgmma = plan.kernel == jaxcnn::ConvPoolAlgorithm::kWgmma;
    text = std::string(stem    ? "kernel=stem block="
                       : wgmma ? "kernel=wgmma block="
                               : "kernel=tensor_core block=") +
           std::to_string(plan.tile_h) + "x" + std::to_string(plan.tile_w) + " pooled=" + std::to_string(plan.pooled_h) + "x" +
           std::to_string(plan.pooled_w) + " block_k=" + std::to_string(plan.block_k) +
           " grid=" + std::to_string(plan.grid) + " smem=" + std::to_string(plan.smem_bytes) +
           " recompute=" + recompute + " flat_k=" + (plan.flat_k ? "1" : "0") +
           (stem ? std::string(" tma=") + (plan.tma ? "1" : "0") : std::string());
  }
  if (out != nullptr && out_len > 0) {
    const size_t n_copy = std::min<size_t>(text.size(), static_cast<size_t>(out_len - 1));
    std::memcpy(out, text.data(), n_copy);
    out[n_copy] = '\0';
  }
  return plan.unsupported != nullptr ? -1 : static_cast<int64_t>(text.size());
}
