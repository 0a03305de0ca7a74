"""`ModelSpec`: one model body plus everything derived from it (params, forward, layer table)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxcnn.models.backends import get_ops
from jaxcnn.models.layers import LayerInfo, Net, bind_layer, describe
from jaxcnn.ops.conv2d.config import SUPPORTED_DTYPES

# Biases stand in for folded batch-norm shifts: small but non-zero, so tests see them.
BIAS_STD = 0.01


class LayerFn(NamedTuple):
    """One layer alone, for timing it: `fn(*example_args)` runs it (jit-able)."""

    info: LayerInfo
    fn: Callable
    example_args: tuple


def _dtype(dtype) -> np.dtype:
    dtype = jnp.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype must be one of {', '.join(d.name for d in SUPPORTED_DTYPES)}, got {dtype.name}")
    return dtype


@dataclass(frozen=True)
class ModelSpec:
    """A CNN in NHWC. `body(net, x) -> logits` is the single definition of the architecture."""

    name: str
    image_size: int
    channels: int
    num_classes: int
    body: Callable[[Net, Any], Any]

    def input_shape(self, batch: int = 1) -> tuple[int, int, int, int]:
        return (batch, self.image_size, self.image_size, self.channels)

    def layers(self, batch: int = 1, dtype=jnp.float32, *, softmax: bool = False) -> list[LayerInfo]:
        """The layer table of `apply` on a [batch, ...] input of `dtype` (with the same softmax)."""
        return list(_describe(self, batch, _dtype(dtype), softmax).layers)

    def init(self, key, dtype=jnp.float32) -> dict[str, dict[str, jax.Array]]:
        """He-normal weights, small normal biases: {layer name: {"w": ..., "b": ...}}.

        `key` is a PRNG key or an int seed; the same key gives the same params.
        """
        if isinstance(key, (int, np.integer)):
            key = jax.random.PRNGKey(int(key))
        return _init_fn(self, _dtype(dtype))(key)

    def abstract_params(self, dtype=jnp.float32) -> dict[str, dict[str, jax.ShapeDtypeStruct]]:
        """The params' shapes and dtypes without creating them (for jax.eval_shape, lowering)."""
        dtype = _dtype(dtype)
        return {
            name: {"w": jax.ShapeDtypeStruct(spec.weight_shape, dtype),
                   "b": jax.ShapeDtypeStruct(spec.weight_shape[-1:], dtype)}
            for name, spec in _describe(self, 1, dtype, False).weight_specs.items()
        }

    def apply(self, params, x, backend: str = "xla", *, softmax: bool = False):
        """Logits [N, num_classes] (probabilities with softmax=True) for NHWC images `x`."""
        ops = get_ops(backend)
        if x.ndim != 4 or x.shape[-1] != self.channels:
            raise ValueError(f"{self.name} takes NHWC images with {self.channels} channels, got shape {x.shape}")
        _dtype(x.dtype)
        return _forward(self, Net(ops, params), x, softmax)

    def layer_fns(self, params, batch: int, dtype=jnp.float32, backend: str = "jaxcnn", *,
                  ops: tuple[str, ...] | None = None, seed: int = 0) -> list[LayerFn]:
        """Every layer (or those whose op is in `ops`) alone on `backend`, with example arguments:
        random normal inputs and the layer's own weights from `params` (cast to `dtype`).

        All the example inputs exist at once: filter with `ops` for big batches."""
        table = get_ops(backend)
        dtype = _dtype(dtype)
        calls = []
        for index, info in enumerate(self.layers(batch, dtype)):
            if ops is not None and info.op not in ops:
                continue
            keys = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), index), len(info.input_shapes))
            inputs = tuple(jax.random.normal(k, s, jnp.float32).astype(dtype) for k, s in zip(keys, info.input_shapes))
            weights = () if info.weight_shape is None else tuple(
                params[info.name][k].astype(dtype) for k in ("w", "b"))
            calls.append(LayerFn(info, bind_layer(info, table), inputs + weights))
        return calls


def _forward(spec: ModelSpec, net: Net, x, softmax: bool):
    logits = spec.body(net, x)
    return net.softmax("softmax", logits) if softmax else logits


@functools.lru_cache(maxsize=64)
def _init_fn(spec: ModelSpec, dtype: np.dtype) -> Callable:
    """One jitted program drawing every weight from a single normal sample, sliced per layer:
    one random op compiles in well under a second, one per layer takes tens of seconds."""
    weight_specs = _describe(spec, 1, dtype, False).weight_specs
    shapes = [shape for w in weight_specs.values() for shape in (w.weight_shape, w.weight_shape[-1:])]
    scales = [scale for w in weight_specs.values() for scale in (w.std, BIAS_STD)]
    offsets = np.cumsum([0] + [math.prod(shape) for shape in shapes])

    def init(key):
        sample = jax.random.normal(key, (int(offsets[-1]),), jnp.float32)
        arrays = iter(
            (scale * sample[start:stop].reshape(shape)).astype(dtype)
            for shape, scale, start, stop in zip(shapes, scales, offsets[:-1], offsets[1:])
        )
        return {name: {"w": next(arrays), "b": next(arrays)} for name in weight_specs}

    return jax.jit(init)


@functools.lru_cache(maxsize=64)
def _describe(spec: ModelSpec, batch: int, dtype: np.dtype, softmax: bool) -> Net:
    return describe(lambda net, x: _forward(spec, net, x, softmax),
                    jax.ShapeDtypeStruct(spec.input_shape(batch), dtype))
