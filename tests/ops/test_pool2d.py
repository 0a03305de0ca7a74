"""max_pool2d / avg_pool2d semantics, gradients, vmap and validation on the reference (CPU)
path, against an independent float64 NumPy oracle and lax.reduce_window."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st
from jax import lax
from jax.test_util import check_grads

import jaxcnn
from arrays import random_shape_test, random_x, sds, traces
from pool_oracle import FROM_NHWC, TO_NHWC, TOL, pool_f64, to_layout

LAYOUTS = ("NHWC", "NCHW", "CHWN")
POOLS = {"max": jaxcnn.max_pool2d, "avg": jaxcnn.avg_pool2d}


def run_pool(x, case):
    kw = dict(stride=case["stride"], padding=case["padding"], layout=case["layout"])
    if case["mode"] == "avg":
        kw["count_include_pad"] = case["count_include_pad"]
    return POOLS[case["mode"]](x, case["window"], **kw)


def oracle(x, case):
    return pool_f64(np.asarray(x, np.float64), case["layout"], case["mode"], case["window"],
                    case["stride"], case["padding"], case.get("count_include_pad", True))


@st.composite
def pool_cases(draw):
    """Random NHWC-logical shape, window, stride and padding, in a random layout."""
    n, c = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    window = draw(st.sampled_from([1, 2, 3, (2, 3), (3, 1), (4, 4), (5, 2)]))
    stride = draw(st.sampled_from([None, 1, 2, 3, (1, 2), (3, 1)]))
    padding = draw(st.sampled_from(
        ["VALID", "SAME", 0, 1, (1, 0), ((0, 2), (1, 0)), ((2, 1), (0, 3)), ((3, 3), (3, 3))]))
    layout = draw(st.sampled_from(LAYOUTS))
    nhwc = (n, h, w, c)
    return dict(
        shape=tuple(nhwc[i] for i in FROM_NHWC[layout]), layout=layout,
        mode=draw(st.sampled_from(["max", "avg"])), window=window, stride=stride,
        padding=padding, count_include_pad=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
    )


def fits(case):
    return traces(lambda x: run_pool(x, case), sds(case["shape"]))


@random_shape_test(pool_cases(), fits)
def test_matches_float64_oracle(case):
    x = random_x(case["seed"], case["shape"])
    out = run_pool(x, case)
    want = oracle(x, case)
    assert out.shape == want.shape and out.dtype == jnp.float32
    if case["mode"] == "max":
        np.testing.assert_array_equal(out, want.astype(np.float32))  # max is exact
    else:
        np.testing.assert_allclose(out, want, equal_nan=True, **TOL["float32"])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("mode", ["max", "avg"])
def test_dtypes_and_layouts(layout, dtype, mode):
    nhwc = (2, 11, 10, 5)
    x_nhwc = random_x(1, nhwc, dtype)
    x = jnp.transpose(x_nhwc, FROM_NHWC[layout])
    case = dict(layout=layout, mode=mode, window=3, stride=2, padding="SAME", count_include_pad=True)
    out = run_pool(x, case)
    assert out.dtype == jnp.dtype(dtype)
    want = oracle(np.asarray(x.astype(jnp.float32)), case)
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), want, **TOL[dtype])


def test_layouts_agree_with_each_other():
    x = random_x(2, (3, 13, 9, 4))
    ref = jaxcnn.avg_pool2d(x, (3, 2), (2, 1), padding=((1, 1), (0, 1)))
    for layout in ("NCHW", "CHWN"):
        xl = to_layout(np.asarray(x), layout)
        out = jaxcnn.avg_pool2d(xl, (3, 2), (2, 1), padding=((1, 1), (0, 1)), layout=layout)
        np.testing.assert_allclose(np.transpose(out, TO_NHWC[layout]), ref, rtol=1e-6, atol=1e-7)


def test_matches_flax_style_reduce_window():
    """flax.linen.max_pool / avg_pool are these lax calls (avg divides by the full window)."""
    x = random_x(3, (2, 9, 8, 3))
    pads = ((0, 0), (1, 1), (1, 1), (0, 0))
    mx = lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), pads)
    av = lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), pads) / 9
    np.testing.assert_array_equal(jaxcnn.max_pool2d(x, 3, 2, padding=1), mx)
    np.testing.assert_allclose(jaxcnn.avg_pool2d(x, 3, 2, padding=1), av, rtol=1e-6, atol=1e-7)


def test_count_include_pad_false_divides_by_in_bounds_taps():
    x = jnp.ones((1, 4, 4, 1))
    inc = jaxcnn.avg_pool2d(x, 3, 1, padding=1)
    exc = jaxcnn.avg_pool2d(x, 3, 1, padding=1, count_include_pad=False)
    np.testing.assert_allclose(exc, 1.0, rtol=1e-6)
    assert float(inc[0, 0, 0, 0]) == pytest.approx(4 / 9)  # corner: 4 of 9 taps inside
    # A window entirely in padding (which would give -inf, 0 or 0/0) is refused.
    far = dict(window=2, stride=1, padding=((3, 0), (0, 0)))
    for pool in (jaxcnn.max_pool2d, jaxcnn.avg_pool2d):
        with pytest.raises(ValueError, match="padding .* must be smaller than window"):
            pool(x, **far)


def test_nan_and_inf_propagate_like_xla():
    x = random_x(4, (1, 8, 8, 2))
    x = x.at[0, 2, 3, 0].set(jnp.nan).at[0, 6, 6, 1].set(jnp.inf).at[0, 0, 7, 1].set(-jnp.inf)
    for mode, pool in POOLS.items():
        ours = np.asarray(pool(x, 3, 2, padding=1))
        init, op = (-jnp.inf, lax.max) if mode == "max" else (0.0, lax.add)
        xla = np.asarray(lax.reduce_window(x, init, op, (1, 3, 3, 1), (1, 2, 2, 1),
                                           ((0, 0), (1, 1), (1, 1), (0, 0))))
        for check in (np.isnan, np.isposinf, np.isneginf):
            np.testing.assert_array_equal(check(ours), check(xla))
        assert np.isnan(ours).sum() == 2  # the 2 windows that hold (2, 3)


def test_stride_defaults_to_window_and_padding_forms_agree():
    x = random_x(5, (2, 10, 9, 3))
    assert jaxcnn.max_pool2d(x, 2).shape == (2, 5, 4, 3)
    explicit = jaxcnn.avg_pool2d(x, 3, 1, padding=((1, 1), (1, 1)))
    for same in ("SAME", "same", 1, (1, 1)):
        np.testing.assert_array_equal(jaxcnn.avg_pool2d(x, 3, 1, padding=same), explicit)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ["max", "avg"])
def test_grad_matches_lax(layout, mode):
    x = to_layout(np.asarray(random_x(6, (2, 9, 8, 3))), layout)
    case = dict(layout=layout, mode=mode, window=3, stride=2, padding=((1, 0), (1, 1)),
                count_include_pad=False)
    h, w = layout.index("H"), layout.index("W")
    dims, strides, pads = [1] * 4, [1] * 4, [(0, 0)] * 4
    dims[h] = dims[w] = 3
    strides[h] = strides[w] = 2
    pads[h], pads[w] = (1, 0), (1, 1)

    def lax_pool(x):
        if mode == "max":
            return lax.reduce_window(x, -jnp.inf, lax.max, dims, strides, pads)
        total = lax.reduce_window(x, 0.0, lax.add, dims, strides, pads)
        count = lax.reduce_window(jnp.ones_like(x), 0.0, lax.add, dims, strides, pads)
        return total / count

    cot = random_x(7, jax.eval_shape(lax_pool, x).shape)
    ours = jax.grad(lambda x: jnp.sum(run_pool(x, case) * cot))(x)
    want = jax.grad(lambda x: jnp.sum(lax_pool(x) * cot))(x)
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-6)


def test_check_grads_numerically():
    x = random_x(8, (1, 6, 5, 2))
    check_grads(lambda x: jaxcnn.avg_pool2d(x, (3, 2), (2, 1), padding="SAME", layout="NCHW"),
                (x,), order=2, modes=("rev",), atol=1e-2, rtol=1e-2)
    check_grads(lambda x: jaxcnn.max_pool2d(x, 2, 1, layout="CHWN"), (x,), order=1,
                modes=("rev",), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("in_axis", [0, 2, 4])
def test_vmap_folds_into_batch(layout, in_axis):
    base = to_layout(np.zeros((2, 7, 6, 3)), layout).shape
    full = list(base)
    full.insert(in_axis, 3)
    x = random_x(9, tuple(full))
    fn = lambda x: jaxcnn.max_pool2d(x, 3, 2, padding=1, layout=layout)  # noqa: E731
    out = jax.vmap(fn, in_axes=in_axis)(x)
    for i in range(3):
        np.testing.assert_array_equal(out[i], fn(jnp.take(x, i, axis=in_axis)))
    avg = jax.vmap(lambda x: jaxcnn.avg_pool2d(x, 2, layout=layout), in_axes=in_axis, out_axes=1)(x)
    for i in range(3):
        np.testing.assert_allclose(avg[:, i],
                                   jaxcnn.avg_pool2d(jnp.take(x, i, axis=in_axis), 2, layout=layout),
                                   rtol=1e-6)


def test_vmap_of_grad():
    x = random_x(10, (4, 6, 6, 3))
    per_example = jax.vmap(jax.grad(lambda x: jaxcnn.max_pool2d(x[None], 2).sum()))(x)
    whole = jax.grad(lambda x: jaxcnn.max_pool2d(x, 2).sum())(x)
    np.testing.assert_array_equal(per_example, whole)


def test_jit_and_eager_agree():
    x = random_x(11, (2, 3, 13, 12))
    f = lambda x: jaxcnn.avg_pool2d(x, 3, 2, padding="SAME", layout="NCHW")  # noqa: E731
    np.testing.assert_array_equal(jax.jit(f)(x), f(x))


X = jax.ShapeDtypeStruct((2, 8, 8, 4), jnp.float32)


@pytest.mark.parametrize(
    "x,kwargs,error,match",
    [
        (sds((8, 8, 4)), {}, ValueError, "x must be rank 4"),
        (sds((2, 8, 8, 4), jnp.int32), {}, TypeError, "x dtype"),
        (sds((2, 8, 8, 4), jnp.complex64), {}, TypeError, "x dtype"),
        (sds((2, 0, 8, 4)), {}, ValueError, "x must not have zero-size H, W or C"),
        (X, dict(window=0), ValueError, "window must be >= 1"),
        (X, dict(window=(2, -1)), ValueError, "window must be >= 1"),
        (X, dict(window=2.0), TypeError, "window must be an int"),
        (X, dict(window=(1, 2, 3)), TypeError, "window must be an int"),
        (X, dict(stride=0), ValueError, "stride must be >= 1"),
        (X, dict(stride="2"), TypeError, "stride must be an int"),
        (X, dict(padding=-1), ValueError, "padding must be >= 0"),
        (X, dict(padding=((0, -1), (0, 0))), ValueError, r"padding\[0\] must be >= 0"),
        (X, dict(padding="FULL"), ValueError, "padding must be"),
        (X, dict(padding=1.5), TypeError, "padding must be an int"),
        (X, dict(layout="NWHC"), ValueError, "layout must be one of"),
        (X, dict(layout=0), TypeError, "layout must be one of"),
        (X, dict(window=9), ValueError, "does not fit the padded input"),
        (X, dict(count_include_pad="yes"), TypeError, "count_include_pad must be a bool"),
    ],
)
def test_bad_arguments_raise_at_trace_time(x, kwargs, error, match):
    kw = dict(window=2)
    kw.update(kwargs)
    fn = jaxcnn.avg_pool2d if "count_include_pad" in kw else jaxcnn.max_pool2d
    with pytest.raises(error, match=match):
        jax.jit(lambda x: fn(x, **kw)).trace(x)


def test_primitive_bind_validates_too():
    """The abstract eval checks operands even when the public wrapper is bypassed."""
    from jaxcnn.ops.pool2d.api import Pool2dPrimitive
    from jaxcnn.ops.pool2d.config import make_pool_config

    cfg = make_pool_config((2, 8, 8, 4), jnp.float32, mode="max", window=2)
    with pytest.raises(TypeError, match="x dtype"):
        jax.eval_shape(lambda x: Pool2dPrimitive.outer.bind(x, cfg=cfg, operand_names=("x",)),
                       sds((2, 8, 8, 4), jnp.int32))


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_grad_under_jit(mode):
    x = random_x(12, (2, 3, 9, 8))
    fn = lambda x: jnp.sum(POOLS[mode](x, 3, 2, padding=1, layout="NCHW") ** 2)  # noqa: E731
    np.testing.assert_allclose(jax.jit(jax.grad(fn))(x), jax.grad(fn)(x), rtol=1e-6, atol=1e-7)
