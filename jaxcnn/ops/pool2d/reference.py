"""Pure-lax references of pooling: the CPU lowering, the fallback, the tests' oracle and the
backward passes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcnn.ops.pool2d.config import Pool2dConfig, avg_divisors


def _window_args(cfg: Pool2dConfig):
    """reduce_window's per-axis window, strides and padding for cfg.layout."""
    h, w = cfg.spatial_axes
    dims, strides, pads = [1] * 4, [1] * 4, [(0, 0)] * 4
    dims[h], dims[w] = cfg.window
    strides[h], strides[w] = cfg.stride
    pads[h], pads[w] = cfg.padding
    return tuple(dims), tuple(strides), tuple(pads)


def pool2d_reference(x, cfg: Pool2dConfig):
    """Same semantics as the CUDA kernels: max with -inf padding in x's dtype (exact, NaN
    propagates), avg summed in fp32 and divided once, then rounded to x's dtype."""
    dims, strides, pads = _window_args(cfg)
    if cfg.mode == "max":
        # A concrete (NumPy) init: under a trace jnp.array would be a tracer and lax would
        # take its generic reduce_window, which has no reverse-mode derivative.
        init = np.array(-np.inf, x.dtype)
        return lax.reduce_window(x, init, lax.max, dims, strides, pads)
    total = lax.reduce_window(x.astype(jnp.float32), 0.0, lax.add, dims, strides, pads)
    if cfg.count_include_pad:
        return (total / (cfg.window[0] * cfg.window[1])).astype(x.dtype)
    divisor = jnp.asarray(avg_divisors(x.shape, cfg))  # [P, Q], a trace-time constant
    h, w = cfg.spatial_axes
    shape = [1] * 4
    shape[h], shape[w] = divisor.shape
    return (total / divisor.reshape(shape)).astype(x.dtype)

