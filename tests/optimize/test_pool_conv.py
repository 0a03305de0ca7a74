"""optimize() runs an average pool read only by a 1x1 conv after the conv (optimize/pool_conv.py):
the forms Keras (count without the padding), Flax and Equinox (sum / window size) trace, in
NHWC and NCHW; the same values and gradients as the traced order; never where the two do not
commute; the rule that decides off GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxcnn
from jaxcnn.optimize.pool_conv import POOL_CONV
from pool_branch import block, conv, flax_avg, keras_avg
from reference64 import rel_err

RNG = np.random.default_rng(7)
C, K = 12, 5
X = jnp.asarray(RNG.normal(size=(2, 9, 7, C)), jnp.float32)  # odd sides: the border counts differ
W = jnp.asarray(RNG.normal(size=(1, 1, C, K)) / 3, jnp.float32)
VECS = [jnp.asarray(RNG.uniform(0.5, 1.5, K), jnp.float32) for _ in range(4)]
# float32: the commuted order sums the same products in another order (C products per pixel,
# then at most 9 window terms): a few ulps of the output's scale.
TOL = 1e-5


def ops(fn, *args, policy="all"):
    return [r.op for r in jaxcnn.optimize(fn, policy=policy).rewrites(*args)]


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("pool", [keras_avg, flax_avg], ids=["keras", "flax"])
def test_pool_then_1x1_conv_commutes_with_the_same_values_and_gradients(pool, layout):
    fn = block(pool, layout)
    x = X if layout == "NHWC" else jnp.transpose(X, (0, 3, 1, 2))
    args = (x, W, *VECS)
    opt = jaxcnn.optimize(fn, policy="all")
    assert [r.op for r in opt.rewrites(*args)] == [POOL_CONV]
    (r,) = opt.rewrites(*args)
    assert r.w_shape == (1, 1, C, K) and r.kwargs["window"] == (3, 3) and r.layout == layout
    want = np.asarray(jax.jit(fn)(*args), np.float64)
    got = jax.jit(opt)(*args)
    assert got.shape == want.shape and got.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(got))) and rel_err(got, want) < TOL

    def loss(f):
        return lambda x, w: jnp.sum(f(x, w, *VECS) ** 2)
    gx, gw = jax.jit(jax.grad(loss(opt), argnums=(0, 1)))(x, W)
    wx, ww = jax.jit(jax.grad(loss(fn), argnums=(0, 1)))(x, W)
    assert rel_err(gx, np.asarray(wx, np.float64)) < TOL and rel_err(gw, np.asarray(ww, np.float64)) < TOL


def test_bf16_pool_between_f32_converts_commutes():
    """A bf16 model whose pool sums in float32 (converts around it) keeps its dtypes."""
    def pool(x, layout):
        return flax_avg(x.astype(jnp.float32), layout).astype(jnp.bfloat16)

    fn = block(pool)
    args = (X.astype(jnp.bfloat16), W.astype(jnp.bfloat16), *VECS)
    assert ops(fn, *args) == [POOL_CONV]
    got = jax.jit(jaxcnn.optimize(fn, policy="all"))(*args)
    traced = jax.jit(fn)(*args)
    assert got.dtype == traced.dtype
    want = np.asarray(traced, np.float64)
    # one bf16 rounding of the conv's output and of the pool's (2^-8 each), at the output's scale
    assert rel_err(got, want) < 2 * 2.0 ** -8


NOT_COMMUTED = {
    # the pooled value is read by something else as well
    "pooled_read_twice": lambda x, w: (lambda p: conv(p, w) + jnp.sum(p))(flax_avg(x)),
    # a 3x3 conv mixes pixels: the pool would move across it
    "3x3_conv": lambda x, w: conv(flax_avg(x), jnp.tile(w, (3, 3, 1, 1))),
    "strided_conv": lambda x, w: conv(flax_avg(x), w, stride=2),
    # the scale depends on x (a per-pixel max over channels): not linear in x
    "scaled_by_x": lambda x, w: conv(lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1), "SAME")
                                     / jnp.max(x, axis=-1, keepdims=True), w),
    # a per-channel scale treats channels differently
    "per_channel_scale": lambda x, w: conv(flax_avg(x) * jnp.arange(1.0, C + 1), w),
    "max_pool": lambda x, w: conv(lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 1, 1, 1), "SAME"), w),
    # a pool over the channel axis
    "channel_pool": lambda x, w: conv(lax.reduce_window(x, 0.0, lax.add, (1, 1, 1, 3), (1, 1, 1, 1), "SAME"), w),
}


@pytest.mark.parametrize("name", list(NOT_COMMUTED))
def test_pairs_that_do_not_commute_are_not_matched(name):
    fn = NOT_COMMUTED[name]
    assert POOL_CONV not in ops(fn, X, W)
    np.testing.assert_allclose(jax.jit(jaxcnn.optimize(fn, policy="all"))(X, W), jax.jit(fn)(X, W), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k, stride, commuted", [(K, 1, True), (C, 1, False), (2 * C, 1, False), (K, 2, False)])
def test_rule_commutes_only_where_the_pool_shrinks(k, stride, commuted, monkeypatch):
    """Off GPU (nothing measured) policy="auto" commutes where the pool then averages fewer
    channels at the same image size, and says why either way."""
    monkeypatch.setenv("JAXCNN_MEASURE", "0")
    w = jnp.asarray(RNG.normal(size=(1, 1, C, k)), jnp.float32)

    def fn(x, w):
        return conv(keras_avg(x, stride=stride), w)

    opt = jaxcnn.optimize(fn)
    assert (POOL_CONV in [r.op for r in opt.rewrites(X, w)]) == commuted
    text = opt.explain(X, w)
    assert ("the pool averages" in text) == commuted
    assert ("the pool would not shrink" in text) != commuted
    np.testing.assert_allclose(jax.jit(opt)(X, w), jax.jit(fn)(X, w), rtol=1e-5, atol=1e-5)
