"""jaxcnn.conv3x3_conv1x1 and jaxcnn.conv1x1_depthwise on the reference (CPU) path: equal to a
float64 NumPy oracle on random (odd, N = 1, strided) shapes for every activation and dtype,
grads against a plain lax composition, vmap, validation errors naming the argument, NaN
propagation, the fused-kernel rules, and the CUDA lowering text (one FFI custom call for
bf16/fp16 shapes the kernel runs -- for conv3x3_conv1x1 only with algorithm="fused" -- XLA's
convs otherwise). Batch sharding: test_sharding.py."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

import jaxcnn
from jaxcnn._native import library
from jaxcnn.ops import primitive
from jaxcnn.ops.chain import config as chain_config
from arrays import BAD_NHWC_X, as_f64, check_trace_raises, he_normal, normal, sds
from cuda_lowering import cuda_text, custom_calls, needs_library
from reference64 import ALLCLOSE_TOL as TOL
from vmap_batching import check_folds_into_batch

DTYPES = ("float32", "bfloat16", "float16")
ACTS = (None, "relu", "relu6")
# Every activation in both positions (the hypothesis test draws any pair).
ACT_PAIRS = [("relu", "relu"), (None, "relu"), ("relu", "relu6"), ("relu6", None)]
C3C1_TARGET = "jaxcnn_conv3x3_conv1x1_fwd"
C1DW_TARGET = "jaxcnn_conv1x1_depthwise_fwd"


def c3c1_operands(seed, n, h, w, c, m, k, dtype=jnp.float32):
    """(x, w3, w1, b3, b1), the public argument order; x scaled so relu6 clamps somewhere."""
    ks = jax.random.split(jax.random.PRNGKey(seed), 5)
    return (normal(ks[0], (n, h, w, c), 3.0, dtype), he_normal(ks[1], (3, 3, c, m), dtype),
            he_normal(ks[2], (1, 1, m, k), dtype), normal(ks[3], (m,), 0.5, dtype),
            normal(ks[4], (k,), 0.5, dtype))


def c1dw_operands(seed, n, h, w, c, m, dtype=jnp.float32):
    """(x, w1, wd, b1, bd), the public argument order."""
    ks = jax.random.split(jax.random.PRNGKey(seed), 5)
    return (normal(ks[0], (n, h, w, c), 3.0, dtype), he_normal(ks[1], (1, 1, c, m), dtype),
            he_normal(ks[2], (3, 3, 1, m), dtype), normal(ks[3], (m,), 0.5, dtype),
            normal(ks[4], (m,), 0.5, dtype))


def assert_close(got, want, dtype):
    """TOL[dtype] with atol relative to the largest |want|: where two computations round the
    intermediate t to neighbouring values, outputs move by ulp(t) * |w|, whatever their size."""
    got, want = as_f64(got), as_f64(want)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    tol = TOL[jnp.dtype(dtype).name]
    np.testing.assert_allclose(got, want, rtol=tol["rtol"], atol=tol["atol"] * scale)


def _act64(v, act):
    if act is None:
        return v
    v = np.maximum(v, 0.0)  # np.maximum / np.minimum propagate NaN, as lax's do
    return np.minimum(v, 6.0) if act == "relu6" else v


def _round_to(v, dtype):
    """float64 -> dtype -> float64: the intermediate's one rounding."""
    return as_f64(jnp.asarray(v, jnp.float32).astype(dtype))


def _taps64(t, tap, stride, p, q):
    """Sum over the 3x3 taps of the zero-padded t of tap(slice, dy, dx), each slice the [N, P, Q, C]
    pixels that tap reads."""
    tp = np.pad(t, ((0, 0), (1, 1), (1, 1), (0, 0)))
    return sum(tap(tp[:, dy:dy + stride * (p - 1) + 1:stride, dx:dx + stride * (q - 1) + 1:stride], dy, dx)
               for dy in range(3) for dx in range(3))


def c3c1_oracle(x, w3, w1, b3, b1, activations=("relu", "relu")):
    """Independent float64 NumPy conv3x3 -> conv1x1; t rounded to x's dtype."""
    dtype = x.dtype
    x, w3, w1, b3, b1 = (as_f64(a) for a in (x, w3, w1, b3, b1))
    _, h, w, _ = x.shape
    t = _taps64(x, lambda s, dy, dx: s @ w3[dy, dx], 1, h, w)
    t = _round_to(_act64(t + b3, activations[0]), dtype)
    return _act64(t @ w1[0, 0] + b1, activations[1])


def c1dw_oracle(x, w1, wd, b1, bd, stride=1, activations=("relu", "relu")):
    """Independent float64 NumPy conv1x1 -> depthwise3x3 (stride, pad 1); t rounded."""
    dtype = x.dtype
    x, w1, wd, b1, bd = (as_f64(a) for a in (x, w1, wd, b1, bd))
    _, h, w, _ = x.shape
    t = _round_to(_act64(x @ w1[0, 0] + b1, activations[0]), dtype)
    p, q = (h - 1) // stride + 1, (w - 1) // stride + 1
    y = _taps64(t, lambda s, dy, dx: s * wd[dy, dx, 0], stride, p, q)
    return _act64(y + bd, activations[1])


def _lax_act(v, act):
    return {None: lambda v: v, "relu": jax.nn.relu, "relu6": jax.nn.relu6}[act](v)


def _lax_conv(x, w, stride=1, padding="VALID", groups=1):
    return jax.lax.conv_general_dilated(x, w, (stride, stride), padding,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        feature_group_count=groups, precision="highest")


def c3c1_lax(x, w3, w1, b3, b1, activations=("relu", "relu")):
    """The unfused float32 layers as a JAX user writes them."""
    t = _lax_act(_lax_conv(x, w3, padding=((1, 1), (1, 1))) + b3, activations[0])
    return _lax_act(_lax_conv(t, w1) + b1, activations[1])


def c1dw_lax(x, w1, wd, b1, bd, stride=1, activations=("relu", "relu")):
    t = _lax_act(_lax_conv(x, w1) + b1, activations[0])
    y = _lax_conv(t, wd, stride, ((1, 1), (1, 1)), groups=wd.shape[3])
    return _lax_act(y + bd, activations[1])


# ---------------------------------------------------------------- values against the oracle

# (n, h, w, c, m, k): odd sizes, N = 1, 1x1 images, single channels.
C3C1_SHAPES = [(2, 7, 5, 8, 16, 8), (1, 9, 11, 3, 5, 7), (3, 1, 1, 4, 2, 3), (1, 6, 13, 16, 24, 40),
               (2, 4, 4, 1, 1, 1)]
# (n, h, w, c, m, stride): stride 2 over even and odd sizes.
C1DW_SHAPES = [(2, 7, 5, 8, 16, 1), (1, 9, 11, 3, 5, 2), (2, 8, 6, 16, 24, 2), (3, 1, 1, 4, 2, 2),
               (1, 2, 3, 5, 7, 2), (1, 10, 9, 8, 8, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("acts", ACT_PAIRS)
@pytest.mark.parametrize("shape", C3C1_SHAPES)
def test_conv3x3_conv1x1_matches_float64_oracle(shape, acts, dtype):
    n, h, w, c, m, k = shape
    ops = c3c1_operands(sum(shape), *shape, jnp.dtype(dtype))
    got = jax.jit(lambda *a: jaxcnn.conv3x3_conv1x1(*a, activations=acts))(*ops)
    assert got.shape == (n, h, w, k) and got.dtype == jnp.dtype(dtype)
    assert_close(got, c3c1_oracle(*ops, activations=acts), dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("acts", ACT_PAIRS)
@pytest.mark.parametrize("shape", C1DW_SHAPES)
def test_conv1x1_depthwise_matches_float64_oracle(shape, acts, dtype):
    n, h, w, c, m, stride = shape
    ops = c1dw_operands(sum(shape), n, h, w, c, m, jnp.dtype(dtype))
    got = jax.jit(lambda *a: jaxcnn.conv1x1_depthwise(*a, stride=stride, activations=acts))(*ops)
    assert got.shape == (n, (h - 1) // stride + 1, (w - 1) // stride + 1, m)
    assert got.dtype == jnp.dtype(dtype)
    assert_close(got, c1dw_oracle(*ops, stride, acts), dtype)


def test_relu6_clamps_and_float32_equals_lax_layers():
    ops = c3c1_operands(1, 2, 9, 7, 8, 16, 8)
    got = jaxcnn.conv3x3_conv1x1(*ops, activations=("relu6", "relu6"))
    assert float(jnp.max(got)) == 6.0 and float(jnp.min(got)) == 0.0  # both clamps were hit
    np.testing.assert_allclose(got, c3c1_lax(*ops, ("relu6", "relu6")), **TOL["float32"])
    ops = c1dw_operands(2, 2, 9, 7, 8, 16)
    got = jaxcnn.conv1x1_depthwise(*ops, stride=2, activations=("relu6", "relu6"))
    assert float(jnp.max(got)) == 6.0
    np.testing.assert_allclose(got, c1dw_lax(*ops, 2, ("relu6", "relu6")), **TOL["float32"])


@st.composite
def chain_cases(draw):
    return dict(n=draw(st.integers(1, 3)), h=draw(st.integers(1, 12)), w=draw(st.integers(1, 12)),
                c=draw(st.integers(1, 24)), m=draw(st.integers(1, 24)), k=draw(st.integers(1, 24)),
                stride=draw(st.sampled_from([1, 2])), acts=(draw(st.sampled_from(ACTS)),
                                                            draw(st.sampled_from(ACTS))),
                dtype=draw(st.sampled_from(DTYPES)), seed=draw(st.integers(0, 2**16)))


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(chain_cases())
def test_random_shapes_match_float64_oracle(case):
    n, h, w, c, m, k, dtype, acts = (case[key] for key in ("n", "h", "w", "c", "m", "k", "dtype", "acts"))
    ops = c3c1_operands(case["seed"], n, h, w, c, m, k, jnp.dtype(dtype))
    got = jaxcnn.conv3x3_conv1x1(*ops, activations=acts)
    assert_close(got, c3c1_oracle(*ops, activations=acts), dtype)
    ops = c1dw_operands(case["seed"], n, h, w, c, m, jnp.dtype(dtype))
    got = jaxcnn.conv1x1_depthwise(*ops, stride=case["stride"], activations=acts)
    assert_close(got, c1dw_oracle(*ops, case["stride"], acts), dtype)


def test_none_biases_are_zero():
    x, w3, w1, _, _ = c3c1_operands(3, 1, 5, 6, 8, 8, 8)
    zeros = jnp.zeros((8,))
    np.testing.assert_array_equal(jaxcnn.conv3x3_conv1x1(x, w3, w1),
                                  jaxcnn.conv3x3_conv1x1(x, w3, w1, zeros, zeros))
    x, w1, wd, _, _ = c1dw_operands(3, 1, 5, 6, 8, 8)
    np.testing.assert_array_equal(jaxcnn.conv1x1_depthwise(x, w1, wd, stride=2),
                                  jaxcnn.conv1x1_depthwise(x, w1, wd, zeros, zeros, stride=2))


@pytest.mark.parametrize("act", ACTS)
def test_nan_propagates_through_both_convs(act):
    x, w3, w1, b3, b1 = c3c1_operands(4, 1, 7, 7, 4, 4, 4)
    x = x.at[0, 3, 3, 0].set(jnp.nan)
    y = np.asarray(jaxcnn.conv3x3_conv1x1(x, w3, w1, b3, b1, activations=(act, act)))
    # t is NaN on the 3x3 around (3, 3), the 1x1 keeps those pixels.
    nan = np.zeros((7, 7), bool)
    nan[2:5, 2:5] = True
    assert np.isnan(y[0][nan]).all() and not np.isnan(y[0][~nan]).any()
    x, w1, wd, b1, bd = c1dw_operands(4, 1, 7, 7, 4, 4)
    x = x.at[0, 3, 3, 0].set(jnp.nan)
    y = np.asarray(jaxcnn.conv1x1_depthwise(x, w1, wd, b1, bd, stride=2, activations=(act, act)))
    # Stride-2 outputs whose window (rows/cols 2p-1 .. 2p+1) covers pixel 3: p, q in {1, 2}.
    nan = np.zeros((4, 4), bool)
    nan[1:3, 1:3] = True
    assert np.isnan(y[0][nan]).all() and not np.isnan(y[0][~nan]).any()


def test_jit_and_eager_agree():
    ops = c3c1_operands(5, 2, 6, 5, 8, 8, 8)
    np.testing.assert_array_equal(jax.jit(jaxcnn.conv3x3_conv1x1)(*ops), jaxcnn.conv3x3_conv1x1(*ops))
    ops = c1dw_operands(5, 2, 6, 5, 8, 8)
    f = lambda *a: jaxcnn.conv1x1_depthwise(*a, stride=2)  # noqa: E731
    np.testing.assert_array_equal(jax.jit(f)(*ops), f(*ops))


# ---------------------------------------------------------------- the fused-kernel rule


def test_fused_kernel_rule():
    c3c1, c1dw = chain_config.conv3x3_conv1x1_fused, chain_config.conv1x1_depthwise_fused
    bf16, f16, f32 = jnp.bfloat16, jnp.float16, jnp.float32
    assert c3c1((2, 9, 9, 64), 384, 256, bf16) and c3c1((1, 1, 1, 8), 8, 8, f16)
    assert not c3c1((2, 9, 9, 64), 64, 64, f32)
    assert not c3c1((2, 9, 9, 12), 64, 64, bf16)  # C off a multiple of 8
    assert not c3c1((2, 9, 9, 64), 60, 64, bf16) and not c3c1((2, 9, 9, 64), 64, 20, bf16)
    assert not c3c1((2, 9, 9, 64), 392, 64, bf16)  # M > 384
    assert not c3c1((2**16, 128, 128, 8), 8, 8, bf16)  # 2^31 elements
    assert c1dw((2, 9, 9, 256), 1536, 2, bf16) and c1dw((1, 1, 1, 8), 8, 1, f16)
    assert not c1dw((2, 9, 9, 264), 64, 1, bf16)  # C > 256
    assert not c1dw((2, 9, 9, 12), 64, 1, bf16) and not c1dw((2, 9, 9, 16), 60, 1, bf16)
    assert not c1dw((2, 9, 9, 16), 64, 2, f32)
    assert not c1dw((2**13, 128, 128, 8), 16, 2, bf16)  # the intermediate has 2^31 elements
    assert c1dw((2**13, 128, 128, 8), 8, 2, bf16)


def test_conv3x3_conv1x1_algorithm_rule():
    """algorithm="fused" runs the kernel where it applies; "auto" is "xla" on every shape for now (the
    kernel measured 0.2-0.8x of cuDNN's convs on an H100)."""
    runs = chain_config.conv3x3_conv1x1_runs_fused
    bf16, f32 = jnp.bfloat16, jnp.float32
    for shape, m, k in (((64, 56, 56, 64), 64, 256), ((1, 56, 56, 64), 64, 256),
                        ((64, 28, 28, 128), 128, 512), ((64, 14, 14, 256), 256, 1024),
                        ((2, 9, 9, 64), 384, 256)):
        assert runs(shape, m, k, bf16, "fused")
        assert not runs(shape, m, k, bf16, "auto") and not runs(shape, m, k, bf16, "xla")
    assert not runs((2, 9, 9, 64), 64, 64, f32, "fused")  # the kernel does not apply
    assert not runs((2, 9, 9, 64), 392, 64, bf16, "fused")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        runs((2, 9, 9, 64), 64, 64, bf16, "cudnn")


# ---------------------------------------------------------------- validation


C3C1_GOOD = dict(x=sds((2, 8, 8, 16)), w3=sds((3, 3, 16, 8)), w1=sds((1, 1, 8, 4)), b3=sds((8,)),
                 b1=sds((4,)))
C1DW_GOOD = dict(x=sds((2, 8, 8, 16)), w1=sds((1, 1, 16, 8)), wd=sds((3, 3, 1, 8)), b1=sds((8,)),
                 bd=sds((8,)))


@pytest.mark.parametrize(
    "changes,error,match",
    [
        *BAD_NHWC_X,
        (dict(w3=sds((3, 3, 15, 8))), ValueError, r"w3 must have shape \(3, 3, 16, 8\)"),
        (dict(w3=sds((1, 1, 16, 8))), ValueError, r"w3 must be rank 4 HWIO \[3, 3"),
        (dict(w3=sds((3, 3, 16))), ValueError, "w3 must be rank 4 HWIO"),
        (dict(w3=sds((3, 3, 16, 8), jnp.bfloat16)), TypeError, "w3 dtype bfloat16 must equal x"),
        (dict(w1=sds((1, 1, 7, 4))), ValueError, r"w1 must have shape \(1, 1, 8, 4\)"),
        (dict(w1=sds((3, 3, 8, 4))), ValueError, r"w1 must be rank 4 HWIO \[1, 1"),
        (dict(w1=sds((1, 1, 8, 0))), ValueError, "w1 must have >= 1 output channels"),
        (dict(b3=sds((7,))), ValueError, r"b3 must have shape \(8,\)"),
        (dict(b1=sds((4, 1))), ValueError, r"b1 must have shape \(4,\)"),
        (dict(b1=sds((4,), jnp.float16)), TypeError, "b1 dtype float16 must equal x"),
    ],
)
def test_conv3x3_conv1x1_bad_arguments(changes, error, match):
    check_trace_raises(jaxcnn.conv3x3_conv1x1, C3C1_GOOD, changes, error, match)


@pytest.mark.parametrize(
    "changes,error,match",
    [
        (dict(x=sds((2, 8, 8))), ValueError, r"x must be rank 4 \[N, H, W, C\]"),
        (dict(x=sds((2, 8, 8, 16), jnp.int8)), TypeError, "x dtype must be float32"),
        (dict(w1=sds((1, 1, 15, 8))), ValueError, r"w1 must have shape \(1, 1, 16, 8\)"),
        (dict(w1=sds((3, 3, 16, 8))), ValueError, "w1 must be rank 4 HWIO"),
        (dict(wd=sds((3, 3, 8, 8))), ValueError, r"wd must have shape \(3, 3, 1, 8\)"),
        (dict(wd=sds((3, 3, 1, 4))), ValueError, r"wd must have shape \(3, 3, 1, 8\)"),
        (dict(wd=sds((5, 5, 1, 8))), ValueError, "wd must have shape"),
        (dict(wd=sds((3, 3, 1, 8), jnp.float16)), TypeError, "wd dtype float16 must equal x"),
        (dict(b1=sds((9,))), ValueError, r"b1 must have shape \(8,\)"),
        (dict(bd=sds((1,))), ValueError, r"bd must have shape \(8,\)"),
    ],
)
def test_conv1x1_depthwise_bad_arguments(changes, error, match):
    check_trace_raises(jaxcnn.conv1x1_depthwise, C1DW_GOOD, changes, error, match)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(stride=3), ValueError, "stride must be 1 or 2"),
    (dict(stride=0), ValueError, "stride must be 1 or 2"),
    (dict(stride=(2, 2)), TypeError, "stride must be an int"),
    (dict(stride=True), TypeError, "stride must be an int"),
    (dict(activations="relu"), ValueError, "activations must be a pair"),
    (dict(activations=("relu",)), ValueError, "activations must be a pair"),
    (dict(activations=("relu", "gelu")), ValueError, "activations must be a pair"),
    (dict(activations=("relu", "ReLU")), ValueError, "activations must be a pair"),
])
def test_bad_keyword_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        jax.jit(lambda *a: jaxcnn.conv1x1_depthwise(*a, **kwargs)).trace(*C1DW_GOOD.values())
    if "activations" in kwargs:
        with pytest.raises(error, match=match):
            jax.jit(lambda *a: jaxcnn.conv3x3_conv1x1(*a, **kwargs)).trace(*C3C1_GOOD.values())


@pytest.mark.parametrize("algorithm", ["cudnn", "Fused", "", None, 1, ("fused",)])
def test_conv3x3_conv1x1_bad_algorithm(algorithm):
    with pytest.raises(ValueError, match=r"algorithm must be one of \('auto', 'fused', 'xla'\)"):
        jax.jit(lambda *a: jaxcnn.conv3x3_conv1x1(*a, algorithm=algorithm)).trace(*C3C1_GOOD.values())


@pytest.mark.parametrize("algorithm", ["auto", "fused", "xla"])
def test_conv3x3_conv1x1_algorithms_agree_off_cuda(algorithm):
    """Off CUDA every algorithm is the reference lowering: bit-identical results."""
    ops = c3c1_operands(8, 2, 6, 5, 8, 16, 8, jnp.bfloat16)
    np.testing.assert_array_equal(jaxcnn.conv3x3_conv1x1(*ops, algorithm=algorithm),
                                  jaxcnn.conv3x3_conv1x1(*ops))


def test_primitive_bind_validates_too():
    from jaxcnn.ops.chain.config import ChainConfig
    from jaxcnn.ops.chain.conv1x1_depthwise import Conv1x1DepthwisePrimitive
    from jaxcnn.ops.chain.conv3x3_conv1x1 import Conv3x3Conv1x1Primitive

    for prim, names, good, bad in (
            (Conv3x3Conv1x1Primitive, chain_config.CONV3X3_CONV1X1_OPERANDS, C3C1_GOOD, "b3"),
            (Conv1x1DepthwisePrimitive, chain_config.CONV1X1_DEPTHWISE_OPERANDS, C1DW_GOOD, "bd")):
        ops = {**good, bad: sds((5,))}
        with pytest.raises(ValueError, match=f"{bad} must have shape"):
            jax.eval_shape(lambda *a: prim.outer.bind(*a, cfg=ChainConfig(), operand_names=names),
                           *(ops[name] for name in names))


# ---------------------------------------------------------------- grads and vmap


@pytest.mark.slow
@pytest.mark.parametrize("acts", [("relu", "relu"), ("relu6", None), (None, "relu6")])
def test_grads_match_lax_composition(acts):
    loss = lambda f: lambda *a: jnp.sum(f(*a) ** 2)  # noqa: E731
    ops = c3c1_operands(6, 2, 5, 7, 6, 4, 5)
    got = jax.jit(jax.grad(loss(lambda *a: jaxcnn.conv3x3_conv1x1(*a, activations=acts)),
                           argnums=tuple(range(5))))(*ops)
    want = jax.grad(loss(lambda *a: c3c1_lax(*a, acts)), argnums=tuple(range(5)))(*ops)
    for g, wnt in zip(got, want):
        np.testing.assert_allclose(g, wnt, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(wnt))))
    ops = c1dw_operands(6, 2, 7, 6, 6, 10)
    got = jax.jit(jax.grad(loss(lambda *a: jaxcnn.conv1x1_depthwise(*a, stride=2, activations=acts)),
                           argnums=tuple(range(5))))(*ops)
    want = jax.grad(loss(lambda *a: c1dw_lax(*a, 2, acts)), argnums=tuple(range(5)))(*ops)
    for g, wnt in zip(got, want):
        np.testing.assert_allclose(g, wnt, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(wnt))))


def test_check_grads_numerically():
    # No activations: finite differences break at ReLU kinks.
    ops = c3c1_operands(7, 1, 4, 5, 3, 2, 3)
    check_grads(lambda *a: jaxcnn.conv3x3_conv1x1(*a, activations=(None, None)), ops, order=1,
                modes=["rev"], atol=2e-2, rtol=2e-2)
    ops = c1dw_operands(7, 1, 5, 4, 3, 2)
    check_grads(lambda *a: jaxcnn.conv1x1_depthwise(*a, stride=2, activations=(None, None)), ops,
                order=1, modes=["rev"], atol=2e-2, rtol=2e-2)


def _fns():
    c3c1 = c3c1_operands(8, 2, 5, 6, 8, 8, 8)
    c1dw = c1dw_operands(8, 2, 5, 6, 8, 8)
    return [("jaxcnn_conv3x3_conv1x1", jaxcnn.conv3x3_conv1x1, c3c1, "f32[6,5,6,8]"),
            ("jaxcnn_conv1x1_depthwise",
             lambda *a: jaxcnn.conv1x1_depthwise(*a, stride=2, activations=("relu6", "relu")),
             c1dw, "f32[6,3,3,8]")]


@pytest.mark.parametrize("in_axis", [0, 2])
@pytest.mark.parametrize("which", [0, 1])
def test_vmap_over_x_folds_into_batch(which, in_axis):
    prim, fn, ops, folded = _fns()[which]
    check_folds_into_batch(lambda x: fn(x, *ops[1:]), ops[0], in_axis, primitive=prim + "[",
                           folded=folded, **TOL["float32"])


@pytest.mark.parametrize("which", [0, 1])
def test_vmap_over_weights_and_biases(which):
    _, fn, ops, _ = _fns()[which]
    ws = jnp.stack([ops[2], -2 * ops[2]])
    bs = jnp.stack([ops[3], ops[3] + 1])
    f = jax.vmap(lambda w, b: fn(ops[0], ops[1], w, b, ops[4]))
    got = jax.jit(f)(ws, bs)
    for i in range(2):
        np.testing.assert_allclose(got[i], fn(ops[0], ops[1], ws[i], bs[i], ops[4]),
                                   **TOL["float32"])


def test_vmap_of_grad():
    x, *rest = c3c1_operands(9, 1, 4, 4, 8, 8, 8)
    xs = jnp.stack([x, -x])
    g = jax.vmap(jax.grad(lambda x: jnp.sum(jaxcnn.conv3x3_conv1x1(x, *rest) ** 2)))(xs)
    for i in range(2):
        want = jax.grad(lambda x: jnp.sum(c3c1_lax(x, *rest) ** 2))(xs[i])
        np.testing.assert_allclose(g[i], want, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(want))))


# ---------------------------------------------------------------- CUDA lowering

@pytest.fixture
def handler_present(monkeypatch):
    """Lower as a library with the chain handlers does. Lowering only names the target, so
    this also runs where the loaded library predates the ops (a rebuild adds the symbols)."""
    monkeypatch.setattr(library, "target_registered", lambda target: True)


def c3c1_fused(*a, **kwargs):
    return jaxcnn.conv3x3_conv1x1(*a, algorithm="fused", **kwargs)


def c3c1_sds(dtype, n=2, h=9, w=7, c=16, m=32, k=24):
    return [sds(s, dtype) for s in ((n, h, w, c), (3, 3, c, m), (1, 1, m, k), (m,), (k,))]


def c1dw_sds(dtype, n=2, h=9, w=7, c=16, m=48):
    return [sds(s, dtype) for s in ((n, h, w, c), (1, 1, c, m), (3, 3, 1, m), (m,), (m,))]


@needs_library
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("acts,codes", [(("relu", "relu"), (1, 1)), ((None, "relu6"), (0, 2)),
                                        (("relu6", None), (2, 0))])
def test_cuda_lowering_is_one_ffi_custom_call(handler_present, acts, codes, dtype):
    short = {"bfloat16": "bf16", "float16": "f16"}[dtype]
    text = cuda_text(lambda *a: jaxcnn.conv3x3_conv1x1(*a, activations=acts, algorithm="fused"),
                     *c3c1_sds(dtype))
    calls = custom_calls(text, C3C1_TARGET)
    assert len(calls) == 1, text
    for attr, value in (("act1", codes[0]), ("act2", codes[1])):
        assert re.search(rf"{attr} = {value} : i64", calls[0]), (attr, calls[0])
    assert f"tensor<2x9x7x24x{short}>" in calls[0]
    assert "convolution" not in text
    for stride, (p, q) in ((1, (9, 7)), (2, (5, 4))):
        text = cuda_text(lambda *a: jaxcnn.conv1x1_depthwise(*a, stride=stride, activations=acts),
                         *c1dw_sds(dtype))
        calls = custom_calls(text, C1DW_TARGET)
        assert len(calls) == 1, text
        for attr, value in (("stride", stride), ("act1", codes[0]), ("act2", codes[1])):
            assert re.search(rf"{attr} = {value} : i64", calls[0]), (attr, calls[0])
        assert f"tensor<2x{p}x{q}x48x{short}>" in calls[0]
        assert "convolution" not in text


@needs_library
def test_cuda_lowering_operand_order_is_x_w3_b3_w1_b1(handler_present):
    """Operands of distinct shapes: the call's types list them in the handler's order."""
    text = cuda_text(c3c1_fused, *c3c1_sds(jnp.bfloat16, c=16, m=32, k=24))
    assert ("(tensor<2x9x7x16xbf16>, tensor<3x3x16x32xbf16>, tensor<32xbf16>, tensor<1x1x32x24xbf16>, "
            "tensor<24xbf16>) -> tensor<2x9x7x24xbf16>") in custom_calls(text, C3C1_TARGET)[0]
    text = cuda_text(jaxcnn.conv1x1_depthwise, *c1dw_sds(jnp.bfloat16, c=16, m=48))
    assert ("(tensor<2x9x7x16xbf16>, tensor<1x1x16x48xbf16>, tensor<48xbf16>, tensor<3x3x1x48xbf16>, "
            "tensor<48xbf16>) -> tensor<2x9x7x48xbf16>") in custom_calls(text, C1DW_TARGET)[0]


@needs_library
@pytest.mark.parametrize("algorithm", ["auto", "xla", None])
@pytest.mark.parametrize("dtype,shape", [
    ("bfloat16", dict()), ("float16", dict()),
    ("bfloat16", dict(n=64, h=56, w=56, c=64, m=64, k=256)),  # ResNet-50 conv2 -> conv3
    ("bfloat16", dict(n=1, h=14, w=14, c=256, m=256, k=1024))])
def test_cuda_lowering_of_auto_and_xla_is_xla_convs(handler_present, algorithm, dtype, shape):
    """The default ("auto") and "xla": XLA's two convs, no custom call, no fallback warning,
    even for shapes the kernel runs (it measured slower than cuDNN's convs)."""
    kwargs = {} if algorithm is None else dict(algorithm=algorithm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = cuda_text(lambda *a: jaxcnn.conv3x3_conv1x1(*a, **kwargs), *c3c1_sds(dtype, **shape))
    assert C3C1_TARGET not in text and text.count("stablehlo.convolution") == 2, text
    assert "custom_call" not in text, text


UNFUSED = [
    ("float32", dict(), dict()),
    ("bfloat16", dict(c=12), dict(c=12)),  # C off a multiple of 8
    ("float16", dict(m=20), dict(m=20)),  # M off a multiple of 8
    ("bfloat16", dict(k=4), dict(m=4)),
    ("bfloat16", dict(m=392), dict(c=264)),  # past the resident tile's limits
]


@needs_library
@pytest.mark.parametrize("dtype,c3c1,c1dw", UNFUSED)
def test_cuda_lowering_of_unsupported_configs_is_xla_convs(handler_present, dtype, c3c1, c1dw):
    for fn, ops, target in ((c3c1_fused, c3c1_sds(dtype, **c3c1), C3C1_TARGET),
                            (lambda *a: jaxcnn.conv1x1_depthwise(*a, stride=2), c1dw_sds(dtype, **c1dw),
                             C1DW_TARGET)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # by design, not a fallback warning
            text = cuda_text(fn, *ops)
        assert target not in text and text.count("stablehlo.convolution") == 2, text


@needs_library
def test_library_without_the_handlers_falls_back_to_the_reference(monkeypatch):
    monkeypatch.setattr(library, "target_registered", lambda target: False)
    monkeypatch.delenv(primitive.STRICT_ENV, raising=False)
    primitive._warn_fallback_once.cache_clear()
    fns = ((c3c1_fused, c3c1_sds(jnp.bfloat16), C3C1_TARGET),
           (jaxcnn.conv1x1_depthwise, c1dw_sds(jnp.bfloat16), C1DW_TARGET))
    for fn, ops, target in fns:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            text = cuda_text(fn, *ops)
        assert target not in text and "convolution" in text
        assert any(target.removesuffix("_fwd") in str(w.message) for w in caught), caught
    monkeypatch.setenv(primitive.STRICT_ENV, "1")
    for fn, ops, _ in fns:
        with pytest.raises(RuntimeError, match="CUDA lowering without the jaxcnn library"):
            cuda_text(fn, *ops)


# Skips (does not fail) where the loaded library predates the chain handlers.
needs_handlers = pytest.mark.skipif(
    not (library.target_registered(C3C1_TARGET) and library.target_registered(C1DW_TARGET)),
    reason=library.missing_target_reason(C3C1_TARGET) or library.missing_target_reason(C1DW_TARGET))


@needs_handlers
def test_loaded_library_lowers_to_the_custom_calls():
    """Unpatched: runs once the library is rebuilt with the chain handlers."""
    assert len(custom_calls(cuda_text(c3c1_fused, *c3c1_sds(jnp.bfloat16)), C3C1_TARGET)) == 1
    assert len(custom_calls(cuda_text(jaxcnn.conv1x1_depthwise, *c1dw_sds(jnp.float16)), C1DW_TARGET)) == 1


def test_targets_and_exports():
    assert library.FFI_TARGETS[C3C1_TARGET] == "JaxcnnConv3x3Conv1x1Fwd"
    assert library.FFI_TARGETS[C1DW_TARGET] == "JaxcnnConv1x1DepthwiseFwd"
    for name in ("conv3x3_conv1x1", "conv1x1_depthwise"):
        assert name in jaxcnn.__all__ and name in jaxcnn.ops.__all__


# ---------------------------------------------------------------- padding and epilogue activations

def _lax_epilogue_act(v, act):
    from jaxcnn.ops.epilogue import apply_activation
    return apply_activation(v, act)


@pytest.mark.parametrize("stride,padding", [(2, ((0, 1), (0, 1))), (2, ((1, 1), (0, 1))), (1, 1),
                                            (1, ((0, 0), (2, 1))), (2, 0)])
@pytest.mark.parametrize("acts", [("relu6", "relu6"), ("silu", "hard_swish"), ("gelu_tanh", "sigmoid")])
def test_conv1x1_depthwise_padding_and_activations_equal_lax_layers(stride, padding, acts):
    """float32 against the unfused layers a user writes (Keras pads (0, 1) before a stride-2
    "valid" depthwise), for the clamp and the non-clamp epilogue activations."""
    x, w1, wd, b1, bd = c1dw_operands(5, 2, 8, 7, 8, 16)
    pads = ((padding,) * 2,) * 2 if isinstance(padding, int) else padding
    got = jaxcnn.conv1x1_depthwise(x, w1, wd, b1, bd, stride=stride, activations=acts, padding=padding)
    t = _lax_epilogue_act(_lax_conv(x, w1) + b1, acts[0])
    want = _lax_epilogue_act(_lax_conv(t, wd, stride, pads, groups=wd.shape[3]) + bd, acts[1])
    assert got.shape == want.shape
    assert_close(got, want, jnp.float32)


@pytest.mark.parametrize("padding,error", [(3, ValueError), (-1, ValueError), (((0, 1),), TypeError),
                                           ("same", TypeError), (((0, 1), (True, 1)), TypeError)])
def test_conv1x1_depthwise_bad_padding(padding, error):
    x, w1, wd, b1, bd = c1dw_operands(0, 1, 6, 6, 8, 8)
    with pytest.raises(error, match="padding"):
        jaxcnn.conv1x1_depthwise(x, w1, wd, b1, bd, padding=padding)


def test_chain_rejects_leaky_relu():
    x, w1, wd, b1, bd = c1dw_operands(0, 1, 6, 6, 8, 8)
    with pytest.raises(ValueError, match="activations"):
        jaxcnn.conv1x1_depthwise(x, w1, wd, b1, bd, activations=("leaky_relu", None))


@needs_library
def test_cuda_lowering_carries_padding_and_epilogue_codes(handler_present):
    text = cuda_text(lambda *a: jaxcnn.conv1x1_depthwise(*a, stride=2, activations=("silu", "hard_swish"),
                                                         padding=((0, 1), (1, 0))),
                     *c1dw_sds(jnp.bfloat16, h=10, w=8))
    calls = custom_calls(text, C1DW_TARGET)
    assert len(calls) == 1, text
    for attr, value in (("act1", 3), ("act2", 4), ("pad_top", 0), ("pad_bottom", 1), ("pad_left", 1),
                        ("pad_right", 0)):
        assert re.search(rf"{attr} = {value} : i64", calls[0]), (attr, calls[0])
    # P = (10 + 1 - 3) // 2 + 1 = 5, Q = (8 + 1 - 3) // 2 + 1 = 4
    assert "tensor<2x5x4x48xbf16>" in calls[0]


@needs_library
def test_conv3x3_conv1x1_non_clamp_activations_lower_to_xla_convs(handler_present):
    """The fused 3x3 -> 1x1 kernel takes none / relu / relu6 only: silu runs XLA's convs."""
    text = cuda_text(lambda *a: jaxcnn.conv3x3_conv1x1(*a, activations=("silu", "relu"), algorithm="fused"),
                     *c3c1_sds(jnp.bfloat16))
    assert custom_calls(text, C3C1_TARGET) == []
    assert "convolution" in text
