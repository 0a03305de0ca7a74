"""The CUDA lowering of pooling and softmax emits the FFI custom calls with their attributes
(checked on any machine: no GPU needed to lower)."""

import re
import warnings

import jax
import jax.numpy as jnp
import pytest

import jaxcnn
from jaxcnn._native import library
from cuda_lowering import cuda_text, custom_calls, needs_library


def attrs_of(line):
    return {k: int(v) for k, v in re.findall(r"(\w+) = (-?\d+) : i64", line)}


POOL_ATTRS = dict(window_h=3, window_w=2, stride_h=2, stride_w=1,
                  pad_top=1, pad_bottom=2, pad_left=0, pad_right=1)


@needs_library
@pytest.mark.parametrize("layout,code,shape,out",
                         [("NHWC", 0, (2, 9, 10, 6), "2x5x10x6"),
                          ("NCHW", 1, (2, 6, 9, 10), "2x6x5x10"),
                          ("CHWN", 2, (6, 9, 10, 2), "6x5x10x2")])
def test_pool_lowering_is_ffi_custom_call(layout, code, shape, out):
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    kw = dict(window=(3, 2), stride=(2, 1), padding=((1, 2), (0, 1)), layout=layout)
    text = cuda_text(lambda x: jaxcnn.max_pool2d(x, **kw), x)
    (call,) = custom_calls(text, "jaxcnn_max_pool2d_fwd")
    assert attrs_of(call) == dict(POOL_ATTRS, layout=code)
    assert f"tensor<{out}xbf16>" in call and "reduce_window" not in text
    for include in (True, False):
        text = cuda_text(lambda x: jaxcnn.avg_pool2d(x, **kw, count_include_pad=include), x)
        (call,) = custom_calls(text, "jaxcnn_avg_pool2d_fwd")
        assert attrs_of(call) == dict(POOL_ATTRS, layout=code, count_include_pad=int(include))


@needs_library
@pytest.mark.parametrize("log", [False, True])
def test_softmax_lowering_is_ffi_custom_call(log):
    x = jax.ShapeDtypeStruct((3, 5, 1000), jnp.float16)
    fn = jaxcnn.log_softmax if log else jaxcnn.softmax
    text = cuda_text(fn, x)
    (call,) = custom_calls(text, "jaxcnn_softmax_fwd")
    assert attrs_of(call) == dict(log=int(log))
    assert "tensor<3x5x1000xf16>" in call and "stablehlo.exponential" not in text
    # Another axis: moved last around the same custom call.
    (call,) = custom_calls(cuda_text(lambda x: fn(x, axis=1), x), "jaxcnn_softmax_fwd")
    assert "tensor<3x1000x5xf16>" in call


@needs_library
def test_grad_keeps_forward_custom_calls():
    x = jax.ShapeDtypeStruct((2, 8, 8, 4), jnp.float32)
    text = cuda_text(jax.grad(lambda x: jnp.sum(jaxcnn.softmax(jaxcnn.max_pool2d(x, 2)) ** 2)), x)
    assert custom_calls(text, "jaxcnn_max_pool2d_fwd") and custom_calls(text, "jaxcnn_softmax_fwd")


def test_cpu_lowering_is_reference():
    x = jax.ShapeDtypeStruct((2, 8, 8, 4), jnp.float32)
    fn = lambda x: jaxcnn.softmax(jaxcnn.avg_pool2d(x, 2, layout="CHWN"))  # noqa: E731
    text = jax.jit(fn).trace(x).lower(lowering_platforms=("cpu",)).as_text()
    assert "reduce_window" in text and "custom_call @jaxcnn" not in text


def test_cuda_without_library_falls_back_with_warning(monkeypatch):
    monkeypatch.setattr(library, "handlers_registered", lambda: False)
    monkeypatch.delenv("JAXCNN_STRICT", raising=False)
    x = jax.ShapeDtypeStruct((2, 8, 8, 4), jnp.float32)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        text = cuda_text(lambda x: jaxcnn.log_softmax(jaxcnn.max_pool2d(x, 3, 1, layout="NCHW")), x)
    assert "reduce_window" in text and "custom_call @jaxcnn" not in text


def test_strict_mode_refuses_fallback(monkeypatch):
    monkeypatch.setattr(library, "handlers_registered", lambda: False)
    monkeypatch.setenv("JAXCNN_STRICT", "1")
    x = jax.ShapeDtypeStruct((2, 8, 8, 4), jnp.float32)
    for fn in (lambda x: jaxcnn.avg_pool2d(x, 2), jaxcnn.softmax):
        with pytest.raises(RuntimeError, match="CUDA lowering without the jaxcnn library"):
            cuda_text(fn, x)
