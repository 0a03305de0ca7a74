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

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jaxcnn.ops.chain_args import (
    CONV1X1_DEPTHWISE_OPERANDS as OPERAND_NAMES,
    ChainConfig,
    activation_code,
    conv1x1_depthwise_fused,
    conv1x1_depthwise_output_shape,
    make_chain_config,
)
from jaxcnn.ops.chain_reference import conv1x1_depthwise_reference
from jaxcnn.ops.operand_checks import as_array, is_empty_batch
from jaxcnn.ops.primitive import LeadingBatchPrimitive

FFI_TARGET = "jaxcnn_conv1x1_depthwise_fwd"


class Conv1x1DepthwisePrimitive(LeadingBatchPrimitive):
    name = "jaxcnn_conv1x1_depthwise"
    # Only the batch factor n may stay sharded: the depthwise needs halo rows/columns, the
    # 1x1 contraction all input channels.
    sharding_rules = {OPERAND_NAMES: "n h w c, a b c m, m, d e f m, m -> n p q m"}

    @staticmethod
    def abstract(*operands, cfg: ChainConfig, operand_names):
        shape = conv1x1_depthwise_output_shape([o.shape for o in operands],
                                               [o.dtype for o in operands], cfg.stride, cfg.padding)
        return ShapedArray(shape, operands[0].dtype)

    @staticmethod
    def reference(*operands, cfg: ChainConfig, operand_names):
        return conv1x1_depthwise_reference(*operands, cfg=cfg)

    @classmethod
    def cuda_lowering(cls, ctx, *operands, cfg: ChainConfig, operand_names):
        x_aval, w1_aval = ctx.avals_in[:2]
        fused = conv1x1_depthwise_fused(x_aval.shape, w1_aval.shape[3], cfg.stride, x_aval.dtype,
                                        cfg.padding)
        (top, bottom), (left, right) = cfg.padding
        return cls.kernel_or_reference(
            ctx, operands, dict(cfg=cfg, operand_names=operand_names), FFI_TARGET, fused,
            stride=np.int64(cfg.stride), act1=activation_code(cfg.act1),
            act2=activation_code(cfg.act2), pad_top=np.int64(top), pad_bottom=np.int64(bottom),
            pad_left=np.int64(left), pad_right=np.int64(right))

Conv1x1DepthwisePrimitive.register()


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chain(cfg: ChainConfig, *operands):
    return Conv1x1DepthwisePrimitive.outer.bind(*operands, cfg=cfg, operand_names=OPERAND_NAMES)


def _chain_fwd(cfg, *operands):
    return _chain(cfg, *operands), operands


def _chain_bwd(cfg, operands, g):
    # Backward is unfused: XLA's transposes of the reference (it recomputes t).
    _, vjp = jax.vjp(functools.partial(conv1x1_depthwise_reference, cfg=cfg), *operands)
    return vjp(g)


_chain.defvjp(_chain_fwd, _chain_bwd)


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
    x, w1, wd = as_array(x, "x"), as_array(w1, "w1"), as_array(wd, "wd")
    b1, bd = (jnp.zeros(w.shape[-1:], w.dtype) if b is None else as_array(b, name)
              for b, w, name in ((b1, w1, "b1"), (bd, wd, "bd")))
    operands = (x, w1, b1, wd, bd)
    # Validate here too so errors point at the caller, not at a custom_vjp trace.
    out_shape = conv1x1_depthwise_output_shape([o.shape for o in operands],
                                               [o.dtype for o in operands], cfg.stride, cfg.padding)
    if is_empty_batch(x.shape):
        return jnp.zeros(out_shape, x.dtype)  # an empty batch: no kernel launch
    return _chain(cfg, *operands)
