"""profile_function's per-site "jaxcnn" time is of what jaxcnn.optimize(fn) runs at the site: the
decision owner's candidate optimize chose (jaxcnn/profile/function_profile.py)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxcnn
import profile_fn_models
from pool_branch import block, keras_avg
from jaxcnn.optimize.conv_sites import site_candidate, subgraph_fn
from jaxcnn.optimize.rewrite import find_matches
from jaxcnn.profile.function_profile import (
    optimize_choices,
    profile_function,
    site_inputs,
)
from jaxcnn.tuning.decision import prepared


def prepared_inputs(c, values):
    """c.fn's inputs for a site's values, as the decision owner prepares them."""
    args, error = prepared(c, values)
    assert not error, error
    return args

NHWC = ("NHWC", "HWIO", "NHWC")


def bn_cnn():
    """Three conv + per-channel scale/shift (inference BatchNorm) + ReLU blocks, on CPU decided by
    optimize's rules: fp32 at HIGHEST precision (rewritten alone, "auto"), fp32 at the default
    precision (kept as traced), the same before a 2x2 max pool (fused into conv2d_pool)."""
    keys = jax.random.split(jax.random.key(0), 10)

    def block_params(i, c, k):
        return (jax.random.normal(keys[3 * i], (3, 3, c, k)) * 0.2,
                jax.random.uniform(keys[3 * i + 1], (k,)) + 0.5, jax.random.normal(keys[3 * i + 2], (k,)))

    def block(x, w, scale, shift, precision=None):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC, precision=precision)
        return jax.nn.relu(y * scale + shift)

    def forward(params, x):
        x = block(x, *params[0], precision=lax.Precision.HIGHEST)
        x = block(x, *params[1])
        x = block(x, *params[2])
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    params = [block_params(0, 8, 8), block_params(1, 8, 16), block_params(2, 16, 16)]
    return forward, (params, jax.random.normal(keys[9], (2, 8, 8, 8)))


def conv_sites(fn, args):
    """(closed jaxpr, Found, [(path, Found, match)] of its conv sites) as profile_function finds them."""
    closed = jax.make_jaxpr(fn)(*args)
    found = find_matches(closed.jaxpr)
    return closed, found, [(p, w, m) for p, w, m in found.all_matches() if m.op == "conv2d"]


def test_each_site_is_timed_as_the_candidate_optimize_runs_there():
    fn, args = bn_cnn()
    optimized = jaxcnn.optimize(fn)
    optimized(*args)
    rewrites = optimized.rewrites(*args)
    # On CPU optimize's rules decide: the HIGHEST conv alone with "auto", the last conv fused.
    assert [(r.op, r.algorithm) for r in rewrites] == [("conv2d", "auto"), ("conv2d_pool", None)]

    profile = profile_function(fn, args, iters=1, warmup=0, sparsity=False)
    params = [layer.params for layer in profile.layers]
    assert [p["candidate"] for p in params] == ["jaxcnn:auto", "xla", "xla"]
    assert params[0]["optimize"].startswith("jaxcnn.conv2d (algorithm auto)")
    assert params[1]["optimize"] == "kept as traced (XLA)"
    assert params[2]["optimize"].startswith("fused into jaxcnn.conv2d_pool")
    # The BatchNorm folds: its time includes the site's share of the program's one fold.
    assert params[0]["fold_share_ms"] >= 0.0 and params[1]["fold_share_ms"] is None
    # Kept and fused sites run the traced equations: the xla time again, a ratio of exactly 1.
    for layer in profile.layers[1:]:
        assert layer.times["jaxcnn"] is layer.times["xla"]


def test_the_candidate_of_each_site_computes_the_traced_values():
    fn, args = bn_cnn()
    closed, found, sites = conv_sites(fn, args)
    inputs = site_inputs(closed, found, [m for _, _, m in sites], jax.tree.leaves(args))
    optimized = jaxcnn.optimize(fn)
    optimized(*args)
    choices = optimize_choices(optimized.rewrites(*args), [(path, m) for path, _, m in sites])
    # xla_folded too: what optimize runs where a GPU measurement picks XLA's conv on folded weights.
    for (_, where, m), choice in zip(sites, choices):
        values, traced = inputs[id(m)]
        for name in (choice.candidate, "xla_folded"):
            c = site_candidate(where.uses, m, name)
            assert c.name == name
            np.testing.assert_allclose(c.fn(*prepared_inputs(c, values)), traced, rtol=2e-5, atol=2e-5)


def test_a_rewrite_with_xlas_conv_is_the_folded_candidate_where_there_is_something_to_fold():
    fn, args = bn_cnn()
    _, _, sites = conv_sites(fn, args)
    optimized = jaxcnn.optimize(fn)
    optimized(*args)
    alone = dataclasses.replace(optimized.rewrites(*args)[0], algorithm="xla")
    folded = optimize_choices([alone], [(path, m) for path, _, m in sites])
    assert [c.candidate for c in folded] == ["xla_folded", "xla", "xla"]
    assert folded[0].optimize.startswith("jaxcnn.conv2d (algorithm xla)")

    # A plain conv (+ ReLU, nothing to fold) rewritten with algorithm "xla": conv2d's own "xla".
    plain_fn, plain_args = profile_fn_models.lax_nchw_cnn()
    closed, found, plain_sites = conv_sites(plain_fn, plain_args)
    (path, where, m), _ = plain_sites
    rewrite = dataclasses.replace(alone, x_shape=m.site.x_shape, w_shape=m.site.w_shape, path=path)
    (choice, kept) = optimize_choices([rewrite], [(p, s) for p, _, s in plain_sites])
    assert m.plain and (choice.candidate, kept.candidate) == ("jaxcnn:xla", "xla")
    values, traced = site_inputs(closed, found, [m], jax.tree.leaves(plain_args))[id(m)]
    c = site_candidate(where.uses, m, "jaxcnn:xla")
    np.testing.assert_allclose(c.fn(*prepared_inputs(c, values)), subgraph_fn(where.uses, m)(*values), rtol=2e-5,
                               atol=2e-5)
    np.testing.assert_allclose(c.fn(*prepared_inputs(c, values)), traced, rtol=2e-5, atol=2e-5)


def test_kept_sites_are_timed_as_traced_without_an_xla_backend():
    fn, args = profile_fn_models.lax_nchw_cnn()
    profile = profile_function(fn, args, backends=("jaxcnn",), iters=1, warmup=0, sparsity=False)
    assert [layer.params["candidate"] for layer in profile.layers] == ["xla", "xla"]
    assert all(set(layer.times) == {"jaxcnn"} and layer.times["jaxcnn"].n == 1 for layer in profile.layers)


def test_a_rule_pick_outside_the_measured_set_is_built_like_conv_sites():
    fn, args = bn_cnn()
    closed, found, sites = conv_sites(fn, args)
    _, where, m = sites[0]
    values, traced = site_inputs(closed, found, [m], jax.tree.leaves(args))[id(m)]
    # A Hopper rule picks "tensor_core", which conv_site does not measure (auto and wgmma / stem).
    c = site_candidate(where.uses, m, "jaxcnn:tensor_core")
    assert c.name == "jaxcnn:tensor_core" and c.shared is not None  # folded as the prologue folds it
    np.testing.assert_allclose(c.fn(*prepared_inputs(c, values)), traced, rtol=2e-5, atol=2e-5)


def resnet_like_bn_cnn(n: int = 16):
    """bf16 NHWC conv + inference BatchNorm (+ residual) + ReLU blocks at ResNet's 28x28 stage
    sizes: 1x1 128 -> 64, 3x3 64 -> 64, 1x1 64 -> 128 with the block's input added."""
    keys = iter(jax.random.split(jax.random.key(1), 16))

    def bn(k):
        return (jax.random.uniform(next(keys), (k,), jnp.float32, 0.5, 1.5).astype(jnp.bfloat16),
                (0.2 * jax.random.normal(next(keys), (k,))).astype(jnp.bfloat16))

    def conv(x, w, scale, shift, padding):
        y = lax.conv_general_dilated(x, w, (1, 1), padding, dimension_numbers=NHWC)
        return y * scale + shift

    def forward(params, x):
        (w1, *b1), (w2, *b2), (w3, *b3) = params
        y = jax.nn.relu(conv(x, w1, *b1, "VALID"))
        y = jax.nn.relu(conv(y, w2, *b2, "SAME"))
        return jax.nn.relu(conv(y, w3, *b3, "VALID") + x)

    shapes = [(1, 1, 128, 64), (3, 3, 64, 64), (1, 1, 64, 128)]
    params = [((0.1 * jax.random.normal(next(keys), s)).astype(jnp.bfloat16), *bn(s[3])) for s in shapes]
    return forward, (params, jax.random.normal(next(keys), (n, 28, 28, 128)).astype(jnp.bfloat16))


@pytest.mark.gpu
def test_on_a_gpu_each_rewritten_site_is_timed_as_fast_as_optimize_measured_it(monkeypatch, tmp_path):
    """The per-site jaxcnn time is of the candidate optimize measured faster than the traced
    site: not slower than the site's XLA time beyond run-to-run spread (the decision asked for
    decision.MIN_GAIN on random inputs; the profile times the inputs fn computes)."""
    monkeypatch.setenv("JAXCNN_MEASURE", "1")
    monkeypatch.setenv("JAXCNN_AUTOTUNE_CACHE", str(tmp_path / "autotune.json"))
    fn, args = resnet_like_bn_cnn()
    profile = profile_function(fn, args, iters=10, warmup=2, sparsity=False)
    assert profile.is_device_time
    for layer in profile.layers:
        xla, ours = layer.times["xla"], layer.times["jaxcnn"]
        assert xla.kernels and ours.kernels, layer.info.name
        if layer.params["candidate"] == "xla":
            assert ours is xla
        else:
            assert ours.median_ms <= 1.10 * xla.median_ms + 0.002, (layer.info.name, layer.params)


def test_an_average_pool_read_by_a_1x1_conv_is_a_layer_timed_as_optimize_runs_it(monkeypatch):
    """An InceptionV3 pool branch (Keras's average pool, then a 1x1 conv, BatchNorm and ReLU) is a
    layer of its own: "commuted" where optimize moved the pool after the conv (off GPU its rule,
    K < C), its time that of the commuted order, on the inputs fn computes."""
    monkeypatch.setenv("JAXCNN_MEASURE", "0")
    rng = np.random.default_rng(3)
    c, k = 12, 4
    args = (jnp.asarray(rng.normal(size=(2, 7, 7, c)), jnp.float32),
            jnp.asarray(rng.normal(size=(1, 1, c, k)) / 3, jnp.float32),
            *(jnp.asarray(rng.uniform(0.5, 1.5, k), jnp.float32) for _ in range(4)))
    profile = profile_function(block(keras_avg), args, iters=1, warmup=0, sparsity=False)
    (layer,) = profile.layers
    assert layer.params["candidate"] == "commuted"
    assert layer.params["optimize"].startswith("the average pool moved after the 1x1 conv")
    assert layer.info.weight_shape == (1, 1, c, k) and layer.info.output_shape == (2, 7, 7, k)
    assert layer.info.flops == 2 * 2 * 7 * 7 * c * k
    assert set(layer.times) == {"xla", "jaxcnn"}
