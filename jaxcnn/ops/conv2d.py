"""`jaxcnn.conv2d`: NHWC/HWIO 2-D convolution (+bias, +ReLU) as a jax primitive.

CUDA runs the shared-memory tiled direct convolution of cuda_ops/conv through XLA FFI; every
other platform runs the lax reference. Gradients use the reference's transposes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jaxcnn.ops.conv_args import Conv2dConfig, conv2d_output_shape, make_config
from jaxcnn.ops.conv_reference import conv2d_reference, linear_conv2d
from jaxcnn.ops.primitive import BatchShardedPrimitive

ACTIVATION_CODES = {None: 0, "relu": 1}


class Conv2dPrimitive(BatchShardedPrimitive):
    name = "jaxcnn_conv2d"
    sharding_rules = {
        ("x", "w"): "n h w c, r s i k -> n p q k",
        ("x", "w", "bias"): "n h w c, r s i k, k -> n p q k",
    }

    @staticmethod
    def abstract(x, w, *bias, cfg: Conv2dConfig, operand_names):
        b = bias[0] if bias else None
        shape = conv2d_output_shape(
            x.shape, x.dtype, w.shape, w.dtype,
            None if b is None else b.shape, None if b is None else b.dtype, cfg,
        )
        return ShapedArray(shape, x.dtype)

    @staticmethod
    def reference(x, w, *bias, cfg: Conv2dConfig, operand_names):
        return conv2d_reference(x, w, bias[0] if bias else None, cfg)

    @classmethod
    def cuda_lowering(cls, ctx, x, w, *bias, cfg: Conv2dConfig, operand_names):
        target = "jaxcnn_conv2d_fwd" if bias else "jaxcnn_conv2d_fwd_nobias"
        return jax.ffi.ffi_lowering(target)(
            ctx, x, w, *bias,
            stride_h=np.int64(cfg.stride[0]), stride_w=np.int64(cfg.stride[1]),
            pad_h=np.int64(cfg.padding[0][0]), pad_w=np.int64(cfg.padding[1][0]),
            dilation_h=np.int64(cfg.dilation[0]), dilation_w=np.int64(cfg.dilation[1]),
            groups=np.int64(cfg.groups), activation=np.int64(ACTIVATION_CODES[cfg.activation]),
        )

    @classmethod
    def batcher(cls, batched_args, batch_dims, *, cfg: Conv2dConfig, operand_names):
        x, w, *bias = batched_args
        xd, wd, *bd = batch_dims
        if all(d is None for d in (wd, *bd)):
            return _batch_x_only(cls, x, xd, w, bias, cfg, operand_names)
        return _batch_as_groups(cls, x, xd, w, wd, bias, bd, cfg, operand_names)


def _batch_x_only(cls, x, xd, w, bias, cfg, operand_names):
    """vmap over x alone folds into the batch dimension: one launch for all of it."""
    x = jnp.moveaxis(x, xd, 0)
    b, n = x.shape[:2]
    y = cls.outer.bind(x.reshape(b * n, *x.shape[2:]), w, *bias, cfg=cfg, operand_names=operand_names)
    return y.reshape(b, n, *y.shape[1:]), 0


def _batch_as_groups(cls, x, xd, w, wd, bias, bd, cfg, operand_names):
    """vmap over weights becomes a grouped conv: vmapped copy b is groups b*G .. b*G+G-1."""
    size = next(a.shape[d] for a, d in zip((x, w, *bias), (xd, wd, *bd)) if d is not None)

    def lead(a, d):
        return jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)

    x, w = lead(x, xd), lead(w, wd)
    bsz, n, h, wdt, c = x.shape
    _, r, s, cg, k = w.shape
    x = jnp.moveaxis(x, 0, 3).reshape(n, h, wdt, bsz * c)
    w = jnp.moveaxis(w, 0, 3).reshape(r, s, cg, bsz * k)
    bias = [lead(bias[0], bd[0]).reshape(bsz * k)] if bias else []
    grouped = Conv2dConfig(cfg.stride, cfg.padding, cfg.dilation, cfg.groups * bsz, cfg.activation)
    y = cls.outer.bind(x, w, *bias, cfg=grouped, operand_names=operand_names)
    y = y.reshape(*y.shape[:3], bsz, k)
    return jnp.moveaxis(y, 3, 0), 0


Conv2dPrimitive.register()


def _bind(cfg: Conv2dConfig, x, w, bias):
    operands = (x, w) if bias is None else (x, w, bias)
    names = ("x", "w") if bias is None else ("x", "w", "bias")
    return Conv2dPrimitive.outer.bind(*operands, cfg=cfg, operand_names=names)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _conv2d(cfg: Conv2dConfig, x, w, bias):
    return _bind(cfg, x, w, bias)


def _conv2d_fwd(cfg, x, w, bias):
    y = _bind(cfg, x, w, bias)
    return y, (x, w, bias, y)


def _conv2d_bwd(cfg, residuals, g):
    x, w, bias, y = residuals
    if cfg.activation == "relu":
        g = jnp.where(y > 0, g, jnp.zeros_like(g))
    _, conv_vjp = jax.vjp(lambda x_, w_: linear_conv2d(x_, w_, cfg), x, w)
    dx, dw = conv_vjp(g)
    db = None if bias is None else jnp.sum(g.astype(jnp.float32), axis=(0, 1, 2)).astype(bias.dtype)
    return dx, dw, db


_conv2d.defvjp(_conv2d_fwd, _conv2d_bwd)


def conv2d(
    x,
    w,
    bias=None,
    *,
    stride=1,
    padding="SAME",
    dilation=1,
    groups=1,
    activation=None,
):
    """2-D convolution of NHWC `x` with HWIO `w`, plus optional `bias` and ReLU.

    Args:
      x: [N, H, W, C] float32, bfloat16 or float16.
      w: [R, S, C // groups, K], same dtype as x.
      bias: optional [K], same dtype as x.
      stride, dilation: int or (h, w) pair, >= 1 (dilation applies to the kernel).
      padding: "SAME", "VALID", an int, an (h, w) pair, or ((top, bottom), (left, right)).
      groups: feature groups (groups == C is depthwise).
      activation: None or "relu", applied after the bias.

    Returns:
      [N, P, Q, K] in x's dtype, accumulated in float32.
    """
    x, w = jnp.asarray(x), jnp.asarray(w)
    bias = None if bias is None else jnp.asarray(bias)
    cfg = make_config(
        x.shape, w.shape, stride=stride, padding=padding, dilation=dilation,
        groups=groups, activation=activation,
    )
    # Validate here too so errors point at the caller, not at a custom_vjp trace.
    conv2d_output_shape(
        x.shape, x.dtype, w.shape, w.dtype,
        None if bias is None else bias.shape, None if bias is None else bias.dtype, cfg,
    )
    return _conv2d(cfg, x, w, bias)
