"""jaxcnn.optimize: which lax patterns become jaxcnn primitives, and that the rewritten function
computes what the original does (values, jit, grad, vmap, CUDA lowering) on CPU."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

import jaxcnn
from jaxcnn.models import get_model
from jaxcnn.models import backends as B
from jaxcnn.tuning import autotune_cache, layer_autotune
from jaxcnn.tuning import measure as measuring
from jaxcnn.tuning.layer import conv_layer

NHWC = ("NHWC", "HWIO", "NHWC")
TOL = {jnp.float32: dict(rtol=1e-4, atol=1e-4), jnp.bfloat16: dict(rtol=5e-2, atol=5e-2)}


def rand(seed, shape, dtype=jnp.float32):
    # normal values: never all zeros, so a dropped bias or a wrong ReLU shows
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32).astype(dtype)


def ops(fn, *args):
    return [r.op for r in jaxcnn.optimize(fn, policy="all", fuse="none").rewrites(*args)]


def assert_close(got, want, dtype=jnp.float32):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), **TOL[dtype])


def conv(x, w, padding="SAME", **kw):
    return lax.conv_general_dilated(x, w, (1, 1), padding, dimension_numbers=NHWC, **kw)


X, W, Bias = rand(0, (2, 9, 9, 4)), rand(1, (3, 3, 4, 8)), rand(2, (8,))


# -- conv patterns -----------------------------------------------------------------------------

@pytest.mark.parametrize("name, fn, bias, activation", [
    ("plain", lambda x, w, b: conv(x, w), False, None),
    ("bias", lambda x, w, b: conv(x, w) + b, True, None),
    ("bias+maximum", lambda x, w, b: jnp.maximum(conv(x, w) + b, 0.0), True, "relu"),
    ("bias+nn.relu", lambda x, w, b: jax.nn.relu(conv(x, w) + b), True, "relu"),
    ("relu, no bias", lambda x, w, b: jax.nn.relu(conv(x, w)), False, "relu"),
    ("zoo xla_conv2d", lambda x, w, b: B.xla_conv2d(x, w, b, padding=((1, 1), (1, 1)), activation="relu"), True, "relu"),
])
def test_conv_fusions(name, fn, bias, activation):
    opt = jaxcnn.optimize(fn, policy="all", fuse="none")
    [r] = opt.rewrites(X, W, Bias)
    assert (r.op, r.bias, r.kwargs["activation"], r.layout, r.w_shape) == ("conv2d", bias, activation, "NHWC", (3, 3, 4, 8))
    assert_close(opt(X, W, Bias), fn(X, W, Bias))


def test_no_fusion_when_the_intermediate_has_another_reader():
    def conv_read_twice(x, w, b):
        y = conv(x, w)
        return y + b, y
    [r] = jaxcnn.optimize(conv_read_twice, policy="all", fuse="none").rewrites(X, W, Bias)
    assert not r.bias and r.kwargs["activation"] is None

    def sum_read_twice(x, w, b):
        y = conv(x, w) + b
        return jax.nn.relu(y), y * 2
    opt = jaxcnn.optimize(sum_read_twice, policy="all", fuse="none")
    [r] = opt.rewrites(X, W, Bias)
    assert r.bias and r.kwargs["activation"] is None
    assert_close(opt(X, W, Bias), sum_read_twice(X, W, Bias))


def test_bias_broadcast_with_another_reader_still_fuses_and_stays_computed():
    def fn(x, w, b):
        bb = jnp.broadcast_to(b, (1, 1, 1, 8))
        return conv(x, w) + bb, bb * 3
    opt = jaxcnn.optimize(fn, policy="all", fuse="none")
    [r] = opt.rewrites(X, W, Bias)
    assert r.bias
    assert_close(opt(X, W, Bias), fn(X, W, Bias))


def test_non_bias_add_is_not_fused():
    other = rand(3, (2, 9, 9, 8))
    fn = lambda x, w, b: conv(x, w) + b  # b is a full tensor here, not a [K] broadcast
    [r] = jaxcnn.optimize(fn, policy="all", fuse="none").rewrites(X, W, other)
    assert not r.bias
    assert_close(jaxcnn.optimize(fn, policy="all", fuse="none")(X, W, other), fn(X, W, other))


def test_nchw_oihw_highest():
    x, w = rand(4, (2, 4, 10, 10)), rand(5, (8, 4, 3, 3))
    fn = lambda x, w, b: jax.nn.relu(
        lax.conv(x, w, (2, 2), "SAME", precision=lax.Precision.HIGHEST) + b.reshape(1, 8, 1, 1))
    opt = jaxcnn.optimize(fn, policy="all", fuse="none")
    [r] = opt.rewrites(x, w, Bias)
    assert (r.layout, r.w_shape, r.kwargs["precision"], r.kwargs["stride"], r.bias, r.kwargs["activation"]) == \
        ("NCHW", (3, 3, 4, 8), "highest", (2, 2), True, "relu")
    assert_close(opt(x, w, Bias), fn(x, w, Bias))


def test_chwn_layout_and_dilation():
    x = rand(6, (4, 12, 12, 2))  # CHWN
    fn = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "VALID", rhs_dilation=(2, 2),
                                               dimension_numbers=("CHWN", "HWIO", "CHWN"))
    opt = jaxcnn.optimize(fn, policy="all", fuse="none")
    [r] = opt.rewrites(x, W)
    assert r.layout == "CHWN" and r.kwargs["dilation"] == (2, 2)
    assert_close(opt(x, W), fn(x, W))


def test_grouped_and_depthwise():
    x = rand(7, (2, 8, 8, 8))
    for groups, w in ((2, rand(8, (3, 3, 4, 6))), (8, rand(9, (3, 3, 1, 8)))):
        fn = lambda x, w: conv(x, w, feature_group_count=groups)
        opt = jaxcnn.optimize(fn, policy="all", fuse="none")
        [r] = opt.rewrites(x, w)
        assert r.kwargs["groups"] == groups
        assert_close(opt(x, w), fn(x, w))


def test_left_alone():
    x = rand(10, (2, 8, 8, 4))
    lhs_dilated = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), lhs_dilation=(2, 2), dimension_numbers=NHWC)
    assert ops(lhs_dilated, x, W) == []
    assert_close(jaxcnn.optimize(lhs_dilated, policy="all", fuse="none")(x, W), lhs_dilated(x, W))
    widening = lambda x, w: conv(x, w, preferred_element_type=jnp.float32)
    assert ops(widening, x.astype(jnp.bfloat16), W.astype(jnp.bfloat16)) == []
    conv1d = lambda x, w: lax.conv_general_dilated(x, w, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"))
    assert ops(conv1d, rand(11, (2, 8, 4)), rand(12, (3, 4, 5))) == []
    batch_groups = lambda x, w: conv(x, w, batch_group_count=2)
    assert ops(batch_groups, x, W) == []


def test_nothing_rewritten_runs_fn_itself():
    # A bf16 dense conv + pool that policy="auto" leaves to XLA: the call is fn's own trace
    # (a jit inside stays a jit), not a re-emission of its jaxpr.
    x, w = rand(13, (2, 8, 8, 4), jnp.bfloat16), W.astype(jnp.bfloat16)
    calls = []

    def fn(x, w):
        calls.append(1)
        y = jax.jit(lambda x, w: jax.nn.relu(conv(x, w)))(x, w)
        return lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    fast = jaxcnn.optimize(fn, fuse="none")
    assert fast.rewrites(x, w) == []
    before = len(calls)
    assert str(jax.make_jaxpr(fast)(x, w)) == str(jax.make_jaxpr(fn)(x, w))
    assert len(calls) == before + 2  # fast called fn, once per make_jaxpr
    np.testing.assert_array_equal(fast(x, w), fn(x, w))


# -- pools and softmax -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_pools(dtype):
    x = rand(13, (2, 9, 9, 5), dtype)
    mx = lambda x: B.max_pool(x, window=(3, 3), stride=(2, 2), padding=((0, 1), (0, 1)))
    av = lambda x: B.avg_pool(x, window=(2, 2), stride=(1, 1), padding=((1, 1), (1, 1)))
    for fn, op in ((mx, "max_pool2d"), (av, "avg_pool2d")):
        opt = jaxcnn.optimize(fn, policy="all", fuse="none")
        [r] = opt.rewrites(x)
        assert (r.op, r.layout, r.dtype) == (op, "NHWC", jnp.dtype(dtype).name)
        assert_close(opt(x), fn(x), dtype)


def test_nchw_pool_and_unmatched_divisor():
    x = rand(14, (2, 5, 8, 8))
    fn = lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 1, 2, 2), (1, 1, 2, 2), "VALID") / 4
    [r] = jaxcnn.optimize(fn, policy="all", fuse="none").rewrites(x)
    assert (r.op, r.layout, r.kwargs["window"]) == ("avg_pool2d", "NCHW", (2, 2))
    assert_close(jaxcnn.optimize(fn, policy="all", fuse="none")(x), fn(x))
    not_mean = lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 1, 2, 2), (1, 1, 2, 2), "VALID") / 3
    assert ops(not_mean, x) == []
    channel_pool = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 1, 2), (1, 1, 1, 1), "VALID")
    assert ops(channel_pool, x) == []


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_softmax(dtype):
    x = rand(15, (4, 3, 33), dtype)
    for fn, op in ((jax.nn.softmax, "softmax"), (jax.nn.log_softmax, "log_softmax"),
                   (lambda x: jax.nn.softmax(x, axis=1), "softmax"), (B.softmax, "softmax")):
        opt = jaxcnn.optimize(fn, policy="all", fuse="none")
        [r] = opt.rewrites(x)
        assert r.op == op
        assert_close(opt(x), fn(x), dtype)


# -- transformations ---------------------------------------------------------------------------

def small_net(x, w, b, w2):
    y = jax.nn.relu(conv(x, w) + b)
    y = B.max_pool(y, window=(2, 2), stride=(2, 2), padding=((0, 0), (0, 0)))
    y = jax.jit(lambda y: jnp.maximum(conv(y, w2, padding="VALID"), 0.0))(y)
    return jax.nn.log_softmax(y.reshape(y.shape[0], -1))


NET_ARGS = (X, W, Bias, rand(16, (2, 2, 8, 6)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_small_net_values_jit_and_rewrites(dtype):
    args = tuple(a.astype(dtype) for a in NET_ARGS)
    opt = jaxcnn.optimize(small_net, policy="all", fuse="none")
    rewrites = opt.rewrites(*args)
    assert [r.op for r in rewrites] == ["conv2d", "max_pool2d", "conv2d", "log_softmax"]
    assert rewrites[2].path == "jit[<lambda>]" and rewrites[2].kwargs["activation"] == "relu"
    want = small_net(*args)
    assert_close(opt(*args), want, dtype)
    assert_close(jax.jit(opt)(*args), want, dtype)


def test_grad_matches_original():
    loss = lambda f: lambda *a: jnp.sum(f(*a) * jnp.sin(jnp.arange(108.0)).reshape(2, 54))
    got = jax.grad(loss(jaxcnn.optimize(small_net, policy="all", fuse="none")), argnums=(0, 1, 2, 3))(*NET_ARGS)
    want = jax.grad(loss(small_net), argnums=(0, 1, 2, 3))(*NET_ARGS)
    assert_close(got, want)
    got = jax.jit(jax.grad(loss(jaxcnn.optimize(small_net, policy="all", fuse="none")), argnums=1))(*NET_ARGS)
    assert_close(got, want[1])


def test_vmap():
    xs = jnp.stack([X, X * 0.5 + 1.0, -X])
    opt = jaxcnn.optimize(small_net, policy="all", fuse="none")
    got = jax.vmap(opt, in_axes=(0, None, None, None))(xs, *NET_ARGS[1:])
    want = jax.vmap(small_net, in_axes=(0, None, None, None))(xs, *NET_ARGS[1:])
    assert_close(got, want)


def test_cuda_lowering_has_jaxcnn_custom_calls():
    text = jax.jit(jaxcnn.optimize(small_net, policy="all", fuse="none")).trace(*NET_ARGS).lower(lowering_platforms=("cuda",)).as_text()
    targets = set(re.findall(r"jaxcnn_\w+_fwd", text))
    assert {"jaxcnn_conv2d_fwd", "jaxcnn_max_pool2d_fwd", "jaxcnn_softmax_fwd"} <= targets
    assert "stablehlo.convolution" not in text and "reduce_window" not in text


# -- API ---------------------------------------------------------------------------------------

def test_explain_policy_and_cache():
    opt = jaxcnn.optimize(small_net, example_args=NET_ARGS, policy="all", fuse="none")
    text = opt.explain()
    assert text.splitlines()[0] == "4 rewrite(s): 2 conv2d, 1 max_pool2d, 1 log_softmax"
    assert "x[2, 9, 9, 4] w(HWIO)[3, 3, 4, 8] +bias float32" in text and "-> [2, 9, 9, 8]" in text
    assert "-> jaxcnn.max_pool2d(x[2, 9, 9, 8]" in text and "-> [2, 4, 4, 8]" in text
    opt(*NET_ARGS)
    opt(*NET_ARGS)
    assert len(opt._cache) == 1  # one trace per signature
    opt(X[:1], *NET_ARGS[1:])
    assert len(opt._cache) == 2

    xla = jaxcnn.optimize(small_net, policy="xla")
    assert "no rewrite" in xla.explain(*NET_ARGS) and xla.rewrites(*NET_ARGS) == []
    assert_close(xla(*NET_ARGS), small_net(*NET_ARGS))

    seen = []
    def policy(site):
        seen.append(site)
        return "direct" if site.op == "conv2d" and site.w_shape[0] == 3 else "xla"
    chosen = jaxcnn.optimize(small_net, policy=policy, fuse="none")
    [r] = chosen.rewrites(*NET_ARGS)
    assert (r.op, r.algorithm) == ("conv2d", "direct")
    assert {s.op for s in seen} == {"conv2d", "max_pool2d", "log_softmax"}
    assert seen[0].logical_x_shape() == (2, 9, 9, 4)
    assert_close(chosen(*NET_ARGS), small_net(*NET_ARGS))


@pytest.mark.slow
def test_auto_policy_rewrites_only_what_pays():
    """policy="auto" (the default), no autotune measurement: depthwise convs and fp32
    precision="highest" convs of tensor-core shape become jaxcnn.conv2d; dense convs at default
    precision (cuDNN's speed or better on the H200), convs that would run on the CUDA-core
    direct kernel (NCHW, grouped, K off 16 bytes), pools and softmax stay XLA's. policy="all"
    rewrites all of them."""
    x = rand(3, (2, 9, 9, 8))
    hi = lax.Precision.HIGHEST
    def net(x):
        y = conv(x, rand(4, (3, 3, 8, 16)))                                   # dense, default: XLA
        y = conv(y, rand(5, (3, 3, 1, 16)), feature_group_count=16)           # depthwise
        y = conv(y, rand(14, (3, 3, 16, 16)), precision=hi)                   # fp32 HIGHEST: tensor core
        y = conv(y, rand(6, (3, 3, 8, 16)), feature_group_count=2, precision=hi)  # grouped: direct
        y = conv(y, rand(7, (1, 1, 16, 6)), precision=hi)                     # K=6: direct
        y = jax.lax.conv_general_dilated(jnp.transpose(y, (0, 3, 1, 2)), rand(8, (8, 6, 1, 1)), (1, 1),
                                         "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                         precision=hi)                        # NCHW
        y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        return jax.nn.softmax(y.reshape(2, -1))
    auto = jaxcnn.optimize(net, fuse="none")
    kept = [(r.op, r.w_shape, r.kwargs["precision"]) for r in auto.rewrites(x)]
    assert kept == [("conv2d", (3, 3, 1, 16), None), ("conv2d", (3, 3, 16, 16), "highest")], kept
    assert_close(auto(x), net(x))
    every = [r.op for r in jaxcnn.optimize(net, policy="all", fuse="none").rewrites(x)]
    assert every == ["conv2d"] * 6 + ["max_pool2d", "softmax"], every
    # The fp32 tensor-core rows are 16 bytes = 4 channels: K=12 runs there, K=6 does not.
    f32 = lambda x, w: conv(x, w, precision=hi)
    assert [r.op for r in jaxcnn.optimize(f32, fuse="none").rewrites(x, rand(9, (1, 1, 8, 12)))] == ["conv2d"]
    assert jaxcnn.optimize(f32, fuse="none").rewrites(x, rand(9, (1, 1, 8, 6))) == []
    # HIGH is fp32-accurate too (bf16x3 in XLA); DEFAULT and None are TF32: XLA's.
    high = lambda x, w: conv(x, w, precision=lax.Precision.HIGH)
    assert [r.kwargs["precision"] for r in jaxcnn.optimize(high, fuse="none").rewrites(x, rand(9, (1, 1, 8, 12)))] == ["highest"]
    default = lambda x, w: conv(x, w, precision=lax.Precision.DEFAULT)
    assert jaxcnn.optimize(default, fuse="none").rewrites(x, rand(9, (1, 1, 8, 12))) == []
    # An image's few channels (C < 8, C = 1 included: groups == C there too) stay XLA's.
    gray = rand(10, (2, 9, 9, 1))
    assert jaxcnn.optimize(f32, fuse="none").rewrites(gray, rand(11, (3, 3, 1, 16))) == []
    assert jaxcnn.optimize(f32, fuse="none").rewrites(rand(12, (2, 9, 9, 3)), rand(13, (3, 3, 3, 16))) == []


def _autotune_record(winner, times=None):
    """An autotune cache record measured on "Fake GPU" in which `winner` ran fastest."""
    times = dict(times or {"direct": 3.0, "xla": 2.0, "tensor_core": 1.0})
    times[winner] = 0.5
    return dict(op="conv2d", device="Fake GPU", candidates=[
        dict(layout="NHWC", algorithm=a, time_ms=t, source="measured") for a, t in times.items()],
        xla=dict(time_ms=times["xla"], measured=True))


def _fake_gpu(monkeypatch, tmp_path):
    """The layout autotuner reads its autotune cache (a fresh file) as on a GPU named "Fake GPU"."""
    monkeypatch.setenv(autotune_cache.CACHE_ENV, str(tmp_path / "autotune.json"))
    monkeypatch.setattr(measuring, "should_measure", lambda measure: True)
    monkeypatch.setattr(measuring, "device_kind", lambda: "Fake GPU")


def test_auto_policy_leaves_dense_16bit_convs_to_xla_unless_measured(tmp_path, monkeypatch):
    """Issue 9, never slower: our tensor-core conv ran at 0.84-0.91x of cuDNN on VGG layers
    (H200, bf16), so policy="auto" leaves a dense bf16 conv to XLA unless the autotune cache
    holds a measurement of that layer on this GPU in which a jaxcnn kernel beat XLA. fp32
    precision="highest" convs (3xTF32: 1.4-3.2x XLA's HIGHEST) and depthwise convs are still
    rewritten without one."""
    _fake_gpu(monkeypatch, tmp_path)
    x, w = rand(40, (2, 9, 9, 8), jnp.bfloat16), rand(41, (3, 3, 8, 16), jnp.bfloat16)
    fn = lambda x, w: jax.nn.relu(conv(x, w))
    assert jaxcnn.optimize(fn, fuse="none").rewrites(x, w) == []  # no cache entry: XLA's
    assert [r.op for r in jaxcnn.optimize(fn, policy="all", fuse="none").rewrites(x, w)] == ["conv2d"]
    layer = conv_layer((2, 9, 9, 8), (3, 3, 8, 16), "bfloat16", padding=((1, 1), (1, 1)), activation="relu",
                         bias=False)
    key = layer_autotune.conv_key("Fake GPU", layer)
    autotune_cache.AutotuneCache().put(key, _autotune_record("xla"))
    assert jaxcnn.optimize(fn, fuse="none").rewrites(x, w) == []  # measured: XLA's conv won
    autotune_cache.AutotuneCache().put(key, _autotune_record("tensor_core"))
    [r] = jaxcnn.optimize(fn, fuse="none").rewrites(x, w)  # measured: our tensor-core conv won
    assert (r.op, r.algorithm, r.dtype) == ("conv2d", "tensor_core", "bfloat16")
    assert_close(jaxcnn.optimize(fn, fuse="none")(x, w), fn(x, w), jnp.bfloat16)
    # fp16 alike; another layer (no record) stays XLA's.
    assert jaxcnn.optimize(fn, fuse="none").rewrites(x.astype(jnp.float16), w.astype(jnp.float16)) == []
    assert jaxcnn.optimize(fn, fuse="none").rewrites(x, rand(42, (3, 3, 8, 24), jnp.bfloat16)) == []

    # Without a record: fp32 at precision="highest" takes the tensor-core kernel, fp32 at the
    # default (TF32) precision stays XLA's, depthwise convs take the depthwise kernel.
    x32, w32 = x.astype(jnp.float32), w.astype(jnp.float32)
    highest = lambda x, w: conv(x, w, precision=lax.Precision.HIGHEST)
    [r] = jaxcnn.optimize(highest, fuse="none").rewrites(x32, w32)
    assert (r.op, r.kwargs["precision"], r.algorithm) == ("conv2d", "highest", "auto")
    assert jaxcnn.optimize(lambda x, w: conv(x, w), fuse="none").rewrites(x32, w32) == []
    depthwise = lambda x, w: conv(x, w, feature_group_count=8)
    for dtype in (jnp.bfloat16, jnp.float32):
        [r] = jaxcnn.optimize(depthwise, fuse="none").rewrites(x.astype(dtype), rand(43, (3, 3, 1, 8), dtype))
        assert (r.op, r.kwargs["groups"]) == ("conv2d", 8)


def test_auto_policy_takes_the_autotuners_cached_measurement(tmp_path, monkeypatch):
    """Where the autotune cache holds a conv measured on this GPU, policy="auto" takes that
    winner (XLA's conv included) instead of its rule; off the GPU the cache is not read."""
    monkeypatch.setenv(autotune_cache.CACHE_ENV, str(tmp_path / "autotune.json"))
    x, w = rand(30, (2, 9, 9, 8)), rand(31, (3, 3, 8, 16))
    fn = lambda x, w: conv(x, w, precision=lax.Precision.HIGHEST)
    assert [r.algorithm for r in jaxcnn.optimize(fn, fuse="none").rewrites(x, w)] == ["auto"]  # the rule: tensor cores

    layer = conv_layer((2, 9, 9, 8), (3, 3, 8, 16), "float32", padding=((1, 1), (1, 1)), precision="highest",
                         bias=False)
    key = layer_autotune.conv_key("Fake GPU", layer)
    autotune_cache.AutotuneCache().put(key, _autotune_record("xla"))
    assert [r.algorithm for r in jaxcnn.optimize(fn, fuse="none").rewrites(x, w)] == ["auto"]  # CPU: not read
    _fake_gpu(monkeypatch, tmp_path)
    assert jaxcnn.optimize(fn, fuse="none").rewrites(x, w) == []  # measured: XLA's conv won
    autotune_cache.AutotuneCache().put(key, _autotune_record("direct"))
    assert [r.algorithm for r in jaxcnn.optimize(fn, fuse="none").rewrites(x, w)] == ["direct"]
    other = rand(32, (3, 3, 8, 24))  # no record for this layer: the rule again
    assert [r.algorithm for r in jaxcnn.optimize(fn, fuse="none").rewrites(x, other)] == ["auto"]


def test_sparse_auto_picks_from_measured_crossovers(tmp_path, monkeypatch):
    """sparse="auto": each NHWC conv's input zeros are measured on the concrete arguments, and
    the layer's stored crossover decides; no record -> dense. A record saying sparse wins at
    that sparsity makes the conv a sparse_conv2d with the same values."""
    from jaxcnn.tuning import sparse_dispatch as sd

    monkeypatch.setenv(sd.CACHE_ENV, str(tmp_path / "crossover.json"))
    x, w1, w2 = rand(20, (2, 9, 9, 8)), rand(21, (3, 3, 8, 16)), rand(22, (3, 3, 16, 8))
    def net(x, w1, w2):
        return conv(jax.nn.relu(conv(x, w1)), w2)     # conv2 reads a ReLU output: ~half zeros
    dense = jaxcnn.optimize(net, example_args=(x, w1, w2), policy="all", sparse="auto", fuse="none")
    assert [r.algorithm for r in dense.rewrites()] == ["auto", "auto"]
    text = dense.explain()
    assert "dense or sparse (2 conv(s)" in text and "no crossover measured" in text
    assert "jaxcnn_sparse" not in str(jax.make_jaxpr(dense)(x, w1, w2))

    zeros = float(jnp.mean(jax.nn.relu(conv(x, w1)) == 0))
    assert 0.3 < zeros < 0.7
    key = sd.layer_key((2, 9, 9, 16), (3, 3, 16, 8), "float32", stride=(1, 1), padding=((1, 1), (1, 1)),
                       precision="default")
    # Measured: sparse 0.01 ms at any sparsity vs dense 1 ms (a made-up record for the test).
    sd.CrossoverTable().put(sd.Crossover(sd.device_kind(), key, (0.0, 1.0), (0.01, 0.01), 1.0, "xla"))
    picked = jaxcnn.optimize(net, example_args=(x, w1, w2), policy="all", sparse="auto", fuse="none")
    assert [r.algorithm for r in picked.rewrites()] == ["auto", "sparse"]
    assert f"sparse_conv2d at {zeros:.1%} zeros" in picked.explain()
    assert "jaxcnn_sparse" in str(jax.make_jaxpr(picked)(x, w1, w2))
    assert_close(jax.jit(picked)(x, w1, w2), net(x, w1, w2))
    # policy="auto" leaves both (dense fp32, default precision) convs to XLA, but a measured
    # sparse pick still runs: conv2 only.
    auto = jaxcnn.optimize(net, example_args=(x, w1, w2), sparse="auto", fuse="none")
    assert [(r.algorithm, r.w_shape) for r in auto.rewrites()] == [("sparse", (3, 3, 16, 8))]
    assert "dense or sparse (2 conv(s)" in auto.explain()
    assert_close(jax.jit(auto)(x, w1, w2), net(x, w1, w2))
    # Zeros are measured on concrete values: under jit with no example_args there are none.
    with pytest.raises(ValueError, match="concrete"):
        jax.jit(jaxcnn.optimize(net, policy="all", sparse="auto", fuse="none"))(x, w1, w2)
    with pytest.raises(ValueError, match="sparse must be one of"):
        jaxcnn.optimize(net, sparse="yes", fuse="none")


def test_bad_arguments():
    with pytest.raises(ValueError, match="policy"):
        jaxcnn.optimize(small_net, policy="fast", fuse="none")
    with pytest.raises(TypeError, match="fn"):
        jaxcnn.optimize(3, policy="all", fuse="none")
    with pytest.raises(TypeError, match="example_args"):
        jaxcnn.optimize(small_net, example_args=X, policy="all", fuse="none")
    with pytest.raises(ValueError, match="args"):
        jaxcnn.optimize(small_net, policy="all", fuse="none").explain()
    with pytest.raises(ValueError, match="policy returned"):
        jaxcnn.optimize(small_net, policy=lambda s: "fastest", fuse="none").rewrites(*NET_ARGS)


def test_module_is_callable_after_submodule_import():
    import jaxcnn.optimize.rewrite  # binds the module to jaxcnn.optimize
    assert jaxcnn.optimize(small_net, policy="all", fuse="none").rewrites(*NET_ARGS)


# -- zoo -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, size", [("lenet5", 32), ("squeezenet1_1", 64)])
def test_zoo_models(name, size):
    spec = get_model(name)
    params = spec.init(0)
    x = rand(17, (2, size, size, spec.channels))
    fn = lambda p, x: spec.apply(p, x, backend="xla")
    opt = jaxcnn.optimize(fn, policy="all", fuse="none")
    found = [r.op for r in opt.rewrites(params, x)]
    layers = [layer.op for layer in spec.layers(2)]
    assert found.count("conv2d") == layers.count("conv2d") > 0
    assert found.count("max_pool2d") == layers.count("maxpool")
    assert found.count("avg_pool2d") == layers.count("avgpool") > 0
    assert_close(jax.jit(opt)(params, x), fn(params, x))


# -- random conv shapes --------------------------------------------------------------------------

@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 2), hw=st.integers(5, 11), c=st.sampled_from([1, 3, 4]), k=st.integers(1, 6),
       r=st.integers(1, 3), stride=st.integers(1, 3), dilation=st.integers(1, 2),
       padding=st.sampled_from(["SAME", "VALID", ((1, 0), (2, 1))]), bias=st.booleans(), relu=st.booleans(),
       layout=st.sampled_from(["NHWC", "NCHW"]), seed=st.integers(0, 2**16))
def test_random_convs(n, hw, c, k, r, stride, dilation, padding, bias, relu, layout, seed):
    x = rand(seed, (n, hw, hw, c) if layout == "NHWC" else (n, c, hw, hw))
    w = rand(seed + 1, (r, r, c, k))
    b = rand(seed + 2, (k,))
    axis = layout.index("C")

    def fn(x, w, b):
        y = lax.conv_general_dilated(x, w, (stride, stride), padding, rhs_dilation=(dilation, dilation),
                                     dimension_numbers=(layout, "HWIO", layout))
        if bias:
            y = y + jnp.expand_dims(b, [a for a in range(4) if a != axis])
        return jax.nn.relu(y) if relu else y

    opt = jaxcnn.optimize(fn, policy="all", fuse="none")
    [rw] = opt.rewrites(x, w, b)
    assert (rw.bias, rw.kwargs["activation"], rw.layout) == (bias, "relu" if relu else None, layout)
    assert_close(opt(x, w, b), fn(x, w, b))


def test_the_callable_module_forwards_every_keyword():
    """`jaxcnn.optimize` is the module once a submodule was imported: its __call__ must take
    every keyword the function takes (fuse included)."""
    import jaxcnn.optimize as module

    with pytest.raises(ValueError, match="fuse must be one of"):
        module(lambda x: x, fuse="everything")
    with pytest.raises(ValueError, match="policy must be one of"):
        module(lambda x: x, policy="fastest")


def test_sparse_auto_leaves_convs_whose_epilogue_it_cannot_run(tmp_path, monkeypatch):
    """sparse_conv2d takes a bias and ReLU only: a conv with BatchNorm folded into it (or a
    residual) is never handed to it, whatever the crossover says; the result is fn's."""
    from jaxcnn.tuning import sparse_dispatch as sd

    monkeypatch.setenv(sd.CACHE_ENV, str(tmp_path / "crossover.json"))
    x, w1, w2 = rand(30, (2, 9, 9, 8)), rand(31, (3, 3, 8, 16)), rand(32, (3, 3, 16, 8))
    s, t = jnp.linspace(0.5, 1.5, 8), jnp.linspace(-1.0, 1.0, 8)

    def net(x, w1, w2):
        return jax.nn.relu(conv(jax.nn.relu(conv(x, w1)), w2) * s + t)  # conv2: a BatchNorm-like affine
    key = sd.layer_key((2, 9, 9, 16), (3, 3, 16, 8), "float32", stride=(1, 1), padding=((1, 1), (1, 1)),
                       precision="default")
    sd.CrossoverTable().put(sd.Crossover(sd.device_kind(), key, (0.0, 1.0), (0.01, 0.01), 1.0, "xla"))
    opt = jaxcnn.optimize(net, example_args=(x, w1, w2), policy="all", sparse="auto", fuse="none")
    assert "sparse" not in [r.algorithm for r in opt.rewrites()]
    np.testing.assert_allclose(opt(x, w1, w2), net(x, w1, w2), rtol=1e-4, atol=1e-4)
