// Hopper (wgmma) fused 3x3 conv + bias + ReLU + 2x2/2 max-pool: the shape family of VGG's
// pooled layers, where the mma.sync kernel runs at a third of the tensor-core peak.
//
// Each CTA loads one input tile plus its 1-pixel halo (a chunk of channels at a time) into
// shared memory once and runs all nine filter taps as wgmmas on shifted views of it: the
// operand of tap (r, s) is the same tile addressed from pixel (r, s) on. The 2x2 pool happens
// in the accumulator registers. Details: conv_pool_wgmma_sm90a.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "conv_pool/conv_pool.h"

namespace jaxcnn {
namespace conv_pool_wgmma {

constexpr int kChannelMultiple = 32;  // C must be a multiple (whole pipeline chunks)

// Output channels per work item: 128 where K allows (a 16x16 pixel tile as wgmma M), else 64
// (the channels as M, a 32x8 pixel tile as N).
int BlockN(int64_t K);

// The conv tile (outputs per work item) the kernel uses for these params.
void TileShape(const ConvPoolParams& p, int* tile_h, int* tile_w);

// Shared memory per CTA (the pipeline stages; the resident filter where it stays).
int64_t SmemBytes(const ConvPoolParams& p);

// nullptr if the wgmma kernel runs this layer with these pointers, else why not. Checks the
// shape family (3x3, stride 1, dilation 1, padding 1 on both sides, 2x2/2 unpadded pool),
// 16-bit dtype, C % 32, K % 64 (C of 32 or 64 where K % 128 != 0), 16-byte alignment and an
// sm_90 device.
const char* UnsupportedReason(const ConvPoolParams& p, int dtype_bytes, bool is_float,
                              const void* x, const void* w, const void* y);

// Persistent CTAs: min(work items, SMs); work item = (image, tile row, tile column, channel
// block).
int64_t Grid(const ConvPoolParams& p);

template <typename T>
cudaError_t Launch(const ConvPoolParams& p, const ConvPoolBuffers<T>& b, cudaStream_t stream);

}  // namespace conv_pool_wgmma
}  // namespace jaxcnn
