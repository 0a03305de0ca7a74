// XLA FFI handler for the batched weight fold. Operands: k rank-4 weights, then one packed
// fp32 vector holding every factor vector and every vector to cast. Results: k folded weights,
// then m rank-1 vectors, each of its own float dtype. Attributes (k = perms / 4):
//   perms           4 per weight: result i = transpose(weight i * factors, perms[4i:4i+4])
//   scale_axes      per weight, the axis its factors run along (-1: none)
//   scale_offsets   per weight, where its factors start in the packed vector (-1: none)
//   vector_offsets  per vector result, where its values start in the packed vector
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/ffi_common.h"
#include "weights/permuted_weight_ffi.h"
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
                          ffi::Span<const int64_t> perms, ffi::Span<const int64_t> scale_axes,
                          ffi::Span<const int64_t> scale_offsets, ffi::Span<const int64_t> vector_offsets) {
  const size_t k = perms.size() / 4;
  if (perms.size() != 4 * k || scale_axes.size() != k || scale_offsets.size() != k)
    return Invalid("perms must hold 4 entries per weight and scale_axes / scale_offsets one, got " +
                   std::to_string(perms.size()) + " / " + std::to_string(scale_axes.size()) + " / " +
                   std::to_string(scale_offsets.size()));
  if (args.size() != k + 1)
    return Invalid("needs " + std::to_string(k) + " weights and the packed vector, got " +
                   std::to_string(args.size()) + " operands");
  const size_t m = vector_offsets.size();
  if (rets.size() != k + m)
    return Invalid("needs " + std::to_string(k + m) + " results, got " + std::to_string(rets.size()));
  auto packed = args.get<ffi::AnyBuffer>(k);
  if (!packed.has_value() || packed->element_type() != ffi::DataType::F32 || packed->dimensions().size() != 1)
    return Invalid("the last operand must be the packed float32 vector");
  const int64_t packed_size = packed->dimensions()[0];
  const float* packed_data = static_cast<const float*>(packed->untyped_data());
  auto in_packed = [&](int64_t offset, int64_t n) { return offset >= 0 && n >= 0 && offset + n <= packed_size; };
  std::vector<WeightFold> jobs(k + m);
  for (size_t i = 0; i < k; ++i) {
    const std::string which = "weight " + std::to_string(i);
    PermutedWeight w;
    if (std::string problem = ReadPermutedWeight(args, rets, perms, i, which, &w); !problem.empty())
      return Invalid(problem);
    WeightFold& job = jobs[i];
    if (!ToFoldElement(w.src_type, &job.src_type) || !ToFoldElement(w.dst_type, &job.dst_type))
      return Invalid(which + ": weights and results must be float32, bfloat16 or float16");
    job.src = w.src;
    job.dst = w.dst;
    std::copy(w.dims, w.dims + 4, job.dims);
    std::copy(w.perm, w.perm + 4, job.perm);
    const int64_t* dims = w.dims;
    const int64_t axis = scale_axes[i];
    if (axis > 3) return Invalid(which + ": scale axis must be in -1..3, got " + std::to_string(axis));
    if (axis >= 0) {
      if (!in_packed(scale_offsets[i], dims[axis]))
        return Invalid(which + ": its " + std::to_string(dims[axis]) + " factors at offset " +
                       std::to_string(scale_offsets[i]) + " overrun the packed vector");
      job.scale = packed_data + scale_offsets[i];
      job.scale_axis = static_cast<int>(axis);
    }
  }
  for (size_t j = 0; j < m; ++j) {
    auto out = rets.get<ffi::AnyBuffer>(k + j);
    const std::string which = "vector " + std::to_string(j);
    if (!out.has_value() || (*out)->dimensions().size() != 1) return Invalid(which + " must be a rank-1 result");
    WeightFold& job = jobs[k + j];
    if (!ToFoldElement((*out)->element_type(), &job.dst_type))
      return Invalid(which + ": results must be float32, bfloat16 or float16");
    const int64_t n = (*out)->dimensions()[0];
    if (!in_packed(vector_offsets[j], n))
      return Invalid(which + ": its " + std::to_string(n) + " values at offset " + std::to_string(vector_offsets[j]) +
                     " overrun the packed vector");
    job.src = packed_data + vector_offsets[j];
    job.dst = (*out)->untyped_data();
    job.dims[3] = n;
    job.src_type = FoldElement::kF32;
  }
  if (jobs.empty()) return ffi::Error::Success();
  if (const char* reason = weight_fold_unsupported_reason(jobs)) return Invalid(reason);
  JAXCNN_RETURN_IF_CUDA_ERROR(launch_weight_fold(jobs, stream), "weight_fold launch");
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxcnn

JAXCNN_FFI_HANDLER(JaxcnnWeightFold, jaxcnn::WeightFoldImpl,
                   ffi::Ffi::Bind()
                       .Ctx<ffi::PlatformStream<cudaStream_t>>()
                       .RemainingArgs()
                       .RemainingRets()
                       .Attr<ffi::Span<const int64_t>>("perms")
                       .Attr<ffi::Span<const int64_t>>("scale_axes")
                       .Attr<ffi::Span<const int64_t>>("scale_offsets")
                       .Attr<ffi::Span<const int64_t>>("vector_offsets"));
