// What the batched weight handlers (weight_relayout_ffi.cu, weight_fold_ffi.cu) read of each
// weight the same way: operand i and result i as buffers, rank 4, the permutation perms[4i..4i+3],
// and a result shaped like the operand permuted.
#pragma once

#include <cstdint>
#include <string>

#include "common/ffi_common.h"

namespace jaxcnn {

struct PermutedWeight {
  const void* src = nullptr;  // operand i's data
  void* dst = nullptr;        // result i's data
  ffi::DataType src_type = ffi::DataType::INVALID;
  ffi::DataType dst_type = ffi::DataType::INVALID;
  int64_t dims[4] = {1, 1, 1, 1};  // the operand's
  int perm[4] = {0, 1, 2, 3};      // result dim k = operand dim perm[k]
};

// Reads weight i into *out; an empty string when it is well formed, else the message (naming
// it as `which`).
inline std::string ReadPermutedWeight(ffi::RemainingArgs& args, ffi::RemainingRets& rets,
                                      ffi::Span<const int64_t> perms, size_t i, const std::string& which,
                                      PermutedWeight* out) {
  auto w = args.get<ffi::AnyBuffer>(i);
  auto result = rets.get<ffi::AnyBuffer>(i);
  if (!w.has_value() || !result.has_value()) return "operand/result " + std::to_string(i) + " is not a buffer";
  const auto dims = w->dimensions();
  const auto out_dims = (*result)->dimensions();
  if (dims.size() != 4) return which + " must be rank 4, got shape " + DimsToString(dims);
  bool shape_ok = out_dims.size() == 4;
  for (int d = 0; d < 4; ++d) {
    out->dims[d] = dims[d];
    const int64_t p = perms[4 * i + d];
    if (p < 0 || p > 3) return which + ": perm entries must be in 0..3";
    out->perm[d] = static_cast<int>(p);
    shape_ok = shape_ok && out_dims[d] == dims[p];
  }
  if (!shape_ok) return which + ": result shape " + DimsToString(out_dims) + " must be " + DimsToString(dims) + " permuted";
  out->src = w->untyped_data();
  out->dst = (*result)->untyped_data();
  out->src_type = w->element_type();
  out->dst_type = (*result)->element_type();
  return "";
}

}  // namespace jaxcnn
