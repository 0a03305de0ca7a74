"""jaxcnn.optimize on models written with Flax (linen, nnx) and Equinox layers: every conv,
pool and softmax they trace to is rewritten (bias and ReLU fused), the optimized model computes
what the original does (values, jit, grad, vmap), unrecognised ops stay lax. CPU: the jaxcnn
primitives run their lax references here."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxcnn

flax = pytest.importorskip("flax")
eqx = pytest.importorskip("equinox")
import flax.linen as nn  # noqa: E402
from flax import nnx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import thirdparty_models as tm  # noqa: E402

# Whole Flax/Equinox models traced, rewritten and compiled: `make test` leaves them to CI
# (tests/models/test_flax_modules.py keeps jaxcnn.flax in the fast set).
pytestmark = pytest.mark.slow

TOL = {jnp.float32: dict(rtol=2e-4, atol=2e-5), jnp.bfloat16: dict(rtol=5e-2, atol=2e-2)}
# Small heads and images keep the CPU compile short; the layer structure is the real one.
SMALL = {
    "linen_squeezenet1_1": dict(hw=48, num_classes=10),
    "linen_vgg19": dict(hw=32, num_classes=10, hidden=16),
    "nnx_squeezenet1_1": dict(hw=48, num_classes=10),
    "nnx_vgg19": dict(hw=32, num_classes=10, hidden=16),
    "equinox_squeezenet1_1": dict(hw=48, num_classes=10),
    "linen_googlenet_head": dict(hw=64, num_classes=10),
}
# name: (convs, of them with bias + ReLU fused, max pools, avg pools, softmax op)
EXPECTED = {
    "linen_squeezenet1_1": (26, 26, 3, 1, "softmax"),
    "linen_vgg19": (16, 16, 5, 0, "softmax"),
    "linen_lenet": (2, 2, 0, 2, "log_softmax"),
    "linen_resnet_small": (6, 1, 1, 0, "softmax"),
    "linen_googlenet_head": (21, 21, 6, 0, "softmax"),  # 3 stem convs + 3 blocks of 6; jnp.mean is no pool  # block convs have no bias; ReLUs after the residual add stay
    "nnx_squeezenet1_1": (26, 26, 3, 1, "softmax"),
    "nnx_vgg19": (16, 16, 5, 0, "softmax"),
    "nnx_cnn": (2, 2, 0, 2, "log_softmax"),
    "equinox_squeezenet1_1": (26, 26, 3, 1, "softmax"),
    "equinox_cnn": (2, 1, 1, 0, "log_softmax"),  # conv -> pool -> relu: the first ReLU is not the conv's
}


def build(name, batch=2, dtype=jnp.float32):
    return tm.build(name, batch=batch, dtype=dtype, **SMALL.get(name, {}))


def assert_close(got, want, dtype=jnp.float32):
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves) > 0
    for g, w in zip(got_leaves, want_leaves):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), **TOL[dtype])


def assert_grads_and_vmap_match(fast, m, loss=lambda y: jnp.sum(y ** 2)):
    """The optimized model's parameter grads of loss(model(params, x)) and its vmap
    over a stack of two batches equal the original's."""
    grad = lambda f: jax.grad(lambda p, x: loss(f(p, x)))(m.params, m.x)  # noqa: E731
    jax.tree.map(lambda a, b: assert_close(a, b), grad(fast), grad(m.apply))
    xs = jnp.stack([m.x, m.x * 0.5])
    assert_close(jax.vmap(fast, in_axes=(None, 0))(m.params, xs), jax.vmap(m.apply, in_axes=(None, 0))(m.params, xs))


def count_in_jaxpr(fn, *args, name):
    return str(jax.make_jaxpr(fn)(*args)).count(f"{name}[")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_op_rewritten_and_values_equal(name):
    m = build(name)
    opt = jaxcnn.optimize(m.apply, policy="all", fuse="none")
    rewrites = opt.rewrites(m.params, m.x)
    convs, fused, max_pools, avg_pools, softmax = EXPECTED[name]
    ops = [r.op for r in rewrites]
    assert ops.count("conv2d") == convs == count_in_jaxpr(m.apply, m.params, m.x, name="conv_general_dilated")
    assert sum(r.bias and r.kwargs["activation"] == "relu" for r in rewrites) == fused
    assert ops.count("max_pool2d") == max_pools and ops.count("avg_pool2d") == avg_pools
    assert ops.count(softmax) == 1 and len(ops) == convs + max_pools + avg_pools + 1
    assert {r.layout for r in rewrites if r.op != softmax} == {m.layout}
    text = opt.explain(m.params, m.x)
    assert text.splitlines()[0].startswith(f"{len(ops)} rewrite(s)") and len(text.splitlines()) == len(ops) + 1
    assert_close(jax.jit(opt)(m.params, m.x), jax.jit(m.apply)(m.params, m.x))


@pytest.mark.parametrize("name", ["linen_squeezenet1_1", "nnx_vgg19", "equinox_squeezenet1_1"])
def test_bf16(name):
    m = build(name, dtype=jnp.bfloat16)
    opt = jaxcnn.optimize(m.apply, policy="all", fuse="none")
    rewrites = opt.rewrites(m.params, m.x)
    convs, fused, max_pools, avg_pools, _ = EXPECTED[name]
    assert len(rewrites) == convs + max_pools + avg_pools + 1
    assert sum(r.bias and r.kwargs["activation"] == "relu" for r in rewrites) == fused
    assert {r.dtype for r in rewrites} == {"bfloat16"}
    assert_close(jax.jit(opt)(m.params, m.x), jax.jit(m.apply)(m.params, m.x), jnp.bfloat16)


@pytest.mark.parametrize("name", ["linen_lenet", "linen_resnet_small", "nnx_cnn", "equinox_cnn"])
def test_grad(name):
    m = build(name)
    weights = jnp.cos(jnp.arange(10.0))

    def loss(apply):
        return lambda params, x: jnp.sum(apply(params, x) * weights)

    got = jax.jit(jax.grad(loss(jaxcnn.optimize(m.apply, policy="all", fuse="none")), argnums=(0, 1)))(m.params, m.x)
    want = jax.grad(loss(m.apply), argnums=(0, 1))(m.params, m.x)
    assert_close(got, want)


@pytest.mark.parametrize("name", ["linen_lenet", "equinox_cnn"])
def test_vmap(name):
    m = build(name)
    xs = jnp.stack([m.x, -m.x, 0.5 * m.x + 1.0])
    got = jax.jit(jax.vmap(jaxcnn.optimize(m.apply, policy="all", fuse="none"), in_axes=(None, 0)))(m.params, xs)
    want = jax.vmap(m.apply, in_axes=(None, 0))(m.params, xs)
    assert_close(got, want)


def test_nnx_module_called_directly_and_under_nnx_jit():
    m = build("nnx_cnn")
    model = m.module
    want = model(m.x)
    # The module itself (its parameters become constants of the trace) ...
    direct = jaxcnn.optimize(model, policy="all", fuse="none")
    assert [r.op for r in direct.rewrites(m.x)].count("conv2d") == 2
    assert_close(direct(m.x), want)

    # ... and an nnx.jit step taking the module (its body is a pjit sub-jaxpr).
    @nnx.jit
    def predict(model, x):
        return model(x)

    opt = jaxcnn.optimize(predict, policy="all", fuse="none")
    rewrites = opt.rewrites(model, m.x)
    assert [r.op for r in rewrites] == ["conv2d", "avg_pool2d", "conv2d", "avg_pool2d", "log_softmax"]
    assert all(r.path.startswith("jit") for r in rewrites)
    assert_close(opt(model, m.x), want)


def test_unrecognised_layers_stay_lax():
    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.ConvTranspose(4, (3, 3), strides=(2, 2))(x)  # lhs-dilated conv: stays lax
            x = nn.relu(nn.Conv(6, (3, 3), kernel_dilation=2)(x))
            return nn.max_pool(x, (2, 2), strides=(1, 1), padding="SAME") + nn.avg_pool(x, (3, 3), padding=((1, 1), (1, 1)),
                                                                                         count_include_pad=False)

    x = jax.random.normal(jax.random.PRNGKey(0), (2, 7, 7, 3))
    module = Decoder()
    params = module.init(jax.random.PRNGKey(1), x)
    opt = jaxcnn.optimize(module.apply, policy="all", fuse="none")
    rewrites = opt.rewrites(params, x)
    # ConvTranspose and the count_include_pad=False average (sum / per-tap counts) stay lax.
    assert [r.op for r in rewrites] == ["conv2d", "max_pool2d"]
    assert rewrites[0].kwargs["dilation"] == (2, 2) and rewrites[0].bias
    assert_close(opt(params, x), module.apply(params, x))


# -- random single layers -----------------------------------------------------------------------

@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.sampled_from([1, 2, 3, 5]), stride=st.integers(1, 2), padding=st.sampled_from(["SAME", "VALID", 1, ((2, 0), (1, 1))]),
       groups=st.sampled_from([1, 2]), bias=st.booleans(), relu=st.booleans(), seed=st.integers(0, 2**16))
def test_random_linen_conv(k, stride, padding, groups, bias, relu, seed):
    layer = nn.Conv(6, (k, k), strides=stride, padding=padding, feature_group_count=groups, use_bias=bias)
    x = jax.random.normal(jax.random.PRNGKey(seed), (2, 9, 8, 4))
    params = layer.init(jax.random.PRNGKey(seed + 1), x)
    if bias:  # Flax initialises biases to zero: make a dropped bias show
        params = jax.tree.map(lambda p: p + 0.5 if p.ndim == 1 else p, params)
    fn = (lambda p, x: nn.relu(layer.apply(p, x))) if relu else layer.apply
    opt = jaxcnn.optimize(fn, policy="all", fuse="none")
    [r] = opt.rewrites(params, x)
    assert (r.bias, r.kwargs["activation"], r.kwargs["groups"], r.layout) == (bias, "relu" if relu else None, groups, "NHWC")
    assert_close(opt(params, x), fn(params, x))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.sampled_from([1, 3]), stride=st.integers(1, 2), padding=st.integers(0, 2), bias=st.booleans(),
       relu=st.booleans(), pool=st.sampled_from(["max", "avg"]), window=st.integers(2, 3), seed=st.integers(0, 2**16))
def test_random_equinox_conv_and_pool(k, stride, padding, bias, relu, pool, window, seed):
    kx, kw = jax.random.split(jax.random.PRNGKey(seed))
    conv = eqx.nn.Conv2d(3, 5, k, stride=stride, padding=padding, use_bias=bias, key=kw)
    pool_layer = (eqx.nn.MaxPool2d if pool == "max" else eqx.nn.AvgPool2d)(window, stride=1)

    def one(x):
        y = conv(x)
        return pool_layer(jax.nn.relu(y) if relu else y)

    fn = jax.vmap(one)
    x = jax.random.normal(kx, (2, 3, 8, 7))
    opt = jaxcnn.optimize(fn, policy="all", fuse="none")
    [c, p] = opt.rewrites(x)
    assert (c.op, c.bias, c.kwargs["activation"], c.layout) == ("conv2d", bias, "relu" if relu else None, "NCHW")
    assert (p.op, p.layout, p.kwargs["window"]) == (f"{pool}_pool2d", "NCHW", (window, window))
    assert_close(opt(x), fn(x))


def test_autotune_policy_keeps_xla_where_it_wins():
    # policy="autotune": jaxcnn.layouts' choice per conv (model estimates on CPU); a conv whose
    # winner is XLA's stays lax, the rest run the chosen kernel; pools and softmax stay XLA's
    # as under policy="auto" (the H200 measured them no faster as custom calls).
    m = build("equinox_cnn")
    opt = jaxcnn.optimize(m.apply, policy="autotune", fuse="none")
    rewrites = opt.rewrites(m.params, m.x)
    convs = [r for r in rewrites if r.op == "conv2d"]
    assert all(r.algorithm in ("direct", "tensor_core", "depthwise") for r in convs)
    assert [r.op for r in rewrites if r.op != "conv2d"] == []
    assert_close(opt(m.params, m.x), m.apply(m.params, m.x))


@pytest.mark.parametrize("name", ["linen_squeezenet1_1", "nnx_squeezenet1_1", "equinox_squeezenet1_1"])
def test_fuse_all_turns_every_fire_module_into_one_fused_call(name):
    """Equinox's model is NCHW, one example per call under vmap: its convs reach each other
    through unit reshapes and its pools through transposes; it fuses all the same."""
    m = build(name)
    fast = jaxcnn.optimize(m.apply, fuse="all", policy="all")
    assert count_in_jaxpr(fast, m.params, m.x, name="jaxcnn_fire") == 8  # SqueezeNet 1.1's fires
    # Outside the fires: conv1 + ReLU + its 3x3/2 max pool become one conv2d_pool, the
    # classifier conv stays a conv2d call.
    assert count_in_jaxpr(fast, m.params, m.x, name="jaxcnn_conv2d_pool") == 1
    assert count_in_jaxpr(fast, m.params, m.x, name="jaxcnn_conv2d") == 1
    assert_close(jax.jit(fast)(m.params, m.x), jax.jit(m.apply)(m.params, m.x))
    assert "fire" in fast.explain(m.params, m.x)
    unfused = jaxcnn.optimize(m.apply, policy="all", fuse="none")  # fuse="none": the same model, no fire calls
    assert count_in_jaxpr(unfused, m.params, m.x, name="jaxcnn_fire") == 0


def test_fuse_turns_conv_relu_max_pool_into_conv2d_pool():
    """fuse= also takes an NHWC conv + bias + ReLU read only by a max pool (Flax's VGG stages):
    one conv2d_pool each; values, grads and vmap as the original. A conv the pool does not read
    alone stays out."""
    m = build("linen_vgg19")
    fast = jaxcnn.optimize(m.apply, fuse="all", policy="all")
    assert count_in_jaxpr(fast, m.params, m.x, name="jaxcnn_conv2d_pool") == 5  # one per VGG stage
    assert count_in_jaxpr(fast, m.params, m.x, name="jaxcnn_max_pool2d") == 0
    assert [g.kind for g, fused, _ in fast.decisions(m.params, m.x)] == ["conv_pool"] * 5
    assert_close(jax.jit(fast)(m.params, m.x), jax.jit(m.apply)(m.params, m.x))
    assert_grads_and_vmap_match(fast, m)
    # Off the GPU "auto" decides with the cost model; "none" and kinds=("fire",) fuse nothing here.
    assert count_in_jaxpr(jaxcnn.optimize(m.apply, fuse="none"), m.params, m.x, name="jaxcnn_conv2d_pool") == 0
    only_fire = jaxcnn.optimize.optimize_fused(m.apply, groups="all", kinds=("fire",))
    assert count_in_jaxpr(only_fire, m.params, m.x, name="jaxcnn_conv2d_pool") == 0
    with pytest.raises(ValueError, match="kinds"):
        jaxcnn.optimize.optimize_fused(m.apply, kinds=("conv_pool", "residual"))

    def two_readers(x, w):  # the conv's output is also returned: no conv2d_pool
        y = jax.nn.relu(jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
        return y, jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    x, w = jnp.ones((1, 8, 8, 8)), jnp.ones((3, 3, 8, 8))
    assert jaxcnn.optimize.optimize_fused(two_readers, groups="all").decisions(x, w) == []


def test_fuse_takes_a_stem_conv_the_policy_leaves_to_xla():
    """policy="auto" leaves dense convs at default precision to XLA without a measured win (the
    C=3 stem: cuDNN's first-layer kernels beat our plain tensor-core conv), but fused with its
    max pool the stem is conv2d_pool's flat-K kernel, which beat XLA's conv + pool on the H200,
    and the fire modules are one jaxcnn.fire each: fuse= still offers those groups (the
    planner decides)."""
    m = build("linen_squeezenet1_1")
    plain = jaxcnn.optimize(m.apply, fuse="none")
    assert plain.rewrites(m.params, m.x) == []  # no depthwise or fp32-HIGHEST conv here
    fast = jaxcnn.optimize(m.apply, fuse="all")
    kinds = [g.kind for g, fused, _ in fast.decisions(m.params, m.x)]
    assert kinds.count("conv_pool") == 1 and kinds.count("fire") == 8
    assert count_in_jaxpr(fast, m.params, m.x, name="jaxcnn_conv2d_pool") == 1
    assert_close(jax.jit(fast)(m.params, m.x), jax.jit(m.apply)(m.params, m.x))


def test_nchw_fire_runs_channels_last_between_transposes():
    """An NCHW fire is the NHWC kernel between two transposes; the fused model's values, grads
    and vmap are the original's, and a squeeze read by anything besides the expands (here
    through one of the unit reshapes) leaves the group alone."""
    m = build("equinox_squeezenet1_1")
    fast = jaxcnn.optimize(m.apply, fuse="all")
    groups = fast.decisions(m.params, m.x)
    assert [g.attrs["layout"] for g, _, _ in groups] == ["NCHW"] * 9
    fire = next(g for g, _, _ in groups if g.kind == "fire")
    assert fire.x_shape[3] == 64 and fire.y_shape[3] == 128  # NHWC, as the kernels see it
    # The 25 OIHW weights go to HWIO in one op ahead of the groups, not in 25 transposes.
    assert count_in_jaxpr(fast, m.params, m.x, name="jaxcnn_weight_relayout") == 1
    assert "transpose[permutation=(2, 3, 1, 0)]" not in str(jax.make_jaxpr(fast)(m.params, m.x))
    assert_grads_and_vmap_match(fast, m)

    def fire_nchw(x, ws, view_also_returned):
        def conv(v, w, pad):
            y = jax.lax.conv_general_dilated(v[None].reshape(v.shape), w, (1, 1), [(pad, pad)] * 2)
            return jax.nn.relu(y)
        s = conv(x, ws[0], 0)
        view = s[:, None].reshape(s.shape)  # a unit reshape of the squeeze, as Equinox's are
        y = jnp.concatenate([conv(view, ws[1], 0), conv(s, ws[2], 1)], axis=1)
        return (y, view) if view_also_returned else y

    x = jax.random.normal(jax.random.PRNGKey(1), (2, 8, 9, 7))
    ws = [jax.random.normal(k, shape) for k, shape in zip(jax.random.split(jax.random.PRNGKey(2), 3),
                                                          [(4, 8, 1, 1), (6, 4, 1, 1), (6, 4, 3, 3)])]
    one = jaxcnn.optimize.optimize_fused(lambda x, ws: fire_nchw(x, ws, False), groups="all")
    assert [g.kind for g, _, _ in one.decisions(x, ws)] == ["fire"]
    assert_close(one(x, ws), fire_nchw(x, ws, False))
    both = jaxcnn.optimize.optimize_fused(lambda x, ws: fire_nchw(x, ws, True), groups="all")
    assert both.decisions(x, ws) == []


def test_fuse_all_turns_every_inception_block_into_one_call():
    """GoogLeNet's blocks written with Flax layers: one jaxcnn.inception each (the stem convs
    with their pools: conv2d_pool); values, grads and vmap as the original."""
    m = build("linen_googlenet_head")
    fast = jaxcnn.optimize(m.apply, fuse="all")
    assert [g.kind for g, _, _ in fast.decisions(m.params, m.x)].count("inception") == 3
    assert count_in_jaxpr(fast, m.params, m.x, name="jaxcnn_inception") == 3
    assert count_in_jaxpr(fast, m.params, m.x, name="jaxcnn_conv2d_pool") == 2
    assert_close(jax.jit(fast)(m.params, m.x), jax.jit(m.apply)(m.params, m.x))
    assert_grads_and_vmap_match(fast, m, loss=lambda y: jnp.sum(jnp.log(y + 1e-3)))
    only_fire = jaxcnn.optimize.optimize_fused(m.apply, groups="all", kinds=("fire",))
    assert count_in_jaxpr(only_fire, m.params, m.x, name="jaxcnn_inception") == 0


def _lax_inception(x, ws, layout, leak=False):
    """An inception block in raw lax, in `layout` with OIHW weights; leak=True also returns the
    3x3 branch's reduce output (then the block is not fusable)."""
    dn = (layout, "OIHW", layout)
    c = layout.index("C")

    def conv(v, w):
        pad = w.shape[2] // 2
        return jax.nn.relu(jax.lax.conv_general_dilated(v, w, (1, 1), [(pad, pad)] * 2, dimension_numbers=dn))

    window = tuple(3 if d in "HW" else 1 for d in layout)
    pooled = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, window, (1,) * 4,
                                   [(1, 1) if d in "HW" else (0, 0) for d in layout])
    r3 = conv(x, ws[1])
    y = jnp.concatenate([conv(x, ws[0]), conv(r3, ws[2]), conv(conv(x, ws[3]), ws[4]), conv(pooled, ws[5])], axis=c)
    return (y, r3) if leak else y


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_inception_in_raw_lax_any_layout_and_a_leaking_branch(layout):
    shapes = [(6, 5, 1, 1), (4, 5, 1, 1), (7, 4, 3, 3), (3, 5, 1, 1), (2, 3, 5, 5), (4, 5, 1, 1)]  # OIHW
    ws = [jax.random.normal(k, s) for k, s in zip(jax.random.split(jax.random.PRNGKey(3), 6), shapes)]
    x = jax.random.normal(jax.random.PRNGKey(4), (2, 5, 9, 7) if layout == "NCHW" else (2, 9, 7, 5))
    fast = jaxcnn.optimize.optimize_fused(lambda x, ws: _lax_inception(x, ws, layout), groups="all")
    assert [g.kind for g, _, _ in fast.decisions(x, ws)] == ["inception"]
    assert count_in_jaxpr(fast, x, ws, name="jaxcnn_weight_relayout") == 1  # OIHW -> HWIO, once
    assert_close(fast(x, ws), _lax_inception(x, ws, layout))
    leaky = jaxcnn.optimize.optimize_fused(lambda x, ws: _lax_inception(x, ws, layout, leak=True), groups="all")
    assert leaky.decisions(x, ws) == []


def test_fuse_rejects_unknown_values():
    with pytest.raises(ValueError, match="fuse must be one of"):
        jaxcnn.optimize(lambda x: x, fuse="everything")
