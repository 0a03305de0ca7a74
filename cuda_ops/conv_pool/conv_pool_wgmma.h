// Hopper (wgmma) fused 3x3 conv + bias + ReLU + 2x2/2 max-pool: the shape family of VGG's
// pooled layers, where the mma.sync kernel runs at a third of the tensor-core peak.
//
// Each CTA loads one input tile plus its 1-pixel halo (a chunk of channels at a time) into
// shared memory once and runs all nine filter taps as wgmmas on shifted views of it: the
// operand of tap (r, s) is the same tile addressed from pixel (r, s) on. The 2x2 pool happens
// in the accumulator registers. With a 1x1/1 "pool" it stores the conv output itself: conv2d's
// algorithm "wgmma" (conv/conv2d_dispatch.cu). Details: conv_pool_wgmma_sm90a.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/device_attribute.h"
#include "common/epilogue.cuh"
#include "conv_pool/conv_pool.h"

namespace jaxcnn {
namespace conv_pool_wgmma {

constexpr int kChannelMultiple = 32;  // C must be a multiple (whole pipeline chunks)

// The kernel picks its configuration per layer (conv_pool_wgmma_sm90a.cu, ConfigFor): 128
// output channels per work item over a 16x16 pixel tile (pixels as wgmma M), or 64 (the
// channels as M) over tiles of 32, 28 or 14 rows x 8 columns, whichever leaves the busiest SM
// the least work, padding included (weighted by each one's measured speed).

// Output channels per work item.
int BlockN(const ConvPoolParams& p);

// The conv tile (outputs per work item) the kernel uses for these params.
void TileShape(const ConvPoolParams& p, int* tile_h, int* tile_w);

// Shared memory per CTA (the pipeline stages; the resident filter where it stays).
int64_t SmemBytes(const ConvPoolParams& p);

// nullptr if the wgmma kernel runs this layer with these pointers, else why not. Checks the
// shape family (3x3, stride 1, dilation 1, padding 1 on both sides, a 2x2/2 unpadded pool or
// none: a 1x1/1 pool, which conv2d's wgmma algorithm passes),
// 16-bit dtype, C % 32, K % 64, 16-byte alignment and an sm_90 device: `device` where given
// (its driver taken to encode tensor maps, as every CUDA 12 driver does), else the current
// device and this process's driver.
const char* UnsupportedReason(const ConvPoolParams& p, int dtype_bytes, bool is_float,
                              const void* x, const void* w, const void* y,
                              const DeviceLimits* device = nullptr);

// Persistent CTAs: min(work items, SMs); work item = (image, tile row, tile column, channel
// block).
int64_t Grid(const ConvPoolParams& p);

// act: the activation after the bias, applied without the pool only (conv2d's epilogue, any
// common/epilogue.cuh code); the pooled layers always ReLU. No residual.
template <typename T>
cudaError_t Launch(const ConvPoolParams& p, const ConvPoolBuffers<T>& b, cudaStream_t stream,
                   const EpilogueActivation& act = {Activation::kRelu, 0.f});

// The configurations by number, for tests and tuning: their names, whether one can run a
// layer (the resident filter needs K == 64 and C <= 64, 128-channel blocks K % 128 == 0), the
// one Launch picks, and a launch with a given one (cudaErrorInvalidValue where it cannot run
// the layer). The layer must pass UnsupportedReason.
constexpr int kConfigs = 5;
const char* ConfigName(int config);
bool ConfigTakes(int config, const ConvPoolParams& p);
int ChosenConfig(const ConvPoolParams& p);
template <typename T>
cudaError_t LaunchConfig(const ConvPoolParams& p, const ConvPoolBuffers<T>& b, int config,
                         cudaStream_t stream,
                         const EpilogueActivation& act = {Activation::kRelu, 0.f});

// Fire expand (split + merge fusion; jaxcnn.fire's wgmma path): one launch computes
//   y[..., :E1] = relu(conv1x1(s, w1) + b1),  y[..., E1:] = relu(conv3x3_same(s, w3) + b3)
// for s [N, H, W, S], w1 [S, E1], w3 [3, 3, S, E3] (HWIO), y [N, H, W, E1 + E3]: s is read
// once per tile for both, each 64-channel block of y is stored straight into its slice, and a
// block of the 1x1 half runs the centre tap alone (its weights from w1; no 9x zero-padded
// MACs). S a multiple of 32, E1 and E3 of 64, 16-bit types, sm_90.
// E3 = 0 makes it a 1x1 conv of any E1 multiple of 8 (the fire's squeeze: s = x, E1 = squeeze
// channels; w3 unused): whole 64-channel blocks whose extra channels are clipped by the store.
struct FireExpandParams {
  int64_t N, H, W, S, E1, E3;
};
template <typename T>
struct FireExpandBuffers {
  const T* s;
  const T* w1;
  const T* b1;  // may be null (zero bias), as b3
  const T* w3;
  const T* b3;
  T* y;
};
const char* FireExpandUnsupportedReason(const FireExpandParams& f, int dtype_bytes, bool is_float,
                                        const void* s, const void* w1, const void* w3,
                                        const void* y, const DeviceLimits* device = nullptr);
template <typename T>
cudaError_t LaunchFireExpand(const FireExpandParams& f, const FireExpandBuffers<T>& b,
                             cudaStream_t stream);

}  // namespace conv_pool_wgmma
}  // namespace jaxcnn
