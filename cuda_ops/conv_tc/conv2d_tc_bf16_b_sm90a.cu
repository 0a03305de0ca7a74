// bf16 tensor-core conv kernels, configs 3-6 (see conv2d_tc_configs.h).
// Split from the other configs of this dtype so the two compile in parallel.
// B is read from the HWIO weights directly (MN-major, no transpose).
#include "conv_tc/conv2d_tc_cutlass.cuh"

namespace jaxcnn {
namespace conv_tc {

using Element = cutlass::bfloat16_t;

const TcKernelOps kBf16KernelsB[4] = {
    // pp_128x64_c1
    TcConvRunner<TcConvKernel<Element, 128, 64, 128, 1, false, 0, kHalfBFromHwio>>::ops(),
    // pp_64x64_c1
    TcConvRunner<TcConvKernel<Element, 64, 64, 128, 1, false, 0, kHalfBFromHwio>>::ops(),
    // pp_128x64_smallc
    TcConvRunner<TcConvKernel<Element, 128, 64, 32, 1, false, 0, kHalfBFromHwio>>::ops(),
    // pp_128x128_k64
    TcConvRunner<TcConvKernel<Element, 128, 128, 64, 1, false, 0, kHalfBFromHwio>>::ops(),
};

}  // namespace conv_tc
}  // namespace jaxcnn
