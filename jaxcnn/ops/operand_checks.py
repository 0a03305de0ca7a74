"""Checks every public op applies to what it takes, at trace time, before any kernel runs:
array operands, the int32 limits of the CUDA kernels, and the empty batch.

The kernels (cuda_ops/*) index rows, columns, channels and the elements of one image in int32,
and take window, stride, padding and dilation as int32 (the layout transform indexes in int64). Past those limits a kernel would
refuse the launch or wrap around at run time, and XLA fails late and obscurely (RESOURCE_EXHAUSTED
when it allocates a huge result, an MLIR verifier error for a 2**62 pad). These checks raise a
ValueError that names the argument instead. The batch axis is free: kernels loop over images,
so only each dimension of it must fit int32.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

# The activation and weight dtypes the kernels take.
FLOAT_DTYPES = (np.dtype("float32"), np.dtype("bfloat16"), np.dtype("float16"))

# The first value int32 cannot hold.
INT32_LIMIT = 2**31


def as_array(value: Any, name: str):
    """`value` as a jax array; None, strings and other non-numeric objects are a TypeError
    naming the argument (jnp.asarray's own errors do not)."""
    if value is None or isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be an array, got {type(value).__name__}")
    try:
        return jnp.asarray(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be an array, got {type(value).__name__}: {err}") from None


def as_optional_array(value: Any, name: str):
    """as_array, with None passed through (an optional operand such as a bias)."""
    return None if value is None else as_array(value, name)


def bias_or_zeros(value: Any, weight, name: str):
    """A conv's bias as an array (as_array), or zeros of the weight's output channels (its last
    axis) and dtype where it is None."""
    return jnp.zeros(weight.shape[-1:], weight.dtype) if value is None else as_array(value, name)


def check_float_dtype(name: str, dtype: Any, want: np.dtype | None = None) -> None:
    """`dtype` is one of FLOAT_DTYPES and, where `want` is given, equals it (x's dtype)."""
    dtype = np.dtype(dtype)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} dtype must be float32, bfloat16 or float16, got {dtype.name}")
    if want is not None and dtype != want:
        raise TypeError(f"{name} dtype {dtype.name} must equal x dtype {np.dtype(want).name}")


def _ints(value: Any):
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from _ints(v)
    else:
        yield int(value)


def check_int32(name: str, value: Any) -> None:
    """Every int of `value` (an int or nested pairs: a normalized window, stride, padding or
    dilation) fits int32."""
    if max(_ints(value), default=0) >= INT32_LIMIT:
        raise ValueError(f"{name} must be < 2**31 (the kernels take it as int32), got {value!r}")


def check_int32_args(**args: Any) -> None:
    """check_int32 on raw arguments before they are normalized (conv2d's config: SAME arithmetic on
    a 2**62 dilated window overflows into floats and fails with an unrelated TypeError).
    Values that are not ints or nested ints are left to the normalizer, whose error names them."""
    for name, value in args.items():
        try:
            top = max(_ints(value), default=0)
        except (TypeError, ValueError):
            continue
        if top >= INT32_LIMIT:
            check_int32(name, value)


def check_int32_extent(name: str, extent: int, what: str) -> None:
    """One derived extent (e.g. the padded input height) fits int32; `name` is the argument
    that made it too big, `what` says which extent it is."""
    if extent >= INT32_LIMIT:
        raise ValueError(f"{name} makes {what} {extent}, past the kernels' int32 indexing (< 2**31)")


def check_int32_dims(name: str, shape: Sequence[int], what: str | None = None) -> None:
    """Each dimension of `shape` fits int32 (`what` as in check_int32_shape)."""
    dims = tuple(int(d) for d in shape)
    if dims and max(dims) >= INT32_LIMIT:
        subject = what or f"{name} has shape"
        raise ValueError(f"{subject} {dims}: a dimension past the kernels' int32 indexing (< 2**31)")


def check_int32_shape(name: str, shape: Sequence[int], batch_axis: int | None = 0,
                      what: str | None = None) -> None:
    """Each dimension of `shape` and the element count of one image (every dimension but
    `batch_axis`; None: the whole array) fit int32. `what` replaces "<name> has shape" in the
    message, e.g. "padding ((9, 9), (9, 9)) makes the result" when an argument made it big."""
    dims = tuple(int(d) for d in shape)
    subject = what or f"{name} has shape"
    check_int32_dims(name, dims, what)
    image = tuple(d for i, d in enumerate(dims) if i != batch_axis)
    count = math.prod(image)
    if count >= INT32_LIMIT:
        per = "" if batch_axis is None else " per image"
        raise ValueError(f"{subject} {dims}: {count} elements{per}, past the kernels' int32 "
                         "indexing (< 2**31)")


def check_int64_bytes(name: str, shape: Sequence[int], itemsize: int) -> None:
    """The array's byte size fits int64 (kernels that index in int64, e.g. the layout
    transform; past it XLA aborts the process while compiling)."""
    nbytes = math.prod(int(d) for d in shape) * int(itemsize)
    if nbytes >= 2**63:
        raise ValueError(f"{name} has shape {tuple(int(d) for d in shape)}: {nbytes} bytes, "
                         "past int64 (< 2**63)")


def is_empty_batch(shape: Sequence[int], batch_axis: int = 0) -> bool:
    """True for an empty batch (N = 0): ops return the empty result without launching a kernel."""
    return len(shape) > batch_axis and int(shape[batch_axis]) == 0


def with_batch(shape: Sequence[int], size: int, batch_axis: int = 0) -> tuple[int, ...]:
    """`shape` with its batch dimension set to `size` (validate an empty batch as one image)."""
    out = [int(d) for d in shape]
    out[batch_axis] = size
    return tuple(out)
