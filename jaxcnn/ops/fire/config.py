"""Argument validation and shape rule of the fused fire module (`jaxcnn.fire`).

Runs at trace time on static shapes: bad input fails before any kernel runs, with an error
that names the argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from jaxcnn._native.codes import FIRE_ALGORITHMS
from jaxcnn.ops.operand_checks import check_float_dtype, check_int32_shape

# Kernel choice; codes match cuda_ops' FireAlgorithm. "auto": the two-phase kernel for small
# problems (<= 1024 output pixels); on Hopper, the wgmma path (one launch for S = 32, else
# squeeze conv + merged expands) for big problems or S > 32; else the fused mma.sync kernel (bf16/fp16, channel counts
# multiples of 8, 16-byte aligned buffers); else the CUDA-core kernel.
ALGORITHMS = FIRE_ALGORITHMS
# Operand order of the primitive and the custom call.
OPERAND_NAMES = ("x", "squeeze_w", "expand1_w", "expand3_w", "squeeze_b", "expand1_b", "expand3_b")


@dataclass(frozen=True)
class FireConfig:
    """Static parameters of one fire module (shapes live in the operands)."""

    algorithm: str = "auto"


def make_fire_config(algorithm: Any = "auto") -> FireConfig:
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    return FireConfig(algorithm=algorithm)


def _check_shape(name: str, shape: Sequence[int], want: tuple, what: str) -> None:
    if tuple(shape) != want:
        raise ValueError(f"{name} must have shape {want} ({what}), got {tuple(shape)}")


def fire_output_shape(shapes: Sequence[Sequence[int]], dtypes: Sequence[Any]) -> tuple[int, ...]:
    """[N, H, W, E1 + E3] for the operands in OPERAND_NAMES order; raises on bad input.
    N = 0 (an empty batch) is valid."""
    if len(shapes) != len(OPERAND_NAMES) or len(dtypes) != len(OPERAND_NAMES):
        raise ValueError(f"fire takes {len(OPERAND_NAMES)} operands {OPERAND_NAMES}, got {len(shapes)}")
    x_shape, sq_shape, e1_shape, e3_shape = (tuple(s) for s in shapes[:4])
    check_float_dtype("x", dtypes[0])
    x_dtype = np.dtype(dtypes[0])
    for name, dtype in zip(OPERAND_NAMES[1:], dtypes[1:]):
        check_float_dtype(name, dtype, x_dtype)
    if len(x_shape) != 4:
        raise ValueError(f"x must be rank 4 [N, H, W, C] (NHWC), got shape {x_shape}")
    n, h, w, c = x_shape
    if min(h, w, c) < 1:
        raise ValueError(f"x must have H, W and C >= 1, got shape {x_shape}")
    for name, shape, window in (("squeeze_w", sq_shape, 1), ("expand1_w", e1_shape, 1),
                                ("expand3_w", e3_shape, 3)):
        if len(shape) != 4 or shape[:2] != (window, window):
            raise ValueError(
                f"{name} must be rank 4 HWIO [{window}, {window}, in, out], got shape {shape}"
            )
        # expand1 may be empty: the fused squeeze -> 3x3 chain (conv1x1_conv3x3).
        if shape[3] < (0 if name == "expand1_w" else 1):
            raise ValueError(f"{name} must have >= 1 output channels, got shape {shape}")
    s = sq_shape[3]
    _check_shape("squeeze_w", sq_shape, (1, 1, c, s), f"input channels of x = {c}")
    _check_shape("expand1_w", e1_shape, (1, 1, s, e1_shape[3]), f"squeeze channels = {s}")
    _check_shape("expand3_w", e3_shape, (3, 3, s, e3_shape[3]), f"squeeze channels = {s}")
    for name, shape, k in zip(OPERAND_NAMES[4:], shapes[4:], (s, e1_shape[3], e3_shape[3])):
        _check_shape(name, shape, (k,), "one per output channel of its conv")
    check_int32_shape("x", x_shape)
    for name, shape in zip(OPERAND_NAMES[1:4], (sq_shape, e1_shape, e3_shape)):
        check_int32_shape(name, shape, batch_axis=None)
    out = (n, h, w, e1_shape[3] + e3_shape[3])
    check_int32_shape("expand1_w", out, what=f"expand1_w and expand3_w's {out[3]} output "
                      "channels make the result")
    return out
