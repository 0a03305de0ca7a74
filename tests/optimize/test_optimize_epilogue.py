"""optimize() reads what follows a conv as its epilogue: inference BatchNorm (as Flax linen,
nnx, Equinox, Keras and hand-written code trace it) folded into the weights, residual adds and
activations in any form; training-mode BatchNorm stays as traced."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxcnn
from jaxcnn._native import library
from jaxcnn.optimize import patterns
from reference64 import rel_err

RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.normal(size=(2, 8, 8, 6)), jnp.float32)
W = jnp.asarray(RNG.normal(size=(3, 3, 6, 8)) / 4, jnp.float32)
R = jnp.asarray(RNG.normal(size=(2, 8, 8, 8)), jnp.float32)
VECS = [jnp.asarray(RNG.uniform(0.5, 1.5, 8), jnp.float32) for _ in range(4)]


def conv(x, w, layout="NHWC"):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=(layout, "HWIO", layout))


def conv_rewrites(fn, *args):
    return [r for r in jaxcnn.optimize(fn, policy="all").rewrites(*args) if r.op == "conv2d"]


def assert_same(fn, *args, tol=1e-5):
    opt = jaxcnn.optimize(fn, policy="all")
    want = np.asarray(jax.jit(fn)(*args), np.float64)
    got = jax.jit(opt)(*args)
    assert rel_err(got, want) < tol
    return opt


# -- hand-written BatchNorm forms --------------------------------------------------------------

BN_FORMS = {
    "textbook": lambda y, m, v, g, b: (y - m) / jnp.sqrt(v + 1e-5) * g + b,
    "rsqrt_first": lambda y, m, v, g, b: (y - m) * (lax.rsqrt(v + 1e-3) * g) + b,
    "keras": lambda y, m, v, g, b: y * (lax.rsqrt(v + 1e-3) * g) + (b - m * lax.rsqrt(v + 1e-3) * g),
    "reversed_operands": lambda y, m, v, g, b: b + g * ((y - m) * lax.rsqrt(v + 1e-5)),
    "negated": lambda y, m, v, g, b: -(m - y) * g / jnp.sqrt(v) + b,
}


@pytest.mark.parametrize("form", list(BN_FORMS))
@pytest.mark.parametrize("act", ["relu", "relu6", "silu"])
def test_batchnorm_forms_fold_into_one_conv(form, act):
    def fn(x, w, m, v, g, b):
        return getattr(jax.nn, act)(BN_FORMS[form](conv(x, w), m, v, g, b))

    args = (X, W, *VECS)
    rewrites = conv_rewrites(fn, *args)
    assert len(rewrites) == 1 and rewrites[0].kwargs["activation"] == act
    assert any("per-channel" in step for step in rewrites[0].replaced)
    assert_same(fn, *args)


def test_residual_then_activation_and_gradients():
    def fn(x, w, m, v, g, b, r):
        return jax.nn.silu(BN_FORMS["textbook"](conv(x, w), m, v, g, b) + r)

    args = (X, W, *VECS, R)
    (rw,) = conv_rewrites(fn, *args)
    assert "add(residual)" in rw.replaced
    opt = assert_same(fn, *args)
    loss = lambda f: lambda *a: jnp.sum(jnp.cos(f(*a)))  # noqa: E731
    g1 = jax.grad(loss(fn), argnums=tuple(range(7)))(*args)
    g2 = jax.grad(loss(opt), argnums=tuple(range(7)))(*args)
    for a, e in zip(g2, g1):
        assert rel_err(a, np.asarray(e, np.float64)) < 1e-4


def test_training_batchnorm_is_not_folded():
    """Batch statistics are computed from the conv's own output: nothing to fold."""
    def fn(x, w, g, b):
        y = conv(x, w)
        m = jnp.mean(y, axis=(0, 1, 2))
        v = jnp.var(y, axis=(0, 1, 2))
        return jax.nn.relu((y - m) * lax.rsqrt(v + 1e-5) * g + b)

    args = (X, W, VECS[0], VECS[1])
    for r in conv_rewrites(fn, *args):
        assert not any("per-channel" in step for step in r.replaced)
    assert_same(fn, *args)


# -- activations in any form --------------------------------------------------------------------

ACTS = {
    "relu": [jax.nn.relu, lambda y: jnp.maximum(y, 0.0), lambda y: jnp.where(y > 0, y, 0.0)],
    "relu6": [jax.nn.relu6, lambda y: jnp.clip(y, 0.0, 6.0), lambda y: jnp.minimum(jax.nn.relu(y), 6.0)],
    "silu": [jax.nn.silu, lambda y: y * jax.nn.sigmoid(y), lambda y: y / (1 + jnp.exp(-y))],
    "hard_swish": [jax.nn.hard_swish, lambda y: y * jnp.clip(y + 3, 0, 6) / 6],
    "gelu_tanh": [lambda y: jax.nn.gelu(y, approximate=True)],
    "gelu_erf": [lambda y: jax.nn.gelu(y, approximate=False)],
    "sigmoid": [jax.nn.sigmoid, lambda y: 1 / (1 + jnp.exp(-y))],
    "leaky_relu": [lambda y: jax.nn.leaky_relu(y, 0.1), lambda y: jnp.where(y >= 0, y, 0.1 * y)],
}


@pytest.mark.parametrize("name, i", [(n, i) for n, fs in ACTS.items() for i in range(len(fs))])
def test_activation_recognised_by_what_it_computes(name, i):
    act = ACTS[name][i]

    def fn(x, w, b):
        return act(conv(x, w) + b)

    (rw,) = conv_rewrites(fn, X, W, VECS[0])
    assert rw.kwargs["activation"] == name
    if name == "leaky_relu":
        assert rw.kwargs["alpha"] == pytest.approx(0.1)
    assert_same(fn, X, W, VECS[0])


@pytest.mark.parametrize("not_an_activation", [jnp.tanh, lambda y: y * y, lambda y: jnp.maximum(y, 1.0),
                                                lambda y: 2.0 * jax.nn.relu(y)])
def test_other_unary_functions_stay_as_traced(not_an_activation):
    def fn(x, w):
        return not_an_activation(conv(x, w))

    (rw,) = conv_rewrites(fn, X, W)
    assert rw.kwargs["activation"] is None or rw.kwargs["activation"] == "relu" and len(rw.replaced) > 1
    assert_same(fn, X, W)


# -- the frameworks' own BatchNorm layers -------------------------------------------------------

def test_flax_linen_conv_bn_relu_block():
    nn = pytest.importorskip("flax.linen")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            y = nn.Conv(8, (3, 3), use_bias=False)(x)
            y = nn.BatchNorm(use_running_average=True)(y)
            y = nn.relu(y)
            z = nn.BatchNorm(use_running_average=True)(nn.Conv(8, (1, 1), use_bias=False)(y))
            return nn.relu(z + y)

    model = Block()
    variables = model.init(jax.random.PRNGKey(0), X)
    variables = jax.tree.map(lambda a: a + jnp.asarray(RNG.uniform(0.1, 0.5, a.shape), a.dtype), variables)
    fn = lambda v, x: model.apply(v, x)  # noqa: E731
    rewrites = conv_rewrites(fn, variables, X)
    assert len(rewrites) == 2
    assert "add(residual)" in rewrites[1].replaced
    assert_same(fn, variables, X)


def test_flax_nnx_batchnorm_eval():
    nnx = pytest.importorskip("flax.nnx")

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(6, 8, (3, 3), use_bias=False, rngs=rngs)
            self.bn = nnx.BatchNorm(8, use_running_average=True, rngs=rngs)

        def __call__(self, x):
            return nnx.relu6(self.bn(self.conv(x)))

    block = Block(nnx.Rngs(0))
    graphdef, state = nnx.split(block)
    state = jax.tree.map(lambda a: a + 0.25, state)
    fn = lambda s, x: nnx.merge(graphdef, s)(x)  # noqa: E731
    (rw,) = conv_rewrites(fn, state, X)
    assert rw.kwargs["activation"] == "relu6"
    assert_same(fn, state, X)


def test_equinox_batchnorm_inference_nchw():
    eqx = pytest.importorskip("equinox")
    key = jax.random.PRNGKey(1)
    conv_layer = eqx.nn.Conv2d(6, 8, 3, padding=1, use_bias=False, key=key)
    bn = eqx.nn.BatchNorm(8, axis_name="batch", inference=True)
    state = eqx.nn.State(bn)

    def fn(x):
        def one(xi):
            y, _ = bn(conv_layer(xi), state)
            return jax.nn.relu(y)
        return jax.vmap(one, axis_name="batch")(x)

    x = jnp.transpose(X, (0, 3, 1, 2))
    (rw,) = conv_rewrites(fn, x)
    assert rw.kwargs["activation"] == "relu" and rw.layout == "NCHW"
    assert_same(fn, x)


def keras_jax():
    """keras on the JAX backend (the test is skipped where keras is missing or runs another)."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "jax":
        pytest.skip("keras was imported with another backend")
    return keras


def keras_inference(model):
    """(fn(tv, ntv, x), trainable values, non-trainable values) of `model` in inference mode,
    its variables set to random values in [0.5, 1.5) (valid BatchNorm variances)."""
    for v in model.variables:
        v.assign(np.asarray(RNG.uniform(0.5, 1.5, v.shape), v.dtype))
    tv = [v.value for v in model.trainable_variables]
    ntv = [v.value for v in model.non_trainable_variables]
    return (lambda tv, ntv, x: model.stateless_call(tv, ntv, x, training=False)[0]), tv, ntv


def test_keras_batchnorm_relu6_residual():
    keras = keras_jax()
    inp = keras.Input((8, 8, 6))
    y = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inp)
    y = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization()(y))
    z = keras.layers.BatchNormalization()(keras.layers.Conv2D(8, 1, use_bias=False)(y))
    out = keras.layers.Activation("swish")(keras.layers.Add()([z, y]))
    fn, tv, ntv = keras_inference(keras.Model(inp, out))
    rewrites = conv_rewrites(fn, tv, ntv, X)
    assert [r.kwargs["activation"] for r in rewrites] == ["relu6", "silu"]
    assert_same(fn, tv, ntv, X)


def test_keras_zero_padding_joins_the_conv_padding():
    """ZeroPadding2D before a stride-2 "valid" conv (ResNet's stem, EfficientNet's 5x5 depthwise
    downsampling): the conv's match reads the unpadded input with the pad in its padding, so no
    pad pass stays beside the kernel; values match the traced program."""
    keras = keras_jax()
    inp = keras.Input((9, 9, 6))
    y = keras.layers.ZeroPadding2D(((1, 2), (1, 2)))(inp)
    y = keras.layers.DepthwiseConv2D(5, strides=2, use_bias=False)(y)
    y = keras.layers.Activation("swish")(keras.layers.BatchNormalization()(y))
    y = keras.layers.ZeroPadding2D(1)(y)
    out = keras.layers.ReLU()(keras.layers.Conv2D(8, 3, strides=2, use_bias=True)(y))
    fn, tv, ntv = keras_inference(keras.Model(inp, out))
    x = jnp.asarray(RNG.normal(size=(2, 9, 9, 6)), jnp.float32)
    rewrites = conv_rewrites(fn, tv, ntv, x)
    assert [r.kwargs["padding"] for r in rewrites] == [((1, 2), (1, 2)), ((1, 1), (1, 1))]
    assert all(r.replaced[:2] == ("pad", "conv_general_dilated") for r in rewrites)
    assert [r.x_shape for r in rewrites] == [(2, 9, 9, 6), (2, 4, 4, 6)]
    assert_same(fn, tv, ntv, x)


def test_a_pad_read_elsewhere_stays_as_traced():
    """A pad whose output another op also reads is not taken in: the conv keeps its own padding."""
    def fn(x, w):
        t = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        return jax.nn.relu(lax.conv_general_dilated(t, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))), t

    rewrites = conv_rewrites(fn, X, W)
    assert len(rewrites) == 1 and rewrites[0].kwargs["padding"] == ((0, 0), (0, 0))
    assert "pad" not in rewrites[0].replaced


# -- decisions and lowering ---------------------------------------------------------------------

def test_default_policy_explains_kept_sites():
    def fn(x, w, m, v, g, b):
        return jax.nn.relu(BN_FORMS["textbook"](conv(x, w), m, v, g, b))

    text = jaxcnn.optimize(fn).explain(X, W, *VECS)
    assert "no pattern found" not in text
    assert "kept as traced" in text and "per-channel" in text


@pytest.mark.skipif(not library.handlers_registered(), reason=library.library_state().reason or "library loaded")
def test_cuda_lowering_has_one_custom_call_per_site():
    def fn(x, w, w2, m, v, g, b, r):
        y = jax.nn.relu(BN_FORMS["keras"](conv(x, w), m, v, g, b))
        return jax.nn.silu(BN_FORMS["textbook"](conv(y, w2), m, v, g, b) + r)

    w2 = jnp.asarray(RNG.normal(size=(3, 3, 8, 8)), jnp.float32)
    args = (X, W, w2, *VECS, R)
    text = jax.jit(jaxcnn.optimize(fn, policy="all")).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    calls = re.findall(r"custom_call @(jaxcnn_conv2d_fwd\w*)", text)
    assert sorted(calls) == ["jaxcnn_conv2d_fwd", "jaxcnn_conv2d_fwd_residual"]
    assert "stablehlo.convolution" not in text


def test_conv_batchnorm_relu_maxpool_fuses_into_conv2d_pool():
    def fn(x, w, m, v, g, b):
        y = jax.nn.relu(BN_FORMS["textbook"](conv(x, w), m, v, g, b))
        return lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    args = (X, W, *VECS)
    fused = jaxcnn.optimize(fn, fuse="all")
    ops = [r.op for r in fused.rewrites(*args)]
    assert ops == ["conv2d_pool"]
    assert rel_err(jax.jit(fused)(*args), np.asarray(fn(*args), np.float64)) < 1e-5


def test_keras_resnet_stem_pads_join_the_conv_and_the_pool():
    """Keras' ResNet stem: ZeroPadding2D(3) -> 7x7/2 conv -> BatchNorm -> ReLU -> ZeroPadding2D(1)
    -> MaxPooling2D(3, 2). The first pad joins the conv's padding; the second the pool's, as the
    ReLU's output is never below 0 (zeros and the pool's -inf padding give the same maxima); with
    both taken in, conv and pool fuse into one conv2d_pool."""
    keras = keras_jax()
    inp = keras.Input((20, 20, 3))
    y = keras.layers.Conv2D(8, 7, strides=2)(keras.layers.ZeroPadding2D(3)(inp))
    y = keras.layers.Activation("relu")(keras.layers.BatchNormalization(epsilon=1.001e-5)(y))
    out = keras.layers.MaxPooling2D(3, strides=2)(keras.layers.ZeroPadding2D(1)(y))
    fn, tv, ntv = keras_inference(keras.Model(inp, out))
    x = jnp.asarray(RNG.normal(size=(2, 20, 20, 3)), jnp.float32)
    rewrites = jaxcnn.optimize(fn, policy="all", fuse="none").rewrites(tv, ntv, x)
    assert [(r.op, r.kwargs["padding"]) for r in rewrites] == [("conv2d", ((3, 3), (3, 3))), ("max_pool2d", ((1, 1), (1, 1)))]
    assert all("pad" in r.replaced for r in rewrites)
    assert_same(fn, tv, ntv, x)
    fused = jaxcnn.optimize(fn, fuse="all")
    assert [r.op for r in fused.rewrites(tv, ntv, x)] == ["conv2d_pool"]
    assert rel_err(jax.jit(fused)(tv, ntv, x), np.asarray(fn(tv, ntv, x), np.float64)) < 1e-5


@pytest.mark.parametrize("act", [None, "silu", "hard_swish"])
def test_max_pool_keeps_a_zero_pad_of_a_value_that_can_be_negative(act):
    """Zeros are not -inf where the padded value can be negative: the pad stays as traced and
    the pool keeps its own padding; the results still match."""
    def fn(x, w):
        y = conv(x, w)
        y = y if act is None else getattr(jax.nn, act)(y)
        y = jnp.pad(y, ((0, 0), (1, 1), (1, 1), (0, 0)))
        return lax.reduce_window(y, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "VALID")

    pools = [r for r in jaxcnn.optimize(fn, policy="all", fuse="none").rewrites(X, W) if r.op == "max_pool2d"]
    assert [r.kwargs["padding"] for r in pools] == [((0, 0), (0, 0))]
    assert_same(fn, X, W)


def test_a_pad_conv2d_cannot_take_stays_beside_the_conv(monkeypatch):
    """Where conv2d refuses the padding with the pad added (here: refused above 2 per side), the
    conv is still matched, with its own padding, and the pad stays as traced."""
    real = patterns.conv2d

    def picky_conv2d(*args, padding, **kwargs):
        if max(max(pair) for pair in padding) > 2:
            raise ValueError("padding too wide for this test")
        return real(*args, padding=padding, **kwargs)

    monkeypatch.setattr(patterns, "conv2d", picky_conv2d)

    def fn(x, w):
        t = jnp.pad(x, ((0, 0), (3, 3), (3, 3), (0, 0)))
        return jax.nn.relu(lax.conv_general_dilated(t, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")))

    rewrites = conv_rewrites(fn, X, W)
    assert len(rewrites) == 1 and rewrites[0].kwargs["padding"] == ((0, 0), (0, 0))
    assert "pad" not in rewrites[0].replaced
    assert_same(fn, X, W)
