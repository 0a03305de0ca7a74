"""The conv epilogue's activation codes agree between cuda_ops/common/epilogue.cuh and
jaxcnn/ops/epilogue.py, and a conv with a residual lowers to the residual FFI target with the
activation's code and its alpha (no GPU needed to lower)."""

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcnn
from jaxcnn._native import library
from jaxcnn._native.codes import ACTIVATION_CODES
from cuda_lowering import cuda_text, custom_calls

EPILOGUE_HEADER = Path(__file__).resolve().parents[2] / "cuda_ops" / "common" / "epilogue.cuh"


def header_codes() -> dict[str, int]:
    """`kName = code` of the header's `enum class Activation`, by name."""
    text = EPILOGUE_HEADER.read_text()
    body = re.search(r"enum class Activation\s*:\s*int\s*\{(.*?)\};", text, re.S)
    assert body, f"no `enum class Activation` in {EPILOGUE_HEADER}"
    entries = re.findall(r"\bk(\w+)\s*=\s*(\d+)", body.group(1))
    assert entries, body.group(1)
    return {name: int(code) for name, code in entries}


def camel(name) -> str:
    """Python's activation name as the header spells it: None -> 'None', 'gelu_tanh' -> 'GeluTanh'."""
    return "None" if name is None else "".join(part.capitalize() for part in name.split("_"))


def test_header_enum_matches_python_codes():
    assert header_codes() == {camel(name): code for name, code in ACTIVATION_CODES.items()}


def test_header_activation_count_matches():
    count = re.search(r"kNumActivations\s*=\s*(\d+)", EPILOGUE_HEADER.read_text())
    assert count and int(count.group(1)) == len(ACTIVATION_CODES)


X = jax.ShapeDtypeStruct((2, 9, 10, 16), jnp.bfloat16)
W = jax.ShapeDtypeStruct((3, 3, 16, 24), jnp.bfloat16)
B = jax.ShapeDtypeStruct((24,), jnp.bfloat16)
R = jax.ShapeDtypeStruct((2, 9, 10, 24), jnp.bfloat16)


@pytest.mark.skipif(not library.target_registered("jaxcnn_conv2d_fwd_residual"),
                    reason=library.missing_target_reason("jaxcnn_conv2d_fwd_residual") or "registered")
@pytest.mark.parametrize("with_bias", [True, False])
def test_residual_lowers_to_residual_target_with_alpha(with_bias):
    alpha = 0.2
    if with_bias:
        fn = lambda x, w, b, r: jaxcnn.conv2d(x, w, b, residual=r, activation="leaky_relu",  # noqa: E731
                                             alpha=alpha)
        args = (X, W, B, R)
    else:
        fn = lambda x, w, r: jaxcnn.conv2d(x, w, residual=r, activation="leaky_relu",  # noqa: E731
                                          alpha=alpha)
        args = (X, W, R)
    text = cuda_text(fn, *args)
    calls = [line for line in text.splitlines() if "custom_call @jaxcnn_conv2d_fwd" in line]
    assert len(calls) == 1, text
    call = calls[0]
    assert "custom_call @jaxcnn_conv2d_fwd_residual(" in call, call
    # x, w, bias (zeros when none was given) and the residual.
    operands = re.search(r"custom_call @jaxcnn_conv2d_fwd_residual\(([^)]*)\)", call).group(1)
    assert len(operands.split(",")) == 4, call
    ints = dict(re.findall(r"(\w+) = (-?\d+) : i64", call))
    assert ints["activation"] == str(ACTIVATION_CODES["leaky_relu"])
    found = re.search(r"alpha = ([-+0-9.eE]+) : f32", call)
    assert found, call
    assert float(found.group(1)) == pytest.approx(float(np.float32(alpha)))
    assert re.search(r"-> \(tensor<2x9x10x24xbf16>, tensor<\d+xui8>\)", call), call
    assert "stablehlo.convolution" not in text


@pytest.mark.skipif(not library.target_registered("jaxcnn_conv2d_fwd"),
                    reason=library.missing_target_reason("jaxcnn_conv2d_fwd") or "registered")
@pytest.mark.parametrize("activation", [a for a in ACTIVATION_CODES if a is not None])
def test_every_activation_lowers_with_its_code(activation):
    text = cuda_text(lambda x, w, b: jaxcnn.conv2d(x, w, b, activation=activation), X, W, B)
    calls = custom_calls(text, "jaxcnn_conv2d_fwd")
    assert len(calls) == 1, text
    ints = dict(re.findall(r"(\w+) = (-?\d+) : i64", calls[0]))
    assert ints["activation"] == str(ACTIVATION_CODES[activation])
    assert re.search(r"alpha = [-+0-9.eE]+ : f32", calls[0]), calls[0]
