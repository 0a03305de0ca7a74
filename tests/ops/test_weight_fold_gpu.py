"""GPU suite: fold_weights' batched kernel against XLA's jnp expression (bit-exact: both take
the fp32 product and round once), outputs poisoned first; optimize's weight prologue on a
BatchNorm model against the model itself (`pytest -m gpu`)."""

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcnn
from test_weight_fold import bn_model, bn_params, fake_decisions

pytestmark = pytest.mark.gpu

PERMS = list(itertools.permutations(range(4)))
DTYPES = ["float32", "bfloat16", "float16"]


def reference(w, s, axis, perm, dtype):
    v = w.astype(jnp.float32)
    if s is not None:
        shape = [1, 1, 1, 1]
        shape[axis] = w.shape[axis]
        v = v * s.reshape(shape)
    return jnp.transpose(v.astype(dtype), perm)


def check_exact(ws, ss, axes, perms, dtypes, vectors):
    """One fold_weights call with every output buffer pre-filled with NaN (donated and aliased),
    so an element the kernel misses keeps the poison."""
    vdtypes = [DTYPES[i % 3] for i in range(len(vectors))]
    outs = [jnp.full(tuple(w.shape[p] for p in perm), np.nan, d) for w, perm, d in zip(ws, perms, dtypes)]
    outs += [jnp.full(v.shape, np.nan, d) for v, d in zip(vectors, vdtypes)]
    fn = jax.jit(lambda poisons, ws, ss, vs: jaxcnn.fold_weights(ws, ss, axes, perms, dtypes, vs, vdtypes),
                 donate_argnums=0)
    compiled = fn.lower(outs, ws, ss, vectors).compile()
    assert compiled.as_text().count('custom_call_target="jaxcnn_weight_fold"') == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "donated buffers were not usable" would void the poison
        got = compiled(outs, ws, ss, vectors)
    want = jax.jit(lambda ws, ss: [reference(*a) for a in zip(ws, ss, axes, perms, dtypes)])(ws, ss)
    want += [v.astype(d) for v, d in zip(vectors, vdtypes)]
    for g, r in zip(got, want):
        assert g.shape == r.shape and g.dtype == r.dtype
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(r).view(np.uint8))


@pytest.mark.parametrize("src", DTYPES)
def test_every_permutation_scale_axis_and_cast(src):
    """All 24 permutations, each scale axis and none, every result dtype, odd extents, vectors of
    odd lengths; 148 jobs: more than one launch holds."""
    rng = np.random.default_rng(0)
    shapes = [(3, 5, 7, 33), (65, 1, 2, 37), (1, 1, 40, 31), (33, 34, 1, 1)]
    ws, ss, axes, perms, dtypes = [], [], [], [], []
    for i in range(144):
        shape = shapes[i % 4]
        axis = (i // 4) % 5 - 1
        ws.append(jnp.asarray(rng.standard_normal(shape), src))
        ss.append(None if axis < 0 else jnp.asarray(rng.uniform(0.5, 2.0, shape[axis]), jnp.float32))
        axes.append(axis)
        perms.append(PERMS[i % 24])
        dtypes.append(DTYPES[(i // 24) % 3])
    vectors = [jnp.asarray(rng.standard_normal(n), jnp.float32) for n in (1, 31, 64, 1000)]
    check_exact(ws, ss, axes, perms, dtypes, vectors)


@pytest.mark.parametrize("choice", ["xla_folded", "jaxcnn:auto"])
def test_prologue_model_matches_the_model(monkeypatch, choice):
    from jaxcnn.optimize import rewrite
    monkeypatch.setattr(rewrite, "decide_all", fake_decisions(choice))
    fn, params = bn_model(jnp.bfloat16), bn_params(32)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((4, 15, 13, 32)), jnp.bfloat16)
    opt = jax.jit(jaxcnn.optimize(fn, fuse="none"))
    hlo = opt.lower(params, x).compile().as_text()
    assert hlo.count('custom_call_target="jaxcnn_weight_fold"') == 1
    got, want = opt(params, x), jax.jit(fn)(params, x)
    assert bool(jnp.all(jnp.isfinite(got)))
    # Both bf16 programs round differently from each other (folding rounds the weights once and
    # skips the BatchNorm's own bf16 steps): judge both against the model in float32.
    exact = jax.jit(bn_model(jnp.float32))(params, x.astype(jnp.float32))
    err_opt = float(jnp.max(jnp.abs(got.astype(jnp.float32) - exact)))
    err_xla = float(jnp.max(jnp.abs(want.astype(jnp.float32) - exact)))
    assert err_opt <= 2.0 * err_xla, (err_opt, err_xla)
