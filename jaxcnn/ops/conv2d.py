"""`jaxcnn.conv2d`: 2-D convolution (+bias, +ReLU) of NHWC/NCHW/CHWN activations with HWIO
weights, as a jax primitive.

CUDA runs one of the kernel families of cuda_ops (tensor-core implicit GEMM, the Hopper wgmma
kernel for 3x3 stride-1 convs, depthwise, or the CUDA-core direct kernel; `algorithm="auto"`
lets the handler pick) through XLA FFI; every other
platform runs the lax reference. Gradients use the reference's transposes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jaxcnn import _ffi
from jaxcnn.ops.conv_args import (
    ALGORITHMS,
    LAYOUTS,
    PRECISIONS,
    Conv2dConfig,
    conv2d_output_shape,
    make_config,
)
from jaxcnn.ops.layouts import convert_shape
from jaxcnn.ops.conv_reference import conv2d_reference, linear_conv2d, xla_conv2d
from jaxcnn.ops.primitive import BatchShardedPrimitive

ACTIVATION_CODES = {None: 0, "relu": 1}
_IN_FACTORS = dict(zip("NHWC", "nhwc"))
_OUT_FACTORS = dict(zip("NHWC", "npqk"))


class Conv2dPrimitive(BatchShardedPrimitive):
    name = "jaxcnn_conv2d"

    @classmethod
    def sharding_rule(cls, params) -> str:
        layout = params["cfg"].layout
        x = " ".join(_IN_FACTORS[d] for d in layout)
        y = " ".join(_OUT_FACTORS[d] for d in layout)
        bias = ", k" if "bias" in params["operand_names"] else ""
        return f"{x}, r s i k{bias} -> {y}"

    @classmethod
    def batch_axes(cls, params):
        n_axis = params["cfg"].layout.index("N")
        return (n_axis,) + (None,) * (len(params["operand_names"]) - 1), n_axis

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
        x_aval, w_aval = ctx.avals_in[:2]
        # Scratch (filter re-layout, fp32 splits) is a second result XLA allocates with the
        # rest of the program's temporaries: no allocation inside the handler, CUDA-graph safe.
        scratch = _ffi.conv2d_workspace_bytes(
            convert_shape(x_aval.shape, cfg.layout, "NHWC"), w_aval.shape,
            convert_shape(ctx.avals_out[0].shape, cfg.layout, "NHWC"), x_aval.dtype, cfg,
        )
        ctx = ctx.replace(avals_out=[*ctx.avals_out, ShapedArray((scratch,), np.uint8)])
        y, _ = jax.ffi.ffi_lowering(target)(
            ctx, x, w, *bias,
            stride_h=np.int64(cfg.stride[0]), stride_w=np.int64(cfg.stride[1]),
            pad_h=np.int64(cfg.padding[0][0]), pad_w=np.int64(cfg.padding[1][0]),
            dilation_h=np.int64(cfg.dilation[0]), dilation_w=np.int64(cfg.dilation[1]),
            groups=np.int64(cfg.groups), activation=np.int64(ACTIVATION_CODES[cfg.activation]),
            layout=np.int64(LAYOUTS.index(cfg.layout)),
            precision=np.int64(PRECISIONS.index(cfg.precision)),
            algorithm=np.int64(ALGORITHMS.index(cfg.algorithm)),
        )
        return [y]

    @classmethod
    def batcher(cls, batched_args, batch_dims, *, cfg: Conv2dConfig, operand_names):
        x, w, *bias = batched_args
        xd, wd, *bd = batch_dims
        if all(d is None for d in (wd, *bd)):
            return _batch_x_only(cls, x, xd, w, bias, cfg, operand_names)
        return _batch_as_groups(cls, x, xd, w, wd, bias, bd, cfg, operand_names)


def _batch_x_only(cls, x, xd, w, bias, cfg, operand_names):
    """vmap over x alone folds into the batch dimension: one launch for all of it."""
    n_axis = cfg.layout.index("N")
    x = jnp.moveaxis(x, xd, n_axis)  # the vmapped axis just before N
    b, n = x.shape[n_axis], x.shape[n_axis + 1]
    folded = x.reshape(*x.shape[:n_axis], b * n, *x.shape[n_axis + 2 :])
    y = cls.outer.bind(folded, w, *bias, cfg=cfg, operand_names=operand_names)
    return y.reshape(*y.shape[:n_axis], b, n, *y.shape[n_axis + 1 :]), n_axis


def _batch_as_groups(cls, x, xd, w, wd, bias, bd, cfg, operand_names):
    """vmap over weights becomes a grouped conv: vmapped copy b is groups b*G .. b*G+G-1."""
    size = next(a.shape[d] for a, d in zip((x, w, *bias), (xd, wd, *bd)) if d is not None)

    def lead(a, d):
        return jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)

    x, w = lead(x, xd), lead(w, wd)
    layout = cfg.layout
    if layout != "NHWC":  # regroup channels in NHWC, then back
        x = jnp.moveaxis(x, [1 + layout.index(d) for d in "NHWC"], [1, 2, 3, 4])
    bsz, n, h, wdt, c = x.shape
    _, r, s, cg, k = w.shape
    x = jnp.moveaxis(x, 0, 3).reshape(n, h, wdt, bsz * c)
    w = jnp.moveaxis(w, 0, 3).reshape(r, s, cg, bsz * k)
    bias = [lead(bias[0], bd[0]).reshape(bsz * k)] if bias else []
    grouped = cfg.replace(groups=cfg.groups * bsz, layout="NHWC")
    y = cls.outer.bind(x, w, *bias, cfg=grouped, operand_names=operand_names)
    y = jnp.moveaxis(y.reshape(*y.shape[:3], bsz, k), 3, 0)
    if layout != "NHWC":
        y = jnp.moveaxis(y, [1, 2, 3, 4], [1 + layout.index(d) for d in "NHWC"])
    return y, 0


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
    not_channels = tuple(i for i, d in enumerate(cfg.layout) if d != "C")
    db = None if bias is None else jnp.sum(g.astype(jnp.float32), axis=not_channels).astype(bias.dtype)
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
    layout="NHWC",
    precision=None,
    algorithm="auto",
):
    """2-D convolution of `x` with HWIO `w`, plus optional `bias` and ReLU.

    Args:
      x: [N, H, W, C] (or the same dims in `layout` order) float32, bfloat16 or float16.
      w: [R, S, C // groups, K], same dtype as x.
      bias: optional [K], same dtype as x.
      stride, dilation: int or (h, w) pair, >= 1 (dilation applies to the kernel).
      padding: "SAME", "VALID", an int, an (h, w) pair, or ((top, bottom), (left, right)).
      groups: feature groups (groups == C is depthwise).
      activation: None or "relu", applied after the bias.
      layout: "NHWC", "NCHW" or "CHWN": memory order of x and of the result.
      precision: float32 math. None/"default" may use TF32 tensor cores (like XLA's DEFAULT on
        GPUs); "highest" (or lax.Precision.HIGHEST) is fp32-accurate (3xTF32 or FMA).
      algorithm: "auto" (the handler picks), "tensor_core", "direct", "depthwise", "wgmma"
        (the Hopper TMA + wgmma kernel of jaxcnn.conv2d_pool without its pool: bf16/fp16 NHWC
        3x3 stride-1 SAME convs, groups 1, C a multiple of 32, K of 64; "auto" picks it where
        its tiles cover the image), "stem" (jaxcnn.conv2d_pool's small-GEMM-K stem kernel
        without its pool: NHWC, groups 1, activation="relu", R*S*C <= 512, K a multiple of 8
        (4 for fp32 at precision "default"); "auto" picks it where C rules out the tensor-core
        kernel, e.g. an RGB input), or "xla" (XLA's own lax.conv_general_dilated, then bias
        and ReLU in x's dtype, on every platform).

    Returns:
      [N, P, Q, K] (in `layout` order) in x's dtype, accumulated in float32.
    """
    x, w = jnp.asarray(x), jnp.asarray(w)
    bias = None if bias is None else jnp.asarray(bias)
    cfg = make_config(
        x.shape, w.shape, stride=stride, padding=padding, dilation=dilation,
        groups=groups, activation=activation, layout=layout, precision=precision,
        algorithm=algorithm,
    )
    # Validate here too so errors point at the caller, not at a custom_vjp trace.
    conv2d_output_shape(
        x.shape, x.dtype, w.shape, w.dtype,
        None if bias is None else bias.shape, None if bias is None else bias.dtype, cfg,
    )
    if cfg.algorithm == "xla":
        return xla_conv2d(x, w, bias, cfg)
    return _conv2d(cfg, x, w, bias)
