// XLA FFI handlers for conv2d forward: decode, validate, launch, report.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "common/ffi_common.h"
#include "conv/conv2d_dispatch.h"

namespace jaxcnn {
namespace {

constexpr const char* kOpName = "conv2d";

ffi::Error Invalid(const std::string& message) {
  return InvalidArgumentFor("conv2d", message);
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

struct LogicalDims {
  int64_t n, h, w, c;
};

// (N, H, W, C) of a rank-4 tensor stored in `layout`.
LogicalDims ToLogical(ffi::AnyBuffer::Dimensions d, TensorLayout layout) {
  switch (layout) {
    case TensorLayout::kNCHW:
      return {d[0], d[2], d[3], d[1]};
    case TensorLayout::kCHWN:
      return {d[3], d[1], d[2], d[0]};
    case TensorLayout::kNHWC:
    default:
      return {d[0], d[1], d[2], d[3]};
  }
}

// The conv's attributes, as every handler decodes them.
struct ConvAttrs {
  int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups;
  int64_t activation;  // common/epilogue.cuh Activation code
  int64_t layout, precision, algorithm;
  float alpha;  // leaky_relu's negative slope
};

// The Conv2dParams the handler launches with and the workspace query plans with (the two must
// agree): logical sizes, then the attributes; `residual` only matters as null or not to planning.
Conv2dParams MakeParams(int64_t N, int64_t H, int64_t W, int64_t C, int64_t R, int64_t S,
                        int64_t K, int64_t P, int64_t Q, const ConvAttrs& a,
                        const void* residual) {
  Conv2dParams params{N, H, W, C, R, S, K, P, Q,
                      static_cast<int>(a.stride_h), static_cast<int>(a.stride_w),
                      static_cast<int>(a.pad_h), static_cast<int>(a.pad_w),
                      static_cast<int>(a.dilation_h), static_cast<int>(a.dilation_w),
                      static_cast<int>(a.groups)};
  params.epilogue = {static_cast<Activation>(a.activation), a.alpha};
  params.residual = residual;
  params.layout = static_cast<TensorLayout>(a.layout);
  params.precision = static_cast<MathPrecision>(a.precision);
  return params;
}

// `bias` is null for the no-bias handler, `residual` for all but the residual one.
ffi::Error Conv2dFwdImpl(cudaStream_t stream, const ffi::AnyBuffer& x,
                         const ffi::AnyBuffer& w, const ffi::AnyBuffer* bias,
                         const ffi::AnyBuffer* residual, ffi::AnyBuffer& y,
                         ffi::AnyBuffer& workspace, const ConvAttrs& a) {
  const int64_t stride_h = a.stride_h, stride_w = a.stride_w, pad_h = a.pad_h, pad_w = a.pad_w;
  const int64_t dilation_h = a.dilation_h, dilation_w = a.dilation_w, groups = a.groups;
  const int64_t activation = a.activation, layout = a.layout, precision = a.precision;
  const int64_t algorithm = a.algorithm;
  const auto x_dims = x.dimensions();
  const auto w_dims = w.dimensions();
  const auto y_dims = y.dimensions();
  if (layout < 0 || layout > 2)
    return Invalid("layout must be 0 (NHWC), 1 (NCHW) or 2 (CHWN), got " +
                   std::to_string(layout));
  if (precision != 0 && precision != 1)
    return Invalid("precision must be 0 (default) or 1 (highest), got " +
                   std::to_string(precision));
  if (algorithm < 0 || algorithm > 6 || algorithm == 4)
    return Invalid("algorithm must be 0..3, 5 or 6 (auto, direct, tensor_core, "
                   "depthwise, wgmma, stem), got " + std::to_string(algorithm));
  if (x_dims.size() != 4)
    return Invalid("x must be rank 4, got shape " + DimsToString(x_dims));
  if (w_dims.size() != 4)
    return Invalid("w must be rank 4 (HWIO), got shape " +
                   DimsToString(w_dims));
  if (bias != nullptr && bias->dimensions().size() != 1)
    return Invalid("bias must be rank 1 [K], got shape " +
                   DimsToString(bias->dimensions()));
  if (y_dims.size() != 4)
    return Invalid("output y must be rank 4, got shape " +
                   DimsToString(y_dims));

  const ffi::DataType dtype = x.element_type();
  if (!IsSupportedFloatType(dtype))
    return Invalid("x dtype must be float32, bfloat16 or float16");
  if (w.element_type() != dtype) return Invalid("w dtype must equal x dtype");
  if (bias != nullptr && bias->element_type() != dtype)
    return Invalid("bias dtype must equal x dtype");
  if (y.element_type() != dtype)
    return Invalid("output y dtype must equal x dtype");
  if (residual != nullptr) {
    if (residual->element_type() != dtype)
      return Invalid("residual dtype must equal x dtype");
    const auto r_dims = residual->dimensions();
    bool same = r_dims.size() == y_dims.size();
    for (size_t i = 0; same && i < r_dims.size(); ++i) same = r_dims[i] == y_dims[i];
    if (!same)
      return Invalid("residual shape " + DimsToString(r_dims) + " must equal output y shape " +
                     DimsToString(y_dims));
  }

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
  if (!ValidActivationCode(activation))
    return Invalid("activation must be a code 0.." + std::to_string(kNumActivations - 1) +
                   " (common/epilogue.cuh), got " + std::to_string(activation));
  if (!std::isfinite(a.alpha))
    return Invalid("alpha must be finite, got " + std::to_string(a.alpha));

  const auto tensor_layout = static_cast<TensorLayout>(layout);
  const LogicalDims xd = ToLogical(x_dims, tensor_layout);
  const LogicalDims yd = ToLogical(y_dims, tensor_layout);
  const int64_t N = xd.n, H = xd.h, W = xd.w, C = xd.c;
  const int64_t R = w_dims[0], S = w_dims[1], w_in = w_dims[2], K = w_dims[3];
  const int64_t P = yd.h, Q = yd.w;
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
  if (yd.n != N)
    return Invalid("output y batch " + std::to_string(yd.n) +
                   " must equal x batch " + std::to_string(N));
  if (yd.c != K)
    return Invalid("output y channels " + std::to_string(yd.c) +
                   " must equal w output channels K=" + std::to_string(K));

  // Nothing to write. A non-empty y with an empty x or window still launches:
  // the result is then the epilogue of a zero accumulator, as in lax.
  if (IsEmpty(y)) return ffi::Error::Success();
  if (P < 1 || Q < 1)
    return Invalid("output spatial dims P, Q must be >= 1, got shape " +
                   DimsToString(y_dims));

  const Conv2dParams params = MakeParams(N, H, W, C, R, S, K, P, Q, a,
                                         residual != nullptr ? residual->untyped_data() : nullptr);

  return DispatchFloatType(dtype, kOpName, [&](auto traits) -> ffi::Error {
    using T = typename decltype(traits)::type;
    const Conv2dPlan plan =
        plan_conv2d<T>(params, static_cast<Conv2dAlgorithm>(algorithm));
    if (plan.unsupported != nullptr)
      return Invalid(std::string("unsupported by the chosen kernel: ") +
                     plan.unsupported + " (x " + DimsToString(x_dims) +
                     ", w " + DimsToString(w_dims) + ", y " +
                     DimsToString(y_dims) + ")");
    if (workspace.size_bytes() < plan.workspace_bytes)
      return Invalid("workspace of " + std::to_string(workspace.size_bytes()) +
                     " bytes, the kernel needs " +
                     std::to_string(plan.workspace_bytes));
    const T* bias_data =
        bias != nullptr ? static_cast<const T*>(bias->untyped_data()) : nullptr;
    // The launchers return cudaGetLastError() after their launches.
    JAXCNN_RETURN_IF_CUDA_ERROR(
        run_conv2d<T>(plan, static_cast<const T*>(x.untyped_data()),
                      static_cast<const T*>(w.untyped_data()), bias_data,
                      static_cast<T*>(y.untyped_data()), params,
                      workspace.untyped_data(), stream),
        "conv2d_fwd launch");
    return ffi::Error::Success();
  });
}

// The three handler variants: which optional operands (bias, residual) they bind.
ffi::Error Conv2dFwdWithBias(const ConvAttrs& a, cudaStream_t stream, ffi::AnyBuffer x,
                             ffi::AnyBuffer w, ffi::AnyBuffer bias,
                             ffi::Result<ffi::AnyBuffer> y,
                             ffi::Result<ffi::AnyBuffer> workspace) {
  return Conv2dFwdImpl(stream, x, w, &bias, nullptr, *y, *workspace, a);
}

ffi::Error Conv2dFwdNoBias(const ConvAttrs& a, cudaStream_t stream, ffi::AnyBuffer x,
                           ffi::AnyBuffer w, ffi::Result<ffi::AnyBuffer> y,
                           ffi::Result<ffi::AnyBuffer> workspace) {
  return Conv2dFwdImpl(stream, x, w, nullptr, nullptr, *y, *workspace, a);
}

ffi::Error Conv2dFwdResidual(const ConvAttrs& a, cudaStream_t stream, ffi::AnyBuffer x,
                             ffi::AnyBuffer w, ffi::AnyBuffer bias, ffi::AnyBuffer residual,
                             ffi::Result<ffi::AnyBuffer> y,
                             ffi::Result<ffi::AnyBuffer> workspace) {
  return Conv2dFwdImpl(stream, x, w, &bias, &residual, *y, *workspace, a);
}

// ConvHandler<&variant>::Call is the function XLA binds for a variant: the stream, the
// variant's buffers, then the attribute scalars in WithConvAttrs' order, packed into ConvAttrs.
template <auto kVariant>
struct ConvHandler;

template <typename... Buffers,
          ffi::Error (*kVariant)(const ConvAttrs&, cudaStream_t, Buffers...)>
struct ConvHandler<kVariant> {
  static ffi::Error Call(cudaStream_t stream, Buffers... buffers, int64_t stride_h,
                         int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                         int64_t dilation_w, int64_t groups, int64_t activation, int64_t layout,
                         int64_t precision, int64_t algorithm, float alpha) {
    return kVariant(ConvAttrs{stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups,
                              activation, layout, precision, algorithm, alpha},
                    stream, buffers...);
  }
};

// The conv attributes every handler decodes, in the order the implementations take them.
template <typename Binding>
auto WithConvAttrs(Binding binding) {
  return Int64Attrs(std::move(binding), "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w",
                    "groups", "activation", "layout", "precision", "algorithm")
      .template Attr<float>("alpha");
}

}  // namespace
}  // namespace jaxcnn

JAXCNN_FFI_HANDLER(JaxcnnConv2dFwd, jaxcnn::ConvHandler<&jaxcnn::Conv2dFwdWithBias>::Call,
                   // x [N,H,W,C], w [R,S,C/G,K], bias [K] -> y [N,P,Q,K] in layout, workspace u8
                   jaxcnn::WithConvAttrs(jaxcnn::BindBuffers<3, 2>()));

JAXCNN_FFI_HANDLER(JaxcnnConv2dFwdNoBias, jaxcnn::ConvHandler<&jaxcnn::Conv2dFwdNoBias>::Call,
                   // x, w -> y, workspace (as JaxcnnConv2dFwd, without the bias)
                   jaxcnn::WithConvAttrs(jaxcnn::BindBuffers<2, 2>()));

JAXCNN_FFI_HANDLER(JaxcnnConv2dFwdResidual, jaxcnn::ConvHandler<&jaxcnn::Conv2dFwdResidual>::Call,
                   // x, w, bias, residual (as y) -> y, workspace
                   jaxcnn::WithConvAttrs(jaxcnn::BindBuffers<4, 2>()));

// Scratch bytes the handler will need, for the Python lowering (which makes the
// workspace a second result of the custom call). -1: the requested kernel
// family cannot run these params; *reason then says why (the lowering raises).
extern "C" JAXCNN_EXPORT int64_t jaxcnn_conv2d_workspace_bytes(
    int64_t n, int64_t h, int64_t w, int64_t c, int64_t r, int64_t s,
    int64_t k, int64_t p, int64_t q, int64_t stride_h, int64_t stride_w,
    int64_t pad_h, int64_t pad_w, int64_t dil_h, int64_t dil_w, int64_t groups,
    int64_t activation, int64_t has_residual, int64_t layout, int64_t precision,
    int64_t algorithm, int64_t dtype, const char** reason) {
  *reason = nullptr;
  if (!jaxcnn::ValidActivationCode(activation)) {
    *reason = "unknown activation code";
    return -1;
  }
  // The plan depends on the activation's code, not on alpha (left at its default).
  const jaxcnn::ConvAttrs attrs{stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, activation,
                                layout, precision, algorithm, jaxcnn::EpilogueActivation{}.alpha};
  // Planning looks only at whether a residual is given: any non-null pointer says so.
  alignas(16) static const int16_t kAnyResidual[8] = {};
  const jaxcnn::Conv2dParams params = jaxcnn::MakeParams(
      n, h, w, c, r, s, k, p, q, attrs, has_residual != 0 ? kAnyResidual : nullptr);
  const auto requested = static_cast<jaxcnn::Conv2dAlgorithm>(algorithm);
  jaxcnn::Conv2dPlan plan;
  switch (dtype) {  // codes: jaxcnn/_native/codes.py DTYPE_CODES
    case 0: plan = jaxcnn::plan_conv2d<float>(params, requested); break;
    case 1: plan = jaxcnn::plan_conv2d<__nv_bfloat16>(params, requested); break;
    case 2: plan = jaxcnn::plan_conv2d<__half>(params, requested); break;
    default: *reason = "unknown dtype code"; return -1;
  }
  if (plan.unsupported != nullptr) {
    *reason = plan.unsupported;
    return -1;
  }
  return static_cast<int64_t>(plan.workspace_bytes);
}
