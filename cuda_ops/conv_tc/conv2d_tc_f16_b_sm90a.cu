// fp16 tensor-core conv kernels, configs 3-6 (see conv2d_tc_configs.h).
// Split from the other configs of this dtype so the two compile in parallel.
// B is read from the HWIO weights directly (MN-major, no transpose).
#include "conv_tc/conv2d_tc_common_tables.cuh"

namespace jaxcnn {
namespace conv_tc {

const TcKernelOps kF16KernelsB[4] = JAXCNN_TC_CONFIGS_3_6(cutlass::half_t, kHalfBFromHwio);

}  // namespace conv_tc
}  // namespace jaxcnn
