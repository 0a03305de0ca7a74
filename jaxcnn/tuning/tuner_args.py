"""The arguments the tuners share (layout choice, fusion planner), checked the same way by
each: dtype, 4-D shapes, int pairs, iters/warmup, cache and the GPU whose spec estimates use.
Bad values raise TypeError/ValueError naming the argument."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from jaxcnn.ops.conv2d.config import SUPPORTED_DTYPES
from jaxcnn.profile.gpu_specs import GpuSpec, lookup_gpu_spec, spec_by_name
from jaxcnn.tuning import measure as measuring
from jaxcnn.tuning.autotune_cache import AutotuneCache, as_cache

Shape = tuple[int, ...]

_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def dtype_name(dtype: Any, arg: str = "dtype") -> str:
    """The numpy name of a supported dtype ("float32", "bfloat16", "float16"); also takes
    "bf16", "fp16" and "fp32"."""
    try:
        dt = np.dtype(dtype) if not isinstance(dtype, str) else np.dtype(_DTYPE_ALIASES.get(dtype, dtype))
    except TypeError:
        raise TypeError(f"{arg} must be a dtype (float32, bfloat16, float16), got {dtype!r}") from None
    if dt not in SUPPORTED_DTYPES:
        raise TypeError(f"{arg} must be one of float32, bfloat16, float16, got {dt.name}")
    return dt.name


def shape4(shape: Any, arg: str) -> Shape:
    """A 4-D shape of positive ints, as a tuple."""
    if not isinstance(shape, Sequence) or isinstance(shape, str):
        raise TypeError(f"{arg} must be a sequence of 4 ints, got {shape!r}")
    if len(shape) != 4 or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape):
        raise ValueError(f"{arg} must have 4 int dims, got {tuple(shape)!r}")
    if min(shape) < 1:
        raise ValueError(f"{arg} must have dims >= 1, got {tuple(shape)}")
    return tuple(int(d) for d in shape)


def int_pair(value: Any, arg: str) -> tuple[int, int]:
    """An int or a pair of ints, as a pair."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value), int(value))
    if isinstance(value, Sequence) and len(value) == 2 and all(isinstance(v, (int, np.integer)) for v in value):
        return (int(value[0]), int(value[1]))
    raise TypeError(f"{arg} must be an int or a pair of ints, got {value!r}")


def check_iters(iters: Any, warmup: Any) -> None:
    """iters: timed calls per candidate (>= 1); warmup: untimed calls before them (>= 0)."""
    for name, value, low in (("iters", iters, 1), ("warmup", warmup, 0)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")


def resolve_spec(gpu: str | GpuSpec | None, measured: bool) -> tuple[GpuSpec, str]:
    """The GPU spec to model with, and a note on how it was picked: `gpu` (a name or a
    GpuSpec), else this GPU's, else H200's (noted)."""
    if isinstance(gpu, GpuSpec):
        return gpu, ""
    if gpu is not None:
        if not isinstance(gpu, str):
            raise TypeError(f"gpu must be a GPU name, a GpuSpec or None, got {gpu!r}")
        try:
            return spec_by_name(gpu), ""
        except KeyError as err:
            raise ValueError(f"gpu: {err.args[0]}") from None
    if measured:
        spec = lookup_gpu_spec()
        if spec is not None:
            return spec, ""
        return spec_by_name("H200"), f"no spec for {measuring.device_kind()!r}: H200 ceilings assumed"
    if jax.default_backend() == "gpu":
        spec = lookup_gpu_spec()
        if spec is not None:
            return spec, ""
    return spec_by_name("H200"), "no GPU here: H200 ceilings assumed"


def check_cache_and_gpu(cache: Any, gpu: Any) -> AutotuneCache | None:
    """The cache (as_cache) after checking `gpu` too, so a bad argument fails the same way
    with or without a GPU."""
    store = as_cache(cache)
    if gpu is not None:
        resolve_spec(gpu, measured=False)
    return store
