"""The op tables the models run on: the one place where a new jaxcnn kernel replaces lax.

A table maps a layer's `op` (see `LayerInfo.op`) to a function of the layer's arrays
(inputs, then weight and bias) and its static attributes as keywords (`LayerInfo.op_kwargs`):

  conv2d(x, w, bias, *, stride, padding, dilation, groups, activation)
  dense(x, w, bias, *, activation)
  maxpool(x, *, window, stride, padding) / avgpool(...)
  concat(*xs), add(a, b, *, activation), relu6(x), softmax(x)

A table may also map a block kind ("fire", "inception", "bottleneck", "inverted_residual") to
a fused kernel `fn(layers, params, x)` that runs the whole block at once; `layers` are the
block's LayerInfos and `params` their weights by layer name (see `Net.block`). Without such an
entry a block runs layer by layer.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

import jaxcnn

DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")
# None is XLA's DEFAULT precision (TF32 for float32 on recent GPUs) unless the caller sets
# jax.default_matmul_precision; an explicit Precision.DEFAULT would ignore that setting.
XLA_PRECISION = None
_ACTIVATIONS: dict[str | None, Callable] = {None: lambda y: y, "relu": jax.nn.relu}


def xla_conv2d(x, w, bias=None, *, stride=(1, 1), padding=((0, 0), (0, 0)), dilation=(1, 1),
               groups=1, activation=None):
    """What a plain JAX model does: XLA's convolution, then bias and ReLU."""
    y = lax.conv_general_dilated(
        x, w, window_strides=stride, padding=padding, rhs_dilation=dilation,
        dimension_numbers=DIMENSION_NUMBERS, feature_group_count=groups,
        precision=XLA_PRECISION,
    )
    if bias is not None:
        y = y + bias
    return _ACTIVATIONS[activation](y)


def _window_dims(window, stride, padding):
    """NHWC reduce_window arguments of a 2-D window: batch and channels untouched."""
    return (1, *window, 1), (1, *stride, 1), ((0, 0), *padding, (0, 0))


def max_pool(x, *, window, stride, padding):
    """Max over each window; padding never wins (it is -inf)."""
    return lax.reduce_window(x, -jnp.inf, lax.max, *_window_dims(window, stride, padding))


def avg_pool(x, *, window, stride, padding):
    """Mean over each window, padding counted as zeros; summed in float32 so bf16 stays exact."""
    total = lax.reduce_window(x.astype(jnp.float32), 0.0, lax.add, *_window_dims(window, stride, padding))
    return (total / (window[0] * window[1])).astype(x.dtype)


def dense(x, w, bias=None, *, activation=None):
    y = jnp.dot(x, w, precision=XLA_PRECISION)
    if bias is not None:
        y = y + bias
    return _ACTIVATIONS[activation](y)


def concat(*xs):
    return jnp.concatenate(xs, axis=-1)


def add(a, b, *, activation=None):
    return _ACTIVATIONS[activation](a + b)


def relu6_clamp(x):
    """The upper clamp of ReLU6: the models put it after a conv whose fused ReLU did the lower one."""
    return jnp.minimum(x, jnp.asarray(6, x.dtype))


def softmax(x):
    return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


XLA_OPS: dict[str, Callable] = {
    "conv2d": xla_conv2d,
    "maxpool": max_pool,
    "avgpool": avg_pool,
    "dense": dense,
    "concat": concat,
    "add": add,
    "relu6": relu6_clamp,
    "softmax": softmax,
}

# Pools, dense, softmax and elementwise ops stay lax until their kernels exist; a kernel slots
# in here by name (e.g. "maxpool": jaxcnn.maxpool2d, "fire": jaxcnn.fused_fire).
JAXCNN_OPS: dict[str, Callable] = {
    **XLA_OPS,
    "conv2d": jaxcnn.conv2d,
}

BACKENDS: dict[str, dict[str, Callable]] = {"xla": XLA_OPS, "jaxcnn": JAXCNN_OPS}


def get_ops(backend: str) -> dict[str, Callable]:
    try:
        return BACKENDS[backend]
    except (KeyError, TypeError):
        raise ValueError(f"unknown backend {backend!r}; known backends: {', '.join(BACKENDS)}") from None
