"""Argument validation and shape rules of the zero-skipping conv (`jaxcnn.sparse_conv2d`) and
its fused max-pool variant (`jaxcnn.sparse_conv2d_pool`).

The conv arguments are conv2d's (conv_args.make_config / conv2d_output_shape, groups=1); the
pool arguments are max_pool2d's, named pool_window / pool_stride / pool_padding. Everything
runs at trace time on static shapes, so bad input fails before any kernel runs, with an error
that names the argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from jaxcnn.ops.conv_args import Conv2dConfig, _int_pair, conv2d_output_shape, padding_pairs

Pair = tuple[int, int]
OPERAND_NAMES = ("x", "w", "bias")  # bias is always present (zeros when the caller has none)


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
    if cfg.groups != 1:
        raise ValueError(f"groups must be 1 for the sparse conv, got {cfg.groups}")


def make_pool_spec(conv_out_hw: Pair, pool_window: Any, pool_stride: Any, pool_padding: Any) -> MaxPoolSpec:
    """Normalizes the pool arguments against the conv output size (H, W)."""
    window = _int_pair(pool_window, "pool_window", 1)
    stride = window if pool_stride is None else _int_pair(pool_stride, "pool_stride", 1)
    try:
        pads = padding_pairs(pool_padding, conv_out_hw, window, stride)
    except (TypeError, ValueError) as e:
        raise type(e)(f"pool_padding: {e}") from None
    (pt, pb), (pl, pr) = pads
    if min(pt, pb, pl, pr) < 0:
        raise ValueError(f"pool_padding must be non-negative, got {pads}")
    if pt >= window[0] or pb >= window[0] or pl >= window[1] or pr >= window[1]:
        # A window of padding alone would output -inf: no real pooling layer does that.
        raise ValueError(f"pool_padding {pads} must be smaller than pool_window {window} on each side")
    padded = (conv_out_hw[0] + pt + pb, conv_out_hw[1] + pl + pr)
    if padded[0] < window[0] or padded[1] < window[1]:
        raise ValueError(
            f"pool_window {window} does not fit the padded conv output {padded} "
            f"(conv output {tuple(conv_out_hw)}, pool_padding {pads})"
        )
    return MaxPoolSpec(window, stride, pads)


def pooled_size(conv_out_hw: Pair, pool: MaxPoolSpec) -> Pair:
    (pt, pb), (pl, pr) = pool.padding
    return ((conv_out_hw[0] + pt + pb - pool.window[0]) // pool.stride[0] + 1,
            (conv_out_hw[1] + pl + pr - pool.window[1]) // pool.stride[1] + 1)


def sparse_output_shape(x_shape: Sequence[int], x_dtype: Any, w_shape: Sequence[int], w_dtype: Any,
                        bias_shape: Sequence[int] | None, bias_dtype: Any,
                        cfg: SparseConfig) -> tuple[int, int, int, int]:
    """Validates the operands; returns the (pooled) output shape in cfg.conv.layout."""
    check_conv_config(cfg.conv)
    out = conv2d_output_shape(x_shape, x_dtype, w_shape, w_dtype, bias_shape, bias_dtype, cfg.conv)
    if cfg.pool is None:
        return out
    # The pooled op is NHWC only (its layout is fixed by sparse_conv2d_pool).
    n, p, q, k = out
    pp, pq = pooled_size((p, q), cfg.pool)
    return (n, pp, pq, k)


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
