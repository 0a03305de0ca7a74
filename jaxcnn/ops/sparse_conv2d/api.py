"""`jaxcnn.sparse_conv2d`: a 2-D convolution that skips the zeros of its input (e.g. ReLU
outputs), and `jaxcnn.sparse_conv2d_pool`: the same with a fused ReLU + max-pool epilogue.

CUDA runs cuda_ops/sparse through XLA FFI. Stride-1 convs without a pool run the tile kernel:
per output tile it stages the input halo, ballots its nonzeros per channel and scatters only
those into register accumulators. The rest run an encode kernel (one nonzero bitmask per input
pixel per 32 channels) and an output-stationary walk over the set bits. Either way the work is
proportional to the nonzeros; the kernels' scratch is the call's second result, sized by the
library. Every other platform runs the lax reference (a dense conv with
the same results). One primitive, NHWC, groups 1; other layouts transpose around it.
Gradients are dense (the reference's transposes).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import mlir

from jaxcnn._native import library, queries
from jaxcnn.ops.conv2d.config import conv2d_output_shape, make_config
from jaxcnn.ops.conv2d.reference import linear_conv2d
from jaxcnn.ops.layout_transform.api import to_layout
from jaxcnn.ops.layout_axes import convert_shape
from jaxcnn.ops.operand_checks import (
    as_array,
    as_optional_array,
    check_int32_args,
    is_empty_batch,
    with_batch,
)
from jaxcnn.ops.conv_bias_primitive import ConvBiasPrimitive
from jaxcnn.ops.primitive import STRICT_ENV, _warn_fallback_once
from jaxcnn.ops.sparse_conv2d.config import (
    ACTIVATIONS,
    OPERAND_NAMES,
    SparseConfig,
    check_conv_config,
    make_pool_spec,
    kernel_params,
    mask_bytes,
    sparse_output_shape,
)
from jaxcnn.ops.sparse_conv2d.reference import sparse_reference

FFI_TARGET = "jaxcnn_sparse_conv2d_fwd"


class SparseConv2dPrimitive(ConvBiasPrimitive):
    name = "jaxcnn_sparse_conv2d"
    conv_output_shape = staticmethod(sparse_output_shape)
    conv_reference = staticmethod(sparse_reference)

    @classmethod
    def _cuda_or_reference(cls, ctx, *args, **params):
        # A library built before this op has no handler for it: same policy as no library.
        if library.handlers_registered() and not library.target_registered(FFI_TARGET):
            reason = library.missing_target_reason(FFI_TARGET)
            if os.environ.get(STRICT_ENV) == "1":
                raise RuntimeError(f"{cls.name}: CUDA lowering without its handler: {reason}")
            _warn_fallback_once(cls.name, reason)
            return mlir.lower_fun(functools.partial(cls.reference, **params),
                                  multiple_results=False)(ctx, *args)
        return super()._cuda_or_reference(ctx, *args, **params)

    @classmethod
    def cuda_lowering(cls, ctx, x, w, bias, *, cfg: SparseConfig, operand_names):
        x_aval, w_aval, b_aval = ctx.avals_in
        conv = cfg.conv
        _, p, q, _ = conv2d_output_shape(x_aval.shape, x_aval.dtype, w_aval.shape, w_aval.dtype,
                                         b_aval.shape, b_aval.dtype, conv)
        pool = cfg.pool
        window, stride, pads = ((0, 0), (0, 0), ((0, 0), (0, 0))) if pool is None else (
            pool.window, pool.stride, pool.padding)
        # The kernels' scratch is a second result: XLA allocates it with the program's
        # temporaries, the handler allocates nothing (CUDA-graph safe). The library sizes it for
        # its own plan; without the library, the walk kernel's masks.
        scratch_bytes = queries.sparse_conv_scratch_bytes(kernel_params(x_aval.shape, w_aval.shape, cfg,
                                                                  x_aval.dtype))
        if scratch_bytes is None:
            scratch_bytes = mask_bytes(x_aval.shape)
        scratch = ShapedArray((max(scratch_bytes, 16),), np.uint8)
        ctx = ctx.replace(avals_out=[*ctx.avals_out, scratch])
        y, _ = jax.ffi.ffi_lowering(FFI_TARGET)(
            ctx, x, w, bias,
            stride_h=np.int64(conv.stride[0]), stride_w=np.int64(conv.stride[1]),
            pad_h=np.int64(conv.padding[0][0]), pad_w=np.int64(conv.padding[1][0]),
            dilation_h=np.int64(conv.dilation[0]), dilation_w=np.int64(conv.dilation[1]),
            activation=np.int64(ACTIVATIONS.index(conv.activation)),
            pool_window_h=np.int64(window[0]), pool_window_w=np.int64(window[1]),
            pool_stride_h=np.int64(stride[0]), pool_stride_w=np.int64(stride[1]),
            pool_pad_h=np.int64(pads[0][0]), pool_pad_w=np.int64(pads[1][0]),
            conv_out_h=np.int64(p), conv_out_w=np.int64(q),
        )
        return [y]



SparseConv2dPrimitive.register()


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _sparse(cfg: SparseConfig, x, w, bias):
    return SparseConv2dPrimitive.outer.bind(x, w, bias, cfg=cfg, operand_names=OPERAND_NAMES)


def _sparse_fwd(cfg, x, w, bias):
    y = _sparse(cfg, x, w, bias)
    return y, (x, w, bias, y)


def _sparse_bwd(cfg, residuals, g):
    x, w, bias, y = residuals
    if cfg.pool is not None:
        # Dense backward through the reference (recomputes the conv, routes the pool's max).
        _, vjp = jax.vjp(lambda *a: sparse_reference(*a, cfg), x, w, bias)
        return vjp(g)
    if cfg.conv.activation == "relu":
        g = jnp.where(y > 0, g, jnp.zeros_like(g))
    conv = cfg.conv.replace(precision="highest")
    _, conv_vjp = jax.vjp(lambda x_, w_: linear_conv2d(x_, w_, conv), x, w)
    dx, dw = conv_vjp(g)
    db = jnp.sum(g.astype(jnp.float32), axis=(0, 1, 2)).astype(bias.dtype)
    return dx, dw, db


_sparse.defvjp(_sparse_fwd, _sparse_bwd)


def _bias_or_zeros(bias, w):
    return jnp.zeros(w.shape[-1:], w.dtype) if bias is None else jnp.asarray(bias)


def sparse_conv2d(x, w, bias=None, *, stride=1, padding="SAME", dilation=1, activation=None,
                  layout="NHWC", precision=None):
    """`jaxcnn.conv2d` (groups 1) that skips the zeros of `x`: its work shrinks with them.

    Args: as `jaxcnn.conv2d` (x [N, H, W, C] or the same dims in `layout` order, HWIO w of
      x's dtype, optional bias [K], stride, padding, dilation, activation None/"relu").
      precision is accepted for conv2d compatibility and validated; the kernel always
      computes exact fp32 products and sums (what "highest" asks for).

    Returns:
      [N, P, Q, K] (in `layout` order) in x's dtype, accumulated in float32, rounded once.
      Equal to the dense conv up to fp32 summation order (a zero times an inf/NaN weight,
      which the dense conv would turn into NaN, is skipped). An empty batch (N = 0) gives the
      empty result.
    """
    x, w = as_array(x, "x"), as_array(w, "w")
    bias = as_optional_array(bias, "bias")
    check_int32_args(stride=stride, padding=padding, dilation=dilation)
    cfg = make_config(x.shape, w.shape, stride=stride, padding=padding, dilation=dilation,
                      groups=1, activation=activation, layout=layout, precision=precision)
    # An empty batch is validated as one image, then gives the empty result (no kernel).
    n_axis = cfg.layout.index("N")
    empty = is_empty_batch(x.shape, n_axis)
    x_shape = with_batch(x.shape, 1, n_axis) if empty else x.shape
    sparse_cfg = SparseConfig(cfg.replace(layout="NHWC"))
    check_conv_config(sparse_cfg.conv)
    bias_shape, bias_dtype = (None, None) if bias is None else (bias.shape, bias.dtype)
    out_shape = conv2d_output_shape(x_shape, x.dtype, w.shape, w.dtype, bias_shape, bias_dtype, cfg)
    sparse_output_shape(convert_shape(x_shape, cfg.layout, "NHWC"), x.dtype, w.shape, w.dtype,
                        bias_shape, bias_dtype, sparse_cfg)
    if empty:
        return jnp.zeros(with_batch(out_shape, 0, n_axis), x.dtype)
    bias = _bias_or_zeros(bias, w)
    if cfg.layout == "NHWC":
        return _sparse(sparse_cfg, x, w, bias)
    y = _sparse(sparse_cfg, to_layout(x, cfg.layout, "NHWC"), w, bias)
    return to_layout(y, "NHWC", cfg.layout)


def sparse_conv2d_pool(x, w, bias=None, *, stride=1, padding="SAME", pool_window=2, pool_stride=None,
                       pool_padding="VALID"):
    """maxpool(relu(conv(x, w) + bias)) in one zero-skipping kernel: the pre-pool conv output
    stays in registers (never reaches DRAM). NHWC x, HWIO w.

    Args:
      x, w, bias, stride, padding: as `sparse_conv2d` (ReLU is implied).
      pool_window, pool_stride, pool_padding: as `jaxcnn.max_pool2d`'s window, stride (None:
        the window) and padding ("VALID", "SAME", ints or pairs; pads smaller than the window)
        over the conv output; overlapping windows (e.g. 3x3 stride 2) are fine.

    Returns:
      [N, PP, PQ, K] in x's dtype, equal to reduce_window(max) of
      sparse_conv2d(x, w, bias, activation="relu").
    """
    x, w = as_array(x, "x"), as_array(w, "w")
    bias = as_optional_array(bias, "bias")
    check_int32_args(stride=stride, padding=padding)
    cfg = make_config(x.shape, w.shape, stride=stride, padding=padding, groups=1,
                      activation="relu", layout="NHWC", precision="highest")
    empty = is_empty_batch(x.shape)
    x_shape = with_batch(x.shape, 1) if empty else x.shape
    check_conv_config(cfg)
    bias_shape, bias_dtype = (None, None) if bias is None else (bias.shape, bias.dtype)
    _, p, q, _ = conv2d_output_shape(x_shape, x.dtype, w.shape, w.dtype, bias_shape, bias_dtype, cfg)
    sparse_cfg = SparseConfig(cfg, make_pool_spec((p, q), pool_window, pool_stride, pool_padding))
    out_shape = sparse_output_shape(x_shape, x.dtype, w.shape, w.dtype, bias_shape, bias_dtype,
                                    sparse_cfg)
    if empty:
        return jnp.zeros(with_batch(out_shape, 0), x.dtype)
    return _sparse(sparse_cfg, x, w, _bias_or_zeros(bias, w))
