"""`relayout_weights`: many 4-D weights, each with its own axis permutation, in one op.

A model in NCHW keeps its conv weights as OIHW (or another order); the fused kernels read HWIO.
Transposed one by one, each weight is an XLA kernel of its own on every call: 26 of them for an
Equinox SqueezeNet 1.1, about a third of its optimized time at N=1. This op permutes them all
in one launch (cuda_ops/weights) on CUDA, and is `jnp.transpose` per weight elsewhere.

The op is linear: its JVP is itself and its transpose (the gradient) the inverse permutations.
Weights are replicated, so a program over several devices lowers it to the per-weight
transposes (no partitioning rule to get wrong); one device gets the batched kernel.
"""

from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import ad, mlir

from jaxcnn._native import library
from jaxcnn.ops.operand_checks import as_array, check_int32_shape
from jaxcnn.ops.primitive import _single_device, allow_reference_fallback, multiple_result_primitive

__all__ = ["relayout_weights"]

FFI_TARGET = "jaxcnn_weight_relayout"
NAME = "jaxcnn_weight_relayout"


def _check(shapes, dtypes, perms) -> None:
    if len(shapes) != len(perms):
        raise ValueError(f"perms must hold one permutation per weight ({len(shapes)}), got {len(perms)}")
    for i, (shape, dtype, perm) in enumerate(zip(shapes, dtypes, perms)):
        if len(shape) != 4:
            raise ValueError(f"weights[{i}] must be rank 4, got shape {tuple(shape)}")
        check_int32_shape(f"weights[{i}]", shape, batch_axis=None)
        if sorted(perm) != [0, 1, 2, 3]:
            raise ValueError(f"perms[{i}] must be a permutation of (0, 1, 2, 3), got {tuple(perm)}")
        if np.dtype(dtype).itemsize not in (1, 2, 4, 8):
            raise TypeError(f"weights[{i}] dtype must be 1, 2, 4 or 8 bytes wide, got {dtype}")


def _items(value, name: str, what: str) -> list:
    """The items of a list-like argument; None, strings and non-iterables are a TypeError."""
    if value is None or isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
    try:
        return list(value)
    except TypeError:
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}") from None


def _ints(perm, name: str) -> list[int]:
    """One permutation's entries as ints; anything else is a TypeError naming it."""
    entries = _items(perm, name, "a permutation of (0, 1, 2, 3)")
    try:
        return [operator.index(p) for p in entries]
    except TypeError:
        raise TypeError(f"{name} must be a permutation of (0, 1, 2, 3), got {perm!r}") from None


def _abstract(*ws, perms):
    _check([w.shape for w in ws], [w.dtype for w in ws], perms)
    return [ShapedArray(tuple(w.shape[p] for p in perm), w.dtype) for w, perm in zip(ws, perms)]


def _reference(*ws, perms):
    return [jnp.transpose(w, perm) for w, perm in zip(ws, perms)]


def _cuda_lowering(ctx, *ws, perms):
    """One custom call (its operands share an element width: relayout_weights binds per width)."""
    if _single_device(ctx):
        if library.target_registered(FFI_TARGET):
            flat = np.asarray([p for perm in perms for p in perm], np.int64)
            return jax.ffi.ffi_lowering(FFI_TARGET)(ctx, *ws, perms=flat)
        allow_reference_fallback(NAME, library.missing_target_reason(FFI_TARGET))
    return mlir.lower_fun(functools.partial(_reference, perms=perms), multiple_results=True)(ctx, *ws)


def _batch(args, dims, *, perms):
    """Unbatched weights stay one launch; a vmapped weight is a rank-5 transpose of its own."""
    outs, out_dims = [None] * len(args), [None] * len(args)
    plain = [i for i, d in enumerate(dims) if d is None]
    if plain:
        for i, y in zip(plain, relayout_weights([args[i] for i in plain], [perms[i] for i in plain])):
            outs[i] = y
    for i, d in enumerate(dims):
        if d is not None:
            outs[i] = jnp.transpose(jnp.moveaxis(args[i], d, 0), (0, *(p + 1 for p in perms[i])))
            out_dims[i] = 0
    return outs, out_dims


def _inverse(perm):
    inv = [0] * 4
    for k, p in enumerate(perm):
        inv[p] = k
    return tuple(inv)


def _transpose_rule(cts, *ws, perms):
    cts = [ad.instantiate_zeros(ct) for ct in cts]
    return relayout_weights(cts, [_inverse(p) for p in perms])


weight_relayout_p = multiple_result_primitive(NAME, _abstract, _reference, _cuda_lowering, _batch)
ad.deflinear2(weight_relayout_p, _transpose_rule)


def relayout_weights(weights, perms) -> list:
    """`[jnp.transpose(w, p) for w, p in zip(weights, perms)]`, in one kernel launch on CUDA.

    Args:
      weights: rank-4 arrays (any dtypes of 1, 2, 4 or 8 bytes; one launch per element width).
      perms: one permutation of (0, 1, 2, 3) per weight.
    """
    weights = [as_array(w, f"weights[{i}]")
               for i, w in enumerate(_items(weights, "weights", "a list of arrays"))]
    perms = tuple(tuple(_ints(perm, f"perms[{i}]"))
                  for i, perm in enumerate(_items(perms, "perms", "a list of permutations")))
    _check([w.shape for w in weights], [w.dtype for w in weights], perms)
    if not weights:
        return []
    by_width: dict[int, list[int]] = {}
    for i, w in enumerate(weights):
        by_width.setdefault(w.dtype.itemsize, []).append(i)
    outs = [None] * len(weights)
    for group in by_width.values():
        ys = weight_relayout_p.bind(*(weights[i] for i in group), perms=tuple(perms[i] for i in group))
        for i, y in zip(group, ys):
            outs[i] = y
    return outs
