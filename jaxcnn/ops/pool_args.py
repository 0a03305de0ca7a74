"""Argument normalization, validation and shape rules of pooling and softmax.

Everything here runs at trace time on static shapes, so bad input fails before any kernel
runs, with an error that names the argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from jaxcnn.ops.conv_args import SUPPORTED_DTYPES, _int_pair, padding_pairs

Pair = tuple[int, int]

LAYOUTS = ("NHWC", "NCHW", "CHWN")
# The FFI `layout` attribute; same codes as TensorLayout in cuda_ops/common/conv2d_params.h.
LAYOUT_CODES = {"NHWC": 0, "NCHW": 1, "CHWN": 2}
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
    check_dtype("x", x_dtype)
    if 0 in tuple(x_shape):
        raise ValueError(f"x must not have zero-size dimensions, got shape {tuple(x_shape)}")
    window_ = _int_pair(window, "window", 1)
    stride_ = window_ if stride is None else _int_pair(stride, "stride", 1)
    if not isinstance(count_include_pad, (bool, np.bool_)):
        raise TypeError(f"count_include_pad must be a bool, got {count_include_pad!r}")
    h_axis, w_axis = spatial_axes(layout_)
    spatial = (int(x_shape[h_axis]), int(x_shape[w_axis]))
    pads = padding_pairs(padding, spatial, window_, stride_)
    cfg = Pool2dConfig(mode, window_, stride_, pads, layout_, bool(count_include_pad))
    pool2d_output_shape(x_shape, x_dtype, cfg)  # fails here, naming the argument
    return cfg


def pool2d_output_shape(x_shape: Sequence[int], x_dtype: Any, cfg: Pool2dConfig) -> tuple:
    """Validates x against cfg and returns the pooled shape (in cfg.layout)."""
    if len(x_shape) != 4:
        raise ValueError(f"x must be rank 4 ({cfg.layout}), got shape {tuple(x_shape)}")
    check_dtype("x", x_dtype)
    if 0 in tuple(x_shape):
        raise ValueError(f"x must not have zero-size dimensions, got shape {tuple(x_shape)}")
    (pt, pb), (pl, pr) = cfg.padding
    if min(pt, pb, pl, pr) < 0:
        raise ValueError(f"padding must be non-negative, got {cfg.padding}")
    if min(cfg.window) < 1:
        raise ValueError(f"window must be >= 1, got {cfg.window}")
    if min(cfg.stride) < 1:
        raise ValueError(f"stride must be >= 1, got {cfg.stride}")
    h_axis, w_axis = cfg.spatial_axes
    h, w = int(x_shape[h_axis]), int(x_shape[w_axis])
    padded = (h + pt + pb, w + pl + pr)
    if padded[0] < cfg.window[0] or padded[1] < cfg.window[1]:
        raise ValueError(
            f"window {cfg.window} does not fit the padded input {padded} "
            f"(x shape {tuple(x_shape)}, layout {cfg.layout}, padding {cfg.padding})"
        )
    p = (padded[0] - cfg.window[0]) // cfg.stride[0] + 1
    q = (padded[1] - cfg.window[1]) // cfg.stride[1] + 1
    out = list(int(d) for d in x_shape)
    out[h_axis], out[w_axis] = p, q
    return tuple(out)


def avg_divisors(x_shape: Sequence[int], cfg: Pool2dConfig) -> np.ndarray:
    """Per-output-pixel [P, Q] divisor of avg pooling with count_include_pad=False: the
    window's in-bounds taps (0 for a window entirely in padding)."""
    h_axis, w_axis = cfg.spatial_axes
    out = pool2d_output_shape(x_shape, np.float32, cfg)

    def counts(size, n_out, window, stride, pad_lo):
        start = np.arange(n_out) * stride - pad_lo
        return np.clip(np.minimum(start + window, size) - np.maximum(start, 0), 0, None)

    rows = counts(x_shape[h_axis], out[h_axis], cfg.window[0], cfg.stride[0], cfg.padding[0][0])
    cols = counts(x_shape[w_axis], out[w_axis], cfg.window[1], cfg.stride[1], cfg.padding[1][0])
    return np.outer(rows, cols).astype(np.float32)


def softmax_axis(shape: Sequence[int], dtype: Any, axis: Any) -> int:
    """Validates softmax's operand and returns `axis` as a non-negative int."""
    check_dtype("x", dtype)
    if len(shape) < 1:
        raise ValueError("x must have rank >= 1 for softmax, got a scalar")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -len(shape) <= axis < len(shape):
        raise ValueError(f"axis {axis} is out of range for x of rank {len(shape)}")
    return int(axis) % len(shape)
