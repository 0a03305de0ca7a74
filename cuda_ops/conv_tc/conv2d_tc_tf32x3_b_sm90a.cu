// fp32 kHighest (3xTF32, two-level accumulation) tensor-core conv kernels,
// configs 3-6 (see conv2d_tc_configs.h).
#include "conv_tc/conv2d_tc_cutlass.cuh"

namespace jaxcnn {
namespace conv_tc {

using Element = float;

const TcKernelOps kTf32x3KernelsB[4] = {
    // pp_128x64_c1
    TcConvRunner<TcConvKernel<Element, 128, 64, 128, 1, false, kSplit3PromoteK>>::ops(),
    // pp_64x64_c1
    TcConvRunner<TcConvKernel<Element, 64, 64, 128, 1, false, kSplit3PromoteK>>::ops(),
    // pp_128x64_smallc
    TcConvRunner<TcConvKernel<Element, 128, 64, 32, 1, false, kSplit3PromoteK>>::ops(),
    // pp_64x128_k64
    TcConvRunner<TcConvKernel<Element, 64, 128, 64, 1, false, kSplit3PromoteK>>::ops(),
};

}  // namespace conv_tc
}  // namespace jaxcnn
