// Hopper (wgmma) fused 3x3 conv + bias + ReLU + 2x2/2 max-pool: the shape family of VGG's
// pooled layers, where the mma.sync kernel runs at a third of the tensor-core peak.
//
// Each CTA loads one input tile (16x16 conv outputs plus the 1-pixel halo, 32 channels at a
// time) into shared memory once and runs all nine filter taps as wgmmas on shifted views of
// it: the A operand of tap (r, s) is the same tile addressed from pixel (r, s) on, which the
// no-swizzle ("interleave") wgmma layout allows because its 8-row core matrices are 8
// consecutive pixels. An 8x8 block of conv outputs is one m64 wgmma; in its accumulator each
// thread holds two vertically adjacent outputs, and the horizontal neighbour is 4 lanes away,
// so the 2x2 pool is a register max and one shuffle.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "conv_pool/conv_pool.h"

namespace jaxcnn {
namespace conv_pool_wgmma {

constexpr int kTileH = 16, kTileW = 16;  // conv outputs per tile (four 8x8 m64 blocks)
constexpr int kChannelMultiple = 32;     // C must be a multiple (whole pipeline chunks)

// Output channels per CTA: 128 where K allows (a wider wgmma reads fewer shared-memory bytes
// per FLOP: A is read once per 128 output channels instead of per 64), else 64.
inline int BlockN(int64_t K) { return K % 128 == 0 ? 128 : 64; }

// Shared memory per CTA for a channel block (the stages of input tile + weight chunk).
int64_t SmemBytes(int block_n);

// nullptr if the wgmma kernel runs this layer with these pointers, else why not. Checks the
// shape family (3x3, stride 1, dilation 1, padding 1 on both sides, 2x2/2 unpadded pool),
// 16-bit dtype, C % 32, K % 64, 16-byte alignment and an sm_90 device.
const char* UnsupportedReason(const ConvPoolParams& p, int dtype_bytes, bool is_float,
                              const void* x, const void* w, const void* y);

// Persistent CTAs: min(work items, SMs); work item = (image, tile row, tile column, channel
// block).
int64_t Grid(const ConvPoolParams& p);

template <typename T>
cudaError_t Launch(const ConvPoolParams& p, const ConvPoolBuffers<T>& b, cudaStream_t stream);

}  // namespace conv_pool_wgmma
}  // namespace jaxcnn
