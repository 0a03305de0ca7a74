// fp32 (TF32 / 3xTF32) tensor-core conv kernels, configs 0-2 (see conv2d_tc_configs.h).
// Split from the other configs of this dtype so the two compile in parallel.
#include "conv_tc/conv2d_tc_common_tables.cuh"

namespace jaxcnn {
namespace conv_tc {

const TcKernelOps kTf32KernelsA[3] = JAXCNN_TC_CONFIGS_0_2(float, false);

}  // namespace conv_tc
}  // namespace jaxcnn
