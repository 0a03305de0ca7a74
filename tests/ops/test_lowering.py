"""The CUDA lowering emits the FFI custom call (checked on any machine: no GPU needed to lower)."""

import re
import warnings

import jax
import jax.numpy as jnp
import pytest

import jaxcnn
from jaxcnn._native import library
from cuda_lowering import cuda_text, needs_library

X = jax.ShapeDtypeStruct((2, 9, 10, 6), jnp.bfloat16)
W = jax.ShapeDtypeStruct((3, 3, 3, 8), jnp.bfloat16)
B = jax.ShapeDtypeStruct((8,), jnp.bfloat16)


@needs_library
@pytest.mark.parametrize("with_bias", [True, False])
def test_cuda_lowering_is_ffi_custom_call(with_bias):
    args = (X, W, B) if with_bias else (X, W)
    text = cuda_text(
        lambda *a: jaxcnn.conv2d(*a, stride=2, padding=((1, 2), (0, 1)), dilation=(1, 2), groups=2, activation="relu",
                                 algorithm="direct"),
        *args,
    )
    target = "jaxcnn_conv2d_fwd" if with_bias else "jaxcnn_conv2d_fwd_nobias"
    call = [line for line in text.splitlines() if f"custom_call @{target}(" in line]
    assert len(call) == 1, text
    attrs = dict(re.findall(r"(\w+) = (-?\d+) : i64", call[0]))
    assert attrs == dict(activation="1", dilation_h="1", dilation_w="2", groups="2",
                         pad_h="1", pad_w="0", stride_h="2", stride_w="2",
                         layout="0", precision="0", algorithm="1")
    # The second result is the scratch XLA allocates for the handler (u8).
    assert re.search(r"-> \(tensor<2x5x4x8xbf16>, tensor<\d+xui8>\)", call[0]), call[0]
    assert "stablehlo.convolution" not in text


@needs_library
@pytest.mark.parametrize(
    "layout, x_shape, y_shape",
    [("NCHW", (2, 6, 9, 10), "2x8x5x5"), ("CHWN", (6, 9, 10, 2), "8x5x5x2")],
)
def test_cuda_lowering_carries_layout_precision_algorithm(layout, x_shape, y_shape):
    x = jax.ShapeDtypeStruct(x_shape, jnp.float32)
    w = jax.ShapeDtypeStruct((3, 3, 6, 8), jnp.float32)
    text = cuda_text(
        lambda x, w: jaxcnn.conv2d(x, w, stride=2, layout=layout, precision="highest",
                                   algorithm="direct"), x, w)
    call = [line for line in text.splitlines() if "custom_call @jaxcnn_conv2d_fwd_nobias(" in line]
    assert len(call) == 1, text
    attrs = dict(re.findall(r"(\w+) = (-?\d+) : i64", call[0]))
    assert (attrs["layout"], attrs["precision"], attrs["algorithm"]) == (
        str(("NHWC", "NCHW", "CHWN").index(layout)), "1", "1")
    assert f"tensor<{y_shape}xf32>" in call[0]


@needs_library
def test_cuda_lowering_of_grad_keeps_forward_custom_call():
    text = cuda_text(jax.grad(lambda x, w: jaxcnn.conv2d(x, w, groups=2).astype(jnp.float32).sum(), argnums=1), X, W)
    assert "custom_call @jaxcnn_conv2d_fwd_nobias" not in text or "convolution" in text
    assert "convolution" in text  # the backward uses XLA's convolutions for now


def test_cpu_lowering_is_reference():
    text = jax.jit(lambda x, w: jaxcnn.conv2d(x, w, groups=2)).trace(X, W).lower(lowering_platforms=("cpu",)).as_text()
    assert "stablehlo.convolution" in text and "custom_call @jaxcnn" not in text


def test_cuda_without_library_falls_back_with_warning(monkeypatch):
    monkeypatch.setattr(library, "handlers_registered", lambda: False)
    monkeypatch.delenv("JAXCNN_STRICT", raising=False)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        text = cuda_text(lambda x, w: jaxcnn.conv2d(x, w, groups=2, padding="VALID"), X, W)
    assert "stablehlo.convolution" in text and "custom_call @jaxcnn" not in text


def test_strict_mode_refuses_fallback(monkeypatch):
    monkeypatch.setattr(library, "handlers_registered", lambda: False)
    monkeypatch.setenv("JAXCNN_STRICT", "1")
    with pytest.raises(RuntimeError, match="CUDA lowering without the jaxcnn library"):
        cuda_text(lambda x, w: jaxcnn.conv2d(x, w, groups=2, padding=1, algorithm="jaxcnn"), X, W)
