"""relayout_weights on the reference path: values, grads, vmap, validation, and the CUDA
lowering (one custom call for all weights of one element width; per-weight transposes on
several devices)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcnn
from jaxcnn._native import library

PERMS = list(itertools.permutations(range(4)))
OIHW_TO_HWIO = (2, 3, 1, 0)


def random_weights(shapes, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s).astype(np.float32), dtype) for s in shapes]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.tuples(*[st.integers(1, 9)] * 4), st.sampled_from(PERMS)), min_size=1, max_size=5),
       st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16]), st.integers(0, 2**16))
@pytest.mark.slow
def test_values_equal_transpose(jobs, dtype, seed):
    ws = random_weights([s for s, _ in jobs], dtype, seed)
    perms = [p for _, p in jobs]
    got = jax.jit(lambda *w: jaxcnn.relayout_weights(w, perms))(*ws)
    for g, w, p in zip(got, ws, perms):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(jnp.transpose(w, p)))


def test_mixed_widths_and_empty():
    ws = random_weights([(4, 3, 1, 1), (2, 2, 3, 3)], np.float32) + random_weights([(5, 4, 3, 3)], jnp.bfloat16)
    got = jaxcnn.relayout_weights(ws, [OIHW_TO_HWIO] * 3)
    assert [g.dtype for g in got] == [jnp.float32, jnp.float32, jnp.bfloat16]
    for g, w in zip(got, ws):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(jnp.transpose(w, OIHW_TO_HWIO)))
    assert jaxcnn.relayout_weights([], []) == []


def test_grad_is_the_inverse_permutation_and_vmap_works():
    ws = random_weights([(6, 4, 3, 3), (8, 6, 1, 1)])
    perms = [OIHW_TO_HWIO, (1, 0, 3, 2)]
    cts = random_weights([tuple(w.shape[p] for p in perm) for w, perm in zip(ws, perms)], seed=1)
    loss = lambda ws: sum(jnp.sum(y * c) for y, c in zip(jaxcnn.relayout_weights(ws, perms), cts))
    grads = jax.jit(jax.grad(loss))(ws)
    for g, c, perm in zip(grads, cts, perms):
        np.testing.assert_allclose(g, jnp.transpose(c, np.argsort(perm)))
    # vmap over one weight only: the other stays one unbatched op
    stacked = jnp.stack([ws[0], ws[0] * 2])
    ys = jax.vmap(lambda a, b: jaxcnn.relayout_weights([a, b], perms), in_axes=(0, None))(stacked, ws[1])
    np.testing.assert_array_equal(ys[0][1], jnp.transpose(ws[0] * 2, OIHW_TO_HWIO))
    np.testing.assert_array_equal(ys[1][0], jnp.transpose(ws[1], perms[1]))


def test_bad_arguments_name_the_weight():
    w = jnp.ones((2, 3, 1, 1))
    with pytest.raises(ValueError, match=r"weights\[1\] must be rank 4"):
        jaxcnn.relayout_weights([w, jnp.ones((2, 3))], [OIHW_TO_HWIO] * 2)
    with pytest.raises(ValueError, match=r"perms\[0\] must be a permutation"):
        jaxcnn.relayout_weights([w], [(0, 1, 1, 3)])
    with pytest.raises(ValueError, match="one permutation per weight"):
        jaxcnn.relayout_weights([w, w], [OIHW_TO_HWIO])


@pytest.mark.skipif(not library.handlers_registered(), reason="the CUDA library is not built here")
def test_cuda_lowering_is_one_custom_call_per_width():
    ws = random_weights([(4, 3, 1, 1), (6, 4, 3, 3), (5, 5, 1, 1)])
    fn = jax.jit(lambda *w: jaxcnn.relayout_weights(w, [OIHW_TO_HWIO] * 3))
    text = fn.trace(*ws).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count('stablehlo.custom_call @jaxcnn_weight_relayout') == 1, text
    assert "stablehlo.transpose" not in text
    assert "perms = dense<[2, 3, 1, 0, 2, 3, 1, 0, 2, 3, 1, 0]>" in text  # 4 entries per weight
