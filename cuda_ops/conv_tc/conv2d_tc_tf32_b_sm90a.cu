// fp32 (TF32 / 3xTF32) tensor-core conv kernels, configs 3-6 (see conv2d_tc_configs.h).
// Split from the other configs of this dtype so the two compile in parallel.
#include "conv_tc/conv2d_tc_common_tables.cuh"

namespace jaxcnn {
namespace conv_tc {

const TcKernelOps kTf32KernelsB[4] = JAXCNN_TC_CONFIGS_3_6(float, false);

}  // namespace conv_tc
}  // namespace jaxcnn
