"""`jaxcnn.conv3x3_conv1x1`: a 3x3 conv followed by a 1x1 conv as one fused primitive.

    t = act1(conv3x3(x, w3, stride 1, padding 1) + b3)     rounded to x's dtype
    y = act2(conv1x1(t, w1) + b1)

(ResNet bottleneck's conv2 -> conv3, a VGG-style 3x3 then a projection.) NHWC activations,
HWIO weights. CUDA runs cuda_ops/chain through XLA FFI: each tile's 3x3 output stays in shared
memory and the 1x1 reads it there (straight fusion), so t never reaches DRAM. The fused kernel
takes bf16/fp16 with C, M, K multiples of 8 and M <= 384; float32 and other shapes run XLA's
unfused convs (the reference), as does every other platform. It runs only with
algorithm="fused": "auto" (the default) currently runs XLA's convs on every shape, since the
kernel measured 0.2-0.8x of them on an H100 (chain_args.conv3x3_conv1x1_runs_fused has the
numbers and is the one place the choice is made). Gradients are the reference's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.core import ShapedArray

from jaxcnn.ops.chain_args import (
    CONV3X3_CONV1X1_OPERANDS as OPERAND_NAMES,
    ChainConfig,
    activation_code,
    conv3x3_conv1x1_output_shape,
    conv3x3_conv1x1_runs_fused,
    make_chain_config,
)
from jaxcnn.ops.chain_reference import conv3x3_conv1x1_reference
from jaxcnn.ops.operand_checks import as_array, is_empty_batch
from jaxcnn.ops.primitive import LeadingBatchPrimitive

FFI_TARGET = "jaxcnn_conv3x3_conv1x1_fwd"


class Conv3x3Conv1x1Primitive(LeadingBatchPrimitive):
    name = "jaxcnn_conv3x3_conv1x1"
    # Only the batch factor n may stay sharded: the 3x3 needs halo rows/columns, the
    # contractions need all channels.
    sharding_rules = {OPERAND_NAMES: "n h w c, a b c m, m, d e m k, k -> n h w k"}

    @staticmethod
    def abstract(*operands, cfg: ChainConfig, operand_names):
        shape = conv3x3_conv1x1_output_shape([o.shape for o in operands], [o.dtype for o in operands])
        return ShapedArray(shape, operands[0].dtype)

    @staticmethod
    def reference(*operands, cfg: ChainConfig, operand_names):
        return conv3x3_conv1x1_reference(*operands, cfg=cfg)

    @classmethod
    def cuda_lowering(cls, ctx, *operands, cfg: ChainConfig, operand_names):
        x_aval, w3_aval, _, w1_aval, _ = ctx.avals_in
        fused = conv3x3_conv1x1_runs_fused(x_aval.shape, w3_aval.shape[3], w1_aval.shape[3],
                                           x_aval.dtype, cfg.algorithm, (cfg.act1, cfg.act2))
        return cls.kernel_or_reference(
            ctx, operands, dict(cfg=cfg, operand_names=operand_names), FFI_TARGET, fused,
            act1=activation_code(cfg.act1), act2=activation_code(cfg.act2))

Conv3x3Conv1x1Primitive.register()


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chain(cfg: ChainConfig, *operands):
    return Conv3x3Conv1x1Primitive.outer.bind(*operands, cfg=cfg, operand_names=OPERAND_NAMES)


def _chain_fwd(cfg, *operands):
    return _chain(cfg, *operands), operands


def _chain_bwd(cfg, operands, g):
    # Backward is unfused: XLA's transposes of the reference (it recomputes t).
    _, vjp = jax.vjp(functools.partial(conv3x3_conv1x1_reference, cfg=cfg), *operands)
    return vjp(g)


_chain.defvjp(_chain_fwd, _chain_bwd)


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
    x, w3, w1 = as_array(x, "x"), as_array(w3, "w3"), as_array(w1, "w1")
    b3, b1 = (jnp.zeros(w.shape[-1:], w.dtype) if b is None else as_array(b, name)
              for b, w, name in ((b3, w3, "b3"), (b1, w1, "b1")))
    operands = (x, w3, b3, w1, b1)
    # Validate here too so errors point at the caller, not at a custom_vjp trace.
    out_shape = conv3x3_conv1x1_output_shape([o.shape for o in operands],
                                             [o.dtype for o in operands])
    if is_empty_batch(x.shape):
        return jnp.zeros(out_shape, x.dtype)  # an empty batch: no kernel launch
    return _chain(cfg, *operands)
