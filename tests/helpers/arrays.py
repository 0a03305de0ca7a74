"""Arrays the op tests build: abstract operands (for tracing and lowering without data), seeded
random operands drawn in float32 and rounded once to the dtype under test, and the float64
view every oracle comparison reads."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings


def sds(shape, dtype=jnp.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def traces(fn, *operands) -> bool:
    """Whether fn accepts these operands (arrays or ShapeDtypeStructs): tracing it under
    jax.eval_shape raises no ValueError. Random-shape tests skip the draws an op rejects."""
    try:
        jax.eval_shape(fn, *operands)
        return True
    except ValueError:
        return False


def random_shape_test(cases, fits):
    """Decorates test(case) into a slow hypothesis test over the draws of the strategy `cases`
    (60 of them, no deadline) that passes over the draws fits(case) rejects (see traces)."""

    def decorate(test):
        @pytest.mark.slow
        @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
        @given(cases)
        @functools.wraps(test)
        def run(case):
            if fits(case):
                test(case)

        return run

    return decorate


def check_trace_raises(fn, good: dict, changes: dict, error, match: str) -> None:
    """Tracing fn (under jax.jit) on the `good` operands with `changes` swapped in raises
    `error` matching `match`: bad arguments fail at trace time, before any kernel runs."""
    args = {**good, **changes}
    with pytest.raises(error, match=match):
        jax.jit(fn).trace(*args.values())


# Bad NHWC inputs in place of a good x [2, 8, 8, 16] float32, as check_trace_raises' (changes,
# error, match): not rank 4, not a float dtype, an empty spatial dimension. Every op that takes an
# NHWC x rejects these the same way.
BAD_NHWC_X = [
    ({"x": sds((8, 8, 16))}, ValueError, r"x must be rank 4 \[N, H, W, C\]"),
    ({"x": sds((2, 8, 8, 16), jnp.int32)}, TypeError, "x dtype must be float32"),
    ({"x": sds((2, 0, 8, 16))}, ValueError, "x must have H, W and C >= 1"),
]


def as_f64(a) -> np.ndarray:
    """a (any float dtype, bf16 included) as a float64 NumPy array."""
    return np.asarray(jnp.asarray(a, jnp.float32), np.float64)


def normal(key, shape, scale=1.0, dtype=jnp.float32):
    """scale * N(0, 1) drawn in float32, rounded to dtype."""
    return (jax.random.normal(key, shape, jnp.float32) * scale).astype(dtype)


def he_normal(key, hwio, dtype=jnp.float32):
    """HWIO conv weights scaled by sqrt(2 / fan_in) (fan_in = H * W * I), so activations after
    a ReLU stay O(1) through the layer."""
    return normal(key, hwio, np.sqrt(2.0 / np.prod(hwio[:3])), dtype)


def random_x(seed, shape, dtype=jnp.float32, scale=1.0):
    """An input of scale * N(0, 1) values from an integer seed."""
    return normal(jax.random.PRNGKey(seed), shape, scale, dtype)


def random_operands(seed, x_shape, w_shape, dtype=jnp.float32, with_bias=True):
    """conv2d operands from an integer seed: an N(0, 1) input, HWIO weights scaled by
    1 / sqrt(fan_in) and an N(0, 1) bias (None without with_bias), drawn in float32 and rounded
    to dtype."""
    kx, kw, kb = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = jax.random.normal(kx, x_shape, jnp.float32).astype(dtype)
    fan_in = w_shape[0] * w_shape[1] * w_shape[2]
    w = (jax.random.normal(kw, w_shape, jnp.float32) / np.sqrt(fan_in)).astype(dtype)
    b = jax.random.normal(kb, (w_shape[3],), jnp.float32).astype(dtype) if with_bias else None
    return x, w, b
