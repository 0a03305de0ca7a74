"""GPU suite: the CUDA kernel against float64 on fresh random inputs (run with `pytest -m gpu`)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from jax import lax

import jaxcnn
from arrays import random_operands
from reference64 import TOLERANCE, conv2d_f64, rel_err
from test_conv2d import conv_cases, fits

pytestmark = pytest.mark.gpu


def run_poisoned(x, w, b, **kw):
    """Runs the op with its output buffer pre-filled with NaN (a donated, aliased buffer), so
    any element the kernel fails to write stays NaN."""
    args = (x, w) if b is None else (x, w, b)
    kw = {"precision": "highest", "algorithm": "jaxcnn", **kw}  # fp32 vs float64 at 1e-5; our kernels, never XLA
    out = jax.eval_shape(lambda *a: jaxcnn.conv2d(*a, **kw), *args)
    poison = jnp.full(out.shape, jnp.nan, out.dtype)
    # keep_unused: the poison is not read, and jit would otherwise drop it (and the aliasing).
    fn = jax.jit(lambda p, *a: jaxcnn.conv2d(*a, **kw), donate_argnums=0, keep_unused=True)
    compiled = fn.lower(poison, *args).compile()
    text = compiled.as_text()
    # The custom call's first result (the second is its scratch) is the program's output.
    assert 'custom_call_target="jaxcnn_conv2d' in text, text
    root = [line for line in text.splitlines() if "ROOT" in line][-1]
    assert "get-tuple-element" in root or "custom-call" in root, root
    assert "input_output_alias" in text, "the poisoned output buffer must be donated: " + text[:2000]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "donated buffers were not usable" would void the poison
        return compiled(poison, *args)


@settings(max_examples=40, deadline=None)
@given(conv_cases())
def test_kernel_matches_float64_random_shapes(case):
    if not fits(case):
        return
    x, w, b = random_operands(case["seed"], case["x_shape"], case["w_shape"], with_bias=case["with_bias"])
    out = run_poisoned(x, w, b, **case["kw"])
    assert rel_err(out, conv2d_f64(x, w, b, **case["kw"])) <= TOLERANCE["float32"]


LAYERS = [
    ((2, 17, 15, 3), (7, 7, 3, 16), dict(stride=2, padding=3)),                # stem, C=3
    ((1, 13, 11, 12), (3, 3, 1, 12), dict(groups=12)),                        # depthwise
    ((3, 14, 13, 10), (5, 5, 10, 7), dict(dilation=2, padding="VALID")),       # dilated 5x5
    ((2, 9, 7, 20), (3, 3, 5, 12), dict(groups=4, stride=2, activation="relu")),
    ((4, 28, 28, 64), (1, 1, 64, 96), dict(activation="relu")),                 # 1x1
    ((1, 56, 56, 128), (3, 3, 128, 256), dict()),                               # VGG c3_1 at batch 1
    ((2, 27, 27, 96), (5, 5, 96, 256), dict(padding=2)),                        # AlexNet c2
    ((1, 7, 9, 130), (3, 3, 130, 70), dict(stride=(2, 1), padding=((0, 2), (1, 1)))),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("x_shape,w_shape,kw", LAYERS)
def test_kernel_layers_all_dtypes(dtype, x_shape, w_shape, kw):
    x, w, b = random_operands(11, x_shape, w_shape, dtype)
    for bias in (b, None):
        out = run_poisoned(x, w, bias, **kw)
        assert out.dtype == jnp.dtype(dtype)
        assert rel_err(out, conv2d_f64(x, w, bias, **kw)) <= TOLERANCE[dtype]


def test_kernel_is_deterministic():
    x, w, b = random_operands(12, (2, 31, 29, 24), (3, 3, 24, 40), jnp.bfloat16)
    f = jax.jit(lambda *a: jaxcnn.conv2d(*a, activation="relu", algorithm="jaxcnn"))
    np.testing.assert_array_equal(f(x, w, b), f(x, w, b))


def test_nan_and_inf_propagate_like_xla():
    x, w, b = random_operands(13, (1, 12, 12, 4), (3, 3, 4, 5))
    x = x.at[0, 2, 2, 1].set(jnp.nan).at[0, 8, 8, 3].set(jnp.inf)
    ours = np.asarray(jaxcnn.conv2d(x, w, b, algorithm="jaxcnn"))
    xla = np.asarray(lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
        precision=lax.Precision.HIGHEST) + b)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(xla))
    np.testing.assert_array_equal(np.isposinf(ours), np.isposinf(xla))
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(xla))
    assert np.isnan(ours).sum() == 45 and np.isinf(ours).sum() == 45
    relu = np.asarray(jaxcnn.conv2d(x, w, b, activation="relu", algorithm="jaxcnn"))
    assert np.isnan(relu).sum() == 45  # ReLU keeps NaN, as jnp.maximum does


@pytest.mark.parametrize("kw", [dict(activation="relu"), dict(stride=2, groups=2, padding="VALID")])
def test_grad_through_kernel_matches_xla(kw):
    x, w, b = random_operands(14, (2, 12, 11, 6), (3, 3, 6 // kw.get("groups", 1), 8))

    def xla(x, w, b):
        y = lax.conv_general_dilated(
            x, w, (kw.get("stride", 1),) * 2, kw.get("padding", "SAME"),
            dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=kw.get("groups", 1),
            precision=lax.Precision.HIGHEST) + b
        return jax.nn.relu(y) if kw.get("activation") else y

    cot = jax.random.normal(jax.random.PRNGKey(5), jax.eval_shape(xla, x, w, b).shape)
    ours = jax.jit(jax.grad(lambda *a: jnp.sum(jaxcnn.conv2d(*a, **kw, algorithm="jaxcnn") * cot), argnums=(0, 1, 2)))(x, w, b)
    want = jax.jit(jax.grad(lambda *a: jnp.sum(xla(*a) * cot), argnums=(0, 1, 2)))(x, w, b)
    for got, ref in zip(ours, want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_vmap_on_gpu():
    x, w, b = random_operands(15, (3, 2, 9, 9, 4), (3, 3, 4, 6))
    out = jax.jit(jax.vmap(lambda x: jaxcnn.conv2d(x, w, b, activation="relu", algorithm="jaxcnn")))(x)
    for i in range(3):
        assert rel_err(out[i], conv2d_f64(x[i], w, b, activation="relu")) <= TOLERANCE["float32"]


def test_handler_errors_become_python_exceptions():
    """The FFI handler validates too: a bad attribute reaches Python as an exception."""
    x, w, _ = random_operands(16, (1, 8, 8, 4), (3, 3, 4, 6), with_bias=False)
    call = jax.ffi.ffi_call(
        "jaxcnn_conv2d_fwd_nobias",
        (jax.ShapeDtypeStruct((1, 8, 8, 6), x.dtype), jax.ShapeDtypeStruct((0,), jnp.uint8)),
    )
    attrs = dict(stride_h=np.int64(1), stride_w=np.int64(1), pad_h=np.int64(1), pad_w=np.int64(1),
                 dilation_h=np.int64(1), dilation_w=np.int64(1), activation=np.int64(0),
                 layout=np.int64(0), precision=np.int64(1), algorithm=np.int64(0),
                 alpha=np.float32(0.0))
    with pytest.raises(Exception, match="groups"):
        jax.block_until_ready(jax.jit(lambda x, w: call(x, w, groups=np.int64(3), **attrs))(x, w))
    # The process is still healthy afterwards.
    assert rel_err(jaxcnn.conv2d(x, w, padding=1, algorithm="jaxcnn"), conv2d_f64(x, w, padding=1)) <= TOLERANCE["float32"]
