"""Pure-lax reference of the fused fire module: the unfused composition, each conv with
conv2d's semantics (fp32 accumulate, bias and ReLU in fp32, one rounding to x's dtype), so the
squeeze output is rounded to x's dtype between the layers exactly as the CUDA kernel keeps it.
It is the CPU lowering, the fallback, the backward pass and the tests' oracle."""

from __future__ import annotations

import jax.numpy as jnp

from jaxcnn.ops.conv2d.config import make_config
from jaxcnn.ops.conv2d.reference import conv2d_reference


def _conv(x, w, b, padding):
    # fp32 is computed fp32-accurately, as the CUDA-core fused kernel does.
    cfg = make_config(x.shape, w.shape, padding=padding, activation="relu", precision="highest")
    return conv2d_reference(x, w, b, cfg)


def fire_reference(x, squeeze_w, expand1_w, expand3_w, squeeze_b, expand1_b, expand3_b):
    """relu(squeeze 1x1) -> concat([relu(expand 1x1), relu(expand 3x3, pad 1)], channels)."""
    s = _conv(x, squeeze_w, squeeze_b, 0)
    y3 = _conv(s, expand3_w, expand3_b, 1)
    if expand1_w.shape[-1] == 0:  # the straight squeeze -> 3x3 chain
        return y3
    return jnp.concatenate([_conv(s, expand1_w, expand1_b, 0), y3], axis=-1)
