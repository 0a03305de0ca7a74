"""Argument normalization, validation and shape rules shared by the conv2d family of ops.

Everything here runs at trace time on static shapes, so bad input fails before any kernel
runs, with an error that names the argument.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from jax import lax

from jaxcnn._native.codes import CONV2D_ALGORITHMS, CONV2D_PRECISIONS
from jaxcnn.ops.epilogue import ACTIVATIONS, check_activation
from jaxcnn.ops.layout_axes import LAYOUTS, convert_shape  # x and y memory orders; weights are HWIO
from jaxcnn.ops.operand_checks import check_int32, check_int32_extent, check_int32_shape

SUPPORTED_DTYPES = (np.dtype("float32"), np.dtype("bfloat16"), np.dtype("float16"))
# fp32 math ("default" may use TF32, "highest" is fp32-accurate) and kernel family ("auto": the
# CUDA handler picks; "xla" runs XLA's own convolution), their codes the index.
PRECISIONS = CONV2D_PRECISIONS
ALGORITHMS = CONV2D_ALGORITHMS
# jaxcnn.conv2d's algorithm="auto" is a decision between XLA's conv and jaxcnn's families
# (jaxcnn/tuning/conv_choice.py); "jaxcnn" skips it and sends "auto" to the handler, which picks
# among its families alone (what measurements of "our kernel" and fused rewrites want).
HANDLER_ALGORITHM = "jaxcnn"

Pair = tuple[int, int]


@dataclass(frozen=True)
class Conv2dConfig:
    """Static parameters of one NHWC/HWIO convolution; padding is explicit (top,bottom),(left,right)."""

    stride: Pair
    padding: tuple[Pair, Pair]
    dilation: Pair
    groups: int
    activation: str | None
    layout: str = "NHWC"
    precision: str = "default"
    algorithm: str = "auto"
    alpha: float = 0.0  # leaky_relu's negative slope (epilogue.py); 0.0 for every other activation

    def replace(self, **changes: Any) -> "Conv2dConfig":
        return dataclasses.replace(self, **changes)


def normalize_precision(precision: Any) -> str:
    """None / "default" / "highest" / a lax.Precision -> "default" | "highest".

    lax's HIGH (bf16x3 on TPUs) is treated as "highest": on GPUs it is not cheaper."""
    if precision is None:
        return "default"
    if isinstance(precision, lax.Precision):
        return "default" if precision == lax.Precision.DEFAULT else "highest"
    if isinstance(precision, str) and precision.lower() in ("default", "high", "highest", "fastest"):
        return "default" if precision.lower() in ("default", "fastest") else "highest"
    raise ValueError(f"precision must be None, 'default', 'highest' or a lax.Precision, got {precision!r}")


def _int_pair(value: Any, name: str, minimum: int) -> Pair:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        pair = (int(value), int(value))
    elif isinstance(value, Sequence) and len(value) == 2 and all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value
    ):
        pair = (int(value[0]), int(value[1]))
    else:
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return pair


def padding_pairs(padding: Any, spatial: Pair, window: Pair, stride: Pair) -> tuple[Pair, Pair]:
    """Any `conv2d` padding form as explicit ((top, bottom), (left, right)); SAME/VALID as lax."""
    if isinstance(padding, str):
        mode = padding.upper()
        if mode not in ("SAME", "VALID"):
            raise ValueError(f"padding must be 'SAME', 'VALID', an int or pairs, got {padding!r}")
        pads = lax.padtype_to_pads(spatial, window, stride, mode)
        return (tuple(map(int, pads[0])), tuple(map(int, pads[1])))  # type: ignore[return-value]
    if isinstance(padding, Sequence) and len(padding) == 2 and all(
        isinstance(p, Sequence) and not isinstance(p, str) for p in padding
    ):
        rows = _int_pair(padding[0], "padding[0]", 0)
        cols = _int_pair(padding[1], "padding[1]", 0)
        return (rows, cols)
    ph, pw = _int_pair(padding, "padding", 0)
    return ((ph, ph), (pw, pw))


def make_config(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    *,
    stride: Any = 1,
    padding: Any = "SAME",
    dilation: Any = 1,
    groups: Any = 1,
    activation: str | None = None,
    layout: str = "NHWC",
    precision: Any = None,
    algorithm: str = "auto",
    alpha: Any = None,
) -> Conv2dConfig:
    """Normalizes the keyword arguments of `conv2d`; SAME/VALID become explicit pads."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    precision_ = normalize_precision(precision)
    stride_ = _int_pair(stride, "stride", 1)
    dilation_ = _int_pair(dilation, "dilation", 1)
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool):
        raise TypeError(f"groups must be an int, got {groups!r}")
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    alpha_ = check_activation(activation, alpha)
    if len(x_shape) != 4:
        raise ValueError(f"x must be rank 4 ({layout}), got shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(f"w must be rank 4 (HWIO), got shape {tuple(w_shape)}")
    _, h, wd, _ = convert_shape(x_shape, layout, "NHWC")
    window = (dilation_[0] * (w_shape[0] - 1) + 1, dilation_[1] * (w_shape[1] - 1) + 1)
    pads = padding_pairs(padding, (h, wd), window, stride_)
    return Conv2dConfig(stride_, pads, dilation_, int(groups), activation, layout, precision_, algorithm, alpha_)


def _check_dtype(name: str, dtype: Any) -> None:
    if np.dtype(dtype) not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise TypeError(f"{name} dtype must be one of {names}, got {np.dtype(dtype).name}")


def conv2d_output_shape(
    x_shape: Sequence[int],
    x_dtype: Any,
    w_shape: Sequence[int],
    w_dtype: Any,
    bias_shape: Sequence[int] | None,
    bias_dtype: Any,
    cfg: Conv2dConfig,
) -> tuple[int, int, int, int]:
    """Validates operands against `cfg` and returns the output shape (in cfg.layout)."""
    if len(x_shape) != 4:
        raise ValueError(f"x must be rank 4 ({cfg.layout}), got shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(f"w must be rank 4 (HWIO), got shape {tuple(w_shape)}")
    if 0 in convert_shape(x_shape, cfg.layout, "NHWC")[1:]:
        # N = 0 (an empty batch) is allowed: conv2d returns the empty result, as XLA does.
        raise ValueError(f"x must not have zero-size H, W or C, got shape {tuple(x_shape)}")
    if 0 in w_shape:
        raise ValueError(f"w must not have zero-size dimensions, got shape {tuple(w_shape)}")
    _check_dtype("x", x_dtype)
    if np.dtype(w_dtype) != np.dtype(x_dtype):
        raise TypeError(f"w dtype {np.dtype(w_dtype).name} must match x dtype {np.dtype(x_dtype).name}")
    n, h, wd, c = convert_shape(x_shape, cfg.layout, "NHWC")
    r, s, cg, k = w_shape
    g = cfg.groups
    if c % g:
        raise ValueError(f"x channels ({c}) must be divisible by groups ({g})")
    if cg * g != c:
        raise ValueError(f"w input channels ({cg}) times groups ({g}) must equal x channels ({c})")
    if k % g:
        raise ValueError(f"w output channels ({k}) must be divisible by groups ({g})")
    if bias_shape is not None:
        if tuple(bias_shape) != (k,):
            raise ValueError(f"bias must have shape ({k},), got {tuple(bias_shape)}")
        if np.dtype(bias_dtype) != np.dtype(x_dtype):
            raise TypeError(
                f"bias dtype {np.dtype(bias_dtype).name} must match x dtype {np.dtype(x_dtype).name}"
            )
    (pt, pb), (pl, pr) = cfg.padding
    if min(pt, pb, pl, pr) < 0:
        raise ValueError(f"padding must be non-negative, got {cfg.padding}")
    if min(cfg.stride) < 1:
        raise ValueError(f"stride must be >= 1, got {cfg.stride}")
    if min(cfg.dilation) < 1:
        raise ValueError(f"dilation must be >= 1, got {cfg.dilation}")
    p = (h + pt + pb - cfg.dilation[0] * (r - 1) - 1) // cfg.stride[0] + 1
    q = (wd + pl + pr - cfg.dilation[1] * (s - 1) - 1) // cfg.stride[1] + 1
    if p < 1 or q < 1:
        raise ValueError(
            f"the dilated window {(r, s)} (dilation {cfg.dilation}) does not fit the padded input "
            f"{(h + pt + pb, wd + pl + pr)}: output would be {(p, q)}"
        )
    if cfg.algorithm == "depthwise" and cg != 1:
        raise ValueError(f"algorithm='depthwise' needs groups == x channels ({c}), got groups={g}")
    return convert_shape((n, p, q, k), "NHWC", cfg.layout)


def conv2d_flops(x_shape: Sequence[int], w_shape: Sequence[int], out_shape: Sequence[int]) -> int:
    """Multiply-adds x2 of a (grouped) convolution: w holds C/G input channels per output."""
    n, p, q, k = out_shape
    r, s, cg, _ = w_shape
    return 2 * n * p * q * k * r * s * cg


# The int32 limits of the NHWC conv + bias kernels (conv2d_pool, sparse_conv2d).


def check_conv_ints(conv: Conv2dConfig) -> None:
    """The conv's static ints fit int32 (checked before the shape rule, whose arithmetic on
    e.g. a 2**62 dilation would blame the window instead)."""
    check_int32("stride", conv.stride)
    check_int32("padding", conv.padding)
    check_int32("dilation", conv.dilation)


def check_conv_shapes(x_shape: Sequence[int], w_shape: Sequence[int], conv: Conv2dConfig) -> None:
    """The conv's int32 limits on NHWC x and HWIO w (both already of rank 4) and on the padded
    input."""
    check_int32_shape("x", x_shape)
    check_int32_shape("w", w_shape, batch_axis=None)
    (pt, pb), (pl, pr) = conv.padding
    check_int32_extent("padding", max(x_shape[1] + pt + pb, x_shape[2] + pl + pr),
                       "the padded input extent")


def check_conv_result_int32(out_shape: Sequence[int], conv: Conv2dConfig) -> None:
    """The (NHWC) result's int32 limits, naming what made it big: the conv padding if any
    (e.g. 10**7), else w's output channels (unpadded, each image's pixels are at most x's)."""
    if any(conv.padding[0] + conv.padding[1]):
        what = f"padding {conv.padding} makes the result"
    else:
        what = f"w's {out_shape[3]} output channels make the result"
    check_int32_shape("padding", out_shape, what=what)
