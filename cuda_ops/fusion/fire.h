// Fused SqueezeNet fire module launcher (NHWC activations, HWIO weights).
// Plain C++ interface so it can be used without XLA (e.g. by the selftest).
//
//   s  = relu(conv1x1(x, w_sq) + b_sq)           rounded to T (as the unfused reference)
//   y  = concat_C(relu(conv1x1(s, w_e1) + b_e1),  relu(conv3x3_pad1(s, w_e3) + b_e3))
//
// Two ways to run it:
//  - one mma.sync kernel (kTensorCore, kFma): the squeeze tile (plus its 1-pixel halo) never
//    leaves shared memory (straight fusion), both expands read it from there (split fusion)
//    and write straight into their channel slices of y (merge fusion: no concatenate);
//  - kTwoPhase: one cooperative launch for small problems (N = 1): the squeeze spread over
//    the whole grid into a workspace, a grid barrier, then the expands; every CTA moves tens
//    of KB where the single kernel's few tiles each stream the whole input and weights;
//  - kWgmma: where it applies (S = 32, E1 and E3 % 64, C % 32) the whole module as one TMA +
//    wgmma launch (fire_fused_wgmma.h: each tile's squeeze over its halo stays in shared
//    memory, all expand weights resident); else the squeeze by the Hopper tensor-core conv
//    (conv_tc/: CUTLASS wgmma + TMA) into a workspace, then both expands in one launch of the wgmma conv kernel
//    (conv_pool/conv_pool_wgmma.h, LaunchFireExpand: split and merge fusion; S % 32, E1 and E3
//    % 64), or where that does not apply one conv_tc launch per expand, each storing into its
//    channel slice of y (no concatenate either way). It wins where the single kernel's
//    mma.sync and halo/channel-split recompute cost more than s's round trip (big batches,
//    S > 32).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/device_attribute.h"

namespace jaxcnn {

// Which kernel runs the fire module.
enum class FireAlgorithm : int {
  kAuto = 0,        // kTwoPhase for small problems, kWgmma where it applies and pays (both
                    // with the buffers' workspace), else
                    // kTensorCore where it applies, else kFma
  kTensorCore = 1,  // bf16/fp16 mma.sync (sm_80+); channel counts multiples of 8
  kFma = 2,         // CUDA-core fp32 FMA: any dtype, any channel counts
  kWgmma = 3,       // wgmma/TMA kernels (sm_90): one fused launch, or the squeeze into the
                    // workspace then the expands into y's slices; bf16/fp16, channel counts
                    // multiples of 8; needs FirePlan::workspace_bytes (0 for one launch)
  kTwoPhase = 4,    // one cooperative mma.sync launch (sm_80+): squeeze over the whole grid
                    // into the workspace, grid barrier, expands into y's slices; for small
                    // problems; bf16/fp16, channels multiples of 8, S <= 64; needs
                    // FirePlan::workspace_bytes
};

// x [N,H,W,C], w_sq [1,1,C,S], w_e1 [1,1,S,E1], w_e3 [3,3,S,E3], biases [S], [E1], [E3],
// y [N,H,W,E1+E3].
struct FireParams {
  int64_t N, H, W, C;
  int64_t S, E1, E3;
};

// What the launcher will run for these params, dtype and pointers (no launch).
struct FirePlan {
  FireAlgorithm kernel = FireAlgorithm::kFma;  // kTensorCore, kWgmma, kTwoPhase or kFma
  const char* unsupported = nullptr;          // non-null: cannot run, says why
  const char* why = "";                       // why this kernel (for selftests / logs)
  // Tensor-core kernel only: shared-memory bytes per CTA; squeeze weights kept in shared
  // memory for the CTA's lifetime (else streamed with each input chunk); expand weights are
  // always resident (the channel split makes them fit); output channels per expand chunk;
  // output tile (tile_h x tile_w pixels); expand channel slices (each CTA computes one
  // slice of E1 and of E3 for its tiles, recomputing the tile's squeeze); CTAs launched.
  int64_t smem_bytes = 0;
  bool squeeze_weights_resident = false;
  bool expand_weights_resident = false;
  int expand_chunk = 0;
  int tile_h = 0, tile_w = 0;
  int split = 0;
  int ctas_per_sm = 0;  // 1 or 2 (JAXCNN_FIRE_CTAS_PER_SM=1|2 forces it where it fits)
  int64_t grid = 0;
  // kTwoPhase: work items of the squeeze phase (16-32 pixels x 16 channels) and of the
  // expand phase (4x16 pixels x 32 channels); tile_h, tile_w, expand_chunk, grid and
  // smem_bytes describe it too.
  int64_t squeeze_items = 0, expand_items = 0;
  // kWgmma, kTwoPhase: device scratch for s (256-byte aligned) the launch needs in
  // FireBuffers.
  int64_t workspace_bytes = 0;
  // kWgmma: 1 launch for the fused kernel (fire_fused_wgmma.h; JAXCNN_FIRE_WGMMA set turns it
  // off), 2 where both expands run as one (conv_pool_wgmma::LaunchFireExpand: s read once per
  // tile, one store per 64-channel block of y), else 3 (one conv each).
  int wgmma_launches = 0;
  // kWgmma: the squeeze runs on the wgmma conv kernel as a 1x1-only layer (on request:
  // JAXCNN_FIRE_WGMMA=squeeze_wgmma, C % 32), else on the CUTLASS conv (conv_tc/).
  bool wgmma_squeeze = false;
};

// The pointers a launch reads and writes; alignment decides the kernel.
template <typename T>
struct FireBuffers {
  const T* x;
  const T* w_sq;
  const T* b_sq;
  const T* w_e1;
  const T* b_e1;
  const T* w_e3;
  const T* b_e3;
  T* y;
  void* workspace = nullptr;  // kWgmma, kTwoPhase: FirePlan::workspace_bytes, 256-byte aligned
  size_t workspace_bytes = 0;
};

// nullptr if the shape can run at all (FMA kernel), else a static message.
const char* fire_unsupported_reason(const FireParams& params);

// Plan for `algorithm`; plan.unsupported says why a forced kernel cannot run. Queries the
// current device's attributes (cached per device).
template <typename T>
FirePlan plan_fire(const FireParams& params, const FireBuffers<T>& buffers,
                   FireAlgorithm algorithm);

// plan_fire's decisions for a described device instead of the current one (the cost model
// plans for a GPU it does not run on; its driver is taken to encode tensor maps).
template <typename T>
FirePlan plan_fire_for_device(const FireParams& params, const FireBuffers<T>& buffers,
                              FireAlgorithm algorithm, const DeviceLimits& device);

// cudaErrorInvalidValue when plan_fire(...).unsupported is set or the plan's workspace is
// missing; cudaSuccess without
// launching when y is empty; else cudaGetLastError() after the launch. x and y must not
// alias.
template <typename T>
cudaError_t launch_fire(const FireParams& params, const FireBuffers<T>& buffers,
                        FireAlgorithm algorithm, cudaStream_t stream);

extern template FirePlan plan_fire<float>(const FireParams&, const FireBuffers<float>&,
                                          FireAlgorithm);
extern template FirePlan plan_fire<__nv_bfloat16>(const FireParams&,
                                                  const FireBuffers<__nv_bfloat16>&,
                                                  FireAlgorithm);
extern template FirePlan plan_fire<__half>(const FireParams&, const FireBuffers<__half>&,
                                           FireAlgorithm);
extern template FirePlan plan_fire_for_device<float>(const FireParams&,
                                                     const FireBuffers<float>&, FireAlgorithm,
                                                     const DeviceLimits&);
extern template FirePlan plan_fire_for_device<__nv_bfloat16>(
    const FireParams&, const FireBuffers<__nv_bfloat16>&, FireAlgorithm, const DeviceLimits&);
extern template FirePlan plan_fire_for_device<__half>(const FireParams&,
                                                      const FireBuffers<__half>&, FireAlgorithm,
                                                      const DeviceLimits&);
extern template cudaError_t launch_fire<float>(const FireParams&, const FireBuffers<float>&,
                                               FireAlgorithm, cudaStream_t);
extern template cudaError_t launch_fire<__nv_bfloat16>(const FireParams&,
                                                       const FireBuffers<__nv_bfloat16>&,
                                                       FireAlgorithm, cudaStream_t);
extern template cudaError_t launch_fire<__half>(const FireParams&, const FireBuffers<__half>&,
                                                FireAlgorithm, cudaStream_t);

}  // namespace jaxcnn
