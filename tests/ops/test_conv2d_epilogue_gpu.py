"""GPU: the general conv epilogue y = act(conv + bias + residual) in every conv kernel family,
each activation, with and without a residual where the family takes one, against float64
(run with `pytest -m gpu`). Shapes leave partial tiles: K off the channel tile, N*P*Q off the
pixel tile. One jit per (family, residual) computes all activations, so the suite stays fast."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcnn
from jaxcnn.ops.epilogue import ACTIVATIONS, apply_activation
from arrays import random_operands
from reference64 import conv2d_f64
from test_conv2d_layouts import from_layout, to_layout

pytestmark = pytest.mark.gpu

LEAKY_ALPHA = 0.15  # not jax.nn's default, so a dropped alpha shows

# Error of the fp32 accumulator relative to the pre-activation scale: fp32 sums of exact
# products (16-bit inputs, or fp32 at precision "highest"), or TF32 operands (10 explicit
# mantissa bits: ~2^-11 per product, summed over GEMM-K with random signs).
ACC_EPS = {"highest": 1e-5, "default": 5e-3}
# The output's one rounding: half an ulp, at most 2^-(explicit mantissa bits + 1) of the value
# (bf16 7 bits, fp16 10, fp32 23), bounded by the largest output.
OUT_EPS = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
# Largest |d act / d v| over the activations (hard_swish: (2v + 3) / 6 reaches 1.5 at v = 3):
# how much of the accumulator's error reaches the output.
MAX_SLOPE = 1.5


def reference(x, w, b, r, kw, activation):
    """float64 act(conv + bias + residual) in NHWC, and the pre-activation's max |value|."""
    plain = {k: v for k, v in kw.items() if k in ("stride", "padding", "dilation", "groups")}
    pre = conv2d_f64(x, w, b, **plain)
    if r is not None:
        pre = pre + np.asarray(r, np.float64)
    with jax.enable_x64(True):
        cpu = jax.devices("cpu")[0]
        out = apply_activation(jax.device_put(pre, cpu), activation,
                               LEAKY_ALPHA if activation == "leaky_relu" else 0.0)
        return np.asarray(out, np.float64), float(np.max(np.abs(pre)))


def run_all_activations(x, w, b, r, kw):
    """jaxcnn.conv2d for every activation, one jit: {activation: output in kw's layout}."""
    layout = kw.get("layout", "NHWC")

    def convs(x, w, b, r):
        return {
            str(a): jaxcnn.conv2d(x, w, b, residual=r, activation=a,
                                  alpha=LEAKY_ALPHA if a == "leaky_relu" else None, **kw)
            for a in ACTIVATIONS
        }

    r_in = None if r is None else to_layout(r, layout)
    return jax.jit(convs)(to_layout(x, layout), w, b, r_in)


def check_family(x_shape, w_shape, dtype, kw, residual, seed=0):
    precision = kw.setdefault("precision", "highest")
    x, w, b = random_operands(seed, x_shape, w_shape, dtype)
    y_shape = jax.eval_shape(lambda x, w: jaxcnn.conv2d(x, w, **{**kw, "layout": "NHWC",
                                                                    "algorithm": "auto"}),
                             x, w).shape
    r = (jax.random.normal(jax.random.PRNGKey(seed + 1), y_shape, jnp.float32).astype(dtype)
         if residual else None)
    outs = run_all_activations(x, w, b, r, kw)
    layout = kw.get("layout", "NHWC")
    for activation in ACTIVATIONS:
        out = outs[str(activation)]
        assert out.dtype == jnp.dtype(dtype)
        got = np.asarray(from_layout(out, layout), np.float64)
        assert not np.isnan(got).any(), f"{activation}: NaN in the output"
        want, pre_scale = reference(x, w, b, r, kw, activation)
        out_scale = float(np.max(np.abs(want)))
        allowed = MAX_SLOPE * ACC_EPS[precision] * pre_scale + OUT_EPS[dtype] * out_scale
        err = float(np.max(np.abs(got - want)))
        assert err <= allowed, (f"{kw.get('algorithm')} {dtype} {activation} residual={residual}:"
                                f" max err {err:.3e} > {allowed:.3e} (pre-activation scale "
                                f"{pre_scale:.2f}, output scale {out_scale:.2f})")


RESIDUAL = [False, True]


# direct (CUDA-core implicit GEMM): K = 10 and N*P*Q = 126 leave partial 64-wide tiles.
@pytest.mark.parametrize("residual", RESIDUAL)
@pytest.mark.parametrize("layout", ["NHWC", "NCHW", "CHWN"])
def test_direct(layout, residual):
    check_family((2, 9, 7, 6), (3, 3, 6, 10), "float32",
                 dict(layout=layout, algorithm="direct", stride=1, padding="SAME"), residual)


@pytest.mark.parametrize("residual", RESIDUAL)
def test_direct_bf16_grouped(residual):
    check_family((2, 9, 7, 6), (3, 3, 3, 10), "bfloat16",
                 dict(algorithm="direct", groups=2, stride=2), residual)


# depthwise: NHWC runs the channel-last kernel (4-wide vectors at C = 24), NCHW the plane kernel.
@pytest.mark.parametrize("residual", RESIDUAL)
@pytest.mark.parametrize("layout,dtype", [("NHWC", "bfloat16"), ("NCHW", "float32"),
                                          ("CHWN", "float16")])
def test_depthwise(layout, dtype, residual):
    check_family((2, 13, 11, 24), (3, 3, 1, 24), dtype,
                 dict(layout=layout, algorithm="depthwise", groups=24), residual)


# tensor_core: K = 72 (a 64-wide channel tile and a partial one), N*P*Q = 286.
@pytest.mark.parametrize("residual", RESIDUAL)
@pytest.mark.parametrize("dtype,precision", [("bfloat16", "highest"), ("float16", "highest"),
                                             ("float32", "default"), ("float32", "highest")])
def test_tensor_core(dtype, precision, residual):
    check_family((2, 11, 13, 32), (3, 3, 32, 72), dtype,
                 dict(algorithm="tensor_core", precision=precision), residual)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_tensor_core_residual_wide_tile(dtype):
    """Enough 128x128 tiles to fill an H100/H200 (N*P*Q = 18432, K = 136): the residual runs on
    the wide (pp_128x128) residual variant."""
    check_family((8, 48, 48, 32), (1, 1, 32, 136), dtype, dict(algorithm="tensor_core"), True)


# wgmma: 3x3/1 SAME, 16-bit, C % 32, K % 64; a 14x12 image leaves partial pixel tiles.
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_wgmma(dtype):
    check_family((2, 14, 12, 32), (3, 3, 32, 64), dtype, dict(algorithm="wgmma"), False)


# stem: C = 3 (GEMM-K = 27), K = 24 (a partial 64-channel block), N*P*Q = 144.
@pytest.mark.parametrize("dtype,precision", [("bfloat16", "highest"), ("float32", "default")])
def test_stem(dtype, precision):
    check_family((2, 17, 15, 3), (3, 3, 3, 24), dtype,
                 dict(algorithm="stem", stride=2, padding=1, precision=precision), False)


@pytest.mark.parametrize("algorithm,x_shape,w_shape,kw", [
    ("wgmma", (2, 14, 12, 32), (3, 3, 32, 64), {}),
    ("stem", (2, 17, 15, 3), (3, 3, 3, 24), dict(stride=2, padding=1)),
])
def test_families_without_residual_refuse_it(algorithm, x_shape, w_shape, kw):
    x, w, b = random_operands(3, x_shape, w_shape, "bfloat16")
    y = jax.eval_shape(lambda x, w: jaxcnn.conv2d(x, w, **kw), x, w)
    r = jnp.zeros(y.shape, y.dtype)
    with pytest.raises(ValueError, match="no residual"):
        jax.jit(lambda x, w, b, r: jaxcnn.conv2d(x, w, b, residual=r, algorithm=algorithm,
                                                 activation="relu", **kw))(x, w, b, r)


@pytest.mark.parametrize("x_shape,w_shape,kw", [
    ((2, 14, 16, 32), (3, 3, 32, 64), {}),                   # wgmma's shape family
    ((2, 17, 15, 3), (3, 3, 3, 24), dict(stride=2, padding=1)),  # the stem's
])
def test_auto_with_residual_avoids_families_without_one(x_shape, w_shape, kw):
    check_family(x_shape, w_shape, "bfloat16", dict(kw, algorithm="auto"), True)
