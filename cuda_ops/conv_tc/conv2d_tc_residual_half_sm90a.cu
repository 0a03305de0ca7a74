// bf16/fp16 tensor-core conv kernels with a residual (the epilogue's source tensor), for the
// configs kResidualConfigs lists (see conv2d_tc_configs.h): pp_128x128 and pp_128x64.
// B is read from the HWIO weights directly (MN-major, no transpose).
#include "conv_tc/conv2d_tc_cutlass.cuh"

namespace jaxcnn {
namespace conv_tc {

const TcKernelOps kBf16KernelsResidual[2] = {
    // pp_128x128_c1
    TcConvRunner<TcConvKernel<cutlass::bfloat16_t, 128, 128, 128, 1, false, 0, kHalfBFromHwio,
                              true>>::ops(),
    // pp_128x64_c1
    TcConvRunner<TcConvKernel<cutlass::bfloat16_t, 128, 64, 128, 1, false, 0, kHalfBFromHwio,
                              true>>::ops(),
};

const TcKernelOps kF16KernelsResidual[2] = {
    // pp_128x128_c1
    TcConvRunner<TcConvKernel<cutlass::half_t, 128, 128, 128, 1, false, 0, kHalfBFromHwio,
                              true>>::ops(),
    // pp_128x64_c1
    TcConvRunner<TcConvKernel<cutlass::half_t, 128, 64, 128, 1, false, 0, kHalfBFromHwio,
                              true>>::ops(),
};

}  // namespace conv_tc
}  // namespace jaxcnn
