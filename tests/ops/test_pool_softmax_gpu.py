"""GPU suite for the pooling and softmax kernels: NaN-poisoned outputs, odd shapes, every
dtype and layout, NaN/Inf propagation, against float64 oracles and XLA (`pytest -m gpu`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from jax import lax

import jaxcnn
from arrays import as_f64, random_x
from poisoned_output import run_poisoned
from pool_oracle import FROM_NHWC, TOL, pool_f64, softmax_f64, to_layout
from test_pool2d import fits, pool_cases, run_pool

pytestmark = pytest.mark.gpu

LAYOUTS = ("NHWC", "NCHW", "CHWN")
DTYPES = ("float32", "bfloat16", "float16")


# ---------------------------------------------------------------- pooling


def pool_target(mode):
    return f"jaxcnn_{mode}_pool2d_fwd"


def check_pool(x, case, dtype):
    out = run_poisoned(lambda x: run_pool(x, case), x, target=pool_target(case["mode"]))
    assert out.dtype == x.dtype
    want = pool_f64(as_f64(x), case["layout"], case["mode"], case["window"], case["stride"],
                    case["padding"], case.get("count_include_pad", True))
    assert out.shape == want.shape
    if case["mode"] == "max":  # max is exact in every dtype
        np.testing.assert_array_equal(as_f64(out), want)
    else:
        np.testing.assert_allclose(as_f64(out), want, equal_nan=True, **TOL[dtype])


@settings(max_examples=40, deadline=None)
@given(pool_cases())
def test_pool_kernels_random_shapes(case):
    if not fits(case):
        return
    check_pool(random_x(case["seed"], case["shape"]), case, "float32")


# (NHWC-logical shape, window, stride, padding): CNN pool layers at small batch plus shapes
# that hit each kernel path (vector widths, NCHW plane/row tiles, NCHW fallback).
POOL_LAYERS = [
    ((2, 112, 112, 64), 2, 2, "VALID"),          # VGG: 16-byte vectors, NCHW row tiles
    ((2, 55, 55, 96), 3, 2, "VALID"),            # AlexNet/SqueezeNet: odd rows, overlap
    ((3, 27, 27, 256), 3, 2, "VALID"),           # NCHW whole-plane tiles, misaligned rows
    ((2, 28, 28, 48), 3, 1, 1),                  # GoogLeNet inception branch pool
    ((2, 14, 14, 52), 3, 2, "SAME"),             # GoogLeNet 3x3/2 SAME (asymmetric pad)
    ((5, 7, 7, 36), 7, 1, "VALID"),              # global avg pool, C % 8 != 0
    ((1, 9, 300, 3), (2, 3), (1, 2), ((1, 0), (2, 1))),  # C = 3: scalar loads
    ((7, 6, 5, 3), 4, 1, ((3, 3), (3, 3))),     # windows entirely in padding, N odd
    ((2, 5, 13000, 2), 3, 2, 1),                 # NCHW rows too long to stage: fallback
    ((1, 33, 35, 1), (5, 2), (3, 4), "SAME"),    # generic window, strides > window
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("nhwc,window,stride,padding", POOL_LAYERS)
def test_pool_layers_all_dtypes_layouts(dtype, layout, nhwc, window, stride, padding):
    x = to_layout(np.asarray(random_x(21, nhwc, dtype)), layout)
    x = jnp.asarray(x)
    for mode, flags in (("max", [True]), ("avg", [True, False])):
        for include in flags:
            case = dict(layout=layout, mode=mode, window=window, stride=stride, padding=padding,
                        count_include_pad=include)
            check_pool(x, case, dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pool_nan_and_inf_propagate_like_xla(layout):
    nhwc = random_x(22, (2, 12, 12, 16))
    nhwc = (nhwc.at[0, 2, 2, 1].set(jnp.nan).at[1, 8, 8, 3].set(jnp.inf)
            .at[1, 0, 11, 5].set(-jnp.inf).at[0, 5, 5, 9].set(jnp.nan))
    x = jnp.transpose(nhwc, FROM_NHWC[layout])
    h, w = layout.index("H"), layout.index("W")
    dims, strides, pads = [1] * 4, [1] * 4, [(0, 0)] * 4
    dims[h] = dims[w] = 3
    strides[h] = strides[w] = 2
    pads[h] = pads[w] = (1, 1)
    for mode, pool in (("max", jaxcnn.max_pool2d), ("avg", jaxcnn.avg_pool2d)):
        ours = np.asarray(pool(x, 3, 2, padding=1, layout=layout))
        init, op = (-jnp.inf, lax.max) if mode == "max" else (0.0, lax.add)
        xla = np.asarray(jax.jit(lambda x: lax.reduce_window(x, init, op, dims, strides, pads))(x))
        for check in (np.isnan, np.isposinf, np.isneginf):
            np.testing.assert_array_equal(check(ours), check(xla))
        assert np.isnan(ours).sum() >= 2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pool_matches_xla_reduce_window(layout):
    x = jnp.transpose(random_x(23, (4, 56, 56, 64), jnp.bfloat16), FROM_NHWC[layout])
    h, w = layout.index("H"), layout.index("W")
    dims, strides = [1] * 4, [1] * 4
    dims[h] = dims[w] = 3
    strides[h] = strides[w] = 2
    xla = jax.jit(lambda x: lax.reduce_window(x, -jnp.inf, lax.max, dims, strides, "VALID"))(x)
    np.testing.assert_array_equal(jaxcnn.max_pool2d(x, 3, 2, layout=layout), xla)


def test_pool_is_deterministic():
    x = random_x(24, (3, 5, 31, 29), jnp.bfloat16)
    f = jax.jit(lambda x: jaxcnn.avg_pool2d(x, 3, 2, padding="SAME", layout="NCHW"))
    np.testing.assert_array_equal(f(x), f(x))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pool_grad_through_kernel_matches_xla(layout):
    x = jnp.transpose(random_x(25, (2, 12, 11, 6)), FROM_NHWC[layout])
    h, w = layout.index("H"), layout.index("W")
    dims, strides = [1] * 4, [1] * 4
    dims[h] = dims[w] = 3
    strides[h] = strides[w] = 2
    ours = jax.jit(jax.grad(lambda x: jnp.sum(jaxcnn.max_pool2d(x, 3, 2, layout=layout) ** 2)))(x)
    want = jax.jit(jax.grad(lambda x: jnp.sum(
        lax.reduce_window(x, -jnp.inf, lax.max, dims, strides, "VALID") ** 2)))(x)
    np.testing.assert_allclose(ours, want, rtol=1e-6, atol=1e-6)


def test_pool_vmap_on_gpu():
    x = random_x(26, (3, 2, 4, 9, 9))  # vmapped over a CHWN stack
    out = jax.jit(jax.vmap(lambda x: jaxcnn.avg_pool2d(x, 2, 1, layout="CHWN"), in_axes=3))(
        jnp.moveaxis(x, 0, 3))
    for i in range(3):
        want = pool_f64(np.asarray(x[i]), "CHWN", "avg", 2, 1, "VALID")
        np.testing.assert_allclose(out[i], want, **TOL["float32"])


def test_pool_handler_errors_become_python_exceptions():
    x = random_x(27, (1, 8, 8, 4))
    call = jax.ffi.ffi_call("jaxcnn_max_pool2d_fwd", jax.ShapeDtypeStruct((1, 4, 4, 4), x.dtype))
    attrs = dict(window_h=np.int64(2), window_w=np.int64(2), stride_h=np.int64(2),
                 stride_w=np.int64(2), pad_top=np.int64(0), pad_bottom=np.int64(0),
                 pad_left=np.int64(0), pad_right=np.int64(0))
    with pytest.raises(Exception, match="layout"):
        jax.block_until_ready(jax.jit(lambda x: call(x, layout=np.int64(7), **attrs))(x))
    bad_shape = jax.ffi.ffi_call("jaxcnn_max_pool2d_fwd", jax.ShapeDtypeStruct((1, 3, 4, 4), x.dtype))
    with pytest.raises(Exception, match="does not match"):
        jax.block_until_ready(jax.jit(lambda x: bad_shape(x, layout=np.int64(0), **attrs))(x))
    np.testing.assert_array_equal(jaxcnn.max_pool2d(x, 2), pool_f64(np.asarray(x), "NHWC", "max", 2, None, "VALID"))


# ---------------------------------------------------------------- softmax

# Row lengths around every kernel switch: warp rows (<= 1024 fp32 / bf16 elements in
# registers), CTA rows (<= 32768), online two-pass rows (> 32768), odd lengths (scalar loads).
SOFTMAX_COLS = [1, 2, 7, 31, 32, 33, 100, 255, 256, 1000, 1001, 1024, 1025, 2048, 4095, 4096,
                8000, 16384, 32767, 32768, 32769, 40000, 65536]


def check_softmax(x, log, dtype):
    fn = jaxcnn.log_softmax if log else jaxcnn.softmax
    out = run_poisoned(fn, x, target="jaxcnn_softmax_fwd")
    assert out.dtype == x.dtype and out.shape == x.shape
    want = softmax_f64(as_f64(x), -1, log)
    tol = dict(TOL[dtype])
    if log:  # log-probabilities are O(log cols): one rounding relative to that
        tol["atol"] = tol["rtol"] * max(1.0, float(np.abs(want).max()))
    elif dtype == "float32":
        tol = dict(rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(as_f64(out), want, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", SOFTMAX_COLS)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_row_lengths_all_dtypes(dtype, cols, log):
    rows = 37 if cols <= 4096 else 5
    check_softmax(random_x(31, (rows, cols), dtype, scale=4.0), log, dtype)


@pytest.mark.parametrize("shape", [(1, 1000), (64, 1000), (256, 1000), (3, 4, 5, 77), (100003, 3),
                                   (2, 100003)])
def test_softmax_shapes(shape):
    for log in (False, True):
        check_softmax(random_x(32, shape, jnp.bfloat16, scale=4.0), log, "bfloat16")


@pytest.mark.parametrize("cols", [10, 1000, 5000, 40000])
def test_softmax_nan_and_inf_rows_like_xla(cols):
    x = random_x(33, (5, cols), scale=3.0)
    x = (x.at[0, cols // 2].set(jnp.nan).at[1, cols - 1].set(jnp.inf)
         .at[2].set(-jnp.inf).at[3, 0].set(-jnp.inf))
    for log, ref in ((False, jax.nn.softmax), (True, jax.nn.log_softmax)):
        ours = np.asarray((jaxcnn.log_softmax if log else jaxcnn.softmax)(x))
        xla = np.asarray(jax.jit(ref)(x))
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(xla))
        np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(xla))
        assert np.isnan(ours[:3]).all()
        np.testing.assert_allclose(ours[3:], xla[3:], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_matches_xla(log):
    x = random_x(34, (256, 1000), scale=5.0)
    ref = jax.nn.log_softmax if log else jax.nn.softmax
    ours = (jaxcnn.log_softmax if log else jaxcnn.softmax)(x)
    # log_softmax near 0 is (x - max) - log(sum): rounding of terms of size |x| (~20) in fp32.
    np.testing.assert_allclose(ours, jax.jit(ref)(x), rtol=2e-5, atol=4e-6)


def test_softmax_grad_and_vmap_on_gpu():
    x = random_x(35, (3, 16, 300))
    cot = random_x(36, x.shape)
    ours = jax.jit(jax.grad(lambda x: jnp.sum(jaxcnn.softmax(x, axis=1) * cot)))(x)
    want = jax.jit(jax.grad(lambda x: jnp.sum(jax.nn.softmax(x, axis=1) * cot)))(x)
    np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-7)
    out = jax.jit(jax.vmap(jaxcnn.log_softmax, in_axes=2))(x)
    np.testing.assert_allclose(out, jnp.moveaxis(jax.nn.log_softmax(x, axis=1), 2, 0), rtol=1e-5, atol=1e-6)


def test_softmax_is_deterministic():
    x = random_x(37, (64, 40000), jnp.bfloat16)
    f = jax.jit(jaxcnn.softmax)
    np.testing.assert_array_equal(f(x), f(x))
