"""GPU suite: relayout_weights' batched kernel against jnp.transpose, bit-exact, outputs
poisoned first (`pytest -m gpu`)."""

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcnn

pytestmark = pytest.mark.gpu

PERMS = list(itertools.permutations(range(4)))
OIHW_TO_HWIO = (2, 3, 1, 0)
DTYPES = ["float32", "bfloat16", "float16", "int8"]


def random_weight(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.asarray(rng.integers(0, 100, size=shape).astype(dtype))
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32), dtype)


def poison(shape, dtype):
    return jnp.full(shape, -1 if jnp.issubdtype(dtype, jnp.integer) else np.nan, dtype)


def check_exact(ws, perms):
    """One relayout_weights call with every output buffer pre-filled with poison (donated and
    aliased), so an element the kernel misses keeps the poison."""
    outs = [poison(tuple(w.shape[p] for p in perm), w.dtype) for w, perm in zip(ws, perms)]
    fn = jax.jit(lambda poisons, ws: jaxcnn.relayout_weights(ws, perms), donate_argnums=0)
    compiled = fn.lower(outs, ws).compile()
    assert compiled.as_text().count('custom_call_target="jaxcnn_weight_relayout"') == len({w.dtype.itemsize for w in ws})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "donated buffers were not usable" would void the poison
        got = compiled(outs, ws)
    for g, w, perm in zip(got, ws, perms):
        want = jnp.transpose(w, perm)
        assert g.shape == want.shape and g.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(want).view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_permutation_of_odd_shapes(dtype):
    """All 24 permutations in one call (more jobs than one launch holds), extents not multiples
    of the 32-wide tile, size-1 axes."""
    shapes = [(3, 5, 7, 33), (65, 1, 2, 37), (1, 1, 40, 31), (33, 34, 1, 1)]
    ws = [random_weight(shapes[i % 4], jnp.dtype(dtype), i) for i in range(len(PERMS))]
    check_exact(ws, PERMS)


def test_squeezenet_weights_oihw_to_hwio():
    """Every conv weight of SqueezeNet 1.1 as an Equinox model holds it (OIHW), bf16."""
    shapes = [(64, 3, 3, 3)]
    for s, e, cin in [(16, 64, 64), (16, 64, 128), (32, 128, 128), (32, 128, 256), (48, 192, 256),
                      (48, 192, 384), (64, 256, 384), (64, 256, 512)]:
        shapes += [(s, cin, 1, 1), (e, s, 1, 1), (e, s, 3, 3)]
    ws = [random_weight(s, jnp.bfloat16, i) for i, s in enumerate(shapes)]
    check_exact(ws, [OIHW_TO_HWIO] * len(ws))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.tuples(*[st.integers(1, 70)] * 2, *[st.integers(1, 5)] * 2), st.sampled_from(PERMS)),
                min_size=1, max_size=30),
       st.sampled_from(DTYPES), st.integers(0, 2**16))
def test_random_batches(jobs, dtype, seed):
    ws = [random_weight(s, jnp.dtype(dtype), seed + i) for i, (s, _) in enumerate(jobs)]
    check_exact(ws, [p for _, p in jobs])


def test_mixed_widths_and_empty_weights():
    ws = [random_weight((4, 3, 3, 3), jnp.float32, 0), random_weight((0, 3, 1, 1), jnp.bfloat16, 1),
          random_weight((5, 2, 1, 1), jnp.bfloat16, 2)]
    got = jaxcnn.relayout_weights(ws, [OIHW_TO_HWIO] * 3)
    for g, w in zip(got, ws):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(jnp.transpose(w, OIHW_TO_HWIO), np.float32))


def test_grad_on_gpu():
    ws = [random_weight((6, 4, 3, 3), jnp.float32, 0), random_weight((8, 6, 1, 1), jnp.float32, 1)]
    cts = [random_weight(tuple(w.shape[p] for p in OIHW_TO_HWIO), jnp.float32, 2 + i) for i, w in enumerate(ws)]
    loss = lambda ws: sum(jnp.sum(y * c) for y, c in zip(jaxcnn.relayout_weights(ws, [OIHW_TO_HWIO] * 2), cts))
    grads = jax.jit(jax.grad(loss))(ws)
    for g, c in zip(grads, cts):
        np.testing.assert_array_equal(g, jnp.transpose(c, np.argsort(OIHW_TO_HWIO)))
