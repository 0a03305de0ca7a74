"""GPU suite for the straight conv chains (`pytest -m gpu`): the fused bf16/fp16 kernels of
jaxcnn.conv3x3_conv1x1 and jaxcnn.conv1x1_depthwise against the float64 oracle and XLA's
unfused reference over random shapes (odd H/W, N = 1, channels 8..384, stride 1/2, every
activation), NaN-poisoned outputs, NaN propagation, the unfused fallback for configs the
kernels do not run (float32, channel counts off multiples of 8, past the tile limits) and for
conv3x3_conv1x1's algorithm="auto"/"xla", handler errors, grads and vmap. conv3x3_conv1x1's
kernel runs only with algorithm="fused"."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcnn
from jaxcnn.ops.chain.config import ChainConfig
from jaxcnn.ops.chain.reference import conv1x1_depthwise_reference, conv3x3_conv1x1_reference
from test_chain import (ACTS, C1DW_TARGET, C3C1_TARGET, as_f64, assert_close, c1dw_oracle,
                        c1dw_operands, c3c1_operands, c3c1_oracle, needs_handlers)
from poisoned_output import run_poisoned

# A library built before the chains would lower them to XLA (an error under JAXCNN_STRICT=1).
pytestmark = [pytest.mark.gpu, needs_handlers]
HALF = ("bfloat16", "float16")


def c3c1_call(acts, algorithm="fused"):
    # "fused": the kernel under test ("auto" currently picks XLA's convs for every shape).
    return lambda *a: jaxcnn.conv3x3_conv1x1(*a, activations=acts, algorithm=algorithm)


def c1dw_call(stride, acts):
    return lambda *a: jaxcnn.conv1x1_depthwise(*a, stride=stride, activations=acts)


def xla_reference(reference, ops, cfg):
    """The op's unfused reference on the GPU (XLA's convs), operands in primitive order."""
    return jax.jit(lambda *a: reference(*a, cfg=cfg))(*ops)


def cpu_reference(reference, ops, cfg):
    """The reference on the CPU: lax's NaN semantics (XLA's GPU conv + ReLU fusion turns a
    NaN into 0, measured on an H100 for bf16 relu, so it cannot be the NaN oracle)."""
    cpu = jax.devices("cpu")[0]
    return jax.jit(lambda *a: reference(*a, cfg=cfg))(*(jax.device_put(o, cpu) for o in ops))


def check_c3c1(shape, dtype, acts, seed=0):
    ops = c3c1_operands(seed, *shape, jnp.dtype(dtype))
    got = run_poisoned(c3c1_call(acts), *ops, target=C3C1_TARGET)
    assert got.dtype == jnp.dtype(dtype) and got.shape == (*shape[:3], shape[5])
    assert not np.isnan(as_f64(got)).any()
    x, w3, w1, b3, b1 = ops
    ref = xla_reference(conv3x3_conv1x1_reference, (x, w3, b3, w1, b1), ChainConfig(*acts))
    assert_close(got, ref, dtype)
    assert_close(got, c3c1_oracle(*ops, activations=acts), dtype)


def check_c1dw(shape, dtype, acts, stride, seed=0):
    n, h, w, c, m = shape
    ops = c1dw_operands(seed, *shape, jnp.dtype(dtype))
    got = run_poisoned(c1dw_call(stride, acts), *ops, target=C1DW_TARGET)
    assert got.shape == (n, (h - 1) // stride + 1, (w - 1) // stride + 1, m)
    assert not np.isnan(as_f64(got)).any()
    x, w1, wd, b1, bd = ops
    ref = xla_reference(conv1x1_depthwise_reference, (x, w1, b1, wd, bd), ChainConfig(*acts, stride))
    assert_close(got, ref, dtype)
    assert_close(got, c1dw_oracle(*ops, stride, acts), dtype)


# (n, h, w, c, m, k): odd sizes, N = 1, 1x1 images, the M limit, ResNet/VGG-like layers.
C3C1_SHAPES = [(1, 1, 1, 8, 8, 8), (2, 7, 5, 8, 16, 8), (1, 13, 17, 64, 64, 256),
               (3, 9, 11, 24, 40, 56), (1, 14, 14, 256, 256, 1024), (2, 28, 28, 128, 128, 512),
               (1, 33, 31, 32, 384, 384), (2, 56, 56, 64, 64, 64), (1, 5, 70, 16, 8, 384)]
# (n, h, w, c, m): MobileNetV2-like expansions, the C limit.
C1DW_SHAPES = [(1, 1, 1, 8, 8), (2, 7, 5, 8, 16), (1, 112, 112, 16, 96), (2, 56, 56, 24, 144),
               (1, 28, 28, 32, 192), (3, 15, 13, 64, 384), (1, 14, 14, 96, 576),
               (2, 7, 7, 160, 960), (1, 9, 10, 256, 1536), (1, 2, 3, 40, 8)]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("acts", [("relu", None), (None, "relu6")])
@pytest.mark.parametrize("shape", C3C1_SHAPES)
def test_conv3x3_conv1x1_fixed_shapes(shape, acts, dtype):
    check_c3c1(shape, dtype, acts, seed=sum(shape))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("acts", [("relu6", "relu6"), (None, "relu")])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("shape", C1DW_SHAPES)
def test_conv1x1_depthwise_fixed_shapes(shape, stride, acts, dtype):
    check_c1dw(shape, dtype, acts, stride, seed=sum(shape))


mult8 = st.integers(1, 48).map(lambda v: 8 * v)  # 8 .. 384


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([1, 1, 2, 3]), st.integers(1, 40), st.integers(1, 40), mult8, mult8, mult8,
       st.sampled_from(ACTS), st.sampled_from(ACTS), st.sampled_from(HALF), st.integers(0, 2**16))
def test_conv3x3_conv1x1_random_shapes(n, h, w, c, m, k, act1, act2, dtype, seed):
    check_c3c1((n, h, w, c, m, k), dtype, (act1, act2), seed)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([1, 1, 2, 3]), st.integers(1, 40), st.integers(1, 40),
       st.integers(1, 32).map(lambda v: 8 * v), mult8, st.sampled_from([1, 2]),
       st.sampled_from(ACTS), st.sampled_from(ACTS), st.sampled_from(HALF), st.integers(0, 2**16))
def test_conv1x1_depthwise_random_shapes(n, h, w, c, m, stride, act1, act2, dtype, seed):
    check_c1dw((n, h, w, c, m), dtype, (act1, act2), stride, seed)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("act", ACTS)
def test_nan_propagates_like_lax(act, dtype):
    """fmaxf(NaN, 0) is 0 on CUDA: the kernels must keep lax's NaN-propagating max/min."""
    x, w3, w1, b3, b1 = c3c1_operands(1, 1, 9, 9, 16, 16, 16, jnp.dtype(dtype))
    x = x.at[0, 4, 4, 3].set(jnp.nan)
    got = np.isnan(as_f64(c3c1_call((act, act))(x, w3, w1, b3, b1)))
    want = np.isnan(as_f64(cpu_reference(conv3x3_conv1x1_reference, (x, w3, b3, w1, b1),
                                         ChainConfig(act, act))))
    assert want.any() and (got == want).all()
    x, w1, wd, b1, bd = c1dw_operands(1, 1, 9, 9, 16, 16, jnp.dtype(dtype))
    x = x.at[0, 4, 4, 3].set(jnp.nan)
    for stride in (1, 2):
        got = np.isnan(as_f64(jaxcnn.conv1x1_depthwise(x, w1, wd, b1, bd, stride=stride,
                                                       activations=(act, act))))
        want = np.isnan(as_f64(cpu_reference(conv1x1_depthwise_reference, (x, w1, b1, wd, bd),
                                             ChainConfig(act, act, stride))))
        assert want.any() and (got == want).all()


# ---------------------------------------------------------------- the unfused fallback

# (dtype, c3c1 shape (n, h, w, c, m, k), c1dw shape (n, h, w, c, m)) the kernels do not run.
UNFUSED = [
    ("float32", (2, 9, 7, 16, 32, 24), (2, 9, 7, 16, 48)),
    ("bfloat16", (2, 9, 7, 12, 32, 24), (2, 9, 7, 12, 48)),  # C off a multiple of 8
    ("float16", (1, 8, 8, 16, 20, 8), (1, 8, 8, 16, 20)),  # M off a multiple of 8
    ("bfloat16", (1, 8, 8, 16, 392, 16), (1, 8, 8, 264, 16)),  # past the resident tile's limits
]


@pytest.mark.parametrize("dtype,c3c1,c1dw", UNFUSED)
def test_unsupported_configs_run_xla_convs_correctly(dtype, c3c1, c1dw):
    acts = ("relu", "relu6")
    ops = c3c1_operands(2, *c3c1, jnp.dtype(dtype))
    f = jax.jit(c3c1_call(acts))
    assert C3C1_TARGET not in f.lower(*ops).as_text()
    assert_close(f(*ops), c3c1_oracle(*ops, activations=acts), dtype)
    ops = c1dw_operands(2, *c1dw, jnp.dtype(dtype))
    for stride in (1, 2):
        f = jax.jit(c1dw_call(stride, acts))
        assert C1DW_TARGET not in f.lower(*ops).as_text()
        assert_close(f(*ops), c1dw_oracle(*ops, stride, acts), dtype)


@pytest.mark.parametrize("algorithm", ["auto", "xla"])
def test_auto_and_xla_run_xla_convs(algorithm):
    """algorithm="auto" currently picks XLA's convs for conv3x3_conv1x1 on every shape (the fused kernel
    measured slower than cuDNN's): no custom call, and the reference's result."""
    acts = ("relu", "relu6")
    ops = c3c1_operands(7, 2, 14, 14, 64, 64, 256, jnp.bfloat16)
    f = jax.jit(c3c1_call(acts, algorithm))
    assert C3C1_TARGET not in f.lower(*ops).as_text()
    assert_close(f(*ops), c3c1_oracle(*ops, activations=acts), "bfloat16")


# ---------------------------------------------------------------- handler, grads, vmap


def test_handler_errors_become_python_exceptions():
    x, w3, w1, b3, b1 = c3c1_operands(3, 1, 4, 4, 8, 8, 8, jnp.bfloat16)
    acts = dict(act1=np.int64(1), act2=np.int64(1))
    call = jax.ffi.ffi_call(C3C1_TARGET, jax.ShapeDtypeStruct((1, 4, 4, 16), jnp.bfloat16))
    with pytest.raises(Exception, match="conv3x3_conv1x1: output y must have shape"):
        jax.block_until_ready(jax.jit(lambda *a: call(*a, **acts))(x, w3, b3, w1, b1))
    ok = jax.ffi.ffi_call(C3C1_TARGET, jax.ShapeDtypeStruct((1, 4, 4, 8), jnp.bfloat16))
    with pytest.raises(Exception, match="act1 and act2 must be epilogue activation codes"):
        jax.block_until_ready(jax.jit(lambda *a: ok(*a, act1=np.int64(9), act2=np.int64(0)))(
            x, w3, b3, w1, b1))
    # An epilogue code the fused 3x3 -> 1x1 kernel does not take (3: not a clamp).
    with pytest.raises(Exception, match=r"activations must be 0 \(none\), 1 \(relu\) or 2 \(relu6\)"):
        jax.block_until_ready(jax.jit(lambda *a: ok(*a, act1=np.int64(3), act2=np.int64(0)))(
            x, w3, b3, w1, b1))
    with pytest.raises(Exception, match="conv3x3_conv1x1: b3 must have shape"):
        jax.block_until_ready(jax.jit(lambda *a: ok(*a, **acts))(x, w3, b1[:4], w1, b1))
    f32 = [a.astype(jnp.float32) for a in (x, w3, b3, w1, b1)]
    ok32 = jax.ffi.ffi_call(C3C1_TARGET, jax.ShapeDtypeStruct((1, 4, 4, 8), jnp.float32))
    with pytest.raises(Exception, match="conv3x3_conv1x1: x dtype must be bfloat16 or float16"):
        jax.block_until_ready(jax.jit(lambda *a: ok32(*a, **acts))(*f32))
    x12 = jnp.ones((1, 4, 4, 12), jnp.bfloat16)
    w12 = jnp.ones((3, 3, 12, 8), jnp.bfloat16)
    with pytest.raises(Exception, match="unsupported shape: C, M and K must be multiples of 8"):
        jax.block_until_ready(jax.jit(lambda *a: ok(*a, **acts))(x12, w12, b3, w1, b1))
    x, w1, wd, b1, bd = c1dw_operands(3, 1, 5, 5, 8, 8, jnp.bfloat16)
    dw = jax.ffi.ffi_call(C1DW_TARGET, jax.ShapeDtypeStruct((1, 3, 3, 8), jnp.bfloat16))
    pads = dict(pad_top=np.int64(1), pad_bottom=np.int64(1), pad_left=np.int64(1), pad_right=np.int64(1))
    with pytest.raises(Exception, match="conv1x1_depthwise: stride must be 1 or 2"):
        jax.block_until_ready(jax.jit(lambda *a: dw(*a, stride=np.int64(3), **acts, **pads))(x, w1, b1, wd, bd))
    with pytest.raises(Exception, match="conv1x1_depthwise: each padding must be 0, 1 or 2"):
        jax.block_until_ready(jax.jit(lambda *a: dw(*a, stride=np.int64(1), **acts, **dict(pads, pad_left=np.int64(3))))(
            x, w1, b1, wd, bd))
    with pytest.raises(Exception, match="conv1x1_depthwise: output y must have shape"):
        jax.block_until_ready(jax.jit(lambda *a: dw(*a, stride=np.int64(1), **acts, **pads))(x, w1, b1, wd, bd))
    # The process is still healthy afterwards.
    check_c1dw((1, 5, 5, 8, 8), "bfloat16", ("relu", "relu"), 2)


def test_deterministic():
    ops = c3c1_operands(4, 2, 27, 27, 128, 128, 256, jnp.bfloat16)
    f = jax.jit(c3c1_call(("relu", "relu")))
    np.testing.assert_array_equal(f(*ops), f(*ops))
    ops = c1dw_operands(4, 2, 27, 27, 64, 384, jnp.bfloat16)
    f = jax.jit(c1dw_call(2, ("relu6", "relu6")))
    np.testing.assert_array_equal(f(*ops), f(*ops))


def test_grads_through_the_kernels():
    """The forward is the kernel, the backward the reference's transposes: both work under jit."""
    loss = lambda f: lambda *a: jnp.sum(f(*a).astype(jnp.float32) ** 2)  # noqa: E731
    for fn, ops, ref in (
            (c3c1_call(("relu", "relu")), c3c1_operands(5, 2, 9, 11, 16, 32, 16, jnp.bfloat16),
             lambda x, w3, w1, b3, b1: conv3x3_conv1x1_reference(x, w3, b3, w1, b1, cfg=ChainConfig())),
            (c1dw_call(2, ("relu", "relu")), c1dw_operands(5, 2, 9, 11, 16, 32, jnp.bfloat16),
             lambda x, w1, wd, b1, bd: conv1x1_depthwise_reference(x, w1, b1, wd, bd,
                                                                   cfg=ChainConfig(stride=2)))):
        got = jax.jit(jax.grad(loss(fn), argnums=tuple(range(5))))(*ops)
        want = jax.jit(jax.grad(loss(ref), argnums=tuple(range(5))))(*ops)
        for g, w in zip(got, want):
            # Same backward; the forward values (hence the cotangent) differ by bf16 roundings.
            np.testing.assert_allclose(as_f64(g), as_f64(w), rtol=5e-2,
                                       atol=5e-2 * float(jnp.max(jnp.abs(as_f64(w)))))


def test_vmap_on_gpu():
    ops = c3c1_operands(6, 2, 9, 10, 32, 16, 32, jnp.bfloat16)
    xs = jnp.stack([ops[0], -ops[0], ops[0] * 2])
    f = c3c1_call(("relu", "relu"))
    got = jax.jit(jax.vmap(lambda x: f(x, *ops[1:])))(xs)
    for i in range(3):
        np.testing.assert_array_equal(got[i], f(xs[i], *ops[1:]))
    ops = c1dw_operands(6, 2, 9, 10, 32, 64, jnp.float16)
    f = c1dw_call(2, ("relu6", None))
    got = jax.jit(jax.vmap(lambda x: f(x, *ops[1:])))(xs.astype(jnp.float16))
    for i in range(3):
        np.testing.assert_array_equal(got[i], f(xs[i].astype(jnp.float16), *ops[1:]))


# Keras' stride-2 form (zero pad (0, 1) then a "valid" depthwise) and other paddings, with the
# epilogue's non-clamp activations, on even and odd sizes.
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape,stride,padding,acts", [
    ((2, 112, 112, 16, 96), 2, ((0, 1), (0, 1)), ("relu6", "relu6")),
    ((1, 15, 13, 24, 144), 2, ((0, 1), (1, 1)), ("silu", "silu")),
    ((2, 28, 28, 32, 192), 1, ((1, 1), (1, 1)), ("hard_swish", None)),
    ((1, 9, 10, 40, 240), 1, ((2, 0), (0, 2)), ("gelu_tanh", "sigmoid")),
    ((1, 7, 7, 8, 16), 2, ((0, 0), (0, 0)), ("gelu_erf", "relu")),
])
def test_conv1x1_depthwise_padding_and_epilogue_activations(shape, stride, padding, acts, dtype):
    ops = c1dw_operands(3, *shape, jnp.dtype(dtype))
    call = lambda *a: jaxcnn.conv1x1_depthwise(*a, stride=stride, activations=acts, padding=padding)  # noqa: E731
    got = run_poisoned(call, *ops, target=C1DW_TARGET)
    assert not np.isnan(as_f64(got)).any()
    x, w1, wd, b1, bd = ops
    ref = xla_reference(conv1x1_depthwise_reference, (x, w1, b1, wd, bd),
                        ChainConfig(*acts, stride, padding=padding))
    assert got.shape == ref.shape
    assert_close(got, ref, dtype)
