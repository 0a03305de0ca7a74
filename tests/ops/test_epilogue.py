"""conv2d's general epilogue (bias, residual, activation) on the reference path: values against a
float64 oracle, gradients against the unfused jax formulation, vmap, validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxcnn
from jaxcnn.ops.epilogue import ACTIVATIONS, apply_activation
from reference64 import TOLERANCE, conv2d_f64, rel_err

X_SHAPE, W_SHAPE = (2, 7, 6, 5), (3, 3, 5, 4)
ALL = [a for a in ACTIVATIONS if a is not None]


def operands(seed, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=X_SHAPE), dtype)
    w = jnp.asarray(rng.normal(size=W_SHAPE) / 4, dtype)
    b = jnp.asarray(rng.normal(size=W_SHAPE[3]), dtype)
    r = jnp.asarray(rng.normal(size=(2, 7, 6, 4)) * 2, dtype)
    return x, w, b, r


def oracle(x, w, b, r, activation, alpha):
    y = conv2d_f64(x, w, b)
    if r is not None:
        y = y + np.asarray(r, np.float64)
    with jax.enable_x64(True):
        return np.asarray(apply_activation(jnp.asarray(y, jnp.float64), activation, alpha))


def unfused(x, w, b, r, activation, alpha, layout="NHWC"):
    """The same computation as a JAX user writes it (what the gradients must equal)."""
    y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=(layout, "HWIO", layout))
    y = y + b.reshape([-1 if d == "C" else 1 for d in layout])
    if r is not None:
        y = y + r
    return {None: lambda v: v, "relu": jax.nn.relu, "relu6": jax.nn.relu6, "silu": jax.nn.silu,
            "hard_swish": jax.nn.hard_swish, "gelu_tanh": lambda v: jax.nn.gelu(v, approximate=True),
            "gelu_erf": lambda v: jax.nn.gelu(v, approximate=False), "sigmoid": jax.nn.sigmoid,
            "leaky_relu": lambda v: jax.nn.leaky_relu(v, alpha)}[activation](y)


@pytest.mark.parametrize("activation", ALL)
@pytest.mark.parametrize("with_residual", [True, False])
def test_values_match_float64(activation, with_residual):
    x, w, b, r = operands(0)
    r = r if with_residual else None
    alpha = 0.15 if activation == "leaky_relu" else None
    out = jaxcnn.conv2d(x, w, b, residual=r, activation=activation, alpha=alpha)
    ref = oracle(x, w, b, r, activation, alpha or 0.0)
    assert rel_err(out, ref) < TOLERANCE["float32"]
    xla = jaxcnn.conv2d(x, w, b, residual=r, activation=activation, alpha=alpha, algorithm="xla")
    assert rel_err(xla, ref) < TOLERANCE["float32"]


@pytest.mark.parametrize("layout", ["NCHW", "CHWN"])
def test_residual_in_other_layouts(layout):
    x, w, b, r = operands(1)
    perm = [ "NHWC".index(d) for d in layout]
    out = jaxcnn.conv2d(jnp.transpose(x, perm), w, b, residual=jnp.transpose(r, perm), activation="silu",
                        layout=layout)
    ref = oracle(x, w, b, r, "silu", 0.0)
    assert rel_err(jnp.transpose(out, np.argsort(perm)), ref) < TOLERANCE["float32"]


@pytest.mark.parametrize("activation", ["relu6", "silu", "gelu_erf", "leaky_relu", "hard_swish"])
def test_gradients_match_unfused(activation):
    x, w, b, r = operands(2)
    alpha = 0.2 if activation == "leaky_relu" else None

    def ours(*a):
        return jnp.sum(jnp.sin(jaxcnn.conv2d(a[0], a[1], a[2], residual=a[3], activation=activation, alpha=alpha)))

    def theirs(*a):
        return jnp.sum(jnp.sin(unfused(*a, activation, alpha or 0.0)))

    g1 = jax.grad(ours, argnums=(0, 1, 2, 3))(x, w, b, r)
    g2 = jax.grad(theirs, argnums=(0, 1, 2, 3))(x, w, b, r)
    for name, a, e in zip("xwbr", g1, g2):
        assert rel_err(a, np.asarray(e, np.float64)) < 1e-5, name


@pytest.mark.parametrize("algorithm", ["auto", "xla"])
@pytest.mark.parametrize("activation", ["relu", "relu6"])
def test_gradient_at_the_kink_matches_jax_nn(algorithm, activation):
    """A pre-activation of exactly 0 (and 6 for relu6) gets jax.nn's gradient: 0."""
    x = jnp.zeros((1, 1, 1, 1), jnp.float32)
    w = jnp.ones((1, 1, 1, 1), jnp.float32)
    for bias in (0.0, 6.0):
        b = jnp.full((1,), bias, jnp.float32)
        grad = jax.grad(lambda b_: jnp.sum(jaxcnn.conv2d(x, w, b_, activation=activation, algorithm=algorithm)))(b)
        want = jax.grad(lambda b_: jnp.sum(getattr(jax.nn, activation)(b_)))(b)
        assert float(grad[0]) == float(want[0]), (bias, float(grad[0]), float(want[0]))


def test_vmap_over_x_and_residual_and_over_weights():
    x, w, b, r = operands(3)
    xs, rs = jnp.stack([x, 2 * x]), jnp.stack([r, -r])
    f = lambda x_, r_: jaxcnn.conv2d(x_, w, b, residual=r_, activation="silu")  # noqa: E731
    got = jax.vmap(f)(xs, rs)
    for i in range(2):
        assert rel_err(got[i], np.asarray(f(xs[i], rs[i]), np.float64)) < 1e-6
    ws = jnp.stack([w, -w])
    g = lambda w_: jaxcnn.conv2d(x, w_, b, residual=r, activation="gelu_tanh")  # noqa: E731
    got = jax.vmap(g)(ws)
    for i in range(2):
        assert rel_err(got[i], np.asarray(g(ws[i]), np.float64)) < 1e-5


def test_bf16_rounds_once():
    x, w, b, r = operands(4, jnp.bfloat16)
    out = jaxcnn.conv2d(x, w, b, residual=r, activation="silu")
    assert out.dtype == jnp.bfloat16
    assert rel_err(out, oracle(x, w, b, r, "silu", 0.0)) < TOLERANCE["bfloat16"]


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(activation="swish"), ValueError, "activation"),
    (dict(activation="relu", alpha=0.1), ValueError, "alpha"),
    (dict(activation="leaky_relu", alpha="0.1"), TypeError, "alpha"),
    (dict(activation="leaky_relu", alpha=float("nan")), ValueError, "alpha"),
    (dict(residual=jnp.zeros((2, 7, 6, 3))), ValueError, "residual"),
    (dict(residual=jnp.zeros((2, 7, 6, 4), jnp.bfloat16)), TypeError, "residual"),
    (dict(residual="r"), TypeError, "residual"),
])
def test_bad_epilogue_arguments_name_the_argument(kwargs, error, words):
    x, w, b, _ = operands(5)
    with pytest.raises(error, match=words):
        jaxcnn.conv2d(x, w, b, **kwargs)


def test_empty_batch_gives_the_empty_result():
    _, w, b, _ = operands(6)
    out = jaxcnn.conv2d(jnp.zeros((0, 7, 6, 5)), w, b, residual=jnp.zeros((0, 7, 6, 4)), activation="relu")
    assert out.shape == (0, 7, 6, 4)
