"""`jaxcnn.conv3x3_conv1x1`: a 3x3 conv followed by a 1x1 conv as one fused primitive.

    t = act1(conv3x3(x, w3, stride 1, padding 1) + b3)     rounded to x's dtype
    y = act2(conv1x1(t, w1) + b1)

(ResNet bottleneck's conv2 -> conv3, a VGG-style 3x3 then a projection.) NHWC activations,
HWIO weights. CUDA runs cuda_ops/chain through XLA FFI: each tile's 3x3 output stays in shared
memory and the 1x1 reads it there (straight fusion), so t never reaches DRAM. The fused kernel
takes bf16/fp16 with C, M, K multiples of 8 and M <= 384; float32 and other shapes run XLA's
unfused convs (the reference), as does every other platform. It runs only with
algorithm="fused": "auto" (the default) currently runs XLA's convs on every shape, since the
kernel measured 0.2-0.8x of them on an H100 (config.conv3x3_conv1x1_runs_fused has the
numbers and is the one place the choice is made). Gradients are the reference's.
"""

from __future__ import annotations

from jaxcnn.ops.chain.config import (
    CONV3X3_CONV1X1_OPERANDS as OPERAND_NAMES,
    ChainConfig,
    conv3x3_conv1x1_output_shape,
    conv3x3_conv1x1_runs_fused,
    make_chain_config,
)
from jaxcnn.ops.chain.primitive import ChainPrimitive
from jaxcnn.ops.chain.reference import conv3x3_conv1x1_reference

FFI_TARGET = "jaxcnn_conv3x3_conv1x1_fwd"


class Conv3x3Conv1x1Primitive(ChainPrimitive):
    name = "jaxcnn_conv3x3_conv1x1"
    operand_names = OPERAND_NAMES
    ffi_target = FFI_TARGET
    # Only the batch factor n may stay sharded: the 3x3 needs halo rows/columns, the
    # contractions need all channels.
    sharding_rules = {OPERAND_NAMES: "n h w c, a b c m, m, d e m k, k -> n h w k"}

    block_reference = staticmethod(conv3x3_conv1x1_reference)

    @staticmethod
    def output_shape(shapes, dtypes, cfg: ChainConfig):
        return conv3x3_conv1x1_output_shape(shapes, dtypes)

    @staticmethod
    def fused_kernel(avals_in, cfg: ChainConfig):
        x_aval, w3_aval, _, w1_aval, _ = avals_in
        fused = conv3x3_conv1x1_runs_fused(x_aval.shape, w3_aval.shape[3], w1_aval.shape[3],
                                           x_aval.dtype, cfg.algorithm, (cfg.act1, cfg.act2))
        return fused, {}

Conv3x3Conv1x1Primitive.register()


def conv3x3_conv1x1(x, w3, w1, b3=None, b1=None, *, activations=("relu", "relu"),
                    algorithm="auto"):
    """act2(conv1x1(act1(conv3x3(x, w3, padding 1) + b3), w1) + b1). With algorithm="fused",
    one fused kernel on CUDA for bf16/fp16 with channel counts multiples of 8 and at most 384
    mid channels; float32, other shapes and other algorithms run XLA's unfused convs.

    Args:
      x: [N, H, W, C] float32, bfloat16 or float16 (NHWC).
      w3: [3, 3, C, M] (HWIO), stride 1, padding 1; w1: [1, 1, M, K]; same dtype as x.
      b3, b1: [M], [K] biases, or None for zero bias.
      activations: (act1, act2), each None or a conv epilogue activation but leaky_relu
        ("relu", "relu6", "silu", "hard_swish", "gelu_tanh", "gelu_erf", "sigmoid"; the fused
        kernel takes None, relu and relu6, the others run XLA's unfused convs); NaN
        propagates.
      algorithm: "auto" (default), "fused" or "xla". "fused": the fused kernel where it
        applies (else XLA's unfused convs). "xla": always XLA's unfused convs (cuDNN on CUDA).
        "auto": currently "xla" on every shape; on an H100 (bf16) the fused kernel ran at
        0.2-0.8x of XLA's layers (e.g. ResNet-50 conv2 -> conv3 at 56x56, N = 64: 190 us vs
        95 us), since its mma.sync mainloop reaches ~110 TFLOP/s while cuDNN's wgmma convs
        reach several times that, and fusing saves only t's DRAM round trip.

    Returns:
      [N, H, W, K] in x's dtype. Each conv accumulates in float32 and rounds once to x's dtype
      (the intermediate too, as the unfused layers would). An empty batch (N = 0) gives the
      empty result.
    """
    cfg = make_chain_config(activations, algorithm=algorithm)
    return Conv3x3Conv1x1Primitive.chain_call(cfg, x, w3, w1, b3, b1)
