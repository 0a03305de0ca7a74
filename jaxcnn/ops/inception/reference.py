"""Pure-lax reference of the fused inception block: the unfused composition, each conv with
conv2d's semantics (fp32 accumulate, bias and ReLU in fp32, one rounding to x's dtype; the
reduce outputs are rounded to x's dtype between layers, as the CUDA composition stores them).
It is the CPU lowering, the fallback, the backward pass and the tests' oracle."""

from __future__ import annotations

import jax.numpy as jnp

from jaxcnn.ops.conv2d.config import make_config
from jaxcnn.ops.conv2d.reference import conv2d_reference
from jaxcnn.ops.inception.config import POOL_WINDOW, InceptionConfig
from jaxcnn.ops.pool2d.config import make_pool_config
from jaxcnn.ops.pool2d.reference import pool2d_reference


def conv_config(x_shape, w_shape, cfg: InceptionConfig, algorithm: str = "auto"):
    """conv2d's config of one conv of the block: stride 1, SAME (k // 2) padding, ReLU."""
    return make_config(x_shape, w_shape, padding=w_shape[0] // 2, activation="relu",
                       precision=cfg.precision, algorithm=algorithm)


def pool_config(x_shape, dtype):
    return make_pool_config(x_shape, dtype, mode="max", window=POOL_WINDOW, stride=1,
                            padding=POOL_WINDOW // 2)


def _conv(x, w, b, cfg: InceptionConfig):
    return conv2d_reference(x, w, b, conv_config(x.shape, w.shape, cfg))


def inception_reference(x, w_1x1, w_3x3_reduce, w_3x3, w_5x5_reduce, w_5x5, w_pool_proj,
                        b_1x1, b_3x3_reduce, b_3x3, b_5x5_reduce, b_5x5, b_pool_proj,
                        *, cfg: InceptionConfig = InceptionConfig()):
    """concat([1x1, 3x3(3x3_reduce), 5x5(5x5_reduce), pool_proj(maxpool 3x3/1)], channels)."""
    pooled = pool2d_reference(x, pool_config(x.shape, x.dtype))
    return jnp.concatenate([
        _conv(x, w_1x1, b_1x1, cfg),
        _conv(_conv(x, w_3x3_reduce, b_3x3_reduce, cfg), w_3x3, b_3x3, cfg),
        _conv(_conv(x, w_5x5_reduce, b_5x5_reduce, cfg), w_5x5, b_5x5, cfg),
        _conv(pooled, w_pool_proj, b_pool_proj, cfg),
    ], axis=-1)
