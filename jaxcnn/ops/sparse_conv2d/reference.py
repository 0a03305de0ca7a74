"""Pure-lax reference of the zero-skipping conv and of its fused max-pool variant: the CPU
lowering, the fallback, the backward pass and the tests' oracle.

The CUDA kernel accumulates exact fp32 FMAs whatever `precision` says (skipping zeros changes
no product), so the reference is conv2d's at "highest" precision: fp32 accumulate, bias and
activation in fp32, one rounding to x's dtype. The pooled variant is
reduce_window(max) over relu(conv + bias) rounded to x's dtype, equal to the kernel's single
rounding of the window max because rounding is monotone.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jaxcnn.ops.conv2d.reference import conv2d_reference
from jaxcnn.ops.sparse_conv2d.config import SparseConfig


def sparse_reference(x, w, bias, cfg: SparseConfig):
    conv = cfg.conv.replace(precision="highest")
    if cfg.pool is None:
        return conv2d_reference(x, w, bias, conv)
    y = conv2d_reference(x, w, bias, conv.replace(activation="relu"))
    pool = cfg.pool
    return lax.reduce_window(
        y, -jnp.inf, lax.max, (1, *pool.window, 1), (1, *pool.stride, 1),
        ((0, 0), *pool.padding, (0, 0)),
    )
