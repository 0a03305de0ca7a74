"""A convolution layer by its shapes, and its implicit-GEMM view.

NHWC input x [n, h, w, c], HWIO weights [r, s, c/groups, k], NHWC output y [n, p, q, k]. The
implicit GEMM of one group: M = n*p*q output pixels, N = k/groups output channels,
K = r*s*c/groups (filter taps x input channels of the group).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jaxcnn.ops.conv2d.config import padding_pairs
from jaxcnn.profile.gpu_specs import precision_class

ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def _pair(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    first, second = value
    return (int(first), int(second))


@dataclass(frozen=True)
class ConvShape:
    """A convolution's sizes: input x [n, h, w, c] (NHWC), weights [r, s, c per group, k]
    (HWIO). The records of one conv (ConvLayer here, the benchmark scripts' cases) extend it."""

    n: int
    h: int
    w: int
    c: int
    k: int
    r: int
    s: int

    @property
    def x_nhwc(self) -> tuple[int, int, int, int]:
        return (self.n, self.h, self.w, self.c)


@dataclass(frozen=True)
class ConvLayer(ConvShape):
    """A conv layer for the cost model: its sizes (ConvShape's n, h, w, c, k, r, s first), then
    stride, padding, dilation and groups (normalised to pairs and explicit pads), the dtype."""

    stride: Any = 1  # int or (sh, sw)
    padding: Any = 0  # int, (ph, pw), ((top, bottom), (left, right)), "SAME" or "VALID"
    dilation: Any = 1  # int or (dh, dw)
    groups: int = 1
    dtype: str = "bf16"  # "bf16" | "fp16" | "fp32" (anything precision_class takes)
    name: str = ""

    def __post_init__(self) -> None:
        # Normalise once, so every property below sees pairs and a precision class.
        object.__setattr__(self, "stride", _pair(self.stride))
        object.__setattr__(self, "dilation", _pair(self.dilation))
        object.__setattr__(self, "dtype", precision_class(self.dtype))
        object.__setattr__(self, "padding", self._explicit_padding(self.padding))
        if self.c % self.groups or self.k % self.groups:
            raise ValueError(f"groups={self.groups} must divide c={self.c} and k={self.k}")
        if self.p <= 0 or self.q <= 0:
            raise ValueError(f"empty output {self.p}x{self.q} for {self}")

    def _explicit_padding(self, padding: Any) -> tuple[tuple[int, int], tuple[int, int]]:
        (sh, sw), (dh, dw) = self.stride, self.dilation
        window = ((self.r - 1) * dh + 1, (self.s - 1) * dw + 1)
        return padding_pairs(padding, (self.h, self.w), window, (sh, sw))

    @classmethod
    def from_config(cls, config: dict[str, Any], dtype: str, name: str = "") -> ConvLayer:
        """From a bench_layers.json row's config {n,h,w,c,k,r,s,stride,padding,dilation,groups}."""
        keys = ("n", "h", "w", "c", "k", "r", "s", "stride", "padding", "dilation", "groups")
        kwargs = {key: config[key] for key in keys if key in config}
        return cls(**kwargs, dtype=dtype, name=name or config.get("name", ""))

    @classmethod
    def from_layer_info(cls, info: Any) -> ConvLayer:
        """From a jaxcnn.models LayerInfo of a conv2d (NHWC input, HWIO weight)."""
        n, h, w, c = info.input_shapes[0]
        r, s, _, k = info.weight_shape
        return cls(
            n, h, w, c, k, r, s,
            stride=info.stride or 1,
            padding=info.padding or 0,
            dilation=info.dilation or 1,
            groups=info.groups or 1,
            dtype=info.dtype,
            name=info.name,
        )

    # ---------------------------------------------------------------- output and GEMM view

    @property
    def p(self) -> int:
        (top, bottom), _ = self.padding
        span = (self.r - 1) * self.dilation[0] + 1
        return (self.h + top + bottom - span) // self.stride[0] + 1

    @property
    def q(self) -> int:
        _, (left, right) = self.padding
        span = (self.s - 1) * self.dilation[1] + 1
        return (self.w + left + right - span) // self.stride[1] + 1

    @property
    def c_per_group(self) -> int:
        return self.c // self.groups

    @property
    def gemm_m(self) -> int:
        return self.n * self.p * self.q

    @property
    def gemm_n(self) -> int:
        """Output channels of one group."""
        return self.k // self.groups

    @property
    def gemm_k(self) -> int:
        return self.r * self.s * self.c_per_group

    @property
    def flops(self) -> float:
        """Useful multiply-adds x 2 over all groups."""
        return 2.0 * self.gemm_m * self.gemm_n * self.gemm_k * self.groups

    # ---------------------------------------------------------------- bytes

    @property
    def elem_bytes(self) -> int:
        """Bytes per element in global memory (TF32 math still reads float32)."""
        return ELEMENT_BYTES["fp32" if self.dtype == "tf32" else self.dtype]

    @property
    def x_bytes(self) -> int:
        return self.n * self.h * self.w * self.c * self.elem_bytes

    @property
    def w_bytes(self) -> int:
        return self.r * self.s * self.c_per_group * self.k * self.elem_bytes

    @property
    def y_bytes(self) -> int:
        return self.gemm_m * self.k * self.elem_bytes

    @property
    def unique_bytes(self) -> int:
        """x, w and y once each: the least DRAM traffic any algorithm can have."""
        return self.x_bytes + self.w_bytes + self.y_bytes

    def describe(self) -> str:
        (sh, _), (dh, _) = self.stride, self.dilation
        return (
            f"{self.n}x{self.h}x{self.w}x{self.c}->{self.k} {self.r}x{self.s} s{sh} d{dh} "
            f"g{self.groups} {self.dtype}"
        )
