"""GPU suite: the layout-transform kernel against jnp.transpose, bit-exact (`pytest -m gpu`)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcnn
from jaxcnn.ops import layout_axes
from poisoned_output import run_poisoned

pytestmark = pytest.mark.gpu

PAIRS = list(itertools.permutations(layout_axes.LAYOUTS, 2))
DTYPES = ["float32", "bfloat16", "float16", "int8", "int32"]
# The kernel moves bytes: it sees only the element width, so the full shape x pair grid runs one
# dtype per width (the random test below samples every dtype).
ONE_DTYPE_PER_WIDTH = ["float32", "bfloat16", "int8"]
# Odd extents (no 16-byte vectors on one or both sides), size-1 axes (copies and 2-D
# transposes), skinny C=3 inputs, and real activation shapes (logical N, C, H, W).
SHAPES = [
    (1, 1, 1, 1),
    (2, 3, 5, 7),
    (5, 1, 7, 3),
    (1, 8, 1, 1),
    (3, 17, 9, 13),
    (2, 130, 3, 3),
    (65, 33, 1, 1),
    (7, 8, 2, 4),
    (64, 3, 7, 7),
    (2, 3, 224, 224),
    (1, 96, 55, 55),
    (8, 64, 56, 56),
    (64, 512, 7, 7),
    (33, 24, 13, 11),
]


def random_logical(shape, dtype, seed=0):
    """Values that never equal the poison: finite floats, integers >= 0."""
    rng = np.random.default_rng(seed)
    if jnp.issubdtype(dtype, jnp.integer):
        return rng.integers(0, 100, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def check_exact(logical, src, dst):
    x = jnp.asarray(np.einsum("nchw->" + src.lower(), logical))
    got = run_poisoned(lambda a: jaxcnn.to_layout(a, src, dst), x, target="jaxcnn_layout_transform")
    want = jnp.transpose(x, layout_axes.permutation(src, dst))
    assert got.shape == want.shape and got.dtype == want.dtype
    # Bit patterns: NaN payloads and -0.0 must survive too.
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8))


@pytest.mark.parametrize("dtype", ONE_DTYPE_PER_WIDTH)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("src,dst", PAIRS)
def test_all_pairs_dtypes_shapes(src, dst, shape, dtype):
    check_exact(random_logical(shape, jnp.dtype(dtype)), src, dst)


@settings(max_examples=60, deadline=None)
@given(
    st.tuples(st.integers(1, 70), st.integers(1, 70), st.integers(1, 20), st.integers(1, 20)),
    st.sampled_from(PAIRS),
    st.sampled_from(DTYPES),
    st.integers(0, 2**16),
)
def test_random_shapes(shape, pair, dtype, seed):
    check_exact(random_logical(shape, jnp.dtype(dtype), seed), *pair)


def test_special_values_are_moved_bit_exact():
    logical = random_logical((3, 5, 4, 6), np.float32)
    logical.flat[::7] = np.nan
    logical.flat[1::7] = -0.0
    logical.flat[2::7] = np.inf
    for src, dst in PAIRS:
        check_exact(logical, src, dst)


def test_offsets_past_int32():
    """2.2e9 one-byte elements: element offsets exceed int32 on both sides."""
    shape = (2, 1025, 1024, 1024)  # logical N, C, H, W
    x = jax.jit(lambda: (jnp.arange(np.prod(shape), dtype=jnp.uint32) % 251).astype(jnp.int8).reshape(
        layout_axes.shape_in("NHWC", N=2, C=1025, H=1024, W=1024)))()
    for dst in ("NCHW", "CHWN"):
        got = jaxcnn.to_layout(x, "NHWC", dst)
        same = jax.jit(lambda a, b: jnp.array_equal(a, jnp.transpose(b, layout_axes.permutation("NHWC", dst))))
        assert bool(same(got, x)), dst
        del got


@pytest.mark.parametrize("src,dst", PAIRS)
def test_grad_and_vmap_on_gpu(src, dst):
    x = jnp.asarray(np.einsum("nchw->" + src.lower(), random_logical((3, 6, 5, 7), np.float32)))
    cot = jax.random.normal(jax.random.PRNGKey(1), layout_axes.convert_shape(x.shape, src, dst))
    g = jax.jit(jax.grad(lambda a: jnp.sum(jaxcnn.to_layout(a, src, dst) * cot)))(x)
    np.testing.assert_array_equal(g, jnp.transpose(cot, layout_axes.permutation(dst, src)))
    xs = jnp.stack([x, x + 1, x * 2], axis=2)
    ys = jax.jit(jax.vmap(lambda a: jaxcnn.to_layout(a, src, dst), in_axes=2))(xs)
    for k in range(3):
        np.testing.assert_array_equal(ys[k], jnp.transpose(xs[:, :, k], layout_axes.permutation(src, dst)))


def test_handler_errors_become_python_exceptions():
    x = jnp.ones((2, 3, 4, 5), jnp.float32)
    call = jax.ffi.ffi_call("jaxcnn_layout_transform", jax.ShapeDtypeStruct((2, 5, 3, 4), x.dtype))
    with pytest.raises(Exception, match="src_layout"):
        jax.block_until_ready(jax.jit(lambda a: call(a, src_layout=np.int64(7), dst_layout=np.int64(1)))(x))
    bad_shape = jax.ffi.ffi_call("jaxcnn_layout_transform", jax.ShapeDtypeStruct((2, 4, 3, 5), x.dtype))
    with pytest.raises(Exception, match="output y shape"):
        jax.block_until_ready(jax.jit(lambda a: bad_shape(a, src_layout=np.int64(0), dst_layout=np.int64(1)))(x))
    # The process is still healthy afterwards.
    check_exact(random_logical((2, 3, 4, 5), np.float32), "NHWC", "NCHW")
