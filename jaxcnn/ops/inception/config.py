"""Argument validation and shape rule of the fused inception block (`jaxcnn.inception`).

Runs at trace time on static shapes: bad input fails before any kernel runs, with an error
that names the argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from jaxcnn.ops.conv2d.config import normalize_precision
from jaxcnn.ops.operand_checks import check_float_dtype, check_int32_shape

# Kernel family of every conv of the block (conv2d's choices; "xla" is not one: the block's
# XLA version is the unfused zoo block).
ALGORITHMS = ("auto", "tensor_core", "direct")
# Branch names as in the zoo's models.googlenet.inception (layer names end in these).
BRANCH_LAYERS = ("1x1", "3x3_reduce", "3x3", "5x5_reduce", "5x5", "pool_proj")
WEIGHT_NAMES = tuple(f"w_{b}" for b in BRANCH_LAYERS)
BIAS_NAMES = tuple(f"b_{b}" for b in BRANCH_LAYERS)
# Operand order of the primitive: x, the six HWIO weights, the six biases.
OPERAND_NAMES = ("x", *WEIGHT_NAMES, *BIAS_NAMES)
# The pool branch: 3x3 max pool, stride 1, padding 1 (-inf), as GoogLeNet (and the zoo).
POOL_WINDOW = 3


@dataclass(frozen=True)
class InceptionConfig:
    """Static parameters of one inception block (shapes live in the operands)."""

    algorithm: str = "auto"
    precision: str = "default"


def make_inception_config(algorithm: Any = "auto", precision: Any = None) -> InceptionConfig:
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    return InceptionConfig(algorithm=algorithm, precision=normalize_precision(precision))


def _check_weight(name: str, shape: tuple, cin: int, what: str, one_by_one: bool) -> int:
    """Checks an HWIO weight reading `cin` channels; returns its kernel size."""
    if len(shape) != 4:
        raise ValueError(f"{name} must be rank 4 HWIO [kh, kw, in, out], got shape {shape}")
    kh, kw, ci, k = shape
    if one_by_one and (kh, kw) != (1, 1):
        raise ValueError(f"{name} must be a 1x1 conv [1, 1, {cin}, out], got shape {shape}")
    if kh != kw or kh % 2 == 0:
        raise ValueError(f"{name} must have a square odd kernel (padding k // 2 keeps H, W), "
                         f"got shape {shape}")
    if ci != cin:
        raise ValueError(f"{name} must have {cin} input channels ({what}), got shape {shape}")
    if k < 1:
        raise ValueError(f"{name} must have >= 1 output channels, got shape {shape}")
    return kh


def inception_output_shape(shapes: Sequence[Sequence[int]], dtypes: Sequence[Any]) -> tuple[int, ...]:
    """[N, H, W, K1 + K3 + K5 + Kpool] for the operands in OPERAND_NAMES order; raises on bad
    input. N = 0 (an empty batch) is valid."""
    if len(shapes) != len(OPERAND_NAMES) or len(dtypes) != len(OPERAND_NAMES):
        raise ValueError(f"inception takes {len(OPERAND_NAMES)} operands {OPERAND_NAMES}, got {len(shapes)}")
    shapes = [tuple(s) for s in shapes]
    check_float_dtype("x", dtypes[0])
    for name, dtype in zip(OPERAND_NAMES[1:], dtypes[1:]):
        check_float_dtype(name, dtype, np.dtype(dtypes[0]))
    x_shape = shapes[0]
    if len(x_shape) != 4:
        raise ValueError(f"x must be rank 4 [N, H, W, C] (NHWC), got shape {x_shape}")
    n, h, w, c = x_shape
    if min(h, w, c) < 1:
        raise ValueError(f"x must have H, W and C >= 1, got shape {x_shape}")
    w1, w3r, w3, w5r, w5, wp = shapes[1:7]
    _check_weight("w_1x1", w1, c, f"channels of x = {c}", True)
    _check_weight("w_3x3_reduce", w3r, c, f"channels of x = {c}", True)
    _check_weight("w_5x5_reduce", w5r, c, f"channels of x = {c}", True)
    _check_weight("w_pool_proj", wp, c, f"channels of x = {c}", True)
    if len(w3r) == 4:
        _check_weight("w_3x3", w3, w3r[3], f"output channels of w_3x3_reduce = {w3r[3]}", False)
        _check_weight("w_5x5", w5, w5r[3], f"output channels of w_5x5_reduce = {w5r[3]}", False)
    for name, shape, w_shape in zip(BIAS_NAMES, shapes[7:], shapes[1:7]):
        if shape != (w_shape[3],):
            raise ValueError(f"{name} must have shape {(w_shape[3],)} (one per output channel of "
                             f"its conv), got {shape}")
    check_int32_shape("x", x_shape)
    for name, shape in zip(WEIGHT_NAMES, shapes[1:7]):
        check_int32_shape(name, shape, batch_axis=None)
    # The split conv's result holds the three 1x1 branches that read x.
    check_int32_shape("w_1x1", (n, h, w, w1[3] + w3r[3] + w5r[3]),
                      what="w_1x1, w_3x3_reduce and w_5x5_reduce's output channels make the split")
    out = (n, h, w, w1[3] + w3[3] + w5[3] + wp[3])
    check_int32_shape("w_1x1", out, what=f"the branches' {out[3]} output channels (w_1x1, w_3x3, "
                      "w_5x5, w_pool_proj) make the result")
    return out
