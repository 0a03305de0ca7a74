"""Pure-lax reference of the fused conv + bias + ReLU + max-pool: the CPU lowering, the fallback,
the backward pass and the tests' oracle.

Same semantics as the CUDA kernels: the conv accumulates in fp32, bias and ReLU in fp32, one
rounding to x's dtype (conv2d's semantics), then the max over each pool window with -inf padding
(lax.reduce_window). Rounding is monotonic, so pooling before or after it gives the same values:
the result equals `max_pool2d(conv2d(x, w, b, activation="relu"))` exactly.
"""

from __future__ import annotations

import numpy as np
from jax import lax

from jaxcnn.ops.conv2d_pool.config import ConvPoolConfig
from jaxcnn.ops.conv2d.reference import conv2d_reference, linear_conv2d


def max_pool_nhwc(y, cfg: ConvPoolConfig):
    """reduce_window max over H, W of an NHWC y with the config's window, stride and padding."""
    # A concrete (NumPy) init: under a trace a jnp scalar would be a tracer and lax would pick
    # its generic reduce_window, which has no reverse-mode derivative.
    init = np.array(-np.inf, y.dtype)
    return lax.reduce_window(
        y, init, lax.max, (1, *cfg.pool_window, 1), (1, *cfg.pool_stride, 1),
        ((0, 0), *cfg.pool_padding, (0, 0)),
    )


def conv_pool_reference(x, w, bias, cfg: ConvPoolConfig):
    """max_pool(relu(conv(x, w) + bias)) on NHWC x, HWIO w, [K] bias."""
    return max_pool_nhwc(conv2d_reference(x, w, bias, cfg.conv), cfg)


def xla_conv_pool(x, w, bias, cfg: ConvPoolConfig):
    """The layer as a JAX user writes it (what XLA runs and the benchmark compares with): conv in
    x's dtype, bias and ReLU in x's dtype, then reduce_window max."""
    y = linear_conv2d(x, w, cfg.conv)
    y = lax.max(y + bias.reshape(1, 1, 1, -1), np.array(0, y.dtype))
    return max_pool_nhwc(y, cfg)
