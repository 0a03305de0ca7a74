"""What jaxcnn.flax's linen and nnx modules share: Flax argument conventions mapped onto
jaxcnn.conv2d / the pools, with the unsupported ones rejected by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from jaxcnn.ops.conv2d.api import conv2d
from jaxcnn.ops.fire.api import fire
from jaxcnn.ops.pool2d.api import avg_pool2d, max_pool2d


def pair(value: Any, name: str, allow_int: bool = True) -> tuple[int, int]:
    """A 2-D stride/dilation (int or 2 ints; None = 1, as in Flax) or, with allow_int=False, a
    kernel/window shape: Flax reads an int there as a 1-D window, which jaxcnn does not run."""
    if value is None and allow_int:
        return (1, 1)
    if isinstance(value, int) and not isinstance(value, bool):
        if allow_int:
            return (value, value)
        raise ValueError(f"{name}: Flax reads an int as a 1-D window; jaxcnn.flax runs 2-D windows: pass ({value}, {value})")
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2 \
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return (int(value[0]), int(value[1]))
    raise ValueError(f"{name}: jaxcnn.flax supports 2-D convolutions and pools only: an int or 2 ints, got {value!r}")


def _padding_mode(padding: str, accepted: str) -> str:
    """A padding string: "SAME" or "VALID" in any case; another: ValueError saying what is
    accepted instead."""
    if padding.upper() in ("SAME", "VALID"):
        return padding.upper()
    raise ValueError(f"padding: {accepted}, got {padding!r}")


def conv_padding(padding: Any):
    """Flax's conv padding ("SAME", "VALID", int, 2 ints, 2 (low, high) pairs) for conv2d."""
    if isinstance(padding, str):
        return _padding_mode(padding, "jaxcnn.flax.Conv supports 'SAME', 'VALID' and explicit padding")
    if isinstance(padding, int) and not isinstance(padding, bool):
        return ((padding, padding), (padding, padding))
    if isinstance(padding, Sequence) and len(padding) == 2:
        out = []
        for p in padding:
            if isinstance(p, int) and not isinstance(p, bool):
                out.append((p, p))
            elif isinstance(p, Sequence) and len(p) == 2 and all(isinstance(v, int) for v in p):
                out.append((int(p[0]), int(p[1])))
            else:
                break
        else:
            return tuple(out)
    raise ValueError(f"padding: expected 'SAME', 'VALID', an int or 2 ints / (low, high) pairs, got {padding!r}")


def pool_padding(padding: Any):
    """Flax's pool padding for the pools: "SAME", "VALID", or explicit padding as conv_padding."""
    if isinstance(padding, str):
        return _padding_mode(padding, "expected 'SAME', 'VALID' or 2 (low, high) pairs")
    return conv_padding(padding)


def check_unsupported(**given) -> None:
    """ValueError naming the first Flax argument set to something jaxcnn.flax does not run."""
    defaults = dict(input_dilation=(1, None), mask=(None,), conv_general_dilated=(None,),
                    conv_general_dilated_cls=(None,), preferred_element_type=(None,))
    for name, value in given.items():
        if name == "input_dilation":
            if value is None or pair(value, name) == (1, 1):
                continue
        elif value is None or any(value is d for d in defaults[name]):
            continue
        raise ValueError(f"{name}: not supported by jaxcnn.flax.Conv (got {value!r}); use flax's own Conv for it")


def batched(fn, x, rank: int = 4):
    """Applies fn (on [N, H, W, C]) to x with Flax's batch conventions: [H, W, C] without a
    batch, or several leading batch dims."""
    x = jnp.asarray(x)
    if x.ndim == rank - 1:
        return fn(x[None])[0]
    if x.ndim < rank:
        raise ValueError(f"inputs: expected [..., H, W, C] with at least {rank - 1} dims, got shape {x.shape}")
    lead = x.shape[:-3]
    y = fn(x.reshape((-1,) + x.shape[-3:]))
    return y.reshape(lead + y.shape[1:])


def conv_apply(x, kernel, bias, *, strides, padding, kernel_dilation, feature_group_count, precision,
               activation, algorithm, dtype):
    """The conv of a Flax Conv layer: promote to `dtype` (else the common type), jaxcnn.conv2d."""
    dtype = dtype or jnp.result_type(x, kernel, *(() if bias is None else (bias,)))
    x, kernel = jnp.asarray(x, dtype), jnp.asarray(kernel, dtype)
    bias = None if bias is None else jnp.asarray(bias, dtype)
    return batched(lambda x: conv2d(x, kernel, bias, stride=pair(strides, "strides"), padding=conv_padding(padding),
                                    dilation=pair(kernel_dilation, "kernel_dilation"), groups=feature_group_count,
                                    activation=activation, precision=precision, algorithm=algorithm), x)


def max_pool(inputs, window_shape, strides=None, padding="VALID"):
    """flax.linen.max_pool (NHWC, 2-D windows) on jaxcnn.max_pool2d."""
    window = pair(window_shape, "window_shape", allow_int=False)
    stride = pair(strides, "strides")  # None: 1, as in Flax (not the window, as in jaxcnn)
    return batched(lambda x: max_pool2d(x, window, stride, padding=pool_padding(padding)), inputs)


def avg_pool(inputs, window_shape, strides=None, padding="VALID", count_include_pad=True):
    """flax.linen.avg_pool (NHWC, 2-D windows) on jaxcnn.avg_pool2d."""
    window = pair(window_shape, "window_shape", allow_int=False)
    stride = pair(strides, "strides")  # None: 1, as in Flax (not the window, as in jaxcnn)
    if not isinstance(count_include_pad, bool):
        raise TypeError(f"count_include_pad: expected a bool, got {type(count_include_pad).__name__}")
    return batched(lambda x: avg_pool2d(x, window, stride, padding=pool_padding(padding),
                                        count_include_pad=count_include_pad), inputs)


def fire_apply(x, params, *, fused: bool, algorithm: str, dtype):
    """The fire module on {squeeze, expand1x1, expand3x3: (kernel, bias)}: one fused jaxcnn.fire
    kernel, or three jaxcnn.conv2d (bias + ReLU fused into each) and a concatenate."""
    dtype = dtype or jnp.result_type(x, *(v for kb in params.values() for v in kb if v is not None))
    x = jnp.asarray(x, dtype)
    p = {k: tuple(None if v is None else jnp.asarray(v, dtype) for v in kb) for k, kb in params.items()}
    (sw, sb), (e1w, e1b), (e3w, e3b) = p["squeeze"], p["expand1x1"], p["expand3x3"]

    def run(x):
        if fused:
            return fire(x, sw, e1w, e3w, sb, e1b, e3b, algorithm=algorithm)
        s = conv2d(x, sw, sb, padding="VALID", activation="relu")
        return jnp.concatenate([conv2d(s, e1w, e1b, padding="VALID", activation="relu"),
                                conv2d(s, e3w, e3b, padding=((1, 1), (1, 1)), activation="relu")], axis=-1)
    return batched(run, x)
