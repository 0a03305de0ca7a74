"""jaxcnn.conv2d_pool on the reference (CPU) path: equal to conv2d -> reduce_window and to a
float64 oracle over random shapes (odd sizes, strides, padding, overlapping windows), layouts,
validation errors, grads, vmap, batch sharding on 8 forced host devices, and the CUDA lowering
text (one FFI custom call, no XLA convolution or reduce_window left)."""

import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax
from jax.test_util import check_grads

import jaxcnn
from jaxcnn._native import library
from jaxcnn.ops.conv2d_pool.api import Conv2dPoolPrimitive
from jaxcnn.ops.conv2d_pool.config import OPERAND_NAMES, make_conv_pool_config
from arrays import as_f64, he_normal, normal, sds, traces
from cuda_lowering import cuda_text, custom_calls
from reference64 import conv2d_f64, rel_err
from host_devices import run_on_8_host_devices
from vmap_batching import check_folds_into_batch

TOL = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 2e-3}


def operands(seed, n, h, w, c, k, r=3, s=3, dtype=jnp.float32):
    """x, He-scaled HWIO w and a bias that leaves about half the ReLU inputs negative."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (normal(keys[0], (n, h, w, c), dtype=dtype), he_normal(keys[1], (r, s, c, k), dtype),
            normal(keys[2], (k,), 0.3, dtype))


def max_pool_f64(y, window, stride, pads):
    """Independent NumPy max pool of NHWC y with -inf padding."""
    (pt, pb), (pl, pr) = pads
    yp = np.pad(y, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=-np.inf)
    ph = (yp.shape[1] - window[0]) // stride[0] + 1
    pw = (yp.shape[2] - window[1]) // stride[1] + 1
    out = np.full((y.shape[0], ph, pw, y.shape[3]), -np.inf)
    for i in range(window[0]):
        for j in range(window[1]):
            out = np.maximum(out, yp[:, i: i + stride[0] * (ph - 1) + 1: stride[0],
                                     j: j + stride[1] * (pw - 1) + 1: stride[1]])
    return out


def oracle(x, w, b, *, stride=1, padding="SAME", dilation=1, pool_window=2, pool_stride=None,
           pool_padding="VALID"):
    """float64 conv + bias + ReLU (XLA on upcast inputs), then a NumPy max pool."""
    y = conv2d_f64(as_f64(x), as_f64(w), as_f64(b), stride=stride, padding=padding,
                   dilation=dilation, activation="relu")
    cfg = make_conv_pool_config(x.shape, w.shape, stride=stride, padding=padding,
                                dilation=dilation, pool_window=pool_window,
                                pool_stride=pool_stride, pool_padding=pool_padding)
    return max_pool_f64(y, cfg.pool_window, cfg.pool_stride, cfg.pool_padding)


def composition(x, w, b, *, pool_window=2, pool_stride=None, pool_padding="VALID", **conv):
    """The unfused layer on jaxcnn's own primitives: conv2d(relu) -> max_pool2d."""
    y = jaxcnn.conv2d(x, w, b, activation="relu", **conv)
    return jaxcnn.max_pool2d(y, pool_window, pool_stride, padding=pool_padding)


# ---------------------------------------------------------------- numerics


@st.composite
def cases(draw):
    r = draw(st.sampled_from([1, 2, 3, 5]))
    window = draw(st.sampled_from([(2, 2), (3, 3), (2, 3), (1, 1)]))
    return dict(
        n=draw(st.integers(1, 3)), h=draw(st.integers(r + window[0], 17)),
        w=draw(st.integers(r + window[1], 17)), c=draw(st.integers(1, 12)),
        k=draw(st.integers(1, 12)), r=r, s=r, stride=draw(st.sampled_from([1, 2, (1, 2)])),
        padding=draw(st.sampled_from(["SAME", "VALID", 1, ((0, 2), (1, 0))])),
        dilation=draw(st.sampled_from([1, 1, 2])) if r > 1 else 1,
        pool_window=window,
        pool_stride=draw(st.sampled_from([None, 1, 2, (2, 1)])),
        pool_padding=draw(st.sampled_from(["VALID", "SAME", ((0, 1), (1, 0))])),
        seed=draw(st.integers(0, 2**16)),
    )


def _fits(case):
    return traces(lambda x, w, b: run(case, x, w, b), *operands(0, *_dims(case)))


def _dims(case):
    return case["n"], case["h"], case["w"], case["c"], case["k"], case["r"], case["s"]


def _kwargs(case):
    return {k: case[k] for k in ("stride", "padding", "dilation", "pool_window", "pool_stride",
                                 "pool_padding")}


def run(case, x, w, b, **extra):
    return jaxcnn.conv2d_pool(x, w, b, **_kwargs(case), **extra)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(cases())
def test_random_shapes_match_float64_oracle_and_unfused_composition(case):
    if not _fits(case):
        return  # the window does not fit this draw's conv output
    x, w, b = operands(case["seed"], *_dims(case))
    got = jax.jit(lambda x, w, b: run(case, x, w, b))(x, w, b)
    want = oracle(x, w, b, **_kwargs(case))
    assert got.shape == want.shape and got.dtype == x.dtype
    assert rel_err(got, want) < TOL["float32"], (rel_err(got, want), case)
    # Bitwise equal to the unfused primitives (same fp32 conv, pooling is exact).
    np.testing.assert_array_equal(got, composition(x, w, b, **_kwargs(case), precision="highest"))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("window,stride", [(2, None), (3, 2)])
def test_half_types_match_float64_oracle(dtype, window, stride):
    x, w, b = operands(3, 2, 15, 13, 16, 24, dtype=jnp.dtype(dtype))
    got = jaxcnn.conv2d_pool(x, w, b, pool_window=window, pool_stride=stride)
    assert got.dtype == jnp.dtype(dtype)
    want = oracle(x, w, b, pool_window=window, pool_stride=stride)
    assert rel_err(got, want) < TOL[dtype]
    np.testing.assert_array_equal(got, composition(x, w, b, pool_window=window, pool_stride=stride))


def test_equals_conv_then_reduce_window_vgg_and_alexnet_pools():
    """2x2/2 (VGG) and overlapping 3x3/2 (AlexNet), conv -> lax.reduce_window written out."""
    x, w, b = operands(4, 2, 14, 14, 8, 16, 3, 3)
    for window, stride in (((2, 2), (2, 2)), ((3, 3), (2, 2))):
        y = jaxcnn.conv2d(x, w, b, padding=1, activation="relu", precision="highest")
        want = lax.reduce_window(y, -jnp.inf, lax.max, (1, *window, 1), (1, *stride, 1), "VALID")
        got = jaxcnn.conv2d_pool(x, w, b, padding=1, pool_window=window, pool_stride=stride,
                                 precision="highest")
        assert got.shape == ((2, 7, 7, 16) if window == (2, 2) else (2, 6, 6, 16))
        np.testing.assert_array_equal(got, want)


def test_pool_stride_defaults_to_window_and_bias_none_is_zero():
    x, w, _ = operands(5, 1, 12, 12, 4, 8)
    got = jaxcnn.conv2d_pool(x, w, pool_window=(3, 2))
    want = jaxcnn.conv2d_pool(x, w, jnp.zeros((8,)), pool_window=(3, 2), pool_stride=(3, 2))
    assert got.shape == (1, 4, 6, 8)
    np.testing.assert_array_equal(got, want)


def test_relu_output_is_nonnegative_and_nan_propagates():
    x, w, b = operands(6, 1, 8, 8, 4, 4)
    y = jaxcnn.conv2d_pool(x, w, b - 10.0)
    np.testing.assert_array_equal(y, 0.0)  # every pre-activation negative: ReLU gives 0
    x = x.at[0, 0, 0, 0].set(jnp.nan)
    y = np.asarray(jaxcnn.conv2d_pool(x, w, b))
    assert np.isnan(y[0, 0, 0]).all() and not np.isnan(y[0, 2:, 2:]).any()


@pytest.mark.parametrize("layout", ["NCHW", "CHWN"])
def test_layouts_match_nhwc(layout):
    x, w, b = operands(7, 2, 11, 9, 6, 8)
    perm = [ "NHWC".index(d) for d in layout]
    got = jax.jit(lambda x: jaxcnn.conv2d_pool(x, w, b, pool_window=3, pool_stride=2,
                                               layout=layout))(jnp.transpose(x, perm))
    want = jaxcnn.conv2d_pool(x, w, b, pool_window=3, pool_stride=2)
    np.testing.assert_array_equal(got, jnp.transpose(want, perm))


# ---------------------------------------------------------------- validation


X, W, B = sds((2, 8, 8, 4)), sds((3, 3, 4, 8)), sds((8,))


@pytest.mark.parametrize(
    "args,kwargs,error,match",
    [
        ((sds((8, 8, 4)), W, B), {}, ValueError, "x must be rank 4"),
        ((X, sds((3, 4, 8)), B), {}, ValueError, r"w must be rank 4 \(HWIO\)"),
        ((sds((2, 8, 8, 4), jnp.int32), sds((3, 3, 4, 8), jnp.int32), None), {}, TypeError, "x dtype"),
        ((X, sds((3, 3, 4, 8), jnp.bfloat16), B), {}, TypeError, "w dtype bfloat16 must match x"),
        ((X, sds((3, 3, 5, 8)), B), {}, ValueError, r"w input channels \(5\)"),
        ((X, W, sds((7,))), {}, ValueError, r"bias must have shape \(8,\)"),
        ((X, W, sds((8,), jnp.float16)), {}, TypeError, "bias dtype"),
        ((X, W, B), dict(stride=0), ValueError, "stride must be >= 1"),
        ((X, W, B), dict(padding="FULL"), ValueError, "padding must be"),
        ((X, W, B), dict(dilation=(1, 0)), ValueError, "dilation must be >= 1"),
        ((X, W, B), dict(pool_window=0), ValueError, "pool_window must be >= 1"),
        ((X, W, B), dict(pool_window=2.0), TypeError, "pool_window must be an int"),
        ((X, W, B), dict(pool_stride=(2, 0)), ValueError, "pool_stride must be >= 1"),
        ((X, W, B), dict(pool_padding="FULL"), ValueError, "pool_padding must be"),
        ((X, W, B), dict(pool_padding=-1), ValueError, "pool_padding must be >= 0"),
        ((X, W, B), dict(pool_padding=2), ValueError, "pool_padding .* must be smaller than pool_window"),
        ((X, W, B), dict(pool_window=9), ValueError, r"pool_window \(9, 9\) does not fit"),
        ((X, W, B), dict(layout="HWCN"), ValueError, "layout must be one of"),
        ((X, W, B), dict(algorithm="winograd"), ValueError, "algorithm must be one of"),
        ((X, W, B), dict(precision="float64"), ValueError, "precision must be"),
        ((X, W, B), dict(sparse=1), TypeError, "sparse must be a bool"),
        ((X, W, B), dict(sparse=True, dilation=2), ValueError, "sparse=True takes no dilation"),
        ((X, W, B), dict(sparse=True, algorithm="direct"), ValueError, "algorithm must be 'auto'"),
    ],
)
def test_bad_arguments_raise_at_trace_time(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        jax.jit(lambda *a: jaxcnn.conv2d_pool(*a, **kwargs)).trace(*args)


def test_primitive_bind_validates_too():
    cfg = make_conv_pool_config(X.shape, W.shape)
    with pytest.raises(ValueError, match="bias must have shape"):
        jax.eval_shape(lambda *a: Conv2dPoolPrimitive.outer.bind(*a, cfg=cfg,
                                                                 operand_names=OPERAND_NAMES),
                       X, W, sds((5,)))


# ---------------------------------------------------------------- grads and vmap


def test_grads_match_unfused_composition():
    x, w, b = operands(8, 2, 9, 10, 6, 8)
    loss = lambda f: lambda x, w, b: jnp.sum(f(x, w, b) ** 2)  # noqa: E731
    kw = dict(pool_window=3, pool_stride=2, padding=1)
    got = jax.jit(jax.grad(loss(lambda *a: jaxcnn.conv2d_pool(*a, **kw)), argnums=(0, 1, 2)))(x, w, b)
    want = jax.grad(loss(lambda *a: composition(*a, precision="highest", **kw)),
                    argnums=(0, 1, 2))(x, w, b)
    for g, g_want in zip(got, want):
        np.testing.assert_allclose(g, g_want, rtol=1e-4, atol=1e-4)


def test_check_grads_numerically():
    # Large positive bias keeps ReLU inputs away from the kink; distinct random values keep
    # the pool's argmax stable under the finite-difference step.
    x, w, _ = operands(9, 1, 6, 6, 3, 4)
    f = lambda x, w: jaxcnn.conv2d_pool(x, w, jnp.full((4,), 20.0), precision="highest")  # noqa: E731
    check_grads(f, (x, w), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("in_axis", [0, 3])
def test_vmap_over_x_folds_into_batch(in_axis):
    x, w, b = operands(10, 2, 8, 6, 4, 8)
    check_folds_into_batch(lambda x: jaxcnn.conv2d_pool(x, w, b), x, in_axis,
                           primitive="jaxcnn_conv2d_pool", folded="f32[6,4,3,8]", exact=True)


def test_vmap_over_weights_and_bias():
    x, w, b = operands(11, 2, 8, 8, 4, 8)
    ws, bs = jnp.stack([w, 2 * w]), jnp.stack([b, -b])
    got = jax.jit(jax.vmap(lambda w, b: jaxcnn.conv2d_pool(x, w, b, pool_window=3, pool_stride=2)))(ws, bs)
    for i in range(2):
        np.testing.assert_array_equal(got[i], jaxcnn.conv2d_pool(x, ws[i], bs[i], pool_window=3,
                                                                 pool_stride=2))


def test_vmap_of_grad():
    x, w, b = operands(12, 1, 6, 6, 4, 4)
    xs = jnp.stack([x, -x])
    g = jax.vmap(jax.grad(lambda x: jnp.sum(jaxcnn.conv2d_pool(x, w, b) ** 2)))(xs)
    for i in range(2):
        want = jax.grad(lambda x: jnp.sum(composition(x, w, b, precision="highest") ** 2))(xs[i])
        np.testing.assert_allclose(g[i], want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- sharding

SHARDING_SCRIPT = textwrap.dedent(
    """
    import jax
    import jaxcnn
    from batch_sharding import check_forward, check_grads, check_shard_map, data_mesh, shard_batch

    k = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(k[0], (16, 11, 9, 6))
    w, b = jax.random.normal(k[1], (3, 3, 6, 8)) * 0.3, jax.random.normal(k[2], (8,)) * 0.1
    f = lambda x, w, b: jaxcnn.conv2d_pool(x, w, b, pool_window=3, pool_stride=2)
    xs = shard_batch(x, data_mesh())
    check_forward(f, x, xs, w, b, local="f32[2,5,4,8]", exact=True)
    # The weight gradient sums over the batch's 16*11*9 conv outputs (per device, then
    # all-reduced) after the forward's 3*3*6 terms.
    check_grads(f, (0, 1, 2), x, xs, w, b, n_terms=16 * 11 * 9 + 3 * 3 * 6)
    check_shard_map(f, x, xs, w, b, exact=True)
    print("SHARDING OK")
    """
)


@pytest.mark.slow
def test_batch_sharded_conv2d_pool_has_no_all_gather():
    assert "SHARDING OK" in run_on_8_host_devices(SHARDING_SCRIPT, timeout=600)


# ---------------------------------------------------------------- CUDA lowering


@pytest.fixture
def library_registered(monkeypatch):
    """Lower as if the CUDA library were loaded: the custom call is emitted at lowering time,
    the handler is only looked up when compiling for a GPU."""
    monkeypatch.setattr(library, "handlers_registered", lambda: True)


@pytest.mark.parametrize("algorithm,code", [("auto", 0), ("tensor_core", 1), ("direct", 2),
                                            ("stem", 3), ("wgmma", 4)])
def test_cuda_lowering_is_one_ffi_custom_call(library_registered, algorithm, code):
    args = (sds((2, 15, 13, 16), jnp.bfloat16), sds((3, 3, 16, 32), jnp.bfloat16),
            sds((32,), jnp.bfloat16))
    text = cuda_text(lambda *a: jaxcnn.conv2d_pool(*a, stride=(1, 2), padding=((1, 0), (2, 1)),
                                                   pool_window=3, pool_stride=2,
                                                   algorithm=algorithm), *args)
    calls = custom_calls(text, "jaxcnn_conv2d_pool_fwd")
    assert len(calls) == 1, text
    call = calls[0]
    for attr, value in [("algorithm", code), ("stride_h", 1), ("stride_w", 2), ("pad_top", 1),
                        ("pad_bottom", 0), ("pad_left", 2), ("pad_right", 1),
                        ("pool_window_h", 3), ("pool_stride_w", 2), ("pool_pad_top", 0),
                        ("precision", 0)]:
        assert re.search(rf"{attr} = {value} : i64", call), (attr, call)
    # conv output 14 x 8 -> pooled 6 x 3; the pre-pool tensor exists nowhere in the program.
    assert "tensor<2x6x3x32xbf16>" in call
    assert "convolution" not in text and "reduce_window" not in text
    assert "2x14x8x32" not in text


def test_cuda_lowering_target_is_registered_with_the_library():
    assert library.FFI_TARGETS["jaxcnn_conv2d_pool_fwd"] == "JaxcnnConv2dPoolFwd"


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window,stride", [(2, 2), (3, 2)])
def test_sparse_true_routes_to_the_zero_skipping_kernel_with_the_same_result(dtype, window, stride):
    k = jax.random.split(jax.random.PRNGKey(7), 3)
    x = jax.nn.relu(jax.random.normal(k[0], (2, 11, 9, 6))).astype(dtype)  # ~50% zeros
    w = (0.3 * jax.random.normal(k[1], (3, 3, 6, 5))).astype(dtype)
    b = (0.1 * jax.random.normal(k[2], (5,))).astype(dtype)
    kw = dict(padding=1, pool_window=window, pool_stride=stride)
    dense = jaxcnn.conv2d_pool(x, w, b, **kw)
    sparse = jaxcnn.conv2d_pool(x, w, b, sparse=True, **kw)
    assert sparse.shape == dense.shape and sparse.dtype == dense.dtype
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(sparse, np.float32), np.asarray(dense, np.float32),
                               rtol=tol, atol=tol)
    if not library.target_registered("jaxcnn_sparse_conv2d_fwd"):
        pytest.skip("library built without the sparse handler: CUDA lowering falls back")
    text = cuda_text(lambda *a: jaxcnn.conv2d_pool(*a, sparse=True, **kw), x, w, b)
    assert "jaxcnn_sparse_conv2d_fwd" in text and "jaxcnn_conv2d_pool_fwd" not in text
