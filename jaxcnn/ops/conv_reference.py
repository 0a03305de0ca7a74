"""Pure-lax reference of conv2d: the CPU lowering, the fallback, and the tests' oracle."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jaxcnn.ops.conv_args import Conv2dConfig


def linear_conv2d(x, w, cfg: Conv2dConfig, *, out_dtype=None):
    """The convolution alone (no bias, no activation), in `x.dtype` unless `out_dtype`.

    x and the result are in cfg.layout, w is HWIO. fp32 follows cfg.precision (XLA may use TF32
    for "default" on GPUs, as our tensor-core kernel does); half types need no upcast.
    """
    highest = x.dtype == jnp.float32 and cfg.precision == "highest"
    precision = lax.Precision.HIGHEST if highest else lax.Precision.DEFAULT
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=cfg.stride,
        padding=cfg.padding,
        rhs_dilation=cfg.dilation,
        dimension_numbers=(cfg.layout, "HWIO", cfg.layout),
        feature_group_count=cfg.groups,
        precision=precision,
        preferred_element_type=out_dtype,
    )


def conv2d_reference(x, w, bias, cfg: Conv2dConfig):
    """Same semantics as the CUDA kernel: fp32 accumulate, bias and ReLU in fp32, one rounding."""
    y = linear_conv2d(x, w, cfg, out_dtype=jnp.float32)
    if bias is not None:
        channel_axis = cfg.layout.index("C")
        y = y + jnp.expand_dims(bias.astype(jnp.float32), tuple(range(channel_axis + 1 - 4, 0)))
    if cfg.activation == "relu":
        y = jnp.maximum(y, 0.0)
    return y.astype(x.dtype)


def xla_conv2d(x, w, bias, cfg: Conv2dConfig):
    """conv2d as a JAX user writes it, what algorithm="xla" runs: the conv in x's dtype (cuDNN
    still accumulates in fp32), then bias and ReLU in x's dtype. For half types that rounds twice,
    unlike conv2d_reference, but it is the formulation XLA fuses and runs fastest."""
    y = linear_conv2d(x, w, cfg)
    if bias is not None:
        channel_axis = cfg.layout.index("C")
        y = y + jnp.expand_dims(bias, tuple(range(channel_axis + 1 - 4, 0)))
    return jnp.maximum(y, 0) if cfg.activation == "relu" else y
