"""`jaxcnn.max_pool2d` / `jaxcnn.avg_pool2d`: 2-D pooling in NHWC, NCHW or CHWN.

CUDA runs the layout-specialized kernels of cuda_ops/pool through XLA FFI (each layout reads
along its contiguous axis with 16-byte loads); every other platform runs the lax reference.
Gradients are the lax reference's (XLA's select-and-scatter / pad-and-sum).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jaxcnn.ops.layout_axes import LAYOUT_CODES
from jaxcnn.ops.operand_checks import as_array, is_empty_batch
from jaxcnn.ops.pool2d.config import (
    Pool2dConfig,
    make_pool_config,
    pool2d_output_shape,
)
from jaxcnn.ops.pool2d.reference import pool2d_reference
from jaxcnn.ops.primitive import BatchShardedPrimitive

# Shardy rules per layout: the batch factor "n" stays sharded, spatial dims change size.
_RULES = {
    "NHWC": "n h w c -> n p q c",
    "NCHW": "n c h w -> n c p q",
    "CHWN": "c h w n -> c p q n",
}


class Pool2dPrimitive(BatchShardedPrimitive):
    name = "jaxcnn_pool2d"
    sharding_rules = {}  # per layout: see sharding_rule

    @staticmethod
    def abstract(x, *, cfg: Pool2dConfig, operand_names):
        return ShapedArray(pool2d_output_shape(x.shape, x.dtype, cfg), x.dtype)

    @staticmethod
    def reference(x, *, cfg: Pool2dConfig, operand_names):
        return pool2d_reference(x, cfg)

    @classmethod
    def cuda_lowering(cls, ctx, x, *, cfg: Pool2dConfig, operand_names):
        (pt, pb), (pl, pr) = cfg.padding
        attrs = dict(
            layout=np.int64(LAYOUT_CODES[cfg.layout]),
            window_h=np.int64(cfg.window[0]), window_w=np.int64(cfg.window[1]),
            stride_h=np.int64(cfg.stride[0]), stride_w=np.int64(cfg.stride[1]),
            pad_top=np.int64(pt), pad_bottom=np.int64(pb),
            pad_left=np.int64(pl), pad_right=np.int64(pr),
        )
        if cfg.mode == "max":
            return jax.ffi.ffi_lowering("jaxcnn_max_pool2d_fwd")(ctx, x, **attrs)
        return jax.ffi.ffi_lowering("jaxcnn_avg_pool2d_fwd")(
            ctx, x, count_include_pad=np.int64(cfg.count_include_pad), **attrs
        )

    @classmethod
    def batch_axes(cls, params):
        axis = params["cfg"].batch_axis
        return (axis,), axis

    @classmethod
    def sharding_rule(cls, params) -> str:
        return _RULES[params["cfg"].layout]

    @classmethod
    def batcher(cls, batched_args, batch_dims, *, cfg: Pool2dConfig, operand_names):
        """vmap folds the mapped axis into the batch axis: one launch for all of it."""
        (x,), (bd,) = batched_args, batch_dims
        n_axis = cfg.batch_axis  # in the unbatched operand
        # Put the mapped axis right before N, merge the two, pool, split them again.
        x = jnp.moveaxis(x, bd, n_axis)
        v, n = x.shape[n_axis], x.shape[n_axis + 1]
        merged = x.reshape(*x.shape[:n_axis], v * n, *x.shape[n_axis + 2 :])
        y = cls.outer.bind(merged, cfg=cfg, operand_names=operand_names)
        y = y.reshape(*y.shape[:n_axis], v, n, *y.shape[n_axis + 1 :])
        return y, n_axis


Pool2dPrimitive.register()


def _pool_or_empty(cfg: Pool2dConfig, x):
    """The pooled x; an empty batch gives the empty result without a kernel launch."""
    if is_empty_batch(x.shape, cfg.batch_axis):
        return jnp.zeros(pool2d_output_shape(x.shape, x.dtype, cfg), x.dtype)
    return Pool2dPrimitive.bind_with_reference_vjp(cfg, (x,), ("x",))


def max_pool2d(x, window, stride=None, padding="VALID", layout="NHWC"):
    """2-D max pooling; same result as lax.reduce_window(x, -inf, lax.max, ...).

    Args:
      x: rank-4 float32, bfloat16 or float16 array in `layout`.
      window: int or (h, w) pair, >= 1.
      stride: int or (h, w) pair, >= 1; None means stride = window.
      padding: "SAME", "VALID", an int, an (h, w) pair, or ((top, bottom), (left, right));
        padded positions are -inf; each side must be smaller than the window (so every window
        holds input).
      layout: "NHWC", "NCHW" or "CHWN" (batch last).

    Returns:
      The pooled array in `layout` and x's dtype. NaN in a window gives NaN. An empty batch
      (N = 0) gives the empty result.
    """
    x = as_array(x, "x")
    cfg = make_pool_config(
        x.shape, x.dtype, mode="max", window=window, stride=stride, padding=padding, layout=layout
    )
    return _pool_or_empty(cfg, x)


def avg_pool2d(x, window, stride=None, padding="VALID", layout="NHWC", count_include_pad=True):
    """2-D average pooling, summed in float32 and rounded once to x's dtype.

    Same arguments as `max_pool2d`, plus:
      count_include_pad: True divides every window by window_h * window_w (padding counts as
        zeros: flax.linen.avg_pool and lax-based pools); False divides by the window's taps
        inside x (PyTorch's count_include_pad=False).
    """
    x = as_array(x, "x")
    cfg = make_pool_config(
        x.shape, x.dtype, mode="avg", window=window, stride=stride, padding=padding,
        layout=layout, count_include_pad=count_include_pad,
    )
    return _pool_or_empty(cfg, x)
