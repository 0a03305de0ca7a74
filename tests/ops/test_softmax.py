"""softmax / log_softmax semantics, gradients, vmap and validation on the reference (CPU)
path, against a float64 NumPy oracle and jax.nn."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

import arrays
import jaxcnn
from pool_oracle import TOL, softmax_f64

FNS = {False: jaxcnn.softmax, True: jaxcnn.log_softmax}


# Logits of scale 3: rows mix near-zero and saturated probabilities.
random_x = functools.partial(arrays.random_x, scale=3.0)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple),
    axis_pick=st.integers(0, 3),
    log=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matches_float64_oracle(shape, axis_pick, log, seed):
    axis = axis_pick % len(shape) - (len(shape) if seed % 2 else 0)  # negative axes too
    x = random_x(seed, shape)
    out = FNS[log](x, axis=axis)
    assert out.shape == x.shape and out.dtype == jnp.float32
    np.testing.assert_allclose(out, softmax_f64(x, axis, log), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("cols", [1, 7, 1000, 1025])
@pytest.mark.parametrize("log", [False, True])
def test_dtypes_round_once(dtype, cols, log):
    x = random_x(1, (5, cols), dtype)
    out = FNS[log](x)
    assert out.dtype == jnp.dtype(dtype)
    want = softmax_f64(np.asarray(x.astype(jnp.float32)), -1, log)
    tol = dict(TOL[dtype])
    if log:  # log-probabilities are O(log cols): relative error of one rounding
        tol["atol"] = tol["rtol"] * max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), want, **tol)


def test_matches_jax_nn():
    x = random_x(2, (4, 3, 33))
    for axis in (-1, 0, 1):
        np.testing.assert_allclose(jaxcnn.softmax(x, axis), jax.nn.softmax(x, axis=axis), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(jaxcnn.log_softmax(x, axis), jax.nn.log_softmax(x, axis=axis), rtol=1e-6, atol=1e-6)


def test_nan_and_inf_rows_like_jax():
    x = random_x(3, (5, 6))
    x = (x.at[0, 2].set(jnp.nan)          # NaN: whole row NaN
          .at[1, 4].set(jnp.inf)          # +inf: inf - inf = NaN, whole row NaN
          .at[2].set(-jnp.inf)            # all -inf: NaN
          .at[3, 1].set(-jnp.inf))        # one -inf: probability 0, rest finite
    for log in (False, True):
        ours = np.asarray(FNS[log](x))
        theirs = np.asarray((jax.nn.log_softmax if log else jax.nn.softmax)(x))
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
        np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
        assert np.isnan(ours[:3]).all() and np.isfinite(np.delete(ours[3], 1)).all()
        np.testing.assert_allclose(ours[3:], theirs[3:], rtol=1e-6, atol=1e-7)


def test_large_values_do_not_overflow():
    x = jnp.array([[1e4, 1e4 - 1.0, -1e4], [-3e38, 3e38, 0.0]], jnp.float32)
    np.testing.assert_allclose(jaxcnn.softmax(x), softmax_f64(x), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("axis", [-1, 1])
def test_grad_matches_jax(log, axis):
    x = random_x(4, (3, 7, 10))
    cot = random_x(5, x.shape, scale=1.0)
    ref = jax.nn.log_softmax if log else jax.nn.softmax
    ours = jax.grad(lambda x: jnp.sum(FNS[log](x, axis) * cot))(x)
    want = jax.grad(lambda x: jnp.sum(ref(x, axis=axis) * cot))(x)
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-6)


def test_check_grads_numerically():
    x = random_x(6, (2, 5), scale=1.0)
    for log in (False, True):
        check_grads(lambda x: FNS[log](x), (x,), order=2, modes=("rev",), atol=1e-2, rtol=1e-2)


def test_grad_in_half_precision_keeps_dtype():
    x = random_x(7, (4, 16), jnp.bfloat16)
    g = jax.grad(lambda x: jaxcnn.softmax(x).astype(jnp.float32)[:, 0].sum())(x)
    assert g.dtype == jnp.bfloat16
    want = jax.grad(lambda x: jax.nn.softmax(x.astype(jnp.float32))[:, 0].sum())(x.astype(jnp.float32))
    np.testing.assert_allclose(g.astype(jnp.float32), want, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("in_axis", [0, 1, 2])
def test_vmap(in_axis):
    x = random_x(8, (4, 3, 9))
    for log in (False, True):
        out = jax.vmap(FNS[log], in_axes=in_axis)(x)
        for i in range(x.shape[in_axis]):
            np.testing.assert_allclose(out[i], FNS[log](jnp.take(x, i, axis=in_axis)), rtol=1e-6, atol=1e-7)


def test_rank1_and_jit():
    x = random_x(9, (17,))
    np.testing.assert_allclose(jax.jit(jaxcnn.softmax)(x), jax.nn.softmax(x), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "x,axis,error,match",
    [
        (jax.ShapeDtypeStruct((), jnp.float32), -1, ValueError, "rank >= 1"),
        (jax.ShapeDtypeStruct((4, 5), jnp.int32), -1, TypeError, "x dtype"),
        (jax.ShapeDtypeStruct((4, 5), jnp.float32), 2, ValueError, "axis 2 is out of range"),
        (jax.ShapeDtypeStruct((4, 5), jnp.float32), -3, ValueError, "out of range"),
        (jax.ShapeDtypeStruct((4, 5), jnp.float32), 1.0, TypeError, "axis must be an int"),
        (jax.ShapeDtypeStruct((4, 5), jnp.float32), (0, 1), TypeError, "axis must be an int"),
    ],
)
def test_bad_arguments_raise_at_trace_time(x, axis, error, match):
    for fn in FNS.values():
        with pytest.raises(error, match=match):
            jax.jit(lambda x: fn(x, axis)).trace(x)
