// fp32 tensor-core conv kernels with a residual (the epilogue's source tensor), config
// pp_128x64 only (see conv2d_tc_configs.h): TF32 (precision default) and 3xTF32 (highest).
#include "conv_tc/conv2d_tc_cutlass.cuh"

namespace jaxcnn {
namespace conv_tc {

const TcKernelOps kTf32KernelsResidual[1] = {
    // pp_128x64_c1
    TcConvRunner<TcConvKernel<float, 128, 64, 128, 1, false, 0, false, true>>::ops(),
};

const TcKernelOps kTf32x3KernelsResidual[1] = {
    // pp_128x64_c1
    TcConvRunner<TcConvKernel<float, 128, 64, 128, 1, false, kSplit3PromoteK, false, true>>::ops(),
};

}  // namespace conv_tc
}  // namespace jaxcnn
