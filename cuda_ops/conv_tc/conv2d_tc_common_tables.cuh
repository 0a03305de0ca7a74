// The common config table (conv2d_tc_configs.h) of one element type, in the two halves that
// conv2d_tc_<dtype>_a_sm90a.cu (configs 0-2) and conv2d_tc_<dtype>_b_sm90a.cu (configs 3-6)
// define, so the two compile in parallel. JAXCNN_TC_CONFIGS_0_2 and JAXCNN_TC_CONFIGS_3_6 are
// the brace-enclosed initializers of those halves' `const TcKernelOps` arrays: one
// TcConvKernel<Element, tile M, tile N, K-tile bytes, cluster M, cooperative, PromoteK = 0,
// BMnMajor> per config, in config order. BMnMajor: bf16/fp16 pass kHalfBFromHwio (B read from
// the HWIO weights directly, no transpose); TF32 passes false (TcConvKernel's default).
#pragma once

#include "conv_tc/conv2d_tc_cutlass.cuh"

// Configs 0-2: `const TcKernelOps table[3]`.
#define JAXCNN_TC_CONFIGS_0_2(Element, BMnMajor)                                      \
  {                                                                                   \
    /* coop_128x256_c2 */                                                             \
    TcConvRunner<TcConvKernel<Element, 128, 256, 128, 2, true, 0, BMnMajor>>::ops(),  \
    /* coop_256x128_c2 */                                                             \
    TcConvRunner<TcConvKernel<Element, 256, 128, 128, 2, true, 0, BMnMajor>>::ops(),  \
    /* pp_128x128_c1 */                                                               \
    TcConvRunner<TcConvKernel<Element, 128, 128, 128, 1, false, 0, BMnMajor>>::ops(), \
  }

// Configs 3-6: `const TcKernelOps table[4]`.
#define JAXCNN_TC_CONFIGS_3_6(Element, BMnMajor)                                     \
  {                                                                                  \
    /* pp_128x64_c1 */                                                               \
    TcConvRunner<TcConvKernel<Element, 128, 64, 128, 1, false, 0, BMnMajor>>::ops(), \
    /* pp_64x64_c1 */                                                                \
    TcConvRunner<TcConvKernel<Element, 64, 64, 128, 1, false, 0, BMnMajor>>::ops(),  \
    /* pp_128x64_smallc */                                                           \
    TcConvRunner<TcConvKernel<Element, 128, 64, 32, 1, false, 0, BMnMajor>>::ops(),  \
    /* pp_128x128_k64 */                                                             \
    TcConvRunner<TcConvKernel<Element, 128, 128, 64, 1, false, 0, BMnMajor>>::ops(), \
  }
