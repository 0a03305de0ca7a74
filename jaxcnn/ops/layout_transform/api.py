"""`jaxcnn.to_layout`: NHWC / NCHW / CHWN activation layout transforms as a jax primitive.

CUDA runs the shared-memory tiled transpose of cuda_ops/layout through XLA FFI; every other
platform runs `jnp.transpose`. The op is linear: its JVP is itself and its transpose (the
gradient) is the inverse transform, so `grad` runs the CUDA kernel too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad

from jaxcnn.ops.layout_axes import (
    LAYOUT_CODES,
    LAYOUTS,
    batch_axis,
    check_layout,
    convert_shape,
    permutation,
)
from jaxcnn.ops.operand_checks import as_array, check_int64_bytes
from jaxcnn.ops.primitive import BatchShardedPrimitive

__all__ = ["LAYOUTS", "to_layout"]


def check_operand(shape, dtype, src: str) -> None:
    """Rank, dtype and size of `x` (the kernel moves bits: any 1, 2, 4 or 8-byte real/bool
    type; it indexes bytes in int64)."""
    if len(shape) != 4:
        raise ValueError(f"x must be rank 4 ({src}), got shape {tuple(shape)}")
    dtype = np.dtype(dtype)
    check_int64_bytes("x", shape, dtype.itemsize)
    if dtype == np.bool_:
        return
    if jnp.issubdtype(dtype, jnp.floating):
        bits = jnp.finfo(dtype).bits
    elif jnp.issubdtype(dtype, jnp.integer):
        bits = jnp.iinfo(dtype).bits
    else:
        bits = None
    if bits is None or bits != dtype.itemsize * 8 or dtype.itemsize not in (1, 2, 4, 8):
        raise TypeError(
            f"x dtype must be a real or bool type of 1, 2, 4 or 8 bytes "
            f"(e.g. float32, bfloat16, float16), got {dtype}"
        )


class LayoutTransformPrimitive(BatchShardedPrimitive):
    name = "jaxcnn_layout_transform"

    @staticmethod
    def abstract(x, *, src: str, dst: str, operand_names):
        check_operand(x.shape, x.dtype, src)
        return ShapedArray(convert_shape(x.shape, src, dst), x.dtype)

    @staticmethod
    def reference(x, *, src: str, dst: str, operand_names):
        return jnp.transpose(x, permutation(src, dst))

    @classmethod
    def cuda_lowering(cls, ctx, x, *, src: str, dst: str, operand_names):
        return jax.ffi.ffi_lowering("jaxcnn_layout_transform")(
            ctx, x, src_layout=np.int64(LAYOUT_CODES[src]), dst_layout=np.int64(LAYOUT_CODES[dst])
        )

    @classmethod
    def batcher(cls, batched_args, batch_dims, *, src: str, dst: str, operand_names):
        """A vmapped axis folds into N: one launch for all of it. It is moved just before N,
        so merged index = v * N + n, which the transform carries to dst unchanged."""
        (x,), (bd,) = batched_args, batch_dims
        ns, nd = batch_axis(src), batch_axis(dst)
        x = jnp.moveaxis(x, bd, ns)
        v = x.shape[ns]
        x = x.reshape(*x.shape[:ns], v * x.shape[ns + 1], *x.shape[ns + 2 :])
        y = cls.outer.bind(x, src=src, dst=dst, operand_names=operand_names)
        y = y.reshape(*y.shape[:nd], v, y.shape[nd] // v, *y.shape[nd + 1 :])
        return y, nd

    @classmethod
    def batch_axes(cls, params):
        return (batch_axis(params["src"]),), batch_axis(params["dst"])

    @classmethod
    def sharding_rule(cls, params) -> str:
        # Factors are the logical dims; "n" (the batch) is the only one kept sharded.
        return f"{' '.join(params['src'].lower())} -> {' '.join(params['dst'].lower())}"


LayoutTransformPrimitive.register()


def _transpose_rule(ct, x, *, src: str, dst: str, operand_names):
    return [LayoutTransformPrimitive.outer.bind(ct, src=dst, dst=src, operand_names=operand_names)]


ad.deflinear2(LayoutTransformPrimitive.outer, _transpose_rule)


def to_layout(x, src: str = "NHWC", dst: str = "NCHW"):
    """`x`, a 4-D activation laid out as `src`, laid out as `dst`.

    Args:
      x: 4-D array in layout `src` (real or bool dtype of 1, 2, 4 or 8 bytes).
      src, dst: "NHWC", "NCHW" or "CHWN" (N batch, C channels, H, W spatial).

    Returns:
      The same values as `jnp.transpose(x, permutation(src, dst))`; `x` itself when
      src == dst. An empty x (e.g. N = 0) gives the empty result.
    """
    src = check_layout(src, "src")
    dst = check_layout(dst, "dst")
    x = as_array(x, "x")
    check_operand(x.shape, x.dtype, src)
    if src == dst:
        return x
    if x.size == 0:
        return jnp.zeros(convert_shape(x.shape, src, dst), x.dtype)  # nothing to move: no kernel
    return LayoutTransformPrimitive.outer.bind(x, src=src, dst=dst, operand_names=("x",))
