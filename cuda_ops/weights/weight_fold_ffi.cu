// XLA FFI handler for the batched weight fold: k weight operands, then one fp32 factor vector
// per weight whose scale_axes entry is >= 0 (in weight order); k results, each of its own
// float dtype. Attributes: `perms` (4 entries per weight: result i = transpose(weight i * its
// factors along scale_axes[i], perms[4i:4i+4]), cast to result i's dtype) and `scale_axes`
// (one per weight, -1: no factors).
#include <cstdint>
#include <string>
#include <vector>

#include "common/ffi_common.h"
#include "weights/weight_fold.h"

namespace jaxcnn {
namespace {

ffi::Error Invalid(const std::string& message) {
  return InvalidArgumentFor("weight_fold", message);
}

bool ToFoldElement(ffi::DataType t, FoldElement* out) {
  switch (t) {
    case ffi::DataType::F32: *out = FoldElement::kF32; return true;
    case ffi::DataType::BF16: *out = FoldElement::kBF16; return true;
    case ffi::DataType::F16: *out = FoldElement::kF16; return true;
    default: return false;
  }
}

ffi::Error WeightFoldImpl(cudaStream_t stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                          ffi::Span<const int64_t> perms, ffi::Span<const int64_t> scale_axes) {
  const size_t k = rets.size();
  if (scale_axes.size() != k)
    return Invalid("scale_axes must hold one entry per result (" + std::to_string(k) + "), got " +
                   std::to_string(scale_axes.size()));
  if (perms.size() != 4 * k)
    return Invalid("perms must hold 4 entries per result (" + std::to_string(4 * k) + "), got " +
                   std::to_string(perms.size()));
  size_t scaled = 0;
  for (size_t i = 0; i < k; ++i) scaled += scale_axes[i] >= 0 ? 1 : 0;
  if (args.size() != k + scaled)
    return Invalid("needs " + std::to_string(k) + " weights and " + std::to_string(scaled) +
                   " factor vectors, got " + std::to_string(args.size()) + " operands");
  std::vector<WeightFold> jobs(k);
  size_t next_scale = k;
  for (size_t i = 0; i < k; ++i) {
    auto w = args.get<ffi::AnyBuffer>(i);
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (!w.has_value() || !out.has_value()) return Invalid("operand/result " + std::to_string(i) + " is not a buffer");
    const std::string which = "weight " + std::to_string(i);
    const auto dims = w->dimensions();
    const auto out_dims = (*out)->dimensions();
    if (dims.size() != 4) return Invalid(which + " must be rank 4, got shape " + DimsToString(dims));
    WeightFold& job = jobs[i];
    if (!ToFoldElement(w->element_type(), &job.src_type) || !ToFoldElement((*out)->element_type(), &job.dst_type))
      return Invalid(which + ": weights and results must be float32, bfloat16 or float16");
    job.src = w->untyped_data();
    job.dst = (*out)->untyped_data();
    bool shape_ok = out_dims.size() == 4;
    for (int d = 0; d < 4; ++d) {
      job.dims[d] = dims[d];
      const int64_t p = perms[4 * i + d];
      if (p < 0 || p > 3) return Invalid(which + ": perm entries must be in 0..3");
      job.perm[d] = static_cast<int>(p);
      shape_ok = shape_ok && out_dims[d] == dims[p];
    }
    if (!shape_ok) return Invalid(which + ": result shape " + DimsToString(out_dims) + " must be " +
                                  DimsToString(dims) + " permuted");
    const int64_t axis = scale_axes[i];
    if (axis > 3) return Invalid(which + ": scale axis must be in -1..3, got " + std::to_string(axis));
    if (axis >= 0) {
      auto scale = args.get<ffi::AnyBuffer>(next_scale++);
      if (!scale.has_value()) return Invalid(which + ": its factors are not a buffer");
      if (scale->element_type() != ffi::DataType::F32 || scale->dimensions().size() != 1 ||
          scale->dimensions()[0] != dims[axis])
        return Invalid(which + ": factors must be float32 of shape [" + std::to_string(dims[axis]) + "], got " +
                       DimsToString(scale->dimensions()));
      job.scale = static_cast<const float*>(scale->untyped_data());
      job.scale_axis = static_cast<int>(axis);
    }
  }
  if (k == 0) return ffi::Error::Success();
  if (const char* reason = weight_fold_unsupported_reason(jobs)) return Invalid(reason);
  JAXCNN_RETURN_IF_CUDA_ERROR(launch_weight_fold(jobs, stream), "weight_fold launch");
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxcnn

// Re-declared with default visibility so -fvisibility=hidden builds export it.
extern "C" JAXCNN_EXPORT XLA_FFI_Error* JaxcnnWeightFold(XLA_FFI_CallFrame*);

// Command-buffer (CUDA graph) compatible: kernel launches on the given stream only.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcnnWeightFold, jaxcnn::WeightFoldImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<ffi::Span<const int64_t>>("perms")
                                  .Attr<ffi::Span<const int64_t>>("scale_axes"),
                              {ffi::Traits::kCmdBufferCompatible});
