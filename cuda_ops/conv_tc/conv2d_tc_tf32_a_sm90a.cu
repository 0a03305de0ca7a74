// fp32 (TF32 / 3xTF32) tensor-core conv kernels, configs 0-2 (see conv2d_tc_configs.h).
// Split from the other configs of this dtype so the two compile in parallel.
#include "conv_tc/conv2d_tc_cutlass.cuh"

namespace jaxcnn {
namespace conv_tc {

using Element = float;

const TcKernelOps kTf32KernelsA[3] = {
    // coop_128x256_c2
    TcConvRunner<TcConvKernel<Element, 128, 256, 128, 2, true>>::ops(),
    // coop_256x128_c2
    TcConvRunner<TcConvKernel<Element, 256, 128, 128, 2, true>>::ops(),
    // pp_128x128_c1
    TcConvRunner<TcConvKernel<Element, 128, 128, 128, 1, false>>::ops(),
};

}  // namespace conv_tc
}  // namespace jaxcnn
