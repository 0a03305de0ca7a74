"""Argument validation and shape rules of the zero-skipping conv (`jaxcnn.sparse_conv2d`) and
its fused max-pool variant (`jaxcnn.sparse_conv2d_pool`).

The conv arguments are conv2d's (conv2d's config: make_config / conv2d_output_shape, groups=1); the
pool arguments are max_pool2d's, named pool_window / pool_stride / pool_padding. Everything
runs at trace time on static shapes, so bad input fails before any kernel runs, with an error
that names the argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from jaxcnn.ops.conv2d.config import (
    Conv2dConfig,
    check_conv_ints,
    check_conv_result_int32,
    check_conv_shapes,
    conv2d_output_shape,
)
from jaxcnn.ops.pool2d.config import normalize_pool_args, pool_output_hw

Pair = tuple[int, int]
OPERAND_NAMES = ("x", "w", "bias")  # bias is always present (zeros when the caller has none)
# The kernels' epilogues; index = the FFI `activation` attribute.
ACTIVATIONS = (None, "relu")


@dataclass(frozen=True)
class MaxPoolSpec:
    """The fused epilogue maxpool(relu(.)): explicit pads ((top, bottom), (left, right))."""

    window: Pair
    stride: Pair
    padding: tuple[Pair, Pair]


@dataclass(frozen=True)
class SparseConfig:
    """Static parameters of one call: the conv (NHWC, groups 1) and an optional pool."""

    conv: Conv2dConfig
    pool: MaxPoolSpec | None = None


def check_conv_config(cfg: Conv2dConfig) -> None:
    """What the sparse kernels take of conv2d's arguments; static ints within int32."""
    if cfg.groups != 1:
        raise ValueError(f"groups must be 1 for the sparse conv, got {cfg.groups}")
    if cfg.activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS} for the sparse conv, "
                         f"got {cfg.activation!r}")
    check_conv_ints(cfg)


def make_pool_spec(conv_out_hw: Pair, pool_window: Any, pool_stride: Any, pool_padding: Any) -> MaxPoolSpec:
    """Normalizes and validates the pool arguments against the conv output size (H, W): the
    rules of max_pool2d (pool2d's config), arguments named pool_*."""
    window, stride, pads = normalize_pool_args(conv_out_hw, pool_window, pool_stride, pool_padding,
                                               prefix="pool_")
    pool = MaxPoolSpec(window, stride, pads)
    pooled_size(conv_out_hw, pool)
    return pool


def pooled_size(conv_out_hw: Pair, pool: MaxPoolSpec) -> Pair:
    """(PP, PQ) of the pool over the conv output; raises on a bad pool."""
    return pool_output_hw(conv_out_hw, pool.window, pool.stride, pool.padding, prefix="pool_",
                          input_name="the padded conv output")


def sparse_output_shape(x_shape: Sequence[int], x_dtype: Any, w_shape: Sequence[int], w_dtype: Any,
                        bias_shape: Sequence[int] | None, bias_dtype: Any,
                        cfg: SparseConfig) -> tuple[int, int, int, int]:
    """Validates the (NHWC) operands; returns the (pooled) NHWC output shape."""
    check_conv_config(cfg.conv)
    out = conv2d_output_shape(x_shape, x_dtype, w_shape, w_dtype, bias_shape, bias_dtype, cfg.conv)
    check_conv_shapes(x_shape, w_shape, cfg.conv)
    if cfg.pool is not None:
        n, p, q, k = out
        out = (n, *pooled_size((p, q), cfg.pool), k)
    check_conv_result_int32(out, cfg.conv)
    return out


def mask_bytes(x_nhwc: Sequence[int]) -> int:
    """The walk kernel's scratch: one uint32 nonzero mask per input pixel per 32 channels."""
    n, h, w, c = x_nhwc
    return n * h * w * ((c + 31) // 32) * 4


def kernel_params(x_nhwc: Sequence[int], w_shape: Sequence[int], cfg: SparseConfig,
                  dtype=np.float32) -> dict:
    """The fields of cuda_ops/sparse/sparse_conv.h's SparseConvParams, by name (`dtype`: the
    storage type, whose size picks the tile kernel's staging)."""
    n, h, wd, c = x_nhwc
    r, s, _, k = w_shape
    conv = cfg.conv
    (pt, pb), (pl, pr) = conv.padding
    p = (h + pt + pb - conv.dilation[0] * (r - 1) - 1) // conv.stride[0] + 1
    q = (wd + pl + pr - conv.dilation[1] * (s - 1) - 1) // conv.stride[1] + 1
    params = dict(N=n, H=h, W=wd, C=c, R=r, S=s, K=k, P=p, Q=q, stride_h=conv.stride[0],
                  stride_w=conv.stride[1], pad_h=pt, pad_w=pl, dilation_h=conv.dilation[0],
                  dilation_w=conv.dilation[1], activation=int(conv.activation == "relu"),
                  elem_bytes=np.dtype(dtype).itemsize)
    if cfg.pool is not None:
        pp, pq = pooled_size((p, q), cfg.pool)
        params.update(pool_h=cfg.pool.window[0], pool_w=cfg.pool.window[1],
                      pool_stride_h=cfg.pool.stride[0], pool_stride_w=cfg.pool.stride[1],
                      pool_pad_h=cfg.pool.padding[0][0], pool_pad_w=cfg.pool.padding[1][0], PP=pp, PQ=pq)
    return params
