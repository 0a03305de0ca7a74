"""Layers of the model zoo: `LayerInfo` (one row of a layer table) and `Net`, the layer calls a
model body is written with.

A model is one Python function `body(net, x) -> logits` that calls `net.conv`, `net.maxpool`,
`net.dense`, ... Every call runs the op from the backend's table (backends.py) and records a
LayerInfo from the arrays it actually saw. The same body therefore gives:

  * the forward pass (`Net(ops, params)`),
  * the layer table and the weight shapes (`describe`: the body under `jax.eval_shape`, with
    zero placeholders for weights), so the architecture is written once.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxcnn.models.backends import XLA_OPS
from jaxcnn.ops.conv2d.config import conv2d_flops, make_config

Shape = tuple[int, ...]
Pair = tuple[int, int]

# Static attributes a layer passes to its op, in the order a table row lists them.
OP_ATTRIBUTES = ("window", "stride", "padding", "dilation", "groups", "activation")
# max, subtract, exp, sum, divide per element.
SOFTMAX_FLOPS_PER_ELEMENT = 5


@dataclass(frozen=True)
class LayerInfo:
    """One layer as the model runs it, at one batch size and dtype.

    flops: 2 x multiply-adds for conv2d and dense (bias and activation not counted); window
      size per output for pools (comparisons or adds); one per output element for add and
      relu6; SOFTMAX_FLOPS_PER_ELEMENT per element for softmax; 0 for concat.
    bytes: the least memory traffic: inputs, weight, bias and output each moved once.
    """

    name: str
    op: str
    dtype: str
    input_shapes: tuple[Shape, ...]
    output_shape: Shape
    weight_shape: Shape | None = None
    bias_shape: Shape | None = None
    window: Pair | None = None
    stride: Pair | None = None
    padding: tuple[Pair, Pair] | None = None
    dilation: Pair | None = None
    groups: int | None = None
    activation: str | None = None
    block: str | None = None  # the enclosing block (fire module, bottleneck, ...), if any
    flops: int = 0
    bytes: int = 0

    @property
    def input_shape(self) -> Shape:
        return self.input_shapes[0]

    def op_kwargs(self) -> dict[str, Any]:
        """The keywords the op function is called with (attributes that are set)."""
        return {k: getattr(self, k) for k in OP_ATTRIBUTES if getattr(self, k) is not None}

    def as_row(self) -> dict[str, Any]:
        """Scalars only (shapes as '1x56x56x64'), for pandas or SQLite."""
        row = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "input_shapes":
                value = ", ".join(_shape_text(s) for s in value)
            elif field.name in ("output_shape", "weight_shape", "bias_shape", "window", "stride", "dilation"):
                value = None if value is None else _shape_text(value)
            elif field.name == "padding":
                value = None if value is None else str(tuple(map(tuple, value)))
            row[field.name] = value
        return row


def _shape_text(shape: Shape) -> str:
    return "x".join(map(str, shape))


def layer_rows(layers: list[LayerInfo], **columns: Any) -> list[dict[str, Any]]:
    """Rows of dicts for a DataFrame or an SQL insert; `columns` (e.g. model=...) lead every row."""
    return [{**columns, "index": i, **info.as_row()} for i, info in enumerate(layers)]


def bind_layer(info: LayerInfo, ops: dict[str, Callable]) -> Callable:
    """The layer alone as a function of its arrays (inputs, then weight and bias): the same
    call `Net` makes when the model runs."""
    return _bind(ops, info.op, info.op_kwargs())


def _bind(ops: dict[str, Callable], op: str, attributes: dict[str, Any]) -> Callable:
    return functools.partial(ops[op], **attributes)


def _flops(op: str, input_shapes, weight_shape, output_shape, window) -> int:
    outputs = math.prod(output_shape)
    if op == "conv2d":
        return conv2d_flops(input_shapes[0], weight_shape, output_shape)
    if op == "dense":
        return 2 * outputs * weight_shape[0]
    if op in ("maxpool", "avgpool"):
        return outputs * window[0] * window[1]
    if op == "concat":
        return 0
    if op == "softmax":
        return SOFTMAX_FLOPS_PER_ELEMENT * outputs
    return outputs


@dataclass(frozen=True)
class WeightSpec:
    """Shape and init scale of one layer's weight (its bias is [weight_shape[-1]])."""

    weight_shape: Shape
    init_scale: float

    @property
    def std(self) -> float:
        """He normal: keeps the second moment of ReLU activations constant layer to layer."""
        fan_in = math.prod(self.weight_shape[:-1])
        return self.init_scale * math.sqrt(2.0 / fan_in)


def _pair(value) -> Pair:
    return (value, value) if isinstance(value, int) else tuple(value)


def _ceil_mode_padding(size: int, window: int, stride: int, pad: int) -> Pair:
    """PyTorch's ceil_mode: extra padding at the end so a partial last window still counts,
    unless that window would start in the end padding."""
    outputs = -(-(size + 2 * pad - window) // stride) + 1
    if (outputs - 1) * stride >= size + pad:
        outputs -= 1
    return pad, (outputs - 1) * stride + window - size - pad


class Net:
    """What a model body calls: each method runs one layer and records its LayerInfo.

    params=None describes the model (see `describe`): weights are zero placeholders of the
    shape the layer needs, and their shapes and init scales are collected in weight_specs.
    """

    def __init__(self, ops: dict[str, Callable], params: dict | None = None):
        self.ops = ops
        self.params = params
        self.layers: list[LayerInfo] = []
        self.weight_specs: dict[str, WeightSpec] = {}
        self._block: str | None = None

    # -- layers with weights -------------------------------------------------------------

    def conv(self, name, x, features, kernel, *, stride=1, padding=0, dilation=1, groups=1,
             activation="relu", init_scale=1.0):
        """Conv + bias (+ ReLU); init_scale shrinks the init of a residual branch's last conv."""
        kh, kw = _pair(kernel)
        weight_shape = (kh, kw, x.shape[-1] // groups, features)
        cfg = make_config(x.shape, weight_shape, stride=stride, padding=padding,
                          dilation=dilation, groups=groups, activation=activation)
        w, b = self._weights(name, weight_shape, x.dtype, init_scale)
        return self._run(name, "conv2d", (x,), (w, b), stride=cfg.stride, padding=cfg.padding,
                         dilation=cfg.dilation, groups=cfg.groups, activation=cfg.activation)

    def dense(self, name, x, features, *, activation="relu"):
        w, b = self._weights(name, (x.shape[-1], features), x.dtype, 1.0)
        return self._run(name, "dense", (x,), (w, b), activation=activation)

    # -- layers without weights ----------------------------------------------------------

    def maxpool(self, name, x, window, *, stride, padding=0, ceil_mode=False):
        return self._pool("maxpool", name, x, window, stride, padding, ceil_mode)

    def avgpool(self, name, x, window, *, stride, padding=0):
        return self._pool("avgpool", name, x, window, stride, padding, False)

    def global_avgpool(self, name, x):
        """Average over all of H and W, flattened to [N, C]."""
        y = self.avgpool(name, x, x.shape[1:3], stride=1)
        return y.reshape(y.shape[0], -1)

    def concat(self, name, *xs):
        return self._run(name, "concat", xs)

    def add(self, name, a, b, *, activation=None):
        return self._run(name, "add", (a, b), activation=activation)

    def relu6(self, name, x):
        return self._run(name, "relu6", (x,))

    def softmax(self, name, x):
        return self._run(name, "softmax", (x,))

    @staticmethod
    def flatten(x):
        """Free reshape to [N, H*W*C], not a layer."""
        return x.reshape(x.shape[0], -1)

    # -- blocks --------------------------------------------------------------------------

    def block(self, kind: str, name: str, body: Callable, x, **kwargs):
        """Runs `body(net, name, x, **kwargs)`, a group of layers a fused kernel may replace.

        When the op table has an entry for `kind`, that kernel runs the whole block as
        `ops[kind](layers, params, x)`; the layers are still described by `body`.
        """
        fused = self.ops.get(kind)
        outer, self._block = self._block, name
        try:
            if fused is None or self.params is None:
                return body(self, name, x, **kwargs)
            inner = describe(lambda net, x_: net.block(kind, name, body, x_, **kwargs), x)
            self.layers.extend(inner.layers)
            return fused(inner.layers, {k: self.params[k] for k in inner.weight_specs}, x)
        finally:
            self._block = outer

    # -- internals -----------------------------------------------------------------------

    def _pool(self, op, name, x, window, stride, padding, ceil_mode):
        window, stride = _pair(window), _pair(stride)
        pads = make_config(x.shape, (*window, 1, 1), stride=stride, padding=padding).padding
        if ceil_mode:
            pads = tuple(
                _ceil_mode_padding(size, k, s, p[0])
                for size, k, s, p in zip(x.shape[1:3], window, stride, pads)
            )
        return self._run(name, op, (x,), window=window, stride=stride, padding=pads)

    def _weights(self, name, weight_shape, dtype, init_scale):
        bias_shape = weight_shape[-1:]
        if self.params is None:
            self.weight_specs[name] = WeightSpec(weight_shape, init_scale)
            return jnp.zeros(weight_shape, dtype), jnp.zeros(bias_shape, dtype)
        if name not in self.params:
            raise ValueError(f"params have no entry for layer {name!r}")
        w, b = self.params[name]["w"], self.params[name]["b"]
        if w.shape != weight_shape or b.shape != bias_shape:
            raise ValueError(
                f"layer {name!r} needs weight {weight_shape} and bias {bias_shape}, "
                f"params hold {w.shape} and {b.shape}"
            )
        if w.dtype != dtype or b.dtype != dtype:
            raise TypeError(f"layer {name!r}: params are {w.dtype}, the input is {np.dtype(dtype).name}")
        return w, b

    def _run(self, name, op, inputs, weights=(), **attributes):
        attributes = {k: v for k, v in attributes.items() if v is not None}
        y = _bind(self.ops, op, attributes)(*inputs, *weights)
        input_shapes = tuple(tuple(a.shape) for a in inputs)
        weight_shape = tuple(weights[0].shape) if weights else None
        itemsize = np.dtype(y.dtype).itemsize
        elements = sum(math.prod(s) for s in input_shapes) + math.prod(y.shape)
        elements += sum(math.prod(w.shape) for w in weights)
        self.layers.append(LayerInfo(
            name=name, op=op, dtype=np.dtype(y.dtype).name, input_shapes=input_shapes,
            output_shape=tuple(y.shape), weight_shape=weight_shape,
            bias_shape=tuple(weights[1].shape) if weights else None,
            block=self._block,
            flops=_flops(op, input_shapes, weight_shape, y.shape, attributes.get("window")),
            bytes=itemsize * elements, **attributes,
        ))
        return y


def describe(body: Callable, x, **kwargs) -> Net:
    """Runs `body(net, x, **kwargs)` on shapes only; the returned Net holds the layers and
    weight specs. `x` needs only .shape and .dtype."""
    net = Net(XLA_OPS)
    jax.eval_shape(lambda x_: body(net, x_, **kwargs), jax.ShapeDtypeStruct(x.shape, x.dtype))
    return net


def mlp_head(net: Net, x, layers: tuple[tuple[str, int], ...]):
    """Dense layers with ReLU between them; the last one gives logits."""
    *hidden, (last_name, classes) = layers
    for name, features in hidden:
        x = net.dense(name, x, features)
    return net.dense(last_name, x, classes, activation=None)
