"""Pure-lax references of the straight conv chains: the unfused composition, each conv
accumulating in float32 with bias and activation in float32 and one rounding to x's dtype, so
the intermediate is rounded between the layers exactly as the CUDA kernels keep it. They are
the CPU lowering, the fallback for configs the fused kernels do not run, the backward pass and
the tests' oracle."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jaxcnn.ops.chain.config import ChainConfig
from jaxcnn.ops.epilogue import apply_activation


def activate(v, activation):
    """The conv epilogue's activation (jax.nn's math; NaN propagates)."""
    return apply_activation(v, activation)


def chain_layer(x, w, b, activation, *, stride=1, padding=((0, 0), (0, 0)), groups=1):
    """One conv of a chain as the fused kernels define it: float32 accumulation, bias and
    activation in float32, one rounding to x's dtype. padding: an int (every side) or
    ((top, bottom), (left, right))."""
    if isinstance(padding, int):
        padding = ((padding, padding), (padding, padding))
    # fp32 fp32-accurately (no TF32), as the unfused fp32 layers the fused op stands for.
    precision = lax.Precision.HIGHEST if x.dtype == jnp.float32 else lax.Precision.DEFAULT
    y = lax.conv_general_dilated(
        x, w, (stride, stride), padding,
        dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups,
        precision=precision, preferred_element_type=jnp.float32,
    )
    return activate(y + b.astype(jnp.float32), activation).astype(x.dtype)


def conv3x3_conv1x1_reference(x, w3, b3, w1, b1, *, cfg: ChainConfig):
    """act2(conv1x1(act1(conv3x3_pad1(x, w3) + b3), w1) + b1)."""
    t = chain_layer(x, w3, b3, cfg.act1, padding=((1, 1), (1, 1)))
    return chain_layer(t, w1, b1, cfg.act2)


def conv1x1_depthwise_reference(x, w1, b1, wd, bd, *, cfg: ChainConfig):
    """act2(depthwise3x3(act1(conv1x1(x, w1) + b1), wd, stride, cfg.padding) + bd)."""
    t = chain_layer(x, w1, b1, cfg.act1)
    return chain_layer(t, wd, bd, cfg.act2, stride=cfg.stride, padding=cfg.padding, groups=wd.shape[3])
