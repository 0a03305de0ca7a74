// XLA FFI handler for the batched weight permutation: k operands, k results, one attribute
// `perms` holding 4 entries per operand (result i = transpose(operand i, perms[4i:4i+4])).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/ffi_common.h"
#include "weights/permuted_weight_ffi.h"
#include "weights/weight_relayout.h"

namespace jaxcnn {
namespace {

ffi::Error Invalid(const std::string& message) {
  return InvalidArgumentFor("weight_relayout", message);
}

ffi::Error WeightRelayoutImpl(cudaStream_t stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                              ffi::Span<const int64_t> perms) {
  const size_t k = args.size();
  if (rets.size() != k)
    return Invalid("needs one result per operand, got " + std::to_string(k) + " operands and " +
                   std::to_string(rets.size()) + " results");
  if (perms.size() != 4 * k)
    return Invalid("perms must hold 4 entries per operand (" + std::to_string(4 * k) + "), got " +
                   std::to_string(perms.size()));
  std::vector<WeightRelayout> jobs(k);
  size_t element_bytes = 0;
  for (size_t i = 0; i < k; ++i) {
    const std::string which = "operand " + std::to_string(i);
    PermutedWeight w;
    if (std::string problem = ReadPermutedWeight(args, rets, perms, i, which, &w); !problem.empty())
      return Invalid(problem);
    if (w.dst_type != w.src_type) return Invalid(which + ": result dtype must equal the operand's");
    const size_t bytes = ffi::ByteWidth(w.src_type);
    if (i > 0 && bytes != element_bytes) return Invalid("every operand must have the same element width");
    element_bytes = bytes;
    WeightRelayout& job = jobs[i];
    job.src = w.src;
    job.dst = w.dst;
    std::copy(w.dims, w.dims + 4, job.dims);
    std::copy(w.perm, w.perm + 4, job.perm);
  }
  if (k == 0) return ffi::Error::Success();
  if (const char* reason = weight_relayout_unsupported_reason(jobs, element_bytes)) return Invalid(reason);
  JAXCNN_RETURN_IF_CUDA_ERROR(launch_weight_relayout(jobs, element_bytes, stream), "weight_relayout launch");
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxcnn

JAXCNN_FFI_HANDLER(JaxcnnWeightRelayout, jaxcnn::WeightRelayoutImpl,
                   ffi::Ffi::Bind()
                       .Ctx<ffi::PlatformStream<cudaStream_t>>()
                       .RemainingArgs()
                       .RemainingRets()
                       .Attr<ffi::Span<const int64_t>>("perms"));
