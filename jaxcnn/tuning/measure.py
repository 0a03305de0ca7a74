"""How jaxcnn measures candidates on this machine: where measuring makes sense, running a
measurement outside any enclosing trace, and trying a candidate before timing it."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import threading
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxcnn._native import library

# JAXCNN_MEASURE=0: automatic decisions (conv2d "auto", optimize's policy, the layout and fusion
# planners) read cached measurements and rules but time nothing new on the device.
MEASURE_ENV = "JAXCNN_MEASURE"
# Fresh random elements random_array draws per array; a larger array repeats them. Drawing
# every element of a batch-64 activation (hundreds of MB) took seconds of a first call, and a
# timing does not depend on the values' period.
RANDOM_BLOCK = 1 << 20


def device_kind() -> str:
    return jax.devices()[0].device_kind


def outside_traces(fn: Callable) -> Callable:
    """fn, run in a fresh thread. JAX keeps its trace state per thread: a measurement made
    while an enclosing jit traces (jaxcnn.optimize without example_args plans on its first,
    traced call) would otherwise stage its random inputs and candidate calls into that program
    and time whatever else ran. In the fresh thread they run for real."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(fn, *args, **kwargs).result()

    return run


def should_measure(measure: bool | None) -> bool:
    """Measure only where jaxcnn's CUDA kernels run: elsewhere conv2d would time the XLA
    reference it falls back to, which says nothing about the kernels. measure=None (automatic)
    is also off where the environment sets MEASURE_ENV=0."""
    if measure is None:
        return library.cuda_available() and os.environ.get(MEASURE_ENV, "1").strip() != "0"
    if not isinstance(measure, bool):
        raise TypeError(f"measure must be True, False or None, got {measure!r}")
    if measure and not library.cuda_available():
        raise RuntimeError(f"measure=True needs the CUDA kernels: {library.cuda_unavailable_reason()}")
    return measure


def runtime_errors() -> tuple[type[BaseException], ...]:
    """What a candidate that cannot run raises: ValueError/TypeError at lowering ("cannot
    run"), or the runtime error of a handler that refuses."""
    errors: list[type[BaseException]] = [ValueError, TypeError]
    with contextlib.suppress(AttributeError):  # jax versions without jax.errors.JaxRuntimeError
        errors.append(jax.errors.JaxRuntimeError)
    return tuple(errors)


def error_line(err: BaseException) -> str:
    """An error as one line: its type and its message's first line."""
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


# XLA times candidate algorithms for a program's convolutions and GEMMs while it compiles it
# (autotuning). Two such compiles at once, or a compile beside another program's run, time each
# other's kernels: XLA warns "Delay kernel timed out" and its choices and compile times suffer.
# Programs that autotune therefore compile and first-run under this lock, one at a time; the
# others (jaxcnn's kernels are custom calls XLA does not tune) compile in parallel.
AUTOTUNE_LOCK = threading.Lock()
AUTOTUNED_OPS = ("stablehlo.convolution", "stablehlo.dot_general")


def autotunes(fn: Callable, args: tuple) -> bool:
    """Whether XLA autotunes while compiling jit(fn) for args: its program has a convolution or
    a GEMM (traced and lowered here; jit's caches reuse both for the call that compiles)."""
    text = jax.jit(fn).lower(*args).as_text()
    return any(op in text for op in AUTOTUNED_OPS)


def run_once(fn: Callable, args: tuple):
    """jit(fn)(*args), synced: compiled and run on any thread, one at a time where XLA
    autotunes the program (AUTOTUNE_LOCK)."""
    lock = AUTOTUNE_LOCK if autotunes(fn, args) else contextlib.nullcontext()
    with lock:
        return jax.block_until_ready(jax.jit(fn)(*args))


def try_run(fn: Callable, args: tuple) -> str:
    """'' if run_once(fn, args) compiles and runs, else the error message."""
    try:
        run_once(fn, args)
    except runtime_errors() as err:
        return error_line(err)
    return ""


def random_array(shape: tuple, dtype, rng: np.random.Generator) -> np.ndarray:
    """A host array of `shape`: floats uniform in [0.5, 1) (a random mantissa under the
    exponent of 0.5, drawn as raw bits: no conversion pass), RANDOM_BLOCK fresh values repeated;
    other dtypes zeros."""
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        return np.zeros(shape, dtype)
    count = int(np.prod(shape, dtype=np.int64))
    uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}.get(dtype.itemsize)
    if uint is None:  # 8-bit floats: few enough values that converting is fine
        return np.resize(rng.uniform(0.5, 1.0, min(count, RANDOM_BLOCK)).astype(dtype), shape)
    bits = np.frombuffer(rng.bytes(min(count, RANDOM_BLOCK) * dtype.itemsize), uint)
    mantissa = uint((1 << int(jnp.finfo(dtype).nmant)) - 1)
    block = bits & mantissa | np.array(0.5, dtype).view(uint)
    return np.resize(block, shape).view(dtype)


class RandomInputs:
    """Random device inputs for the avals of the sites or groups one measurement times, one
    array per shape and dtype (they only read them): random_array's values, positive and O(1),
    so BatchNorm variances stay valid and nothing overflows."""

    def __init__(self, seed: int = 0):
        self._rng = np.random.default_rng(seed)
        self._arrays: dict[tuple, jax.Array] = {}

    def __call__(self, aval) -> jax.Array:
        key = (tuple(aval.shape), jnp.dtype(aval.dtype))
        if key not in self._arrays:
            self._arrays[key] = jax.device_put(random_array(*key, self._rng))
        return self._arrays[key]
