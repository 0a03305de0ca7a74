// XLA FFI handler for the fused fire module: decode, validate, launch, report.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/ffi_common.h"
#include "fusion/fire.h"

namespace jaxcnn {
namespace {

ffi::Error Invalid(const std::string& message) { return InvalidArgumentFor("fire", message); }

// True when `buffer` has exactly the dims `want`.
bool HasShape(const ffi::AnyBuffer& buffer, const std::vector<int64_t>& want) {
  const auto dims = buffer.dimensions();
  if (dims.size() != want.size()) return false;
  size_t i = 0;
  for (int64_t d : want)
    if (dims[i++] != d) return false;
  return true;
}

std::string ShapeText(const std::vector<int64_t>& dims) {
  std::string out = "[";
  bool first = true;
  for (int64_t d : dims) {
    if (!first) out += ", ";
    out += std::to_string(d);
    first = false;
  }
  return out + "]";
}

ffi::Error FireFwd(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w_sq,
                   ffi::AnyBuffer w_e1, ffi::AnyBuffer w_e3, ffi::AnyBuffer b_sq,
                   ffi::AnyBuffer b_e1, ffi::AnyBuffer b_e3, ffi::Result<ffi::AnyBuffer> y,
                   ffi::Result<ffi::AnyBuffer> workspace, int64_t algorithm) {
  if (algorithm < 0 || algorithm > 4)
    return Invalid("algorithm must be 0 (auto), 1 (tensor_core), 2 (fma), 3 (wgmma) or "
                   "4 (two_phase), got " + std::to_string(algorithm));
  const auto x_dims = x.dimensions();
  if (x_dims.size() != 4) return Invalid("x must be rank 4 (NHWC), got shape " + DimsToString(x_dims));
  if (w_sq.dimensions().size() != 4 || w_e1.dimensions().size() != 4 ||
      w_e3.dimensions().size() != 4)
    return Invalid("weights must be rank 4 (HWIO)");
  FireParams p;
  p.N = x_dims[0], p.H = x_dims[1], p.W = x_dims[2], p.C = x_dims[3];
  p.S = w_sq.dimensions()[3];
  p.E1 = w_e1.dimensions()[3];
  p.E3 = w_e3.dimensions()[3];
  struct Expect {
    const char* name;
    const ffi::AnyBuffer* buffer;
    std::vector<int64_t> shape;
  };
  const Expect expects[] = {
      {"squeeze_w", &w_sq, {1, 1, p.C, p.S}},   {"expand1_w", &w_e1, {1, 1, p.S, p.E1}},
      {"expand3_w", &w_e3, {3, 3, p.S, p.E3}},  {"squeeze_b", &b_sq, {p.S}},
      {"expand1_b", &b_e1, {p.E1}},             {"expand3_b", &b_e3, {p.E3}},
      {"output y", &*y, {p.N, p.H, p.W, p.E1 + p.E3}},
  };
  const ffi::DataType dtype = x.element_type();
  if (!IsSupportedFloatType(dtype)) return Invalid("x dtype must be float32, bfloat16 or float16");
  for (const Expect& e : expects) {
    if (!HasShape(*e.buffer, e.shape))
      return Invalid(std::string(e.name) + " must have shape " + ShapeText(e.shape) + ", got " +
                     DimsToString(e.buffer->dimensions()));
    if (e.buffer->element_type() != dtype)
      return Invalid(std::string(e.name) + " dtype must equal x dtype");
  }
  if (const char* reason = fire_unsupported_reason(p))
    return Invalid(std::string("unsupported shape: ") + reason + " (x " + DimsToString(x_dims) +
                   ")");

  return DispatchFloatType(dtype, "fire", [&](auto traits) -> ffi::Error {
    using T = typename decltype(traits)::type;
    const FireBuffers<T> buffers{
        static_cast<const T*>(x.untyped_data()),    static_cast<const T*>(w_sq.untyped_data()),
        static_cast<const T*>(b_sq.untyped_data()), static_cast<const T*>(w_e1.untyped_data()),
        static_cast<const T*>(b_e1.untyped_data()), static_cast<const T*>(w_e3.untyped_data()),
        static_cast<const T*>(b_e3.untyped_data()), static_cast<T*>(y->untyped_data()),
        workspace->untyped_data(), workspace->size_bytes()};
    const auto algo = static_cast<FireAlgorithm>(algorithm);
    const FirePlan plan = plan_fire<T>(p, buffers, algo);
    if (plan.unsupported != nullptr)
      return Invalid(std::string("unsupported by the chosen kernel: ") + plan.unsupported +
                     " (x " + DimsToString(x_dims) + ", squeeze " + std::to_string(p.S) +
                     ", expand " + std::to_string(p.E1) + "+" + std::to_string(p.E3) + ")");
    if (workspace->size_bytes() < static_cast<size_t>(plan.workspace_bytes))
      return Invalid("workspace of " + std::to_string(workspace->size_bytes()) + " bytes; the " +
                     (plan.kernel == FireAlgorithm::kWgmma ? "wgmma path" : "two-phase kernel") +
                     " needs " + std::to_string(plan.workspace_bytes) +
                     " (lowered without the library loaded?)");
    // Launch what was planned: launch_fire re-plans, and must not pick differently.
    JAXCNN_RETURN_IF_CUDA_ERROR(launch_fire<T>(p, buffers, plan.kernel, stream), "fire launch");
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jaxcnn

// Graph-safe: device attributes are queried once per device and cached; the handler then
// only sets the kernel's smem attribute and launches on `stream`.
JAXCNN_FFI_HANDLER(JaxcnnFireFwd, jaxcnn::FireFwd,
                   // x, squeeze_w, expand1_w, expand3_w, squeeze_b, expand1_b, expand3_b
                   //   -> y, workspace u8 (s for wgmma / two_phase)
                   jaxcnn::Int64Attrs(jaxcnn::BindBuffers<7, 2>(), "algorithm"));

namespace {

// The plan for XLA's buffers: 16-byte aligned (only the addresses' alignment matters to the
// plan) and whatever workspace the plan asks for (the lowering allocates it), on `device`
// (nullptr: the current device).
template <typename T>
jaxcnn::FirePlan PlanWithAlignedBuffers(const jaxcnn::FireParams& p,
                                        jaxcnn::FireAlgorithm algorithm,
                                        const jaxcnn::DeviceLimits* device) {
  const T* aligned = reinterpret_cast<const T*>(uintptr_t{256});
  const jaxcnn::FireBuffers<T> buffers{aligned,
                                       aligned,
                                       aligned,
                                       aligned,
                                       aligned,
                                       aligned,
                                       aligned,
                                       const_cast<T*>(aligned),
                                       const_cast<T*>(aligned),
                                       std::numeric_limits<size_t>::max()};
  return device == nullptr ? jaxcnn::plan_fire<T>(p, buffers, algorithm)
                           : jaxcnn::plan_fire_for_device<T>(p, buffers, algorithm, *device);
}

jaxcnn::FirePlan PlanForDtype(const jaxcnn::FireParams& p, int64_t dtype,
                              jaxcnn::FireAlgorithm algorithm,
                              const jaxcnn::DeviceLimits* device = nullptr) {
  switch (dtype) {  // codes: jaxcnn/_native/codes.py DTYPE_CODES
    case 0: return PlanWithAlignedBuffers<float>(p, algorithm, device);
    case 1: return PlanWithAlignedBuffers<__nv_bfloat16>(p, algorithm, device);
    case 2: return PlanWithAlignedBuffers<__half>(p, algorithm, device);
    default: {
      jaxcnn::FirePlan plan;
      plan.unsupported = "unknown dtype code";
      return plan;
    }
  }
}

// The plan as one line of text (the format jaxcnn_fire_plan documents), written into `out`
// (truncated to out_len - 1). Returns the text's length, or -1 when the kernel cannot run these
// params (out then holds the reason).
int64_t WritePlanLine(const jaxcnn::FirePlan& plan, char* out, int64_t out_len) {
  std::string text;
  if (plan.unsupported != nullptr) {
    text = plan.unsupported;
  } else if (plan.kernel == jaxcnn::FireAlgorithm::kFma) {
    text = std::string("kernel=fma (") + plan.why + ")";
  } else if (plan.kernel == jaxcnn::FireAlgorithm::kWgmma) {
    // squeeze=fused: the one-launch kernel computes it per tile (fire_fused_wgmma.h).
    text = "kernel=wgmma launches=" + std::to_string(plan.wgmma_launches) + " squeeze=" +
           (plan.wgmma_launches == 1 ? "fused" : plan.wgmma_squeeze ? "wgmma" : "conv_tc") +
           " workspace=" + std::to_string(plan.workspace_bytes) +
           " (" + plan.why + ")";
  } else if (plan.kernel == jaxcnn::FireAlgorithm::kTwoPhase) {
    text = "kernel=two_phase tile=" + std::to_string(plan.tile_h) + "x" +
           std::to_string(plan.tile_w) + " block=" + std::to_string(plan.expand_chunk) +
           " grid=" + std::to_string(plan.grid) + " ctas_per_sm=" +
           std::to_string(plan.ctas_per_sm) + " smem=" + std::to_string(plan.smem_bytes) +
           " squeeze_items=" + std::to_string(plan.squeeze_items) +
           " expand_items=" + std::to_string(plan.expand_items) +
           " workspace=" + std::to_string(plan.workspace_bytes) + " (" + plan.why + ")";
  } else {
    text = "kernel=tensor_core tile=" + std::to_string(plan.tile_h) + "x" +
           std::to_string(plan.tile_w) + " split=" + std::to_string(plan.split) +
           " grid=" + std::to_string(plan.grid) + " ctas_per_sm=" +
           std::to_string(plan.ctas_per_sm) + " smem=" + std::to_string(plan.smem_bytes) +
           " sq_resident=" + std::to_string(plan.squeeze_weights_resident ? 1 : 0) +
           " expand_chunk=" + std::to_string(plan.expand_chunk);
  }
  if (out != nullptr && out_len > 0) {
    const size_t n_copy = std::min<size_t>(text.size(), static_cast<size_t>(out_len - 1));
    std::memcpy(out, text.data(), n_copy);
    out[n_copy] = '\0';
  }
  return plan.unsupported != nullptr ? -1 : static_cast<int64_t>(text.size());
}

}  // namespace

// The configuration the handler will launch on the current device, as one line of text
// ("kernel=tensor_core tile=8x16 split=1 grid=264 ctas_per_sm=2 smem=... sq_resident=1
// expand_chunk=128"),
// for benchmarks and logs. Returns the text's length (truncated to out_len - 1), or -1 when
// the kernel cannot run these params (out then holds the reason).
extern "C" JAXCNN_EXPORT int64_t jaxcnn_fire_plan(int64_t n, int64_t h, int64_t w, int64_t c,
                                                  int64_t s, int64_t e1, int64_t e3,
                                                  int64_t dtype, int64_t algorithm, char* out,
                                                  int64_t out_len) {
  const jaxcnn::FireParams p{n, h, w, c, s, e1, e3};
  return WritePlanLine(PlanForDtype(p, dtype, static_cast<jaxcnn::FireAlgorithm>(algorithm)),
                       out, out_len);
}

// jaxcnn_fire_plan's line for a described GPU instead of the current device (SMs, opt-in shared
// memory per block, shared memory per SM, compute capability major, cooperative launch support
// 0/1): the plan a cost model asks for on a machine without that GPU (or without any). The
// same decisions, the same format.
extern "C" JAXCNN_EXPORT int64_t jaxcnn_fire_plan_for_device(
    int64_t n, int64_t h, int64_t w, int64_t c, int64_t s, int64_t e1, int64_t e3, int64_t dtype,
    int64_t algorithm, int64_t sm_count, int64_t smem_optin, int64_t smem_per_sm, int64_t major,
    int64_t cooperative, char* out, int64_t out_len) {
  const jaxcnn::FireParams p{n, h, w, c, s, e1, e3};
  jaxcnn::DeviceLimits device;
  device.sm_count = static_cast<int>(sm_count);
  device.smem_optin = static_cast<int>(smem_optin);
  device.smem_per_sm = static_cast<int>(smem_per_sm);
  device.major = static_cast<int>(major);
  device.cooperative = static_cast<int>(cooperative);
  return WritePlanLine(
      PlanForDtype(p, dtype, static_cast<jaxcnn::FireAlgorithm>(algorithm), &device), out,
      out_len);
}

// Workspace bytes the handler will need for these shapes, dtype code and algorithm code (the
// Python lowering makes it a second result of the custom call). Never fails: a kernel that
// cannot run is reported by the handler (lowering must work on a machine without the GPU).
extern "C" JAXCNN_EXPORT int64_t jaxcnn_fire_workspace_bytes(int64_t n, int64_t h, int64_t w,
                                                             int64_t c, int64_t s, int64_t e1,
                                                             int64_t e3, int64_t dtype,
                                                             int64_t algorithm) {
  const jaxcnn::FirePlan plan = PlanForDtype(jaxcnn::FireParams{n, h, w, c, s, e1, e3}, dtype,
                                             static_cast<jaxcnn::FireAlgorithm>(algorithm));
  return plan.kernel == jaxcnn::FireAlgorithm::kWgmma ||
                 plan.kernel == jaxcnn::FireAlgorithm::kTwoPhase
             ? plan.workspace_bytes
             : 0;
}
