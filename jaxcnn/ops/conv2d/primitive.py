"""The conv2d primitive behind `jaxcnn.conv2d` (jaxcnn/ops/conv2d/api.py: arguments and the kernel
decision): abstract eval, CUDA lowering to the FFI handler, batching, sharding, and the
differentiable bind `bind_conv2d`.

CUDA runs the kernel family `cfg.algorithm` names (tensor-core implicit GEMM, the Hopper wgmma
kernel, depthwise, the stem kernel, the CUDA-core direct kernel, or "auto": the handler picks)
through XLA FFI; every other platform runs the lax reference. Gradients use the reference's
transposes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jaxcnn._native import queries
from jaxcnn.ops.conv2d.config import (
    ALGORITHMS,
    LAYOUTS,
    PRECISIONS,
    Conv2dConfig,
    conv2d_output_shape,
)
from jaxcnn.ops.conv2d.reference import (
    check_residual,
    conv2d_reference,
    linear_conv2d,
)
from jaxcnn.ops.epilogue import ACTIVATION_CODES, activation_grad
from jaxcnn.ops.layout_axes import convert_shape
from jaxcnn.ops.primitive import BatchShardedPrimitive

# Activations whose gradient the output alone determines (the backward pass needs no recompute).
_GRAD_FROM_OUTPUT = (None, "relu", "relu6")
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
        residual = f", {y}" if "residual" in params["operand_names"] else ""
        return f"{x}, r s i k{bias}{residual} -> {y}"

    @classmethod
    def batch_axes(cls, params):
        n_axis = params["cfg"].layout.index("N")
        names = params["operand_names"]
        return tuple(n_axis if name in ("x", "residual") else None for name in names), n_axis

    @staticmethod
    def abstract(x, w, *rest, cfg: Conv2dConfig, operand_names):
        b, r = _bias_residual(rest, operand_names)
        shape = conv2d_output_shape(
            x.shape, x.dtype, w.shape, w.dtype,
            None if b is None else b.shape, None if b is None else b.dtype, cfg,
        )
        if r is not None:
            check_residual(r.shape, r.dtype, shape, x.dtype)
        return ShapedArray(shape, x.dtype)

    @staticmethod
    def reference(x, w, *rest, cfg: Conv2dConfig, operand_names):
        bias, residual = _bias_residual(rest, operand_names)
        return conv2d_reference(x, w, bias, cfg, residual=residual)

    @classmethod
    def cuda_lowering(cls, ctx, x, w, *rest, cfg: Conv2dConfig, operand_names):
        # The residual target always takes a bias (conv2d passes zeros when there is none).
        if "residual" in operand_names:
            target = "jaxcnn_conv2d_fwd_residual"
        else:
            target = "jaxcnn_conv2d_fwd" if rest else "jaxcnn_conv2d_fwd_nobias"
        x_aval, w_aval = ctx.avals_in[:2]
        # Scratch (filter re-layout, fp32 splits) is a second result XLA allocates with the
        # rest of the program's temporaries: no allocation inside the handler, CUDA-graph safe.
        scratch = queries.conv2d_workspace_bytes(
            convert_shape(x_aval.shape, cfg.layout, "NHWC"), w_aval.shape,
            convert_shape(ctx.avals_out[0].shape, cfg.layout, "NHWC"), x_aval.dtype, cfg,
            residual="residual" in operand_names,
        )
        ctx = ctx.replace(avals_out=[*ctx.avals_out, ShapedArray((scratch,), np.uint8)])
        y, _ = jax.ffi.ffi_lowering(target)(
            ctx, x, w, *rest,
            stride_h=np.int64(cfg.stride[0]), stride_w=np.int64(cfg.stride[1]),
            pad_h=np.int64(cfg.padding[0][0]), pad_w=np.int64(cfg.padding[1][0]),
            dilation_h=np.int64(cfg.dilation[0]), dilation_w=np.int64(cfg.dilation[1]),
            groups=np.int64(cfg.groups), activation=np.int64(ACTIVATION_CODES[cfg.activation]),
            layout=np.int64(LAYOUTS.index(cfg.layout)),
            precision=np.int64(PRECISIONS.index(cfg.precision)),
            algorithm=np.int64(ALGORITHMS.index(cfg.algorithm)), alpha=np.float32(cfg.alpha),
        )
        return [y]

    @classmethod
    def batcher(cls, batched_args, batch_dims, *, cfg: Conv2dConfig, operand_names):
        args = dict(zip(operand_names, batched_args))
        dims = dict(zip(operand_names, batch_dims))
        size = next(a.shape[d] for a, d in zip(batched_args, batch_dims) if d is not None)
        lead = {name: _leading(args[name], dims[name], size) for name in operand_names}
        if dims["w"] is None and dims.get("bias") is None:
            return _batch_x_only(cls, lead, cfg, operand_names)
        return _batch_as_groups(cls, lead, cfg, operand_names)


def _leading(a, d, size):
    """`a` with its vmapped axis first (broadcast to `size` where it has none)."""
    return jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)


def _bias_residual(rest, operand_names):
    """(bias, residual) from the operands after x and w, each None where absent."""
    named = dict(zip(operand_names[2:], rest))
    return named.get("bias"), named.get("residual")


def _batch_x_only(cls, lead, cfg, operand_names):
    """vmap over x (and the residual) alone folds into the batch dimension: one launch."""
    n_axis = cfg.layout.index("N")

    def fold(a):  # [B, ...N...] -> [..., B*N, ...]
        a = jnp.moveaxis(a, 0, n_axis)
        return a.reshape(*a.shape[:n_axis], a.shape[n_axis] * a.shape[n_axis + 1], *a.shape[n_axis + 2:])

    b = lead["x"].shape[0]
    operands = [fold(lead["x"]), lead["w"][0]]
    operands += [lead[name][0] if name == "bias" else fold(lead[name]) for name in operand_names[2:]]
    y = cls.outer.bind(*operands, cfg=cfg, operand_names=operand_names)
    n = y.shape[n_axis] // b
    return y.reshape(*y.shape[:n_axis], b, n, *y.shape[n_axis + 1:]), n_axis


def _batch_as_groups(cls, lead, cfg, operand_names):
    """vmap over weights becomes a grouped conv: vmapped copy b is groups b*G .. b*G+G-1."""
    layout = cfg.layout
    to_nhwc = [1 + layout.index(d) for d in "NHWC"]

    def channels_last_grouped(a):  # [B, (layout)] -> NHWC with channels (B, C) flattened
        a = jnp.moveaxis(a, to_nhwc, [1, 2, 3, 4])
        bsz, n, h, wdt, c = a.shape
        return jnp.moveaxis(a, 0, 3).reshape(n, h, wdt, bsz * c)

    x, w = lead["x"], lead["w"]
    bsz, k = w.shape[0], w.shape[-1]
    _, r, s, cg, _ = w.shape
    operands = [channels_last_grouped(x), jnp.moveaxis(w, 0, 3).reshape(r, s, cg, bsz * k)]
    for name in operand_names[2:]:
        operands.append(lead[name].reshape(bsz * k) if name == "bias" else channels_last_grouped(lead[name]))
    grouped = cfg.replace(groups=cfg.groups * bsz, layout="NHWC")
    y = cls.outer.bind(*operands, cfg=grouped, operand_names=operand_names)
    y = jnp.moveaxis(y.reshape(*y.shape[:3], bsz, k), 3, 0)
    if layout != "NHWC":
        y = jnp.moveaxis(y, [1, 2, 3, 4], to_nhwc)
    return y, 0


Conv2dPrimitive.register()


def _bind(cfg: Conv2dConfig, x, w, bias, residual):
    names = ["x", "w"]
    operands = [x, w]
    if residual is not None and bias is None:
        # The residual kernels always read a bias: zeros cost K elements.
        k = w.shape[3]
        bias = jnp.zeros((k,), x.dtype)
    if bias is not None:
        names.append("bias")
        operands.append(bias)
    if residual is not None:
        names.append("residual")
        operands.append(residual)
    return Conv2dPrimitive.outer.bind(*operands, cfg=cfg, operand_names=tuple(names))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def bind_conv2d(cfg: Conv2dConfig, x, w, bias, residual):
    """The conv2d primitive on validated operands (bias/residual may be None), with its VJP."""
    return _bind(cfg, x, w, bias, residual)


def _conv2d_fwd(cfg, x, w, bias, residual):
    y = _bind(cfg, x, w, bias, residual)
    return y, (x, w, bias, residual, y)


def _conv2d_bwd(cfg, saved, g):
    x, w, bias, residual, y = saved
    if cfg.activation == "relu":
        g = jnp.where(y > 0, g, jnp.zeros_like(g))
    elif cfg.activation == "relu6":
        g = jnp.where((y > 0) & (y < 6), g, jnp.zeros_like(g))
    elif cfg.activation not in _GRAD_FROM_OUTPUT:
        # The activation's derivative needs its input: recompute the pre-activation in fp32.
        pre = conv2d_reference(x, w, bias, cfg.replace(activation=None), residual=residual,
                               out_dtype=jnp.float32)
        g = activation_grad(pre, g, cfg.activation, cfg.alpha)
    g32 = g.astype(jnp.float32)
    g = g.astype(x.dtype)
    _, conv_vjp = jax.vjp(lambda x_, w_: linear_conv2d(x_, w_, cfg), x, w)
    dx, dw = conv_vjp(g)
    not_channels = tuple(i for i, d in enumerate(cfg.layout) if d != "C")
    db = None if bias is None else jnp.sum(g32, axis=not_channels).astype(bias.dtype)
    dres = None if residual is None else g.astype(residual.dtype)
    return dx, dw, db, dres


bind_conv2d.defvjp(_conv2d_fwd, _conv2d_bwd)


