"""`jaxcnn.conv1x1_depthwise`: a 1x1 conv followed by a depthwise 3x3 conv as one fused
primitive.

    t = act1(conv1x1(x, w1) + b1)                                   rounded to x's dtype
    y = act2(depthwise3x3(t, wd, stride, padding) + bd)

(MobileNetV2's expand -> depthwise; padding 1 on every side, or Keras' (0, 1) before a
stride-2 "valid" depthwise.) NHWC activations, HWIO weights (wd [3, 3, 1, M], one
filter per channel). CUDA runs cuda_ops/chain through XLA FFI: each tile's 1x1 output over its
halo stays in shared memory and the depthwise reads it there (straight fusion), so the
expanded t never reaches DRAM. The fused kernel takes bf16/fp16 with C, M multiples of 8 and
C <= 256; float32 and other shapes run XLA's unfused convs (the reference), as does every
other platform. Gradients are the reference's.
"""

from __future__ import annotations

import numpy as np

from jaxcnn.ops.chain.config import (
    CONV1X1_DEPTHWISE_OPERANDS as OPERAND_NAMES,
    ChainConfig,
    conv1x1_depthwise_fused,
    conv1x1_depthwise_output_shape,
    make_chain_config,
)
from jaxcnn.ops.chain.primitive import ChainPrimitive
from jaxcnn.ops.chain.reference import conv1x1_depthwise_reference

FFI_TARGET = "jaxcnn_conv1x1_depthwise_fwd"


class Conv1x1DepthwisePrimitive(ChainPrimitive):
    name = "jaxcnn_conv1x1_depthwise"
    operand_names = OPERAND_NAMES
    ffi_target = FFI_TARGET
    # Only the batch factor n may stay sharded: the depthwise needs halo rows/columns, the
    # 1x1 contraction all input channels.
    sharding_rules = {OPERAND_NAMES: "n h w c, a b c m, m, d e f m, m -> n p q m"}

    block_reference = staticmethod(conv1x1_depthwise_reference)

    @staticmethod
    def output_shape(shapes, dtypes, cfg: ChainConfig):
        return conv1x1_depthwise_output_shape(shapes, dtypes, cfg.stride, cfg.padding)

    @staticmethod
    def fused_kernel(avals_in, cfg: ChainConfig):
        x_aval, w1_aval = avals_in[:2]
        fused = conv1x1_depthwise_fused(x_aval.shape, w1_aval.shape[3], cfg.stride, x_aval.dtype,
                                        cfg.padding)
        (top, bottom), (left, right) = cfg.padding
        return fused, {"stride": np.int64(cfg.stride), "pad_top": np.int64(top),
                       "pad_bottom": np.int64(bottom), "pad_left": np.int64(left),
                       "pad_right": np.int64(right)}

Conv1x1DepthwisePrimitive.register()


def conv1x1_depthwise(x, w1, wd, b1=None, bd=None, *, stride=1, activations=("relu", "relu"),
                      padding=1):
    """act2(depthwise3x3(act1(conv1x1(x, w1) + b1), wd, stride, padding) + bd), fused into
    one kernel on CUDA for bf16/fp16 with channel counts multiples of 8 and at most 256 input
    channels; float32 and other shapes run XLA's unfused convs.

    Args:
      x: [N, H, W, C] float32, bfloat16 or float16 (NHWC).
      w1: [1, 1, C, M] (HWIO); wd: [3, 3, 1, M] (depthwise HWIO, feature_group_count M);
        same dtype as x.
      b1, bd: [M] biases, or None for zero bias.
      stride: of the depthwise conv, 1 or 2.
      activations: (act1, act2), each None or a conv epilogue activation but leaky_relu
        ("relu", "relu6", "silu", "hard_swish", "gelu_tanh", "gelu_erf", "sigmoid"); NaN
        propagates.
      padding: the depthwise conv's zero padding of t: an int for every side, or
        ((top, bottom), (left, right)); each side 0, 1 or 2.

    Returns:
      [N, P, Q, M] in x's dtype, P = (H + top + bottom - 3) // stride + 1 (Q likewise; at
      padding 1, (H - 1) // stride + 1). Each conv accumulates
      in float32 and rounds once to x's dtype (the intermediate too, as the unfused layers
      would). An empty batch (N = 0) gives the empty result.
    """
    cfg = make_chain_config(activations, stride, padding=padding)
    return Conv1x1DepthwisePrimitive.chain_call(cfg, x, w1, wd, b1, bd)
