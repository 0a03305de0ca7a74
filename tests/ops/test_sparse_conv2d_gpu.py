"""GPU suite for the zero-skipping conv (`pytest -m gpu`): the CUDA kernels against the dense
conv (XLA at HIGHEST precision in float32 on the same rounded values) and a float64 oracle,
over random shapes x sparsity levels (no zeros, 50%, 90%, 99%, all zeros), NaN-poisoned
outputs, the fused pool equal to conv -> reduce_window, VGG/AlexNet layer shapes, grads, vmap,
handler errors as Python exceptions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import jaxcnn
from arrays import as_f64
from poisoned_output import run_poisoned
from reference64 import conv2d_f64
from test_sparse_conv2d import SPARSITIES, pool_f64, sparse_x, weights

pytestmark = pytest.mark.gpu

TARGET = "jaxcnn_sparse_conv2d_fwd"
DTYPES = ("float32", "bfloat16", "float16")
# Against the float64 oracle: fp32 summation in another order, one rounding to the dtype.
TOL = {"float32": dict(rtol=2e-5, atol=2e-5), "bfloat16": dict(rtol=2e-2, atol=2e-2),
       "float16": dict(rtol=3e-3, atol=3e-3)}


def run_sparse_poisoned(fn, *operands):
    """run_poisoned for the sparse kernel: its first result (the second is the mask scratch) is
    the program's output, and no XLA convolution is left."""
    return run_poisoned(fn, *operands, target=TARGET, scratch=True, absent=("convolution",))


def xla_dense(x, w, b, **kw):
    """XLA's dense conv in float32 at HIGHEST precision on the same (rounded) values."""
    f32 = lambda a: None if a is None else jnp.asarray(a, jnp.float32)  # noqa: E731
    return jax.jit(lambda x, w, b: jaxcnn.conv2d(x, w, b, precision="highest", algorithm="xla", **kw))(
        f32(x), f32(w), f32(b))


def check(x, w, b, **kw):
    dtype = x.dtype.name
    got = run_sparse_poisoned(lambda x, w, b: jaxcnn.sparse_conv2d(x, w, b, **kw), x, w, b)
    assert got.dtype == x.dtype and not np.isnan(as_f64(got)).any()
    want = conv2d_f64(as_f64(x), as_f64(w), as_f64(b), **kw)
    np.testing.assert_allclose(as_f64(got), want, **TOL[dtype])
    np.testing.assert_allclose(as_f64(got), as_f64(xla_dense(x, w, b, **kw)), **TOL[dtype])


@st.composite
def gpu_cases(draw):
    r = draw(st.sampled_from([1, 3, 3, 5]))
    return dict(
        n=draw(st.sampled_from([1, 1, 2, 3])), h=draw(st.integers(3, 40)), w=draw(st.integers(3, 40)),
        c=draw(st.one_of(st.integers(1, 70), st.sampled_from([64, 96, 128, 256]))),
        k=draw(st.one_of(st.integers(1, 70), st.sampled_from([64, 128, 192, 256]))),
        r=r, stride=draw(st.sampled_from([1, 1, 2])), dilation=draw(st.sampled_from([1, 1, 2])),
        padding=draw(st.sampled_from(["SAME", "SAME", 0, (1, 2)])),
        activation=draw(st.sampled_from([None, "relu"])), sparsity=draw(st.sampled_from(SPARSITIES)),
        dtype=draw(st.sampled_from(DTYPES)), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=40, deadline=None)
@given(gpu_cases())
def test_random_shapes_x_sparsity(case):
    c = case
    span = c["dilation"] * (c["r"] - 1) + 1
    pad = {"SAME": span, 0: 0, (1, 2): 2}[c["padding"]]
    if min(c["h"], c["w"]) + pad < span:
        return
    dtype = jnp.dtype(c["dtype"])
    x = sparse_x(c["seed"], (c["n"], c["h"], c["w"], c["c"]), c["sparsity"], dtype)
    w, b = weights(c["seed"], c["r"], c["r"], c["c"], c["k"], dtype)
    check(x, w, b, stride=c["stride"], padding=c["padding"], dilation=c["dilation"],
          activation=c["activation"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sparsity", SPARSITIES)
def test_edge_sparsities_n1_odd_sizes(dtype, sparsity):
    dtype = jnp.dtype(dtype)
    x = sparse_x(1, (1, 15, 13, 40), sparsity, dtype)
    w, b = weights(1, 3, 3, 40, 72, dtype)
    check(x, w, b, activation="relu")
    check(x, w, b, stride=2, padding="VALID")


# name: (x shape NHWC, R, K, stride, pad)
LAYERS = {
    "vgg_c1_2": ((1, 224, 224, 64), 3, 64, 1, 1),
    "vgg_c3_2": ((2, 56, 56, 256), 3, 256, 1, 1),
    "vgg_c5_2": ((1, 14, 14, 512), 3, 512, 1, 1),
    "alexnet_c1": ((2, 224, 224, 3), 11, 64, 4, 2),
    "alexnet_c2": ((2, 27, 27, 64), 5, 192, 1, 2),
    "alexnet_c3": ((2, 13, 13, 192), 3, 384, 1, 1),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("sparsity", [0.0, 0.9])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_network_layers(layer, sparsity, dtype):
    shape, r, k, stride, pad = LAYERS[layer]
    dtype = jnp.dtype(dtype)
    x = sparse_x(2, shape, sparsity, dtype, signed=False)
    w, b = weights(2, r, r, shape[-1], k, dtype)
    check(x, w, b, stride=stride, padding=pad, activation="relu")


POOLS = [((2, 2), None, "VALID"), ((3, 3), (2, 2), "VALID"), ((3, 3), (2, 2), "SAME"),
         ((2, 2), (1, 1), "VALID"), ((4, 4), (3, 3), ((1, 1), (1, 1)))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window,stride,padding", POOLS)
@pytest.mark.parametrize("sparsity", [0.0, 0.9, 1.0])
def test_pool_equals_conv_then_reduce_window(window, stride, padding, sparsity, dtype):
    dtype = jnp.dtype(dtype)
    x = sparse_x(3, (2, 27, 25, 48), sparsity, dtype)
    w, b = weights(3, 3, 3, 48, 96, dtype)
    fused = lambda x, w, b: jaxcnn.sparse_conv2d_pool(  # noqa: E731
        x, w, b, pool_window=window, pool_stride=stride, pool_padding=padding)
    got = run_sparse_poisoned(fused, x, w, b)
    assert "reduce-window" not in jax.jit(fused).lower(x, w, b).compile().as_text()
    conv = jaxcnn.sparse_conv2d(x, w, b, activation="relu")
    pads = padding if isinstance(padding, str) else ((0, 0), *padding, (0, 0))
    want = lax.reduce_window(conv, -jnp.inf, lax.max, (1, *window, 1), (1, *(stride or window), 1), pads)
    # The pooled op runs the walk kernel, the stride-1 conv the tile kernel: the same sums in
    # another order.
    np.testing.assert_allclose(as_f64(got), as_f64(want), **TOL[dtype.name])
    explicit = lax.padtype_to_pads(conv.shape[1:3], window, stride or window, padding) \
        if isinstance(padding, str) else padding
    ref = pool_f64(conv2d_f64(as_f64(x), as_f64(w), as_f64(b), activation="relu"), window, stride or window, explicit)
    np.testing.assert_allclose(as_f64(got), ref, **TOL[dtype.name])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vgg_pooled_layer_n4(dtype):
    dtype = jnp.dtype(dtype)
    x = sparse_x(4, (4, 112, 112, 128), 0.8, dtype, signed=False)
    w, b = weights(4, 3, 3, 128, 128, dtype)
    got = run_sparse_poisoned(lambda x, w, b: jaxcnn.sparse_conv2d_pool(x, w, b), x, w, b)
    ref = pool_f64(conv2d_f64(as_f64(x), as_f64(w), as_f64(b), activation="relu"), (2, 2), (2, 2), ((0, 0), (0, 0)))
    np.testing.assert_allclose(as_f64(got), ref, **TOL[dtype.name])


def test_grads_and_vmap_on_gpu():
    x = sparse_x(5, (2, 12, 11, 24), 0.7)
    w, b = weights(5, 3, 3, 24, 16)
    loss = lambda f: lambda x, w, b: jnp.sum(f(x, w, b) ** 2)  # noqa: E731
    got = jax.jit(jax.grad(loss(lambda *a: jaxcnn.sparse_conv2d(*a, activation="relu")), argnums=(0, 1, 2)))(x, w, b)
    want = jax.grad(loss(lambda *a: xla_dense(*a, activation="relu")), argnums=(0, 1, 2))(x, w, b)
    for g, ref in zip(got, want):
        np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-4)
    xs = jnp.stack([x, 2 * x])
    ys = jax.jit(jax.vmap(lambda x: jaxcnn.sparse_conv2d_pool(x, w, b)))(xs)
    for i in range(2):
        np.testing.assert_array_equal(ys[i], jaxcnn.sparse_conv2d_pool(xs[i], w, b))


def test_nan_input_propagates_like_dense():
    x = sparse_x(6, (1, 6, 6, 8), 0.5).at[0, 2, 3, 1].set(jnp.nan)
    w, b = weights(6, 3, 3, 8, 4)
    y = jaxcnn.sparse_conv2d(x, w, b)
    dense = xla_dense(x, w, b)
    np.testing.assert_array_equal(np.isnan(as_f64(y)), np.isnan(as_f64(dense)))


def test_handler_errors_become_python_exceptions():
    x, w, b = jnp.ones((1, 4, 4, 8)), jnp.ones((3, 3, 8, 4)), jnp.ones((4,))
    attrs = dict(stride_h=1, stride_w=1, pad_h=1, pad_w=1, dilation_h=1, dilation_w=1, activation=0,
                 pool_window_h=0, pool_window_w=0, pool_stride_h=0, pool_stride_w=0, pool_pad_h=0,
                 pool_pad_w=0, conv_out_h=4, conv_out_w=4)
    attrs = {k: np.int64(v) for k, v in attrs.items()}
    scratch = jax.ShapeDtypeStruct((64,), jnp.uint8)
    bad_y = jax.ffi.ffi_call(TARGET, (jax.ShapeDtypeStruct((1, 4, 4, 5), jnp.float32), scratch))
    with pytest.raises(Exception, match="must have batch 1 and 4 channels"):
        jax.block_until_ready(jax.jit(lambda *a: bad_y(*a, **attrs))(x, w, b))
    # The stride-2 conv runs the walk kernel, whose masks (16 pixels x 4 bytes) need 64 bytes.
    strided = {**attrs, "stride_h": np.int64(2), "stride_w": np.int64(2), "conv_out_h": np.int64(2),
               "conv_out_w": np.int64(2)}
    small = jax.ffi.ffi_call(TARGET, (jax.ShapeDtypeStruct((1, 2, 2, 4), jnp.float32),
                                      jax.ShapeDtypeStruct((8,), jnp.uint8)))
    with pytest.raises(Exception, match="scratch smaller than the nonzero masks .scratch 8 bytes, the plan uses 64"):
        jax.block_until_ready(jax.jit(lambda *a: small(*a, **strided))(x, w, b))


def test_plan_query_reports_the_launch():
    from jaxcnn._native import queries

    layer = dict(N=1, H=56, W=56, C=256, R=3, S=3, K=256, P=56, Q=56, stride_h=1, stride_w=1, pad_h=1,
                 pad_w=1, dilation_h=1, dilation_w=1)
    plan = queries.sparse_conv_plan(layer)
    # Sixteen warps of 2x8 tiles a CTA on an 8x32 region (56x56 wastes 8 columns, the least of
    # the 16-warp regions, and 8x32 is squarer than 4x64); N=1 fills the GPU only with the input
    # channels split (16 chunks of 16 fp32).
    assert plan is not None and (plan.kernel, plan.tile, plan.k_per_lane, plan.warps, plan.region, plan.chunk) == (
        "tile", (2, 8), 4, (4, 4), (8, 32), 16), plan
    splits = plan.splits
    assert 1 < splits <= 16 and plan.scratch == splits * 56 * 56 * 256 * 4, plan.text
    # 16-bit storage stages 32 channels a chunk.
    assert queries.sparse_conv_plan({**layer, "elem_bytes": 2}).chunk == 32
    assert queries.sparse_conv_scratch_bytes(layer) == splits * 56 * 56 * 256 * 4
    # VGG conv1_2 at N=1: 98 CTAs leave SMs idle, but splitting its 4 chunks would move 4 x 12.8 MB
    # of fp32 partial sums through memory, more than the idle SMs cost.
    conv1_2 = {**layer, "H": 224, "W": 224, "C": 64, "K": 64, "P": 224, "Q": 224}
    assert queries.sparse_conv_plan(conv1_2).splits == 1, queries.sparse_conv_plan(conv1_2).text
    # 28 columns: 7-wide tiles cover them exactly (8-wide ones would compute 32).
    deep = {**layer, "N": 64, "H": 28, "W": 28, "C": 512, "K": 512, "P": 28, "Q": 28}
    plan = queries.sparse_conv_plan(deep)
    assert (plan.kernel, plan.tile, plan.k_per_lane, plan.warps, plan.region, plan.chunk, plan.splits) == (
        "tile", (2, 7), 4, (8, 2), (16, 14), 16, 1), plan.text
    strided = {**layer, "stride_h": 2, "stride_w": 2, "P": 28, "Q": 28}
    plan = queries.sparse_conv_plan(strided)
    assert plan.kernel == "walk" and plan.k_per_lane is not None and plan.scratch == 56 * 56 * 8 * 4, plan.text


@pytest.mark.parametrize("n", [1, 64])
def test_deterministic(n):
    # n=1 splits the channels (partial sums added in a fixed order), n=64 does not.
    x = sparse_x(7, (n, 28, 28, 128), 0.9, jnp.bfloat16)
    w, b = weights(7, 3, 3, 128, 128, jnp.bfloat16)
    f = jax.jit(lambda x, w, b: jaxcnn.sparse_conv2d(x, w, b, activation="relu"))
    np.testing.assert_array_equal(f(x, w, b), f(x, w, b))
