"""GPU suite for the fused conv + bias + ReLU + max-pool (`pytest -m gpu`): the CUDA kernels
(Hopper TMA + wgmma, tensor-core bf16/fp16 and TF32, CUDA-core fp32 "highest" and fallback) against a float64 oracle and against XLA's
conv -> reduce_window on the same rounded values in float32, over random shapes (odd sizes,
N = 1, strides, dilation, overlapping and padded pools), VGG-19 / AlexNet pooled layers,
NaN-poisoned outputs, refusals and handler errors as Python exceptions, grads and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import jaxcnn
from jaxcnn._native import queries
from jaxcnn.ops.conv2d_pool.config import make_conv_pool_config
from arrays import traces
from poisoned_output import run_poisoned
from reference64 import rel_err
from test_conv2d_pool import TOL, as_f64, operands, oracle

pytestmark = pytest.mark.gpu

TARGET = "jaxcnn_conv2d_pool_fwd"
# Against XLA in float32 on the same rounded inputs: the kernel rounds once to the dtype; fp32 at
# precision "default" runs TF32 tensor cores (inputs rounded to 10 mantissa bits).
XLA_F32_TOL = {"float32": 2e-5, "bfloat16": 1e-2, "float16": 2e-3}
TF32_TOL = 5e-3

# Pooled layers (conv before each pool): (name, N, H, W, C, R, K, conv padding, window, stride).
VGG19_POOLED = [("vgg19/c1_2", 224, 64, 64), ("vgg19/c2_2", 112, 128, 128),
                ("vgg19/c3_4", 56, 256, 256), ("vgg19/c4_4", 28, 512, 512),
                ("vgg19/c5_4", 14, 512, 512)]
ALEXNET_POOLED = [("alexnet/conv2", 27, 64, 192, 5, 2), ("alexnet/conv5", 13, 256, 256, 3, 1)]


def xla_f32(x, w, b, **kw):
    """XLA's conv -> bias -> ReLU -> reduce_window on the same rounded values, float32 HIGHEST."""
    x, w, b = (jnp.asarray(a, jnp.float32) for a in (x, w, b))
    cfg = make_conv_pool_config(x.shape, w.shape, **kw)
    c = cfg.conv
    y = lax.conv_general_dilated(x, w, c.stride, c.padding, rhs_dilation=c.dilation,
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                 precision=lax.Precision.HIGHEST)
    y = jnp.maximum(y + b, 0.0)
    return lax.reduce_window(y, -jnp.inf, lax.max, (1, *cfg.pool_window, 1),
                             (1, *cfg.pool_stride, 1), ((0, 0), *cfg.pool_padding, (0, 0)))


def check(x, w, b, algorithm="auto", with_oracle=True, precision=None, **kw):
    dtype = x.dtype.name
    tf32 = dtype == "float32" and precision is None
    # The pre-pool activation never exists as a buffer: no XLA conv, no reduce-window.
    got = run_poisoned(lambda *a: jaxcnn.conv2d_pool(*a, algorithm=algorithm, precision=precision,
                                                     **kw), x, w, b,
                       target=TARGET, absent=("convolution", "reduce-window"))
    assert got.dtype == x.dtype and not np.isnan(as_f64(got)).any()
    want = np.asarray(jax.jit(lambda *a: xla_f32(*a, **kw))(x, w, b), np.float64)
    assert got.shape == want.shape
    tol = TF32_TOL if tf32 else XLA_F32_TOL[dtype]
    assert rel_err(got, want) <= tol, rel_err(got, want)
    if with_oracle:
        assert rel_err(got, oracle(x, w, b, **kw)) <= (TF32_TOL if tf32 else TOL[dtype])


@st.composite
def gpu_cases(draw):
    mult8 = st.integers(1, 12).map(lambda v: 8 * v)
    r = draw(st.sampled_from([1, 3, 3, 5]))
    window = draw(st.sampled_from([(2, 2), (2, 2), (3, 3), (2, 3), (1, 1), (4, 4)]))
    return dict(
        n=draw(st.sampled_from([1, 1, 2, 3])), h=draw(st.integers(r + window[0], 40)),
        w=draw(st.integers(r + window[1], 40)), c=draw(mult8), k=draw(mult8), r=r,
        kw=dict(stride=draw(st.sampled_from([1, 1, 2, (2, 1)])),
                padding=draw(st.sampled_from(["SAME", "VALID", ((2, 0), (0, 1))])),
                dilation=draw(st.sampled_from([1, 1, 2])) if r > 1 else 1,
                pool_window=window,
                pool_stride=draw(st.sampled_from([None, None, 2, 1, (1, 2)])),
                pool_padding=draw(st.sampled_from(["VALID", "VALID", "SAME"]))),
        dtype=draw(st.sampled_from(["bfloat16", "float16", "float32"])),
        seed=draw(st.integers(0, 2**16)))


def _fits(x, w, kw):
    return traces(lambda x, w: jaxcnn.conv2d_pool(x, w, **kw), x, w)


@settings(max_examples=60, deadline=None)
@given(gpu_cases())
def test_tensor_core_kernel_random_shapes(case):
    x, w, b = operands(case["seed"], case["n"], case["h"], case["w"], case["c"], case["k"],
                       case["r"], case["r"], jnp.dtype(case["dtype"]))
    if _fits(x, w, case["kw"]):
        check(x, w, b, "tensor_core", **case["kw"])


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(3, 20), st.integers(3, 20), st.integers(1, 20),
       st.integers(1, 20), st.sampled_from([(2, None), (3, 2)]),
       st.sampled_from(["bfloat16", "float16", "float32"]))
def test_any_channel_counts_run(n, h, w, c, k, pool, dtype):
    """auto: C below 16 or off a multiple of 8 (4 for fp32 TF32) runs the tensor-core kernel's
    flat-K mode, K off that multiple the CUDA-core kernel."""
    x, wt, b = operands(n * h + c + k, n, h, w, c, k, dtype=jnp.dtype(dtype))
    check(x, wt, b, pool_window=pool[0], pool_stride=pool[1])


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 2), st.integers(3, 24), st.integers(3, 24), st.integers(1, 40),
       st.integers(1, 40), st.sampled_from([(2, None), (3, 2)]))
def test_float32_highest_is_fp32_accurate(n, h, w, c, k, pool):
    x, wt, b = operands(n * h + c * k, n, h, w, c, k)
    check(x, wt, b, precision="highest", pool_window=pool[0], pool_stride=pool[1])


@pytest.mark.parametrize("dtype,precision", [("bfloat16", None), ("float16", None),
                                             ("float32", None), ("float32", "highest")])
@pytest.mark.parametrize("name,hw,c,k", VGG19_POOLED)
def test_vgg19_pooled_layers(name, hw, c, k, dtype, precision):
    x, w, b = operands(hw + c, 2, hw, hw, c, k, dtype=jnp.dtype(dtype))
    check(x, w, b, padding=1, with_oracle=hw <= 56, precision=precision)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("name,hw,c,k,r,pad", ALEXNET_POOLED)
def test_alexnet_overlapping_pools(name, hw, c, k, r, pad, dtype):
    x, w, b = operands(hw + c, 2, hw, hw, c, k, r, r, jnp.dtype(dtype))
    check(x, w, b, padding=pad, pool_window=3, pool_stride=2)


def test_headline_vgg_c1_2_n64_bf16():
    x, w, b = operands(0, 64, 224, 224, 64, 64, dtype=jnp.bfloat16)
    check(x, w, b, padding=1, with_oracle=False)


@pytest.mark.parametrize("algorithm", ["tensor_core", "direct"])
def test_forced_algorithms_agree(algorithm):
    x, w, b = operands(1, 2, 17, 23, 64, 72, dtype=jnp.bfloat16)
    check(x, w, b, algorithm, pool_window=3, pool_stride=2)


def _hopper():
    return str(getattr(jax.devices()[0], "compute_capability", "")).startswith("9.")


needs_hopper = pytest.mark.skipif(not _hopper(), reason="the wgmma kernel is sm_90 only")


@st.composite
def wgmma_cases(draw):
    """The wgmma kernel's family (3x3/1 SAME conv, 2x2/2 VALID pool, C % 32, K % 64) over odd
    and partial-tile extents, N = 1, several channel blocks and chunks."""
    return dict(n=draw(st.sampled_from([1, 1, 2, 3])), h=draw(st.integers(2, 41)),
                w=draw(st.integers(2, 41)), c=draw(st.sampled_from([32, 64, 96, 128])),
                k=draw(st.sampled_from([64, 128, 192, 256])),
                dtype=draw(st.sampled_from(["bfloat16", "float16"])),
                seed=draw(st.integers(0, 2**16)))


@needs_hopper
@settings(max_examples=40, deadline=None)
@given(wgmma_cases())
def test_wgmma_kernel_random_shapes(case):
    x, w, b = operands(case["seed"], case["n"], case["h"], case["w"], case["c"], case["k"],
                       dtype=jnp.dtype(case["dtype"]))
    check(x, w, b, "wgmma", padding="SAME")


@needs_hopper
@pytest.mark.parametrize("n,hw,c,k", [(16, 56, 64, 192), (4, 112, 128, 128), (40, 28, 32, 64),
                                      (100, 28, 256, 64), (24, 56, 128, 192)])
def test_wgmma_many_tiles_per_cta(n, hw, c, k):
    # More tiles than SMs: each persistent CTA runs several, and the ping-pong consumers
    # (64-channel blocks) alternate tiles; with C >= 96 an item has at least as many channel
    # chunks as the pipeline has stages (the consumers' ordering barrier keeps them in step).
    x, w, b = operands(15, n, hw, hw, c, k, dtype=jnp.bfloat16)
    check(x, w, b, "wgmma", padding=1, with_oracle=False)


@needs_hopper
@pytest.mark.parametrize("name,hw,c,k", VGG19_POOLED)
def test_auto_runs_wgmma_on_vgg_pooled_layers(name, hw, c, k):
    cfg = make_conv_pool_config((64, hw, hw, c), (3, 3, c, k), padding=1)
    plan = queries.conv_pool_plan((64, hw, hw, c), (3, 3, c, k), "bfloat16", cfg)
    # The configuration measured fastest at N=64 (conv_pool_wgmma_sm90a.cu, ConfigFor): the
    # resident-filter 32x8 tile at 224, 28x8 tiles (no padding rows) at 112, 56 and 28 (the
    # columns pad 28 to 32), 16x16 tiles with 128 channels at 14.
    tile = {224: (32, 8), 112: (28, 8), 56: (28, 8), 28: (28, 8), 14: (16, 16)}[hw]
    assert (plan.kernel, plan.block) == ("wgmma", tile), plan.text
    x, w, b = operands(11, 1, hw, hw, c, k, dtype=jnp.float16)
    check(x, w, b, padding=1)


@needs_hopper
def test_wgmma_matches_tensor_core_kernel_bitwise_close():
    # Same fp32 accumulation of the same products; only the summation order differs.
    x, w, b = operands(12, 2, 30, 22, 64, 128, dtype=jnp.bfloat16)
    f = {a: jax.jit(lambda *o, a=a: jaxcnn.conv2d_pool(*o, padding=1, algorithm=a))
         for a in ("wgmma", "tensor_core")}
    got, want = as_f64(f["wgmma"](x, w, b)), as_f64(f["tensor_core"](x, w, b))
    assert rel_err(got, want) <= XLA_F32_TOL["bfloat16"]


@needs_hopper
def test_wgmma_propagates_nan_and_handles_all_zero_input():
    x, w, b = operands(13, 1, 16, 16, 32, 64, dtype=jnp.bfloat16)
    f = jax.jit(lambda *o: jaxcnn.conv2d_pool(*o, padding=1, algorithm="wgmma"))
    y = np.asarray(f(x.at[0, 5, 6, 3].set(jnp.nan), w, b), np.float32)
    # The NaN reaches every conv output whose 3x3 window holds (5, 6): pooled rows 2-3, cols 2-3.
    nan_pix = np.isnan(y).any(axis=-1)[0]
    assert nan_pix[2:4, 2:4].all() and nan_pix.sum() == 4
    zeros = np.asarray(f(jnp.zeros_like(x), w, b), np.float32)
    np.testing.assert_allclose(zeros, np.broadcast_to(np.maximum(np.asarray(b, np.float32), 0),
                                                      zeros.shape), rtol=0, atol=0)


@needs_hopper
def test_forced_wgmma_refusals_are_python_errors():
    x, w, b = operands(14, 1, 16, 16, 32, 64, dtype=jnp.float32)
    with pytest.raises(Exception, match="wgmma kernel: bfloat16 / float16 only"):
        jax.block_until_ready(jaxcnn.conv2d_pool(x, w, b, padding=1, algorithm="wgmma"))
    x, w, b = operands(14, 1, 16, 16, 32, 64, dtype=jnp.bfloat16)
    with pytest.raises(Exception, match="3x3 conv, stride 1, padding 1"):
        jax.block_until_ready(jaxcnn.conv2d_pool(x, w, b, stride=2, padding=1, algorithm="wgmma"))
    with pytest.raises(Exception, match="2x2 stride-2 unpadded"):
        jax.block_until_ready(jaxcnn.conv2d_pool(x, w, b, padding=1, pool_window=3,
                                                 pool_stride=2, algorithm="wgmma"))
    x, w, b = operands(14, 1, 16, 16, 16, 64, dtype=jnp.bfloat16)
    with pytest.raises(Exception, match="C must be a multiple of 32"):
        jax.block_until_ready(jaxcnn.conv2d_pool(x, w, b, padding=1, algorithm="wgmma"))
    x, w, b = operands(14, 1, 16, 16, 32, 72, dtype=jnp.bfloat16)
    with pytest.raises(Exception, match="K must be a multiple of 64"):
        jax.block_until_ready(jaxcnn.conv2d_pool(x, w, b, padding=1, algorithm="wgmma"))


def test_forced_tensor_core_refusals_are_python_errors():
    x, w, b = operands(2, 1, 8, 8, 16, 8, dtype=jnp.float32)
    with pytest.raises(Exception, match="precision 'highest' runs on CUDA cores"):
        jax.block_until_ready(jaxcnn.conv2d_pool(x, w, b, algorithm="tensor_core",
                                                 precision="highest"))
    x, w, b = operands(2, 1, 8, 8, 8, 6, dtype=jnp.float32)
    with pytest.raises(Exception, match="K must be a multiple of 4"):
        jax.block_until_ready(jaxcnn.conv2d_pool(x, w, b, algorithm="tensor_core"))
    x, w, b = operands(2, 1, 8, 8, 16, 12, dtype=jnp.bfloat16)
    with pytest.raises(Exception, match="K must be a multiple of 8"):
        jax.block_until_ready(jaxcnn.conv2d_pool(x, w, b, algorithm="tensor_core"))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("c,r,kw", [
    (3, 3, dict(stride=2, padding="VALID", pool_window=3, pool_stride=2)),  # SqueezeNet 1.1
    (3, 7, dict(stride=2, padding=3, pool_window=3, pool_stride=2, pool_padding=1)),  # ResNet
    (3, 11, dict(stride=4, padding=2, pool_window=3, pool_stride=2)),  # AlexNet
    (1, 3, dict(padding=1)), (5, 5, dict(padding=2, dilation=2, pool_window=3, pool_stride=2)),
    (12, 3, dict(padding=1, pool_window=3, pool_stride=2)), (20, 3, dict(padding=1)),
])
def test_flat_k_stems_and_small_channel_counts(c, r, kw, dtype):
    """C=3 stems, C below 16 and C off the 16-byte multiple run forced tensor cores in flat-K
    mode (C=20 in fp32 is a multiple of 4: the chunked mode)."""
    x, w, b = operands(c + r, 2, 37, 35, c, 64, r, r, jnp.dtype(dtype))
    check(x, w, b, "tensor_core", **kw)
    cfg = make_conv_pool_config(x.shape, w.shape, algorithm="tensor_core", **kw)
    plan = queries.conv_pool_plan(x.shape, w.shape, dtype, cfg)
    flat = c < 16 or c % (16 // jnp.dtype(dtype).itemsize) != 0
    assert (plan.kernel, plan.flat_k) == ("tensor_core", flat), plan.text


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("n,c,r,k,kw", [
    (2, 3, 3, 64, dict(stride=2, padding="VALID", pool_window=3, pool_stride=2)),  # SqueezeNet 1.1
    (1, 3, 3, 64, dict(stride=2, padding="VALID", pool_window=3, pool_stride=2)),
    (2, 3, 7, 96, dict(stride=2, padding="VALID", pool_window=3, pool_stride=2)),  # SqueezeNet 1.0
    (2, 3, 7, 64, dict(stride=2, padding=3, pool_window=3, pool_stride=2, pool_padding=1)),  # ResNet
    (1, 3, 11, 64, dict(stride=4, padding=2, pool_window=3, pool_stride=2)),  # AlexNet
    (2, 1, 3, 8, dict(padding=1)), (2, 5, 5, 24, dict(padding=2, dilation=2, pool_window=3,
                                                     pool_stride=2, pool_padding=1)),
    (1, 12, 3, 136, dict(padding=1, pool_window=(2, 3), pool_stride=(1, 2))),
])
def test_stem_kernel_small_c(n, c, r, k, kw, dtype):
    """The stem kernel (auto's pick for small C) and forced: odd sizes, N=1, 7x7 and 11x11
    windows, conv and pool padding, dilation, three channel blocks (K=136)."""
    x, w, b = operands(c * 7 + r, n, 45, 39, c, k, r, r, jnp.dtype(dtype))
    check(x, w, b, "stem", **kw)
    check(x, w, b, "auto", **kw)
    cfg = make_conv_pool_config(x.shape, w.shape, **kw)
    plan = queries.conv_pool_plan(x.shape, w.shape, dtype, cfg)
    assert plan.kernel == "stem", plan.text


def test_forced_stem_refusals_are_python_errors():
    x, w, b = operands(4, 1, 12, 12, 64, 64, 3, 3, jnp.bfloat16)  # R*S*C = 576 > 512
    with pytest.raises(Exception, match="R\\*S\\*C above 512"):
        jax.block_until_ready(jaxcnn.conv2d_pool(x, w, b, algorithm="stem"))
    x, w, b = operands(4, 1, 12, 12, 3, 12, 3, 3, jnp.bfloat16)
    with pytest.raises(Exception, match="K must be a multiple of 8"):
        jax.block_until_ready(jaxcnn.conv2d_pool(x, w, b, algorithm="stem"))


def test_handler_errors_become_python_exceptions():
    x, w, b = operands(3, 1, 8, 8, 8, 8, dtype=jnp.bfloat16)
    attrs = dict(stride_h=1, stride_w=1, pad_top=1, pad_bottom=1, pad_left=1, pad_right=1,
                 dilation_h=1, dilation_w=1, pool_window_h=2, pool_window_w=2, pool_stride_h=2,
                 pool_stride_w=2, pool_pad_top=0, pool_pad_left=0, precision=0, algorithm=0)
    attrs = {k: np.int64(v) for k, v in attrs.items()}
    bad = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((1, 4, 4, 9), jnp.bfloat16))
    with pytest.raises(Exception, match="y must have shape"):
        jax.block_until_ready(jax.jit(lambda *a: bad(*a, **attrs))(x, w, b))
    ok = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((1, 4, 4, 8), jnp.bfloat16))
    with pytest.raises(Exception, match="algorithm must be"):
        jax.block_until_ready(jax.jit(lambda *a: ok(*a, **{**attrs, "algorithm": np.int64(9)}))(x, w, b))
    too_many = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((1, 9, 4, 8), jnp.bfloat16))
    with pytest.raises(Exception, match="pooled output extent"):
        jax.block_until_ready(jax.jit(lambda *a: too_many(*a, **attrs))(x, w, b))


def test_plan_query_names_the_kernel():
    cfg = make_conv_pool_config((64, 224, 224, 64), (3, 3, 64, 64), padding=1)
    assert queries.conv_pool_plan((64, 224, 224, 64), (3, 3, 64, 64), "bfloat16", cfg).kernel == (
        "wgmma" if _hopper() else "tensor_core")
    forced = make_conv_pool_config((64, 224, 224, 64), (3, 3, 64, 64), padding=1,
                                   algorithm="tensor_core")
    assert queries.conv_pool_plan((64, 224, 224, 64), (3, 3, 64, 64), "bfloat16",
                                  forced).kernel == "tensor_core"
    assert queries.conv_pool_plan((64, 224, 224, 64), (3, 3, 64, 64), "float32", cfg).kernel == "tensor_core"
    highest = make_conv_pool_config((64, 224, 224, 64), (3, 3, 64, 64), padding=1,
                                    precision="highest")
    assert queries.conv_pool_plan((64, 224, 224, 64), (3, 3, 64, 64), "float32",
                                  highest).kernel == "direct"


def test_deterministic():
    x, w, b = operands(4, 2, 27, 27, 64, 192, 5, 5, jnp.bfloat16)
    f = jax.jit(lambda *a: jaxcnn.conv2d_pool(*a, padding=2, pool_window=3, pool_stride=2))
    np.testing.assert_array_equal(f(x, w, b), f(x, w, b))


def test_grads_through_kernel_match_xla():
    x, w, b = operands(5, 2, 13, 11, 16, 24)
    loss = lambda f: lambda *a: jnp.sum(f(*a) ** 2)  # noqa: E731
    kw = dict(padding=1, pool_window=3, pool_stride=2)
    got = jax.jit(jax.grad(loss(lambda *a: jaxcnn.conv2d_pool(*a, **kw)), argnums=(0, 1, 2)))(x, w, b)
    want = jax.jit(jax.grad(loss(lambda *a: xla_f32(*a, **kw)), argnums=(0, 1, 2)))(x, w, b)
    for g, g_want in zip(got, want):
        # XLA's fp32 convs on GPU may use TF32 (DEFAULT precision) in the backward.
        np.testing.assert_allclose(g, g_want, rtol=2e-2, atol=2e-2 * float(jnp.max(jnp.abs(g_want))))


def test_vmap_on_gpu():
    x, w, b = operands(6, 2, 9, 10, 32, 32, dtype=jnp.bfloat16)
    xs = jnp.stack([x, -x, 2 * x])
    got = jax.jit(jax.vmap(lambda x: jaxcnn.conv2d_pool(x, w, b)))(xs)
    for i in range(3):
        np.testing.assert_array_equal(got[i], jaxcnn.conv2d_pool(xs[i], w, b))


@pytest.mark.parametrize("window,stride", [(2, 2), (3, 2)])
def test_sparse_true_matches_dense_fused_kernel(window, stride):
    k = jax.random.split(jax.random.PRNGKey(8), 3)
    x = jax.nn.relu(jax.random.normal(k[0], (2, 29, 31, 64)) - 1.0)  # ~84% zeros
    w = 0.05 * jax.random.normal(k[1], (3, 3, 64, 64))
    b = 0.1 * jax.random.normal(k[2], (64,))
    kw = dict(padding=1, pool_window=window, pool_stride=stride, precision="highest")
    dense = jaxcnn.conv2d_pool(x, w, b, **kw)
    sparse = jaxcnn.conv2d_pool(x, w, b, sparse=True, **{**kw, "precision": None})
    assert not np.isnan(np.asarray(sparse)).any()
    np.testing.assert_allclose(np.asarray(sparse), np.asarray(dense), rtol=1e-4, atol=1e-4)
