"""jaxcnn.optimize(fn, fuse=...) on expand -> depthwise chains (jaxcnn/optimize/chain_groups.py):
inverted residual blocks written as a JAX user writes them (inference BatchNorm, ReLU6 or
SiLU, Keras' zero pad before a stride-2 "valid" depthwise) become one conv1x1_depthwise each,
compute what the block computes (values and gradients), lower to one custom call per chain,
and chains the kernel cannot run or whose expanded value has other readers stay as they are."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcnn
from arrays import he_normal, normal
from cuda_lowering import cuda_text, custom_calls, needs_library

TARGET = "jaxcnn_conv1x1_depthwise_fwd"
EPS = 1e-3


def _bn(y, p):
    """Inference BatchNorm as Flax and Keras trace it: running statistics, in float32."""
    y32 = y.astype(jnp.float32)
    return ((y32 - p["mean"]) * (p["gamma"] / jnp.sqrt(p["var"] + EPS)) + p["beta"]).astype(y.dtype)


def _conv(x, w, stride=1, padding="VALID", groups=1):
    return jax.lax.conv_general_dilated(x, w, (stride, stride), padding, dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        feature_group_count=groups)


def _bn_params(key, k):
    ks = jax.random.split(key, 4)
    return dict(mean=normal(ks[0], (k,), 0.2), var=jax.random.uniform(ks[1], (k,), minval=0.5, maxval=1.5),
                gamma=1 + normal(ks[2], (k,), 0.1), beta=normal(ks[3], (k,), 0.1))


def block_params(seed, c, m, k, dtype):
    ks = jax.random.split(jax.random.PRNGKey(seed), 6)
    return dict(w1=he_normal(ks[0], (1, 1, c, m), dtype), bn1=_bn_params(ks[1], m),
                wd=he_normal(ks[2], (3, 3, 1, m), dtype), bn2=_bn_params(ks[3], m),
                w2=he_normal(ks[4], (1, 1, m, k), dtype), bn3=_bn_params(ks[5], k))


def inverted_residual(p, x, stride, act=jax.nn.relu6, keras_pad=False):
    """MobileNetV2's block: expand 1x1 + BN + act -> depthwise 3x3 + BN + act -> project 1x1 + BN
    (+ x where the shapes allow)."""
    t = act(_bn(_conv(x, p["w1"]), p["bn1"]))
    if keras_pad:  # ZeroPadding2D((0, 1), (0, 1)) then a "valid" depthwise
        t = jnp.pad(t, ((0, 0), (0, 1), (0, 1), (0, 0)))
        padding = "VALID"
    else:
        padding = ((1, 1), (1, 1))
    t = act(_bn(_conv(t, p["wd"], stride, padding, groups=t.shape[-1]), p["bn2"]))
    y = _bn(_conv(t, p["w2"]), p["bn3"])
    return y + x if y.shape == x.shape else y


def two_blocks(params, x, act=jax.nn.relu6):
    y = inverted_residual(params[0], x, 2, act, keras_pad=True)
    return inverted_residual(params[1], y, 1, act)


def setup(dtype=jnp.bfloat16, c=16, m=96, k=24):
    params = [block_params(1, c, m, k, dtype), block_params(2, k, 6 * k, k, dtype)]
    x = normal(jax.random.PRNGKey(3), (2, 16, 16, c), 1.0, dtype)
    return params, x


def chain_rewrites(opt, *args):
    return [r for r in opt.rewrites(*args) if r.op == "conv1x1_depthwise"]


@pytest.mark.parametrize("act", [jax.nn.relu6, jax.nn.silu])
def test_both_blocks_become_chains_and_compute_the_same(act):
    params, x = setup()
    fn = lambda p, x: two_blocks(p, x, act)  # noqa: E731
    opt = jaxcnn.optimize(fn, fuse="auto")
    chains = chain_rewrites(opt, params, x)
    assert len(chains) == 2
    assert chains[0].kwargs["padding"] == ((0, 1), (0, 1)) and chains[0].kwargs["stride"] == 2
    assert "pad" in chains[0].replaced
    assert chains[1].kwargs["padding"] == ((1, 1), (1, 1)) and chains[1].kwargs["stride"] == 1
    want = np.asarray(jax.jit(fn)(params, x), np.float32)
    got = np.asarray(jax.jit(opt)(params, x), np.float32)
    assert np.isfinite(got).all()
    # BatchNorm folded into bf16 weights rounds them once more than the traced block does.
    np.testing.assert_allclose(got, want, rtol=0, atol=0.05 * np.max(np.abs(want)))
    assert "conv1x1_depthwise" in opt.explain(params, x)


@needs_library
def test_cuda_lowering_has_one_custom_call_per_chain():
    params, x = setup()
    opt = jaxcnn.optimize(two_blocks, fuse="auto")
    text = cuda_text(opt, params, x)
    calls = custom_calls(text, TARGET)
    assert len(calls) == 2, text
    assert "pad_top = 0 : i64" in calls[0] and "pad_bottom = 1 : i64" in calls[0]
    # Both chains' four convs take their folded weights and biases from one weight prologue.
    (fold,) = custom_calls(text, "jaxcnn_weight_fold")
    assert "scale_axes = dense<3> : tensor<4xi64>" in fold


def test_gradients_match_the_traced_blocks():
    params, x = setup(jnp.float32)
    # float32 runs XLA's unfused convs in the fused op: fuse="all" still rewrites to test the plumbing.
    opt = jaxcnn.optimize(two_blocks, fuse="all")
    loss = lambda f: lambda p, x: jnp.sum(f(p, x) ** 2)  # noqa: E731
    want = jax.grad(loss(two_blocks), argnums=(0, 1))(params, x)
    got = jax.grad(loss(opt), argnums=(0, 1))(params, x)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-3, atol=2e-3 * float(np.max(np.abs(w))))


def test_float32_chains_are_not_offered():
    """The fused kernel is 16-bit only: a float32 chain would run XLA's own convs again."""
    params, x = setup(jnp.float32)
    assert chain_rewrites(jaxcnn.optimize(two_blocks, fuse="auto"), params, x) == []


def test_expanded_value_read_elsewhere_is_not_fused():
    params, x = setup()

    def fn(p, x):
        t = jax.nn.relu6(_bn(_conv(x, p[0]["w1"]), p[0]["bn1"]))
        y = jax.nn.relu6(_bn(_conv(t, p[0]["wd"], 1, ((1, 1), (1, 1)), groups=t.shape[-1]), p[0]["bn2"]))
        return y, t  # t is an output too: the fused call would not produce it

    assert chain_rewrites(jaxcnn.optimize(fn, fuse="auto"), params, x) == []


def test_default_fuses_chains_and_fuse_none_or_other_kinds_leave_them():
    params, x = setup()
    assert len(chain_rewrites(jaxcnn.optimize(two_blocks), params, x)) == 2
    assert chain_rewrites(jaxcnn.optimize(two_blocks, fuse="none"), params, x) == []
    assert chain_rewrites(jaxcnn.optimize(two_blocks, policy="xla"), params, x) == []
    opt = jaxcnn.optimize.optimize_fused(two_blocks, kinds=("fire", "conv_pool"))
    assert chain_rewrites(opt, params, x) == []


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="keras is not installed")
def test_keras_mobilenetv2_chains():
    """Every expand -> depthwise pair of Keras' MobileNetV2 (16: 4 of them stride 2 behind a
    ZeroPadding2D) becomes one chain."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks import keras_models
    model = keras_models.build("keras_mobilenetv2", batch=1, hw=64, dtype=jnp.bfloat16, num_classes=10)
    opt = jaxcnn.optimize(model.apply, fuse="auto")
    chains = chain_rewrites(opt, model.params, model.x)
    assert len(chains) == 16
    assert sum(r.kwargs["stride"] == 2 for r in chains) == 4


def test_runs_rewrites_says_whether_the_rewritten_program_runs():
    """Off GPU nothing is measured (None); policy="xla" and a program with no rewrite run fn."""
    params, x = setup()
    assert jaxcnn.optimize(two_blocks).runs_rewrites(params, x) is None
    assert jaxcnn.optimize(two_blocks, policy="xla").runs_rewrites(params, x) is False
    assert jaxcnn.optimize(lambda p, x: x * 2, fuse="none").runs_rewrites(params, x) is False


def test_nchw_block_under_vmap_becomes_a_chain():
    """An NCHW block (OIHW weights) written per example and vmapped, as Equinox models are: the
    convs reach each other through size-1 reshapes; the chain still fuses and computes the same."""
    params, x = setup()
    p = params[1]
    to_oihw = lambda w: jnp.transpose(w, (3, 2, 0, 1))  # noqa: E731
    w1, wd = to_oihw(p["w1"]), to_oihw(p["wd"])

    def one(x):  # x [C, H, W]
        def conv(v, w, stride=1, padding="VALID", groups=1):
            return jax.lax.conv_general_dilated(v[None], w, (stride, stride), padding,
                                                dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                                feature_group_count=groups)[0]

        def bn(v, q):
            s = (q["gamma"] / jnp.sqrt(q["var"] + EPS))[:, None, None]
            return ((v.astype(jnp.float32) - q["mean"][:, None, None]) * s + q["beta"][:, None, None]).astype(v.dtype)
        t = jax.nn.relu6(bn(conv(x, w1), p["bn1"]))
        return jax.nn.relu6(bn(conv(t, wd, 1, ((1, 1), (1, 1)), groups=t.shape[0]), p["bn2"]))

    fn = jax.vmap(one)
    x_nchw = jnp.transpose(normal(jax.random.PRNGKey(4), (2, 8, 8, 24), 1.0, jnp.bfloat16), (0, 3, 1, 2))
    opt = jaxcnn.optimize(fn)
    chains = chain_rewrites(opt, x_nchw)
    assert len(chains) == 1 and chains[0].layout == "NCHW"
    want = np.asarray(jax.jit(fn)(x_nchw), np.float32)
    got = np.asarray(jax.jit(opt)(x_nchw), np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=0.05 * np.max(np.abs(want)))


def test_pad_with_a_computed_value_is_not_folded():
    """Only a literal zero pad folds into the depthwise padding: a pad value the program computes
    (here 0 * a parameter, zero but not known to be) keeps the convs apart."""
    params, x = setup()
    p = params[0]

    def fn(p, x, scale):
        t = jax.nn.relu6(_bn(_conv(x, p["w1"]), p["bn1"]))
        t = jax.lax.pad(t, (scale * 0).astype(t.dtype), ((0, 0, 0), (0, 1, 0), (0, 1, 0), (0, 0, 0)))
        return jax.nn.relu6(_bn(_conv(t, p["wd"], 2, "VALID", groups=t.shape[-1]), p["bn2"]))

    assert chain_rewrites(jaxcnn.optimize(fn), p, x, jnp.float32(1.0)) == []
