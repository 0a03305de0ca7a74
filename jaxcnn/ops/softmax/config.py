"""Argument validation of softmax: runs at trace time on static shapes, so bad input fails
before any kernel runs, with an error that names the argument."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxcnn.ops.operand_checks import check_int32_dims
from jaxcnn.ops.pool2d.config import check_dtype


def softmax_axis(shape: Sequence[int], dtype: Any, axis: Any) -> int:
    """Validates softmax's operand and returns `axis` as a non-negative int."""
    check_dtype("x", dtype)
    if len(shape) < 1:
        raise ValueError("x must have rank >= 1 for softmax, got a scalar")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis must be an int, got {axis!r}")
    if not -len(shape) <= axis < len(shape):
        raise ValueError(f"axis {axis} is out of range for x of rank {len(shape)}")
    check_int32_dims("x", shape)  # the kernel's rows may be many, each row's length int32
    return int(axis) % len(shape)
