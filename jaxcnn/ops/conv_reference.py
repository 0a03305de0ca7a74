"""Pure-lax reference of conv2d: the CPU lowering, the fallback, and the tests' oracle."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jaxcnn.ops.conv_args import Conv2dConfig

DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")


def linear_conv2d(x, w, cfg: Conv2dConfig, *, out_dtype=None):
    """The convolution alone (no bias, no activation), in `x.dtype` unless `out_dtype`.

    fp32 asks for HIGHEST (true fp32, like the kernel); half types need no upcast.
    """
    precision = lax.Precision.HIGHEST if x.dtype == jnp.float32 else lax.Precision.DEFAULT
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=cfg.stride,
        padding=cfg.padding,
        rhs_dilation=cfg.dilation,
        dimension_numbers=DIMENSION_NUMBERS,
        feature_group_count=cfg.groups,
        precision=precision,
        preferred_element_type=out_dtype,
    )


def conv2d_reference(x, w, bias, cfg: Conv2dConfig):
    """Same semantics as the CUDA kernel: fp32 accumulate, bias and ReLU in fp32, one rounding."""
    y = linear_conv2d(x, w, cfg, out_dtype=jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    if cfg.activation == "relu":
        y = jnp.maximum(y, 0.0)
    return y.astype(x.dtype)
