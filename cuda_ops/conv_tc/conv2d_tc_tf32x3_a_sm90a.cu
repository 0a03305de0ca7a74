// fp32 kHighest (3xTF32, two-level accumulation) tensor-core conv kernels,
// configs 0-2 of the 3xTF32 table (see conv2d_tc_configs.h).
#include "conv_tc/conv2d_tc_cutlass.cuh"

namespace jaxcnn {
namespace conv_tc {

using Element = float;

const TcKernelOps kTf32x3KernelsA[3] = {
    // coop_128x128_c2
    TcConvRunner<TcConvKernel<Element, 128, 128, 128, 2, true, kSplit3PromoteK>>::ops(),
    // coop_256x64_c2
    TcConvRunner<TcConvKernel<Element, 256, 64, 128, 2, true, kSplit3PromoteK>>::ops(),
    // pp_64x128_c1
    TcConvRunner<TcConvKernel<Element, 64, 128, 128, 1, false, kSplit3PromoteK>>::ops(),
};

}  // namespace conv_tc
}  // namespace jaxcnn
