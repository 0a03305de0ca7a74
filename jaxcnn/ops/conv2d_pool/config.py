"""Argument normalization, validation and shape rules of the fused conv + bias + ReLU + max-pool
(`jaxcnn.conv2d_pool`).

Runs at trace time on static shapes: bad input fails before any kernel runs, with an error that
names the argument. The conv half reuses conv2d's config (same forms, same messages); the pool
half is pool2d's config (same forms and rules, names prefixed "pool_"), applied to the conv's
output extent.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from jaxcnn._native.codes import CONV_POOL_ALGORITHMS
from jaxcnn.ops.conv2d.config import (
    Conv2dConfig,
    check_conv_ints,
    check_conv_result_int32,
    check_conv_shapes,
    conv2d_output_shape,
    make_config,
)
from jaxcnn.ops.layout_axes import LAYOUTS, convert_shape
from jaxcnn.ops.pool2d.config import normalize_pool_args, pool_output_hw

Pair = tuple[int, int]

# Kernel choice; codes match cuda_ops' ConvPoolAlgorithm. "auto": on Hopper the TMA + wgmma kernel
# for 16-bit 3x3/1 SAME convs with a 2x2/2 pool (C % 32, K % 64; C <= 64 unless K % 128 == 0),
# else tensor cores (bf16/fp16 with K a multiple of 8, fp32 at precision "default" as TF32 with K
# a multiple of 4; a small or unaligned C runs the stem kernel where R*S*C <= 512, else the
# implicit-GEMM kernel's flat-K mode) else the CUDA-core kernel; "tensor_core" (implicit GEMM), "stem" and "wgmma" fail where they
# cannot run; "direct" is the CUDA-core kernel (fp32-accurate, any shape).
ALGORITHMS = CONV_POOL_ALGORITHMS
# Operand order of the primitive and the custom call (bias is always present: zeros for None).
OPERAND_NAMES = ("x", "w", "bias")


@dataclass(frozen=True)
class ConvPoolConfig:
    """Static parameters of one fused layer. `conv` is the NHWC conv (activation "relu");
    the pool's padding is explicit ((top, bottom), (left, right)) on the conv output."""

    conv: Conv2dConfig
    pool_window: Pair
    pool_stride: Pair
    pool_padding: tuple[Pair, Pair]
    algorithm: str = "auto"

    def replace(self, **changes: Any) -> "ConvPoolConfig":
        return dataclasses.replace(self, **changes)


def make_conv_pool_config(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    *,
    stride: Any = 1,
    padding: Any = "SAME",
    dilation: Any = 1,
    pool_window: Any = 2,
    pool_stride: Any = None,
    pool_padding: Any = "VALID",
    layout: Any = "NHWC",
    precision: Any = None,
    algorithm: Any = "auto",
) -> ConvPoolConfig:
    """Normalizes the keyword arguments of `conv2d_pool` for an NHWC x of shape `x_shape`
    (callers convert other layouts first). pool_stride=None means pool_stride = pool_window."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    conv = make_config(
        x_shape, w_shape, stride=stride, padding=padding, dilation=dilation,
        activation="relu", layout="NHWC", precision=precision,
    )
    # The pool's SAME/VALID are resolved on the conv's output extent (P, Q).
    p, q = conv_output_hw(x_shape, w_shape, conv)
    window, pstride, pool_pads = normalize_pool_args(
        (max(p, 1), max(q, 1)), pool_window, pool_stride, pool_padding, prefix="pool_")
    return ConvPoolConfig(conv, window, pstride, pool_pads, algorithm)


def conv_pool_output_shape(
    x_shape: Sequence[int],
    x_dtype: Any,
    w_shape: Sequence[int],
    w_dtype: Any,
    bias_shape: Sequence[int],
    bias_dtype: Any,
    cfg: ConvPoolConfig,
) -> tuple[int, int, int, int]:
    """Validates NHWC operands against `cfg`; returns the pooled NHWC shape [N, PH, PW, K]."""
    check_conv_ints(cfg.conv)
    n, p, q, k = conv2d_output_shape(x_shape, x_dtype, w_shape, w_dtype, bias_shape, bias_dtype,
                                     cfg.conv)
    check_conv_shapes(x_shape, w_shape, cfg.conv)
    ph, pw = pool_output_hw((p, q), cfg.pool_window, cfg.pool_stride, cfg.pool_padding,
                            prefix="pool_", input_name="the padded conv output")
    out = (n, ph, pw, k)
    check_conv_result_int32(out, cfg.conv)
    return out


def conv_output_hw(x_shape: Sequence[int], w_shape: Sequence[int], conv: Conv2dConfig) -> Pair:
    """(P, Q): the pre-pool conv output extent of an NHWC x."""
    _, h, w, _ = x_shape
    (pt, pb), (pl, pr) = conv.padding
    p = (h + pt + pb - conv.dilation[0] * (w_shape[0] - 1) - 1) // conv.stride[0] + 1
    q = (w + pl + pr - conv.dilation[1] * (w_shape[1] - 1) - 1) // conv.stride[1] + 1
    return p, q


def nhwc_shape(shape: Sequence[int], layout: str) -> tuple[int, ...]:
    return tuple(convert_shape(shape, layout, "NHWC"))
