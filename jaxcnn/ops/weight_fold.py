"""`fold_weights`: many conv weights scaled per output channel, cast and permuted, in one op.

Inference BatchNorm folds into a conv as weights * scale[k] and a bias; the scale is a runtime
argument, so the fold runs on every call. Folded conv by conv, that is one XLA kernel per
weight (and one per bias), and XLA's cuDNN convs transpose each weight to their own layout on
top. This op folds, casts and lays out all of a program's weights (and casts its biases, as
[1, 1, 1, K] jobs) in one launch on CUDA (cuda_ops/weights/weight_fold.cu); elsewhere, and
in programs over several devices (weights are replicated), it is the jnp expression per weight.

Differentiation and vmap follow the jnp reference (the fold is bilinear in weights and scales).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import dispatch
from jax.core import ShapedArray
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from jaxcnn import _ffi
from jaxcnn.ops.operand_checks import as_array, check_int32_shape
from jaxcnn.ops.primitive import _single_device, allow_reference_fallback

__all__ = ["fold_weights"]

FFI_TARGET = "jaxcnn_weight_fold"
NAME = "jaxcnn_weight_fold"
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
NO_SCALE = -1


def _reference(*operands, scale_axes, perms, dtypes):
    """transpose((w * scale along its axis) in fp32, cast to the dtype, perm) per weight."""
    k = len(perms)
    weights, scales = operands[:k], list(operands[k:])
    outs = []
    for w, axis, perm, dtype in zip(weights, scale_axes, perms, dtypes):
        v = w.astype(jnp.float32)
        if axis != NO_SCALE:
            shape = [1, 1, 1, 1]
            shape[axis] = w.shape[axis]
            v = v * scales.pop(0).astype(jnp.float32).reshape(shape)
        outs.append(jnp.transpose(v.astype(dtype), perm))
    return outs


def _abstract(*operands, scale_axes, perms, dtypes):
    weights = operands[:len(perms)]
    return [ShapedArray(tuple(w.shape[p] for p in perm), np.dtype(dtype))
            for w, perm, dtype in zip(weights, perms, dtypes)]


def _cuda_lowering(ctx, *operands, scale_axes, perms, dtypes):
    if _single_device(ctx):
        if _ffi.target_registered(FFI_TARGET):
            return jax.ffi.ffi_lowering(FFI_TARGET)(
                ctx, *operands, perms=np.asarray([p for perm in perms for p in perm], np.int64),
                scale_axes=np.asarray(scale_axes, np.int64))
        allow_reference_fallback(NAME, _ffi.missing_target_reason(FFI_TARGET))
    return mlir.lower_fun(functools.partial(_reference, scale_axes=scale_axes, perms=perms, dtypes=dtypes),
                          multiple_results=True)(ctx, *operands)


def _batch(args, dims, **params):
    """vmap runs the jnp reference (a vmapped weight is a rank-5 tensor: not the kernel's)."""
    outs = jax.vmap(functools.partial(_reference, **params), in_axes=tuple(dims))(*args)
    return outs, [0] * len(outs)


weight_fold_p = Primitive(NAME)
weight_fold_p.multiple_results = True
weight_fold_p.def_impl(functools.partial(dispatch.apply_primitive, weight_fold_p))
weight_fold_p.def_abstract_eval(_abstract)
mlir.register_lowering(weight_fold_p, mlir.lower_fun(_reference, multiple_results=True))
mlir.register_lowering(weight_fold_p, _cuda_lowering, platform="cuda")
batching.primitive_batchers[weight_fold_p] = _batch


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


def fold_weights(weights, scales, scale_axes, perms, dtypes) -> list:
    """`[jnp.transpose((w * s along axis).astype(dtype), perm) ...]` (the product in fp32), all
    in one kernel launch on CUDA.

    Args:
      weights: rank-4 float32 / bfloat16 / float16 arrays (a [K] vector goes as [1, 1, 1, K]).
      scales: per weight, a [w.shape[axis]] vector of factors (computed in fp32), or None.
      scale_axes: per weight, the axis its factors run along (ignored where scales[i] is None).
      perms: per weight, a permutation of (0, 1, 2, 3): result axis k is weight axis perm[k].
      dtypes: per weight, the result's dtype (float32, bfloat16 or float16).
    """
    weights = [as_array(w, f"weights[{i}]") for i, w in enumerate(weights)]
    scales, scale_axes, perms, dtypes = list(scales), list(scale_axes), list(perms), list(dtypes)
    _check_counts(len(weights), scales=scales, scale_axes=scale_axes, perms=perms, dtypes=dtypes)
    scales = [None if s is None else as_array(s, f"scales[{i}]") for i, s in enumerate(scales)]
    perms = tuple(tuple(int(p) for p in perm) for perm in perms)
    scale_axes = tuple(NO_SCALE if s is None else int(a) for s, a in zip(scales, scale_axes))
    _check(weights, scales, scale_axes, perms, dtypes)
    if not weights:
        return []
    params = (("scale_axes", scale_axes), ("perms", perms), ("dtypes", tuple(np.dtype(d).name for d in dtypes)))
    present = [s.astype(jnp.float32) for s in scales if s is not None]
    return list(_fold(params, *weights, *present))
