"""conv2d in NCHW and CHWN (reference path): same numbers as NHWC, grads, vmap, precision."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxcnn
from reference64 import conv2d_f64, rel_err

PERM_FROM_NHWC = {"NHWC": (0, 1, 2, 3), "NCHW": (0, 3, 1, 2), "CHWN": (3, 1, 2, 0)}


def to_layout(a, layout):
    return jnp.transpose(a, PERM_FROM_NHWC[layout])


def from_layout(a, layout):
    return jnp.transpose(a, np.argsort(PERM_FROM_NHWC[layout]))


def operands(seed=0, x_shape=(3, 9, 8, 6), w_shape=(3, 3, 3, 8)):
    kx, kw, kb = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = jax.random.normal(kx, x_shape)
    w = jax.random.normal(kw, w_shape) / np.sqrt(np.prod(w_shape[:3]))
    return x, w, jax.random.normal(kb, (w_shape[3],))


KW = dict(stride=(2, 1), padding=((1, 2), (0, 1)), dilation=(1, 2), groups=2, activation="relu")


@pytest.mark.parametrize("layout", ["NCHW", "CHWN"])
def test_layout_matches_nhwc_float64(layout):
    x, w, b = operands()
    y = jaxcnn.conv2d(to_layout(x, layout), w, b, layout=layout, precision="highest", **KW)
    want = conv2d_f64(x, w, b, **KW)
    assert y.shape == to_layout(want, layout).shape
    assert rel_err(from_layout(y, layout), want) <= 1e-5


@pytest.mark.parametrize("layout", ["NCHW", "CHWN"])
def test_layout_grads_match_nhwc(layout):
    x, w, b = operands(1)

    def loss(x, w, b, layout):
        y = jaxcnn.conv2d(to_layout(x, layout), w, b, layout=layout, precision="highest", **KW)
        return jnp.sum(from_layout(y, layout) ** 2)

    got = jax.grad(loss, argnums=(0, 1, 2))(x, w, b, layout)
    want = jax.grad(loss, argnums=(0, 1, 2))(x, w, b, "NHWC")
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["NCHW", "CHWN"])
@pytest.mark.parametrize("in_axes", [(0, None, None), (2, None, None), (None, 0, None), (1, 0, 0)])
def test_layout_vmap(layout, in_axes):
    batch, (x, w, b) = 3, operands(2)
    xs = jnp.stack([x * (i + 1) for i in range(batch)], axis=in_axes[0]) if in_axes[0] is not None else x
    ws = jnp.stack([w * (i + 1) for i in range(batch)], axis=in_axes[1]) if in_axes[1] is not None else w
    bs = jnp.stack([b + i for i in range(batch)], axis=in_axes[2]) if in_axes[2] is not None else b

    def f(x, w, b):
        return jaxcnn.conv2d(to_layout(x, layout), w, b, layout=layout, precision="highest", **KW)

    out = jax.vmap(f, in_axes=in_axes)(xs, ws, bs)
    for i in range(batch):
        take = lambda a, ax: a if ax is None else jnp.take(a, i, axis=ax)  # noqa: E731
        want = conv2d_f64(take(xs, in_axes[0]), take(ws, in_axes[1]), take(bs, in_axes[2]), **KW)
        assert rel_err(from_layout(out[i], layout), want) <= 1e-5


def test_precision_forms():
    x, w, b = operands(3)
    hi = jaxcnn.conv2d(x, w, b, precision=lax.Precision.HIGHEST, **KW)
    np.testing.assert_array_equal(hi, jaxcnn.conv2d(x, w, b, precision="highest", **KW))
    with pytest.raises(ValueError, match="precision"):
        jaxcnn.conv2d(x, w, b, precision="fast", **KW)


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(layout="HWCN"), "layout"), (dict(algorithm="winograd"), "algorithm"),
     (dict(algorithm="depthwise"), "depthwise")],
)
def test_bad_layout_algorithm(kwargs, match):
    x, w, b = operands(4)
    with pytest.raises(ValueError, match=match):
        jaxcnn.conv2d(x, w, b, groups=2, **kwargs)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW", "CHWN"])
def test_algorithm_xla_runs_xla_conv_in_any_layout(layout):
    x, w, b = operands(5)
    y = jaxcnn.conv2d(to_layout(x, layout), w, b, layout=layout, precision="highest",
                      algorithm="xla", **KW)
    assert rel_err(from_layout(y, layout), conv2d_f64(x, w, b, **KW)) <= 1e-5
    # No custom call: the whole op is XLA's own convolution, on GPUs too.
    text = jax.jit(lambda x: jaxcnn.conv2d(x, w, b, layout=layout, algorithm="xla", **KW)).trace(
        to_layout(x, layout)).lower(lowering_platforms=("cuda",)).as_text()
    assert "custom_call" not in text and "convolution" in text
    g = jax.grad(lambda w: jnp.sum(jaxcnn.conv2d(x, w, b, algorithm="xla", **KW) ** 2))(w)
    g_ref = jax.grad(lambda w: jnp.sum(jaxcnn.conv2d(x, w, b, precision="highest", **KW) ** 2))(w)
    np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-4)
