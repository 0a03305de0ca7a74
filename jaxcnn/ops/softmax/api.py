"""`jaxcnn.softmax` / `jaxcnn.log_softmax` as one jax primitive over the last axis.

CUDA runs the fused kernel of cuda_ops/softmax (row max, sum of exp and normalize in one
pass over x, fp32 math) through XLA FFI; every other platform runs the lax reference. Other
axes are moved last around the primitive. Leading axes are all rows; sharding partitions the
first one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jaxcnn.ops.operand_checks import as_array
from jaxcnn.ops.pool2d.config import check_dtype
from jaxcnn.ops.primitive import BatchShardedPrimitive
from jaxcnn.ops.softmax.config import softmax_axis
from jaxcnn.ops.softmax.reference import softmax_reference

_FACTORS = "abcdefghijklm"  # Shardy factor names for the non-batch axes


class SoftmaxPrimitive(BatchShardedPrimitive):
    name = "jaxcnn_softmax"
    sharding_rules = {}  # per rank: see sharding_rule

    @staticmethod
    def abstract(x, *, log: bool, operand_names, rank):
        check_dtype("x", x.dtype)
        if x.ndim < 1:
            raise ValueError("x must have rank >= 1 for softmax, got a scalar")
        return ShapedArray(x.shape, x.dtype)

    @staticmethod
    def reference(x, *, log: bool, operand_names, rank):
        return softmax_reference(x, log=log)

    @classmethod
    def cuda_lowering(cls, ctx, x, *, log: bool, operand_names, rank):
        return jax.ffi.ffi_lowering("jaxcnn_softmax_fwd")(ctx, x, log=np.int64(log))

    @classmethod
    def batch_axes(cls, params):
        # Rank 1 has no row axis to shard: replicated.
        axis = 0 if params["rank"] >= 2 else None
        return (axis,), axis

    @classmethod
    def sharding_rule(cls, params) -> str:
        rank = params["rank"]
        if rank > len(_FACTORS) + 1:
            raise ValueError(f"softmax supports rank <= {len(_FACTORS) + 1} when sharded, got {rank}")
        names = ("n",) + tuple(_FACTORS[: rank - 1]) if rank >= 2 else ("a",)
        dims = " ".join(names)
        return f"{dims} -> {dims}"

    @classmethod
    def batcher(cls, batched_args, batch_dims, *, log: bool, operand_names, rank):
        """A mapped axis is one more row axis: move it first, same kernel."""
        (x,), (bd,) = batched_args, batch_dims
        x = jnp.moveaxis(x, bd, 0)
        return cls.outer.bind(x, log=log, operand_names=operand_names, rank=x.ndim), 0


SoftmaxPrimitive.register()


def _bind(x, log: bool):
    return SoftmaxPrimitive.outer.bind(x, log=log, operand_names=("x",), rank=x.ndim)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _softmax_last(log: bool, x):
    return _bind(x, log)


def _softmax_last_fwd(log, x):
    # Through the custom_vjp again, so the backward (a function of y) has derivatives too.
    y = _softmax_last(log, x)
    return y, y


def _softmax_last_bwd(log, y, g):
    # fp32 math, like the forward: softmax dx = y * (g - sum(g * y));
    # log_softmax dx = g - exp(y) * sum(g).
    yf, gf = y.astype(jnp.float32), g.astype(jnp.float32)
    if log:
        dx = gf - jnp.exp(yf) * jnp.sum(gf, axis=-1, keepdims=True)
    else:
        dx = yf * (gf - jnp.sum(gf * yf, axis=-1, keepdims=True))
    return (dx.astype(y.dtype),)


_softmax_last.defvjp(_softmax_last_fwd, _softmax_last_bwd)


def _apply(x, axis, log: bool):
    x = as_array(x, "x")
    axis = softmax_axis(x.shape, x.dtype, axis)
    if x.size == 0:
        return x  # empty in, empty out (as jax.nn.softmax), no kernel launch
    last = x.ndim - 1
    if axis == last:
        return _softmax_last(log, x)
    return jnp.moveaxis(_softmax_last(log, jnp.moveaxis(x, axis, last)), last, axis)


def softmax(x, axis=-1):
    """exp(x - max) / sum(exp(x - max)) along `axis` (an int), computed in float32 and
    rounded once to x's dtype (float32, bfloat16 or float16). A NaN or +inf in a row makes
    the row NaN, as in jax.nn.softmax."""
    return _apply(x, axis, log=False)


def log_softmax(x, axis=-1):
    """(x - max) - log(sum(exp(x - max))) along `axis`; same conventions as `softmax`."""
    return _apply(x, axis, log=True)
