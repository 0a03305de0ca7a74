"""GPU suite: every conv2d kernel family x layout x dtype x precision against float64, with
NaN-poisoned outputs (run with `pytest -m gpu`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcnn
from arrays import random_operands
from reference64 import TF32_TOLERANCE, TOLERANCE, conv2d_f64, rel_err
from test_conv2d_gpu import run_poisoned
from test_conv2d_layouts import from_layout, to_layout

pytestmark = pytest.mark.gpu

DEPTHWISE = [
    ((2, 17, 15, 32), (3, 3, 1, 32), dict()),
    ((1, 28, 28, 96), (3, 3, 1, 96), dict(stride=2, activation="relu")),
    ((3, 13, 11, 5), (5, 5, 1, 10), dict(groups=5, padding=((1, 3), (2, 2)))),  # multiplier 2
    ((2, 9, 14, 16), (7, 7, 1, 16), dict(dilation=2)),
    ((4, 7, 7, 960), (3, 3, 1, 960), dict()),
]
DENSE = [
    ((2, 17, 15, 3), (7, 7, 3, 16), dict(stride=2, padding=3)),  # stem, C=3
    ((4, 28, 28, 64), (1, 1, 64, 96), dict(activation="relu")),   # 1x1
    ((1, 56, 56, 128), (3, 3, 128, 256), dict()),                 # VGG c3_1, batch 1
    ((2, 27, 27, 96), (5, 5, 96, 256), dict(padding=2)),          # AlexNet c2
    ((3, 15, 15, 16), (3, 3, 16, 64), dict(activation="relu")),   # fire expand 3x3
    ((1, 7, 9, 136), (3, 3, 136, 72), dict(stride=(2, 1), padding=((0, 2), (1, 1)))),
    ((2, 14, 13, 64), (3, 3, 64, 64), dict(dilation=2)),
]


def check(x, w, b, dtype, kw, precision="highest"):
    layout = kw.get("layout", "NHWC")
    plain = {k: v for k, v in kw.items() if k not in ("layout", "algorithm")}
    want = conv2d_f64(x, w, b, **plain)
    out = run_poisoned(to_layout(x, layout), w, b, precision=precision, **kw)
    assert out.dtype == jnp.dtype(dtype)
    tol = TF32_TOLERANCE if (dtype == "float32" and precision == "default") else TOLERANCE[dtype]
    err = rel_err(from_layout(out, layout), want)
    assert err <= tol, f"rel err {err:.2e} > {tol:.0e}"


def check_forced_and_auto(x, w, b, dtype, kw, algorithm):
    """check() with `algorithm` forced and with "auto", each with and without the bias."""
    for algo in (algorithm, "auto"):
        for bias in (b, None):
            check(x, w, bias, dtype, dict(kw, algorithm=algo))


@pytest.mark.parametrize("layout", ["NHWC", "NCHW", "CHWN"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("x_shape,w_shape,kw", DEPTHWISE)
def test_depthwise_kernel(layout, dtype, x_shape, w_shape, kw):
    x, w, b = random_operands(21, x_shape, w_shape, dtype)
    kw = dict(groups=x_shape[3], **kw) if "groups" not in kw else kw
    check_forced_and_auto(x, w, b, dtype, dict(kw, layout=layout), "depthwise")


@pytest.mark.parametrize("layout", ["NHWC", "NCHW", "CHWN"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("x_shape,w_shape,kw", DENSE)
def test_direct_kernel_layouts(layout, dtype, x_shape, w_shape, kw):
    x, w, b = random_operands(22, x_shape, w_shape, dtype)
    check(x, w, b, dtype, dict(kw, layout=layout, algorithm="direct"))


@pytest.mark.parametrize("dtype,precision", [("bfloat16", "default"), ("float16", "default"),
                                             ("float32", "default"), ("float32", "highest")])
@pytest.mark.parametrize("x_shape,w_shape,kw", DENSE)
def test_auto_choice_all_precisions(dtype, precision, x_shape, w_shape, kw):
    """"auto" runs the tensor-core family where it applies: TF32 for fp32 default,
    fp32-accurate (3xTF32) for highest."""
    x, w, b = random_operands(23, x_shape, w_shape, dtype)
    for bias in (b, None):
        check(x, w, bias, dtype, dict(kw, algorithm="auto"), precision=precision)


def test_depthwise_grad_and_vmap_on_gpu():
    x, w, b = random_operands(24, (3, 12, 12, 8), (3, 3, 1, 8))
    f = lambda x, w, b: jnp.sum(jaxcnn.conv2d(x, w, b, groups=8, activation="relu") ** 2)  # noqa: E731
    g = lambda x, w, b: jnp.sum(jax.nn.relu(jax.lax.conv_general_dilated(  # noqa: E731
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=8,
        precision=jax.lax.Precision.HIGHEST) + b) ** 2)
    for got, want in zip(jax.grad(f, (0, 1, 2))(x, w, b), jax.grad(g, (0, 1, 2))(x, w, b)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    per = jax.vmap(lambda xi: jaxcnn.conv2d(xi[None], w, b, groups=8))(x)[:, 0]
    np.testing.assert_allclose(per, jaxcnn.conv2d(x, w, b, groups=8), rtol=1e-6, atol=1e-6)


def _hopper():
    return str(getattr(jax.devices()[0], "compute_capability", "")).startswith("9.")


# The wgmma kernel's family without a pool: 3x3/1 SAME, C % 32, K % 64; odd extents and partial
# tiles, every tile configuration (28/32/14-row and 16x16 tiles by K and image size), VGG-19.
WGMMA = [
    ((2, 13, 11, 32), (3, 3, 32, 64)),
    ((1, 30, 22, 96), (3, 3, 96, 128)),
    ((3, 9, 41, 64), (3, 3, 64, 192)),
    ((1, 14, 14, 512), (3, 3, 512, 512)),   # VGG c5_x, N=1
    ((4, 56, 56, 128), (3, 3, 128, 256)),   # VGG c3_1
    ((2, 112, 112, 64), (3, 3, 64, 128)),   # VGG c2_1
]


@pytest.mark.skipif(not _hopper(), reason="the wgmma kernel is sm_90 only")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("activation", ["relu", None])
@pytest.mark.parametrize("x_shape,w_shape", WGMMA)
def test_wgmma_kernel_unpooled(x_shape, w_shape, activation, dtype):
    x, w, b = random_operands(25, x_shape, w_shape, dtype)
    check_forced_and_auto(x, w, b, dtype, dict(padding="SAME", activation=activation), "wgmma")


@pytest.mark.skipif(not _hopper(), reason="the wgmma kernel is sm_90 only")
def test_wgmma_kernel_refusals_name_the_reason():
    x, w, b = random_operands(26, (1, 16, 16, 32), (3, 3, 32, 64), "float32")
    with pytest.raises(ValueError, match="wgmma kernel: bfloat16 / float16 only"):
        jaxcnn.conv2d(x, w, b, algorithm="wgmma")
    x, w, b = random_operands(26, (1, 16, 16, 32), (3, 3, 32, 64), "bfloat16")
    with pytest.raises(ValueError, match="3x3 conv, stride 1, padding 1"):
        jaxcnn.conv2d(x, w, b, stride=2, algorithm="wgmma")
    with pytest.raises(ValueError, match="NHWC only"):
        jaxcnn.conv2d(jnp.transpose(x, (0, 3, 1, 2)), w, b, layout="NCHW", algorithm="wgmma")
    x, w, b = random_operands(26, (1, 16, 16, 32), (3, 3, 32, 72), "bfloat16")
    with pytest.raises(ValueError, match="K must be a multiple of 64"):
        jaxcnn.conv2d(x, w, b, algorithm="wgmma")


@pytest.mark.skipif(not _hopper(), reason="the wgmma kernel is sm_90 only")
def test_wgmma_grad_and_vmap():
    x, w, b = random_operands(27, (2, 12, 12, 32), (3, 3, 32, 64), "bfloat16")
    f = lambda x, w, b: jnp.sum(jaxcnn.conv2d(x, w, b, activation="relu", algorithm="wgmma")  # noqa: E731
                                .astype(jnp.float32) ** 2)
    g = lambda x, w, b: jnp.sum(jaxcnn.conv2d(x, w, b, activation="relu", algorithm="xla")  # noqa: E731
                                .astype(jnp.float32) ** 2)
    for got, want in zip(jax.grad(f, (0, 1, 2))(x, w, b), jax.grad(g, (0, 1, 2))(x, w, b)):
        assert rel_err(np.asarray(got, np.float64), np.asarray(want, np.float64)) <= 2e-2
    per = jax.vmap(lambda xi: jaxcnn.conv2d(xi[None], w, b, algorithm="wgmma"))(x)[:, 0]
    np.testing.assert_array_equal(np.asarray(per, np.float32),
                                  np.asarray(jaxcnn.conv2d(x, w, b, algorithm="wgmma"), np.float32))


# The stem kernel without its pool: few input channels (an image), strides, any GPU it runs on.
STEM = [
    ((2, 224, 224, 3), (3, 3, 3, 64), dict(padding="SAME")),          # VGG c1_1
    ((1, 37, 41, 3), (7, 7, 3, 64), dict(stride=2, padding=3)),       # ResNet-style stem
    ((3, 19, 23, 1), (5, 5, 1, 16), dict(padding="VALID")),           # LeNet-style
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("x_shape,w_shape,kw", STEM)
def test_stem_kernel_unpooled(x_shape, w_shape, kw, dtype):
    x, w, b = random_operands(28, x_shape, w_shape, dtype)
    check_forced_and_auto(x, w, b, dtype, dict(kw, activation="relu"), "stem")


def test_stem_kernel_refusals_name_the_reason():
    x, w, b = random_operands(29, (1, 16, 16, 3), (3, 3, 3, 64), "bfloat16")
    residual = jnp.zeros((1, 16, 16, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="stem kernel: no residual"):
        jaxcnn.conv2d(x, w, b, residual=residual, activation="relu", algorithm="stem")
    x, w, b = random_operands(29, (1, 16, 16, 64), (3, 3, 64, 64), "bfloat16")
    with pytest.raises(ValueError, match="GEMM-K = R\\*S\\*C above 512"):
        jaxcnn.conv2d(x, w, b, activation="relu", algorithm="stem")
