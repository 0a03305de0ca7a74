// XLA FFI handlers for the straight conv chains (conv3x3 -> conv1x1, conv1x1 -> depthwise3x3):
// decode, validate, launch, report.
#include <cstdint>
#include <string>
#include <vector>

#include "chain/chain.h"
#include "common/ffi_common.h"

namespace jaxcnn {
namespace {

struct Expect {
  const char* name;
  const ffi::AnyBuffer* buffer;
  std::vector<int64_t> shape;
};

std::string ShapeText(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i > 0 ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

bool HasShape(const ffi::AnyBuffer& buffer, const std::vector<int64_t>& want) {
  const auto dims = buffer.dimensions();
  if (dims.size() != want.size()) return false;
  for (size_t i = 0; i < want.size(); ++i)
    if (dims[i] != want[i]) return false;
  return true;
}

// Every operand and the result must have its expected shape and x's dtype.
ffi::Error CheckBuffers(const char* op, ffi::DataType dtype, const std::vector<Expect>& expects) {
  for (const Expect& e : expects) {
    if (!HasShape(*e.buffer, e.shape))
      return InvalidArgumentFor(op, std::string(e.name) + " must have shape " +
                                        ShapeText(e.shape) + ", got " +
                                        DimsToString(e.buffer->dimensions()));
    if (e.buffer->element_type() != dtype)
      return InvalidArgumentFor(op, std::string(e.name) + " dtype must equal x dtype");
  }
  return ffi::Error::Success();
}

bool ToActivation(int64_t code, ChainActivation* act) {
  if (!ValidChainActivationCode(code)) return false;
  *act = static_cast<ChainActivation>(code);
  return true;
}

// Decodes act1/act2 (epilogue codes 0-7) into `p`.
template <typename Params>
ffi::Error DecodeActivations(const char* op, int64_t act1, int64_t act2, Params* p) {
  if (!ToActivation(act1, &p->act1) || !ToActivation(act2, &p->act2))
    return InvalidArgumentFor(op, "act1 and act2 must be epilogue activation codes 0-7, got " +
                                      std::to_string(act1) + " and " + std::to_string(act2));
  return ffi::Error::Success();
}

// The fused kernels are bf16/fp16 only (float32 chains lower to XLA's convs).
template <typename Fn>
ffi::Error DispatchHalfType(ffi::DataType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case ffi::DataType::BF16: return fn(DTypeTraits<ffi::DataType::BF16>{});
    case ffi::DataType::F16: return fn(DTypeTraits<ffi::DataType::F16>{});
    default: return InvalidArgumentFor(op, "x dtype must be bfloat16 or float16");
  }
}

template <typename T>
const T* In(const ffi::AnyBuffer& buffer) {
  return static_cast<const T*>(buffer.untyped_data());
}

// The end both handlers share: dispatch on x's dtype, refuse params the launcher's
// unsupported_reason rejected (`reason`, reported with x's shape and the derived `sizes`), else
// launch(traits) and report its CUDA error.
template <typename Launch>
ffi::Error LaunchChain(const char* op, const ffi::AnyBuffer& x, const char* reason,
                       const std::string& sizes, Launch&& launch) {
  return DispatchHalfType(x.element_type(), op, [&](auto traits) -> ffi::Error {
    if (reason != nullptr)
      return InvalidArgumentFor(op, std::string("unsupported shape: ") + reason + " (x " +
                                        DimsToString(x.dimensions()) + ", " + sizes + ")");
    JAXCNN_RETURN_IF_CUDA_ERROR(launch(traits), (std::string(op) + " launch").c_str());
    return ffi::Error::Success();
  });
}

ffi::Error Conv3x3Conv1x1Fwd(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w3,
                             ffi::AnyBuffer b3, ffi::AnyBuffer w1, ffi::AnyBuffer b1,
                             ffi::Result<ffi::AnyBuffer> y, int64_t act1, int64_t act2) {
  constexpr const char* kOp = "conv3x3_conv1x1";
  const auto x_dims = x.dimensions();
  if (x_dims.size() != 4)
    return InvalidArgumentFor(kOp, "x must be rank 4 (NHWC), got shape " + DimsToString(x_dims));
  if (w3.dimensions().size() != 4 || w1.dimensions().size() != 4)
    return InvalidArgumentFor(kOp, "w3 and w1 must be rank 4 (HWIO)");
  Conv3x3Conv1x1Params p;
  p.N = x_dims[0], p.H = x_dims[1], p.W = x_dims[2], p.C = x_dims[3];
  p.M = w3.dimensions()[3];
  p.K = w1.dimensions()[3];
  if (ffi::Error e = DecodeActivations(kOp, act1, act2, &p); e.failure()) return e;
  if (ffi::Error e = CheckBuffers(kOp, x.element_type(),
                                  {{"w3", &w3, {3, 3, p.C, p.M}},
                                   {"b3", &b3, {p.M}},
                                   {"w1", &w1, {1, 1, p.M, p.K}},
                                   {"b1", &b1, {p.K}},
                                   {"output y", &*y, {p.N, p.H, p.W, p.K}}});
      e.failure())
    return e;
  return LaunchChain(kOp, x, conv3x3_conv1x1_unsupported_reason(p),
                     "M " + std::to_string(p.M) + ", K " + std::to_string(p.K),
                     [&](auto traits) {
                       using T = typename decltype(traits)::type;
                       return launch_conv3x3_conv1x1<T>(p, In<T>(x), In<T>(w3), In<T>(b3),
                                                        In<T>(w1), In<T>(b1),
                                                        static_cast<T*>(y->untyped_data()), stream);
                     });
}

ffi::Error Conv1x1DepthwiseFwd(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w1,
                               ffi::AnyBuffer b1, ffi::AnyBuffer wd, ffi::AnyBuffer bd,
                               ffi::Result<ffi::AnyBuffer> y, int64_t stride, int64_t act1,
                               int64_t act2, int64_t pad_top, int64_t pad_bottom,
                               int64_t pad_left, int64_t pad_right) {
  constexpr const char* kOp = "conv1x1_depthwise";
  if (stride != 1 && stride != 2)
    return InvalidArgumentFor(kOp, "stride must be 1 or 2, got " + std::to_string(stride));
  for (int64_t pad : {pad_top, pad_bottom, pad_left, pad_right})
    if (pad < 0 || pad > kConv1x1DepthwiseMaxPad)
      return InvalidArgumentFor(kOp, "each padding must be 0, 1 or 2, got " +
                                         std::to_string(pad));
  const auto x_dims = x.dimensions();
  if (x_dims.size() != 4)
    return InvalidArgumentFor(kOp, "x must be rank 4 (NHWC), got shape " + DimsToString(x_dims));
  if (w1.dimensions().size() != 4)
    return InvalidArgumentFor(kOp, "w1 must be rank 4 (HWIO)");
  Conv1x1DepthwiseParams p;
  p.N = x_dims[0], p.H = x_dims[1], p.W = x_dims[2], p.C = x_dims[3];
  p.M = w1.dimensions()[3];
  p.stride = static_cast<int>(stride);
  p.pad_top = static_cast<int>(pad_top), p.pad_bottom = static_cast<int>(pad_bottom);
  p.pad_left = static_cast<int>(pad_left), p.pad_right = static_cast<int>(pad_right);
  if (ffi::Error e = DecodeActivations(kOp, act1, act2, &p); e.failure()) return e;
  const int64_t P = Conv1x1DepthwiseOutSize(p.H, p.pad_top, p.pad_bottom, p.stride);
  const int64_t Q = Conv1x1DepthwiseOutSize(p.W, p.pad_left, p.pad_right, p.stride);
  if (ffi::Error e = CheckBuffers(kOp, x.element_type(),
                                  {{"w1", &w1, {1, 1, p.C, p.M}},
                                   {"b1", &b1, {p.M}},
                                   {"wd", &wd, {3, 3, 1, p.M}},
                                   {"bd", &bd, {p.M}},
                                   {"output y", &*y, {p.N, P, Q, p.M}}});
      e.failure())
    return e;
  return LaunchChain(kOp, x, conv1x1_depthwise_unsupported_reason(p), "M " + std::to_string(p.M),
                     [&](auto traits) {
                       using T = typename decltype(traits)::type;
                       return launch_conv1x1_depthwise<T>(p, In<T>(x), In<T>(w1), In<T>(b1),
                                                          In<T>(wd), In<T>(bd),
                                                          static_cast<T*>(y->untyped_data()),
                                                          stream);
                     });
}

}  // namespace
}  // namespace jaxcnn

JAXCNN_FFI_HANDLER(JaxcnnConv3x3Conv1x1Fwd, jaxcnn::Conv3x3Conv1x1Fwd,
                   jaxcnn::Int64Attrs(jaxcnn::BindBuffers<5, 1>(),  // x, w3, b3, w1, b1 -> y
                                      "act1", "act2"));

JAXCNN_FFI_HANDLER(JaxcnnConv1x1DepthwiseFwd, jaxcnn::Conv1x1DepthwiseFwd,
                   jaxcnn::Int64Attrs(jaxcnn::BindBuffers<5, 1>(),  // x, w1, b1, wd, bd -> y
                                      "stride", "act1", "act2", "pad_top", "pad_bottom", "pad_left", "pad_right"));
