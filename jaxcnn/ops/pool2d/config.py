"""Argument normalization, validation and shape rules of pooling.

Everything here runs at trace time on static shapes, so bad input fails before any kernel
runs, with an error that names the argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from jaxcnn.ops.conv2d.config import SUPPORTED_DTYPES, _int_pair, padding_pairs
from jaxcnn.ops.layout_axes import LAYOUTS
from jaxcnn.ops.operand_checks import (
    INT32_LIMIT,
    check_int32,
    check_int32_extent,
    check_int32_shape,
)

Pair = tuple[int, int]

MODES = ("max", "avg")


@dataclass(frozen=True)
class Pool2dConfig:
    """Static parameters of one pooling; padding is explicit (top, bottom), (left, right)."""

    mode: str  # "max" | "avg"
    window: Pair
    stride: Pair
    padding: tuple[Pair, Pair]
    layout: str
    count_include_pad: bool = True  # avg only: divide by the full window

    @property
    def spatial_axes(self) -> Pair:
        return spatial_axes(self.layout)

    @property
    def batch_axis(self) -> int:
        return batch_axis(self.layout)


def spatial_axes(layout: str) -> Pair:
    """(H axis, W axis) of a layout."""
    return (layout.index("H"), layout.index("W"))


def batch_axis(layout: str) -> int:
    return layout.index("N")


def check_dtype(name: str, dtype: Any) -> None:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{name} dtype must be a floating dtype, got {dtype!r}") from None
    if dt not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise TypeError(f"{name} dtype must be one of {names}, got {dt.name}")


def check_layout(layout: Any) -> str:
    if not isinstance(layout, str):
        raise TypeError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    upper = layout.upper()
    if upper not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return upper


def make_pool_config(
    x_shape: Sequence[int],
    x_dtype: Any,
    *,
    mode: str,
    window: Any,
    stride: Any = None,
    padding: Any = "VALID",
    layout: Any = "NHWC",
    count_include_pad: Any = True,
) -> Pool2dConfig:
    """Normalizes and validates the arguments of max_pool2d / avg_pool2d.

    stride=None means stride = window (non-overlapping windows, as Keras and PyTorch).
    padding: "SAME", "VALID", an int, an (h, w) pair or ((top, bottom), (left, right)).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    layout_ = check_layout(layout)
    if len(x_shape) != 4:
        raise ValueError(f"x must be rank 4 ({layout_}), got shape {tuple(x_shape)}")
    if not isinstance(count_include_pad, (bool, np.bool_)):
        raise TypeError(f"count_include_pad must be a bool, got {count_include_pad!r}")
    h_axis, w_axis = spatial_axes(layout_)
    spatial = (int(x_shape[h_axis]), int(x_shape[w_axis]))
    window_, stride_, pads = normalize_pool_args(spatial, window, stride, padding)
    cfg = Pool2dConfig(mode, window_, stride_, pads, layout_, bool(count_include_pad))
    pool2d_output_shape(x_shape, x_dtype, cfg)  # fails here, naming the argument
    return cfg


def normalize_pool_args(extent: Pair, window: Any, stride: Any, padding: Any,
                        prefix: str = "") -> tuple[Pair, Pair, tuple[Pair, Pair]]:
    """(window, stride, ((top, bottom), (left, right))) of a pool over an input of spatial
    `extent` (H, W), from any of max_pool2d's forms; stride None means the window. Errors name
    the arguments with `prefix` ("pool_" for the pool of conv2d_pool / sparse_conv2d_pool)."""
    window_ = _int_pair(window, prefix + "window", 1)
    stride_ = window_ if stride is None else _int_pair(stride, prefix + "stride", 1)
    check_int32(prefix + "window", window_)
    check_int32(prefix + "stride", stride_)
    try:
        pads = padding_pairs(padding, extent, window_, stride_)
    except (TypeError, ValueError) as err:
        if not prefix:
            raise
        raise type(err)(str(err).replace("padding", prefix + "padding", 1)) from None
    return window_, stride_, pads


def pool_output_hw(extent: Pair, window: Pair, stride: Pair, padding: tuple[Pair, Pair],
                   prefix: str = "", input_name: str = "the padded input") -> Pair:
    """The one validation of a pool's geometry (max_pool2d, avg_pool2d and the fused pools of
    conv2d_pool / sparse_conv2d_pool) over an input of spatial `extent`; returns (P, Q).
    Errors name the arguments with `prefix`; `input_name` says what is pooled."""
    (pt, pb), (pl, pr) = padding
    if min(pt, pb, pl, pr) < 0:
        raise ValueError(f"{prefix}padding must be non-negative, got {padding}")
    if min(window) < 1:
        raise ValueError(f"{prefix}window must be >= 1, got {window}")
    if min(stride) < 1:
        raise ValueError(f"{prefix}stride must be >= 1, got {stride}")
    check_int32(prefix + "window", window)
    check_int32(prefix + "stride", stride)
    check_int32(prefix + "padding", padding)
    if window[0] * window[1] >= INT32_LIMIT:
        raise ValueError(f"{prefix}window {window} has {window[0] * window[1]} taps, past the "
                         "kernels' int32 indexing (< 2**31)")
    if max(pt, pb) >= window[0] or max(pl, pr) >= window[1]:
        # A window lying wholly in the padding has no input to pool: max would give -inf,
        # avg 0 or NaN (0 / 0). SAME padding is always smaller than the window.
        raise ValueError(
            f"{prefix}padding {padding} must be smaller than {prefix}window {window} on each side"
        )
    padded = (extent[0] + pt + pb, extent[1] + pl + pr)
    check_int32_extent(prefix + "padding", max(padded), input_name)
    if padded[0] < window[0] or padded[1] < window[1]:
        raise ValueError(
            f"{prefix}window {window} does not fit {input_name} {padded} "
            f"(unpadded {tuple(extent)}, {prefix}padding {padding})"
        )
    return ((padded[0] - window[0]) // stride[0] + 1, (padded[1] - window[1]) // stride[1] + 1)


def pool2d_output_shape(x_shape: Sequence[int], x_dtype: Any, cfg: Pool2dConfig) -> tuple:
    """Validates x against cfg and returns the pooled shape (in cfg.layout). N = 0 (an empty
    batch) is valid: its result is empty too."""
    if len(x_shape) != 4:
        raise ValueError(f"x must be rank 4 ({cfg.layout}), got shape {tuple(x_shape)}")
    check_dtype("x", x_dtype)
    h_axis, w_axis = cfg.spatial_axes
    n_axis = cfg.batch_axis
    if any(int(d) == 0 for i, d in enumerate(x_shape) if i != n_axis):
        raise ValueError(f"x must not have zero-size H, W or C (N = 0 is fine), got shape "
                         f"{tuple(x_shape)}")
    check_int32_shape("x", x_shape, n_axis)
    h, w = int(x_shape[h_axis]), int(x_shape[w_axis])
    p, q = pool_output_hw((h, w), cfg.window, cfg.stride, cfg.padding)
    out = list(int(d) for d in x_shape)
    out[h_axis], out[w_axis] = p, q
    # Without padding the result is no bigger than x: only the padding can make it too big.
    check_int32_shape("padding", out, n_axis, what=f"padding {cfg.padding} makes the result")
    return tuple(out)


def avg_divisors(x_shape: Sequence[int], cfg: Pool2dConfig) -> np.ndarray:
    """Per-output-pixel [P, Q] divisor of avg pooling with count_include_pad=False: the
    window's in-bounds taps (at least 1: pool_output_hw refuses a window wholly in padding)."""
    h_axis, w_axis = cfg.spatial_axes
    out = pool2d_output_shape(x_shape, np.float32, cfg)

    def counts(size, n_out, window, stride, pad_lo):
        start = np.arange(n_out) * stride - pad_lo
        return np.clip(np.minimum(start + window, size) - np.maximum(start, 0), 0, None)

    rows = counts(x_shape[h_axis], out[h_axis], cfg.window[0], cfg.stride[0], cfg.padding[0][0])
    cols = counts(x_shape[w_axis], out[w_axis], cfg.window[1], cfg.stride[1], cfg.padding[1][0])
    return np.outer(rows, cols).astype(np.float32)

