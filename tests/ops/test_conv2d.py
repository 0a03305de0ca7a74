"""conv2d semantics, gradients, vmap and jit on the reference (CPU) path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st
from jax import lax
from jax.test_util import check_grads

import jaxcnn
from arrays import random_operands, random_shape_test, sds, traces
from reference64 import TOLERANCE, conv2d_f64, rel_err


@st.composite
def conv_cases(draw):
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    cg = draw(st.integers(1, 5))
    kg = draw(st.integers(1, 4))
    r, s = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    stride = draw(st.sampled_from([1, 2, 3, (1, 2), (2, 1)]))
    dilation = draw(st.sampled_from([1, 2, (1, 3)]))
    padding = draw(
        st.sampled_from(["SAME", "VALID", 0, 1, 2, (1, 0), ((0, 2), (1, 0)), ((3, 1), (2, 2))])
    )
    h, w = draw(st.integers(1, 13)), draw(st.integers(1, 13))
    n = draw(st.integers(1, 3))
    return dict(
        x_shape=(n, h, w, cg * groups), w_shape=(r, s, cg, kg * groups),
        kw=dict(stride=stride, padding=padding, dilation=dilation, groups=groups,
                activation=draw(st.sampled_from([None, "relu"]))),
        with_bias=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
    )


def fits(case):
    return traces(lambda x, w: jaxcnn.conv2d(x, w, **case["kw"]),
                  sds(case["x_shape"]), sds(case["w_shape"]))


@random_shape_test(conv_cases(), fits)
def test_matches_float64_reference(case):
    x, w, b = random_operands(case["seed"], case["x_shape"], case["w_shape"], with_bias=case["with_bias"])
    out = jaxcnn.conv2d(x, w, b, **case["kw"])
    ref = conv2d_f64(x, w, b, **case["kw"])
    assert out.shape == ref.shape and out.dtype == jnp.float32
    assert rel_err(out, ref) <= TOLERANCE["float32"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(
    "x_shape,w_shape,kw",
    [
        ((2, 17, 15, 3), (7, 7, 3, 16), dict(stride=2, padding=3)),
        ((1, 9, 11, 12), (3, 3, 1, 12), dict(groups=12, padding="SAME")),
        ((3, 13, 12, 10), (5, 5, 10, 7), dict(dilation=2, padding="VALID")),
        ((2, 6, 7, 16), (1, 1, 16, 24), dict(activation="relu")),
    ],
)
def test_dtypes_output_in_input_dtype(dtype, x_shape, w_shape, kw):
    x, w, b = random_operands(0, x_shape, w_shape, dtype)
    out = jaxcnn.conv2d(x, w, b, **kw)
    assert out.dtype == jnp.dtype(dtype)
    assert rel_err(out, conv2d_f64(x, w, b, **kw)) <= TOLERANCE[dtype]


def test_padding_forms_agree():
    x, w, _ = random_operands(1, (1, 10, 9, 4), (3, 3, 4, 5))
    explicit = jaxcnn.conv2d(x, w, padding=((1, 1), (1, 1)))
    np.testing.assert_array_equal(jaxcnn.conv2d(x, w, padding="SAME"), explicit)
    np.testing.assert_array_equal(jaxcnn.conv2d(x, w, padding=1), explicit)
    np.testing.assert_array_equal(jaxcnn.conv2d(x, w, padding=(1, 1)), explicit)
    assert jaxcnn.conv2d(x, w, padding="valid").shape == (1, 8, 7, 5)


def test_relu_propagates_nan_like_xla():
    x, w, b = random_operands(2, (1, 5, 5, 2), (3, 3, 2, 3))
    x = x.at[0, 2, 2, 0].set(jnp.nan)
    out = np.asarray(jaxcnn.conv2d(x, w, b, activation="relu"))
    ref = np.asarray(jnp.maximum(lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")) + b, 0))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    assert np.isnan(out).sum() == 27  # every output that sees the NaN, all 3 channels


def _xla_conv(x, w, b, kw):
    y = lax.conv_general_dilated(
        x, w, (kw.get("stride", 1),) * 2, kw.get("padding", "SAME"),
        rhs_dilation=(kw.get("dilation", 1),) * 2, dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=kw.get("groups", 1), precision=lax.Precision.HIGHEST,
    ) + b
    return jax.nn.relu(y) if kw.get("activation") == "relu" else y


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(activation="relu"), dict(stride=2, dilation=2, padding="VALID"), dict(groups=2, padding="SAME")],
)
def test_grad_matches_xla(kw):
    x, w, b = random_operands(3, (2, 9, 8, 4), (3, 3, 4 // kw.get("groups", 1), 6))
    cot = jax.random.normal(jax.random.PRNGKey(9), jaxcnn.conv2d(x, w, b, **kw).shape)
    ours = jax.grad(lambda *a: jnp.sum(jaxcnn.conv2d(*a, **kw) * cot), argnums=(0, 1, 2))(x, w, b)
    theirs = jax.grad(lambda *a: jnp.sum(_xla_conv(*a, kw) * cot), argnums=(0, 1, 2))(x, w, b)
    for got, want in zip(ours, theirs):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_check_grads_numerically():
    x, w, b = random_operands(4, (1, 5, 4, 2), (3, 2, 2, 3))
    check_grads(
        lambda x, w, b: jaxcnn.conv2d(x, w, b, stride=(2, 1)), (x, w, b),
        order=1, modes=("rev",), atol=3e-2, rtol=3e-2,
    )


def test_grad_without_bias_and_under_jit():
    x, w, _ = random_operands(5, (2, 6, 6, 3), (3, 3, 3, 4))
    gx, gw = jax.jit(jax.grad(lambda x, w: jaxcnn.conv2d(x, w).sum(), argnums=(0, 1)))(x, w)
    ex, ew = jax.grad(lambda x, w: _xla_conv(x, w, 0.0, {}).sum(), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(gx, ex, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, ew, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("in_axes", [(0, None, None), (3, None, None), (None, 0, None),
                                     (None, None, 0), (0, 0, 0), (1, 4, None)])
def test_vmap(in_axes):
    batch = 3
    base_x, base_w, base_b = (2, 7, 6, 4), (3, 3, 2, 6), (6,)

    def batched(shape, axis, seed):
        if axis is None:
            return jax.random.normal(jax.random.PRNGKey(seed), shape)
        full = list(shape)
        full.insert(axis, batch)
        return jax.random.normal(jax.random.PRNGKey(seed), full)

    x, w, b = batched(base_x, in_axes[0], 1), batched(base_w, in_axes[1], 2), batched(base_b, in_axes[2], 3)
    kw = dict(groups=2, stride=2, activation="relu")
    out = jax.vmap(lambda x, w, b: jaxcnn.conv2d(x, w, b, **kw), in_axes=in_axes)(x, w, b)
    for i in range(batch):
        take = lambda a, ax: a if ax is None else jnp.take(a, i, axis=ax)  # noqa: E731
        want = conv2d_f64(take(x, in_axes[0]), take(w, in_axes[1]), take(b, in_axes[2]), **kw)
        assert rel_err(out[i], want) <= 1e-5


def test_vmap_of_grad():
    x, w, b = random_operands(6, (4, 5, 5, 3), (3, 3, 3, 2))
    per_example = jax.vmap(jax.grad(lambda x: jaxcnn.conv2d(x[None], w, b, activation="relu").sum()))(x)
    whole = jax.grad(lambda x: jaxcnn.conv2d(x, w, b, activation="relu").sum())(x)
    np.testing.assert_allclose(per_example, whole, rtol=1e-5, atol=1e-6)


def test_jit_and_eager_agree():
    x, w, b = random_operands(7, (2, 11, 13, 5), (5, 5, 5, 8))
    kw = dict(stride=2, padding="SAME", activation="relu")
    np.testing.assert_array_equal(jax.jit(lambda *a: jaxcnn.conv2d(*a, **kw))(x, w, b), jaxcnn.conv2d(x, w, b, **kw))
