// The whole fire module in one Hopper launch (jaxcnn.fire's kWgmma path, where it applies):
// straight + split + merge fusion on TMA and wgmma, s never leaves shared memory.
//
// Each work item is a 28x8 output tile of one image. Its consumer warpgroup
//   1. computes the squeeze over the tile's 30x10 halo (wgmma m64n32, pixels as M, K = C
//      streamed by TMA in 32-channel chunks), adds the bias, applies ReLU, zeroes the pixels
//      outside the image (the expand 3x3's padding) and writes s, rounded to T as the unfused
//      reference rounds it, into shared memory in the layout TMA would have given it;
//   2. runs every 64-channel block of both expands on that tile (m64n224, the channels as M:
//      the 1x1 blocks the centre tap only, the 3x3 blocks all nine taps as views of the same
//      halo tile) with all expand weights resident in shared memory;
//   3. stores each block by TMA straight into its channel slice of y (no concatenate).
// Two consumer warpgroups take alternate tiles, so one's epilogues overlap the other's wgmmas.
// DRAM sees x once and y once: 148 MB on the headline fire (N = 64, 55x55, 128 -> 32 ->
// (128, 128)), where the two-launch path (squeeze, then the merged expand) moves 173 MB.
// Kernel: fire_fused_wgmma_sm90a.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/device_attribute.h"
#include "fusion/fire.h"

namespace jaxcnn {
namespace fire_fused_wgmma {

// nullptr if the fused kernel runs these params with these pointers, else why not: 16-bit
// types, 32 squeeze channels, C a multiple of 32, E1 and E3 positive multiples of 64 whose
// weights fit shared memory next to the pipeline, 16-byte aligned buffers, an sm_90 device:
// `device` where given (its driver taken to encode tensor maps, as every CUDA 12 driver does),
// else the current device and this process's driver.
const char* UnsupportedReason(const FireParams& p, int dtype_bytes, bool is_float, const void* x,
                              const void* w_sq, const void* w_e1, const void* w_e3,
                              const void* y, const DeviceLimits* device = nullptr);

// p must pass UnsupportedReason; biases may be null (zero).
template <typename T>
cudaError_t Launch(const FireParams& p, const FireBuffers<T>& b, cudaStream_t stream);

}  // namespace fire_fused_wgmma
}  // namespace jaxcnn
