"""Activation layouts: names, their C++ codes (from jaxcnn._native.codes), validation, permutations and axes.

A layout string names the memory order of a 4-D activation with logical dims N (batch),
C (channels), H and W. The codes match `TensorLayout` in cuda_ops/common/conv2d_params.h.
"""

from __future__ import annotations

from typing import Sequence

from jaxcnn._native.codes import LAYOUT_CODES, LAYOUTS  # noqa: F401  (their names, and codes)

NHWC, NCHW, CHWN = LAYOUTS


def check_layout(layout, arg: str = "layout") -> str:
    """Returns `layout` if it is one of LAYOUTS; else TypeError/ValueError naming `arg`."""
    if not isinstance(layout, str):
        raise TypeError(f"{arg} must be a layout string, one of {LAYOUTS}; got {layout!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"{arg} must be one of {LAYOUTS}, got {layout!r}")
    return layout


def permutation(src: str, dst: str) -> tuple[int, ...]:
    """Axes `perm` with `jnp.transpose(x_in_src, perm)` laid out in `dst`."""
    check_layout(src, "src")
    check_layout(dst, "dst")
    return tuple(src.index(dim) for dim in dst)


def batch_axis(layout: str) -> int:
    """Position of N: 0 for NHWC/NCHW, 3 for CHWN."""
    return check_layout(layout).index("N")


def axis(layout: str, dim: str) -> int:
    """Position of logical dim "N", "C", "H" or "W" in `layout`."""
    if dim not in ("N", "C", "H", "W"):
        raise ValueError(f"dim must be one of 'N', 'C', 'H', 'W', got {dim!r}")
    return check_layout(layout).index(dim)


def logical_dims(shape: Sequence[int], layout: str) -> dict[str, int]:
    """{"N": .., "C": .., "H": .., "W": ..} of a shape in `layout`."""
    check_layout(layout)
    if len(shape) != 4:
        raise ValueError(f"a {layout} shape must have 4 dims, got {tuple(shape)}")
    return dict(zip(layout, (int(d) for d in shape)))


def shape_in(layout: str, *, N: int, C: int, H: int, W: int) -> tuple[int, ...]:  # noqa: N803
    """The shape of logical [N, C, H, W] in `layout`."""
    dims = dict(N=N, C=C, H=H, W=W)
    return tuple(dims[d] for d in check_layout(layout))


def convert_shape(shape: Sequence[int], src: str, dst: str) -> tuple[int, ...]:
    """`shape` (in src) as laid out in dst."""
    return shape_in(check_layout(dst, "dst"), **logical_dims(shape, check_layout(src, "src")))
