// fp16 tensor-core conv kernels, configs 0-2 (see conv2d_tc_configs.h).
// Split from the other configs of this dtype so the two compile in parallel.
// B is read from the HWIO weights directly (MN-major, no transpose).
#include "conv_tc/conv2d_tc_cutlass.cuh"

namespace jaxcnn {
namespace conv_tc {

using Element = cutlass::half_t;

const TcKernelOps kF16KernelsA[3] = {
    // coop_128x256_c2
    TcConvRunner<TcConvKernel<Element, 128, 256, 128, 2, true, 0, kHalfBFromHwio>>::ops(),
    // coop_256x128_c2
    TcConvRunner<TcConvKernel<Element, 256, 128, 128, 2, true, 0, kHalfBFromHwio>>::ops(),
    // pp_128x128_c1
    TcConvRunner<TcConvKernel<Element, 128, 128, 128, 1, false, 0, kHalfBFromHwio>>::ops(),
};

}  // namespace conv_tc
}  // namespace jaxcnn
