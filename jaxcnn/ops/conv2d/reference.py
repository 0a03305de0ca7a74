"""Pure-lax reference of conv2d: the CPU lowering, the fallback, and the tests' oracle."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxcnn.ops.conv2d.config import Conv2dConfig
from jaxcnn.ops.epilogue import apply_activation, epilogue_reference


def linear_conv2d(x, w, cfg: Conv2dConfig, *, out_dtype=None, weight_spec: str = "HWIO"):
    """The convolution alone (no bias, no activation), in `x.dtype` unless `out_dtype`.

    x and the result are in cfg.layout, w is HWIO (or the axis order `weight_spec` names). fp32 follows cfg.precision (XLA may use TF32
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
        dimension_numbers=(cfg.layout, weight_spec, cfg.layout),
        feature_group_count=cfg.groups,
        precision=precision,
        preferred_element_type=out_dtype,
    )


def conv2d_reference(x, w, bias, cfg: Conv2dConfig, *, residual=None, out_dtype=None):
    """Same semantics as the CUDA kernels: fp32 accumulate, the epilogue (bias, residual,
    activation) in fp32, one rounding to x's dtype (or `out_dtype`)."""
    y = linear_conv2d(x, w, cfg, out_dtype=jnp.float32)
    y = epilogue_reference(y, bias, residual, cfg.activation, cfg.alpha, cfg.layout.index("C"))
    return y.astype(x.dtype if out_dtype is None else out_dtype)


def xla_conv2d(x, w, bias, cfg: Conv2dConfig, *, residual=None, weight_spec: str = "HWIO"):
    """conv2d as a JAX user writes it, what algorithm="xla" runs: the conv in x's dtype (cuDNN
    still accumulates in fp32), then bias, residual and activation in x's dtype. For half types
    that rounds more than once, unlike conv2d_reference, but it is the formulation XLA fuses
    (into cuDNN's conv + bias + activation where it can) and runs fastest. `weight_spec`: w's
    axis order (the weight prologue hands XLA's conv its weights in the order it reads)."""
    y = linear_conv2d(x, w, cfg, weight_spec=weight_spec)
    if bias is not None:
        channel_axis = cfg.layout.index("C")
        y = y + jnp.expand_dims(bias, tuple(range(channel_axis + 1 - 4, 0)))
    if residual is not None:
        y = y + residual
    return apply_activation(y, cfg.activation, cfg.alpha)


def check_residual(residual_shape, residual_dtype, out_shape, x_dtype) -> None:
    """A residual operand must have the conv output's shape (in its layout) and x's dtype."""
    if tuple(residual_shape) != tuple(out_shape):
        raise ValueError(f"residual must have the output's shape {tuple(out_shape)}, got {tuple(residual_shape)}")
    if np.dtype(residual_dtype) != np.dtype(x_dtype):
        raise TypeError(f"residual dtype {np.dtype(residual_dtype).name} must match x dtype {np.dtype(x_dtype).name}")
