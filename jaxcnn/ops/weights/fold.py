"""`fold_weights`: many conv weights scaled per output channel, cast and permuted, in one op.

Inference BatchNorm folds into a conv as weights * scale[k] and a bias; the scale is a runtime
argument, so the fold runs on every call. Folded conv by conv, that is one XLA kernel per
weight (and one per bias), and XLA's cuDNN convs transpose each weight to their own layout on
top. This op folds, casts and lays out all of a program's weights, and casts its biases, in
one launch on CUDA (cuda_ops/weights/weight_fold.cu); elsewhere, and in programs over several
devices (weights are replicated), it is the jnp expression per weight.

The factor vectors and the biases travel packed in one fp32 operand: XLA computes them all
(BatchNorm's gamma * rsqrt(var + eps), beta - mean * scale, ...) in the one fusion that
concatenates them, rather than in a small kernel per vector.

Differentiation and vmap follow the jnp reference (the fold is bilinear in weights and scales).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import mlir

from jaxcnn._native import library
from jaxcnn.ops.operand_checks import as_array, check_int32_shape
from jaxcnn.ops.primitive import _single_device, allow_reference_fallback, multiple_result_primitive

__all__ = ["fold_weights"]

FFI_TARGET = "jaxcnn_weight_fold"
NAME = "jaxcnn_weight_fold"
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
NO_SCALE = -1


def _reference(*operands, scale_axes, scale_offsets, perms, dtypes, vector_offsets, vector_sizes, vector_dtypes):
    """Per weight: transpose((w * its factors along scale_axis) in fp32, cast, perm); then per
    vector: its slice of the packed operand, cast. operands = (*weights, packed)."""
    *weights, packed = operands
    outs = []
    for w, axis, offset, perm, dtype in zip(weights, scale_axes, scale_offsets, perms, dtypes):
        v = w.astype(jnp.float32)
        if axis != NO_SCALE:
            shape = [1, 1, 1, 1]
            shape[axis] = w.shape[axis]
            v = v * packed[offset:offset + w.shape[axis]].reshape(shape)
        outs.append(jnp.transpose(v.astype(dtype), perm))
    outs += [packed[o:o + n].astype(d) for o, n, d in zip(vector_offsets, vector_sizes, vector_dtypes)]
    return outs


def _abstract(*operands, perms, dtypes, vector_sizes, vector_dtypes, **_):
    weights = operands[:len(perms)]
    return ([ShapedArray(tuple(w.shape[p] for p in perm), np.dtype(dtype)) for w, perm, dtype in zip(weights, perms, dtypes)]
            + [ShapedArray((n,), np.dtype(d)) for n, d in zip(vector_sizes, vector_dtypes)])


def _cuda_lowering(ctx, *operands, **params):
    if _single_device(ctx):
        if library.target_registered(FFI_TARGET):
            return jax.ffi.ffi_lowering(FFI_TARGET)(
                ctx, *operands, perms=np.asarray([p for perm in params["perms"] for p in perm], np.int64),
                scale_axes=np.asarray(params["scale_axes"], np.int64),
                scale_offsets=np.asarray(params["scale_offsets"], np.int64),
                vector_offsets=np.asarray(params["vector_offsets"], np.int64))
        allow_reference_fallback(NAME, library.missing_target_reason(FFI_TARGET))
    return mlir.lower_fun(functools.partial(_reference, **params), multiple_results=True)(ctx, *operands)


def _batch(args, dims, **params):
    """vmap runs the jnp reference (a vmapped weight is a rank-5 tensor: not the kernel's)."""
    outs = jax.vmap(functools.partial(_reference, **params), in_axes=tuple(dims))(*args)
    return outs, [0] * len(outs)


weight_fold_p = multiple_result_primitive(NAME, _abstract, _reference, _cuda_lowering, _batch)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _fold(params, *operands):
    return weight_fold_p.bind(*operands, **dict(params))


@_fold.defjvp
def _fold_jvp(params, primals, tangents):
    return _fold(params, *primals), jax.jvp(functools.partial(_reference, **dict(params)), primals, tangents)[1]


def _check_counts(n: int, **seqs) -> None:
    for name, seq in seqs.items():
        if len(seq) != n:
            raise ValueError(f"{name} must hold one entry per weight ({n}), got {len(seq)}")


def _check(weights, scales, scale_axes, perms, dtypes) -> None:
    for i, (w, s, axis, perm, dtype) in enumerate(zip(weights, scales, scale_axes, perms, dtypes)):
        if w.ndim != 4:
            raise ValueError(f"weights[{i}] must be rank 4, got shape {tuple(w.shape)}")
        check_int32_shape(f"weights[{i}]", w.shape, batch_axis=None)
        if w.dtype.name not in FLOAT_DTYPES:
            raise TypeError(f"weights[{i}] dtype must be one of {FLOAT_DTYPES}, got {w.dtype.name}")
        if np.dtype(dtype).name not in FLOAT_DTYPES:
            raise TypeError(f"dtypes[{i}] must be one of {FLOAT_DTYPES}, got {np.dtype(dtype).name}")
        if sorted(perm) != [0, 1, 2, 3]:
            raise ValueError(f"perms[{i}] must be a permutation of (0, 1, 2, 3), got {tuple(perm)}")
        if s is not None:
            if not 0 <= axis <= 3:
                raise ValueError(f"scale_axes[{i}] must be in 0..3, got {axis}")
            if s.shape != (w.shape[axis],):
                raise ValueError(f"scales[{i}] must have shape ({w.shape[axis]},) (weights[{i}] axis {axis}), "
                                 f"got {tuple(s.shape)}")


def fold_weights(weights, scales, scale_axes, perms, dtypes, vectors=(), vector_dtypes=()) -> list:
    """`[jnp.transpose((w * s along axis).astype(dtype), perm) ...]` (the product in fp32), then
    `[v.astype(dtype) ...]`, all in one kernel launch on CUDA.

    Args:
      weights: rank-4 float32 / bfloat16 / float16 arrays.
      scales: per weight, a [w.shape[axis]] vector of factors (computed in fp32), or None.
      scale_axes: per weight, the axis its factors run along (ignored where scales[i] is None).
      perms: per weight, a permutation of (0, 1, 2, 3): result axis k is weight axis perm[k].
      dtypes: per weight, the result's dtype (float32, bfloat16 or float16).
      vectors: rank-1 arrays (e.g. folded biases), computed in fp32, each cast to ...
      vector_dtypes: ... its result dtype.
    """
    weights = [as_array(w, f"weights[{i}]") for i, w in enumerate(weights)]
    scales, scale_axes, perms, dtypes = list(scales), list(scale_axes), list(perms), list(dtypes)
    _check_counts(len(weights), scales=scales, scale_axes=scale_axes, perms=perms, dtypes=dtypes)
    scales = [None if s is None else as_array(s, f"scales[{i}]") for i, s in enumerate(scales)]
    perms = tuple(tuple(int(p) for p in perm) for perm in perms)
    scale_axes = tuple(NO_SCALE if s is None else int(a) for s, a in zip(scales, scale_axes))
    _check(weights, scales, scale_axes, perms, dtypes)
    vectors = [as_array(v, f"vectors[{i}]") for i, v in enumerate(vectors)]
    vector_dtypes = list(vector_dtypes)
    _check_counts(len(vectors), vector_dtypes=vector_dtypes)
    for i, (v, d) in enumerate(zip(vectors, vector_dtypes)):
        if v.ndim != 1:
            raise ValueError(f"vectors[{i}] must be rank 1, got shape {tuple(v.shape)}")
        if np.dtype(d).name not in FLOAT_DTYPES:
            raise TypeError(f"vector_dtypes[{i}] must be one of {FLOAT_DTYPES}, got {np.dtype(d).name}")
    if not weights and not vectors:
        return []
    pieces, offsets, at = [], [], 0
    for s in [*scales, *vectors]:
        offsets.append(NO_SCALE if s is None else at)
        if s is not None:
            pieces.append(s.astype(jnp.float32))
            at += s.shape[0]
    packed = jnp.concatenate(pieces) if pieces else jnp.zeros((0,), jnp.float32)
    params = (("scale_axes", scale_axes), ("scale_offsets", tuple(offsets[:len(weights)])), ("perms", perms),
              ("dtypes", tuple(np.dtype(d).name for d in dtypes)),
              ("vector_offsets", tuple(offsets[len(weights):])), ("vector_sizes", tuple(v.shape[0] for v in vectors)),
              ("vector_dtypes", tuple(np.dtype(d).name for d in vector_dtypes)))
    return list(_fold(params, *weights, packed))
