"""A layer of a layout chain by its logical shapes (NHWC activations, HWIO weights), whatever
layout it later runs in; and a Block of layers that must share one layout."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxcnn.ops.conv2d.config import conv2d_output_shape, make_config, normalize_precision
from jaxcnn.tuning.tuner_args import Shape, dtype_name, int_pair, shape4

POOL_OPS = ("maxpool", "avgpool")
# Layout-agnostic ops of the zoo: same bytes in every layout.
ELEMENTWISE_OPS = ("relu6", "add", "concat")


def _shape_text(shape) -> str:
    return "x".join(str(d) for d in shape)


@dataclass(frozen=True)
class Layer:
    """One layer of a chain, by its logical NHWC shapes (what it costs does not depend on how
    it was built). op: "conv2d", "maxpool", "avgpool", "relu6", "add" or "concat"."""

    op: str
    x_shape: Shape
    y_shape: Shape
    dtype: str
    name: str = ""
    w_shape: Shape | None = None  # HWIO, conv2d only
    window: tuple[int, int] | None = None  # pools only
    stride: tuple[int, int] = (1, 1)
    padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    activation: str | None = None
    precision: str = "default"
    bias: bool = True
    input_shapes: tuple[Shape, ...] = ()  # every input (add, concat); () means (x_shape,)

    def __post_init__(self) -> None:
        if self.op not in ("conv2d", *POOL_OPS, *ELEMENTWISE_OPS):
            raise ValueError(f"op must be conv2d, {', '.join(POOL_OPS + ELEMENTWISE_OPS)}; got {self.op!r}")
        if self.op == "conv2d" and self.w_shape is None:
            raise ValueError(f"layer {self.name!r}: conv2d needs w_shape")
        if self.op in POOL_OPS and self.window is None:
            raise ValueError(f"layer {self.name!r}: {self.op} needs window")

    @property
    def inputs(self) -> tuple[Shape, ...]:
        return self.input_shapes or (self.x_shape,)

    @property
    def bytes(self) -> int:
        """Inputs, weights and output moved once each."""
        elements = sum(math.prod(s) for s in self.inputs) + math.prod(self.y_shape)
        if self.w_shape is not None:
            elements += math.prod(self.w_shape) + (self.w_shape[3] if self.bias else 0)
        return elements * np.dtype(self.dtype).itemsize

    @property
    def is_depthwise(self) -> bool:
        if self.op != "conv2d":
            return False
        c, k = self.x_shape[3], self.w_shape[3]
        return self.groups == c and c > 1 and k % c == 0

    def conv_kwargs(self) -> dict[str, Any]:
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation,
                    groups=self.groups, activation=self.activation, precision=self.precision)

    def describe(self) -> str:
        if self.op == "conv2d":
            return (f"conv2d x {_shape_text(self.x_shape)} w {_shape_text(self.w_shape)} {self.dtype} "
                    f"stride {self.stride} pad {self.padding} dil {self.dilation} g{self.groups}"
                    f"{' relu' if self.activation else ''}")
        if self.op in POOL_OPS:
            return (f"{self.op} x {_shape_text(self.x_shape)} {self.dtype} window {self.window} "
                    f"stride {self.stride} pad {self.padding}")
        ins = ", ".join(_shape_text(s) for s in self.inputs)
        return f"{self.op} {ins} -> {_shape_text(self.y_shape)} {self.dtype}"

    @classmethod
    def from_layer_info(cls, info: Any, precision: Any = None) -> "Layer":
        """From a jaxcnn.models LayerInfo (4-D NHWC input and output)."""
        if len(info.input_shapes[0]) != 4 or len(info.output_shape) != 4:
            raise ValueError(f"layer {info.name!r} ({info.op}) is not 4-D: no activation layout")
        common = dict(name=info.name, x_shape=tuple(info.input_shapes[0]),
                      y_shape=tuple(info.output_shape), dtype=dtype_name(info.dtype),
                      input_shapes=tuple(tuple(s) for s in info.input_shapes))
        if info.op == "conv2d":
            return cls("conv2d", w_shape=tuple(info.weight_shape), stride=tuple(info.stride),
                       padding=tuple(map(tuple, info.padding)), dilation=tuple(info.dilation),
                       groups=int(info.groups), activation=info.activation,
                       precision=normalize_precision(precision),
                       bias=info.bias_shape is not None, **common)
        if info.op in POOL_OPS:
            return cls(info.op, window=tuple(info.window), stride=tuple(info.stride),
                       padding=tuple(map(tuple, info.padding)), **common)
        if info.op in ELEMENTWISE_OPS:
            return cls(info.op, activation=info.activation, **common)
        raise ValueError(f"layer {info.name!r}: op {info.op!r} has no layout choice")


def conv_layer(x_shape, w_shape, dtype="bfloat16", *, stride=1, padding="SAME", dilation=1,
               groups=1, activation=None, precision=None, bias=True, name="") -> Layer:
    """A conv2d Layer from conv2d's arguments (x logical NHWC, w HWIO); validates them."""
    x_shape, w_shape = shape4(x_shape, "x_shape"), shape4(w_shape, "w_shape")
    dtype = dtype_name(dtype)
    cfg = make_config(x_shape, w_shape, stride=stride, padding=padding, dilation=dilation,
                      groups=groups, activation=activation, precision=precision)
    y_shape = conv2d_output_shape(x_shape, dtype, w_shape, dtype, (w_shape[3],) if bias else None,
                                  dtype, cfg)
    return Layer("conv2d", x_shape, tuple(y_shape), dtype, name=name, w_shape=w_shape,
                 stride=cfg.stride, padding=cfg.padding, dilation=cfg.dilation, groups=cfg.groups,
                 activation=cfg.activation, precision=cfg.precision, bias=bool(bias))


def pool_layer(x_shape, dtype="bfloat16", *, op="maxpool", window=2, stride=None, padding=0,
               name="") -> Layer:
    """A maxpool/avgpool Layer (x logical NHWC); stride defaults to the window."""
    if op not in POOL_OPS:
        raise ValueError(f"op must be one of {POOL_OPS}, got {op!r}")
    x_shape, dtype = shape4(x_shape, "x_shape"), dtype_name(dtype)
    cfg = make_config(x_shape, (*int_pair(window, "window"), 1, 1),
                      stride=int_pair(window, "window") if stride is None else stride, padding=padding)
    (pt, pb), (pl, pr) = cfg.padding
    (wh, ww), (sh, sw) = int_pair(window, "window"), cfg.stride
    p = (x_shape[1] + pt + pb - wh) // sh + 1
    q = (x_shape[2] + pl + pr - ww) // sw + 1
    if p < 1 or q < 1:
        raise ValueError(f"window {window} does not fit the padded input of {x_shape}")
    return Layer(op, x_shape, (x_shape[0], p, q, x_shape[3]), dtype, name=name,
                 window=int_pair(window, "window"), stride=cfg.stride, padding=cfg.padding)


@dataclass(frozen=True)
class Block:
    """Layers that run in one layout (a fire module, a residual block: branches whose inputs
    and outputs must agree). Its input is the first layer's input, its output the last's."""

    name: str
    layers: tuple[Layer, ...]

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError(f"block {self.name!r} has no layers")
        if not all(isinstance(layer, Layer) for layer in self.layers):
            raise TypeError(f"block {self.name!r}: layers must be Layer objects")

    @property
    def x_shape(self) -> Shape:
        return self.layers[0].x_shape

    @property
    def y_shape(self) -> Shape:
        return self.layers[-1].y_shape

    @property
    def dtype(self) -> str:
        return self.layers[0].dtype
