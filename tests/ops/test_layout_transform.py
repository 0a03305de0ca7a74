"""to_layout semantics, grads, vmap, validation, lowering and sharding on the reference path."""

import itertools
import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

import jaxcnn
from jaxcnn.ops import layout_axes
from cuda_lowering import cuda_text, custom_calls, needs_library
from host_devices import run_on_8_host_devices

PAIRS = list(itertools.permutations(layout_axes.LAYOUTS, 2))


def in_layout(logical, layout):
    """Logical [N, C, H, W] array laid out as `layout`, by index names (independent of
    layout_axes.permutation)."""
    return np.einsum("nchw->" + layout.lower(), logical)


def logical_array(n, c, h, w, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, c, h, w)).astype(dtype)


# ---------------------------------------------------------------- the layouts module


def test_layouts_module():
    assert jaxcnn.LAYOUTS == ("NHWC", "NCHW", "CHWN")
    assert layout_axes.LAYOUT_CODES == {"NHWC": 0, "NCHW": 1, "CHWN": 2}  # TensorLayout
    assert [layout_axes.batch_axis(lay) for lay in layout_axes.LAYOUTS] == [0, 0, 3]
    assert layout_axes.permutation("NHWC", "NCHW") == (0, 3, 1, 2)
    assert layout_axes.permutation("NCHW", "NHWC") == (0, 2, 3, 1)
    assert layout_axes.permutation("NHWC", "CHWN") == (3, 1, 2, 0)
    assert layout_axes.permutation("CHWN", "NHWC") == (3, 1, 2, 0)
    assert layout_axes.permutation("NCHW", "CHWN") == (1, 2, 3, 0)
    assert layout_axes.permutation("CHWN", "NCHW") == (3, 0, 1, 2)
    assert layout_axes.axis("CHWN", "W") == 2
    assert layout_axes.shape_in("CHWN", N=2, C=3, H=4, W=5) == (3, 4, 5, 2)
    assert layout_axes.convert_shape((2, 4, 5, 3), "NHWC", "NCHW") == (2, 3, 4, 5)
    for src, dst in PAIRS:
        perm = layout_axes.permutation(src, dst)
        assert layout_axes.permutation(dst, src) == tuple(np.argsort(perm))


# ---------------------------------------------------------------- values


@settings(max_examples=60, deadline=None)
@given(
    st.tuples(*[st.integers(1, 9)] * 4),
    st.sampled_from(PAIRS),
    st.sampled_from([np.float32, jnp.bfloat16, np.float16, np.int8, np.int32]),
)
def test_matches_index_definition(dims, pair, dtype):
    src, dst = pair
    logical = logical_array(*dims, dtype=np.float32, seed=sum(dims)).astype(dtype)
    x = in_layout(logical, src)
    y = jax.jit(lambda a: jaxcnn.to_layout(a, src, dst))(x)
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(y), in_layout(logical, dst))


@pytest.mark.parametrize("src,dst", PAIRS)
def test_round_trip_and_identity(src, dst):
    x = in_layout(logical_array(3, 5, 7, 2), src)
    back = jaxcnn.to_layout(jaxcnn.to_layout(x, src, dst), dst, src)
    np.testing.assert_array_equal(back, x)
    np.testing.assert_array_equal(jaxcnn.to_layout(x, src, src), x)


@pytest.mark.parametrize("shape", [(0, 3, 4, 5), (2, 0, 4, 5), (2, 3, 0, 1)])
def test_empty(shape):
    x = jnp.zeros(shape, jnp.bfloat16)
    y = jaxcnn.to_layout(x, "NHWC", "CHWN")
    assert y.shape == layout_axes.convert_shape(shape, "NHWC", "CHWN")


def test_default_direction_is_nhwc_to_nchw():
    x = in_layout(logical_array(2, 3, 4, 5), "NHWC")
    np.testing.assert_array_equal(jaxcnn.to_layout(x), in_layout(logical_array(2, 3, 4, 5), "NCHW"))


# ---------------------------------------------------------------- autodiff


@pytest.mark.parametrize("src,dst", PAIRS)
def test_grad_is_inverse_transform(src, dst):
    x = jnp.asarray(in_layout(logical_array(2, 3, 5, 4), src))
    cot = jnp.asarray(in_layout(logical_array(2, 3, 5, 4, seed=1), dst))
    g = jax.grad(lambda a: jnp.sum(jaxcnn.to_layout(a, src, dst) * cot))(x)
    np.testing.assert_array_equal(g, jnp.transpose(cot, layout_axes.permutation(dst, src)))
    check_grads(lambda a: jaxcnn.to_layout(a, src, dst), (x,), order=2, modes=("fwd", "rev"))


def test_grad_jaxpr_uses_the_primitive_both_ways():
    x = jnp.ones((2, 3, 4, 5))
    jaxpr = jax.make_jaxpr(jax.grad(lambda a: jnp.sum(jaxcnn.to_layout(a, "NHWC", "CHWN") ** 2)))(x)
    text = str(jaxpr)
    assert text.count("jaxcnn_layout_transform") == 2, text
    assert "transpose[" not in text  # no XLA transpose in the jaxpr


def test_linear_transpose():
    x = jnp.asarray(in_layout(logical_array(2, 3, 4, 5), "NCHW"))
    f_t = jax.linear_transpose(lambda a: jaxcnn.to_layout(a, "NCHW", "CHWN"), x)
    y = jnp.asarray(in_layout(logical_array(2, 3, 4, 5, seed=3), "CHWN"))
    (got,) = f_t(y)
    np.testing.assert_array_equal(got, jaxcnn.to_layout(y, "CHWN", "NCHW"))


# ---------------------------------------------------------------- vmap


@pytest.mark.parametrize("src,dst", PAIRS)
@pytest.mark.parametrize("in_axis", [0, 2, 4])
def test_vmap(src, dst, in_axis):
    xs = np.stack([in_layout(logical_array(2, 3, 5, 4, seed=s), src) for s in range(3)], axis=in_axis)
    got = jax.jit(jax.vmap(lambda a: jaxcnn.to_layout(a, src, dst), in_axes=in_axis))(xs)
    for s in range(3):
        np.testing.assert_array_equal(got[s], in_layout(logical_array(2, 3, 5, 4, seed=s), dst))
    jaxpr = str(jax.make_jaxpr(jax.vmap(lambda a: jaxcnn.to_layout(a, src, dst), in_axes=in_axis))(xs))
    assert jaxpr.count("jaxcnn_layout_transform") == 1  # one launch for all mapped copies


def test_nested_vmap_and_grad_of_vmap():
    xs = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 4, 5, 6, 7)), jnp.float32)
    f = jax.vmap(jax.vmap(lambda a: jaxcnn.to_layout(a, "CHWN", "NHWC"), in_axes=1), in_axes=0)
    got = f(xs)
    want = jnp.stack([jnp.stack([jnp.transpose(xs[i, :, j], (3, 1, 2, 0)) for j in range(4)]) for i in range(2)])
    np.testing.assert_array_equal(got, want)
    g = jax.grad(lambda a: jnp.sum(f(a) ** 2))(xs)
    np.testing.assert_allclose(g, 2 * xs, rtol=1e-6)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(src="NWHC"), ValueError, r"src must be one of \('NHWC', 'NCHW', 'CHWN'\), got 'NWHC'"),
        (dict(dst="nchw"), ValueError, "dst must be one of"),
        (dict(src=0), TypeError, "src must be a layout string"),
        (dict(dst=None), TypeError, "dst must be a layout string"),
        (dict(x=jax.ShapeDtypeStruct((2, 3, 4), jnp.float32)), ValueError, r"x must be rank 4 \(NHWC\)"),
        (dict(x=jax.ShapeDtypeStruct((2, 3, 4, 5), jnp.complex64)), TypeError, "x dtype must be"),
        (dict(x=jax.ShapeDtypeStruct((2, 3, 4, 5), jnp.int4)), TypeError, "x dtype must be"),
    ],
)
def test_validation_errors_name_the_argument(kwargs, error, match):
    x = kwargs.pop("x", jax.ShapeDtypeStruct((2, 3, 4, 5), jnp.float32))
    with pytest.raises(error, match=match):
        jax.jit(lambda a: jaxcnn.to_layout(a, **{"src": "NHWC", "dst": "NCHW", **kwargs})).trace(x)


# ---------------------------------------------------------------- lowering

@needs_library
@pytest.mark.parametrize("src,dst", PAIRS)
def test_cuda_lowering_is_ffi_custom_call(src, dst):
    x = jax.ShapeDtypeStruct(layout_axes.shape_in(src, N=2, C=3, H=5, W=7), jnp.bfloat16)
    text = cuda_text(lambda a: jaxcnn.to_layout(a, src, dst), x)
    calls = custom_calls(text, "jaxcnn_layout_transform")
    assert len(calls) == 1, text
    attrs = dict(re.findall(r"(\w+_layout) = (\d+) : i64", calls[0]))
    assert attrs == dict(src_layout=str(layout_axes.LAYOUT_CODES[src]), dst_layout=str(layout_axes.LAYOUT_CODES[dst]))
    out_shape = "x".join(map(str, layout_axes.convert_shape(x.shape, src, dst)))
    assert f"tensor<{out_shape}xbf16>" in calls[0]
    assert "stablehlo.transpose" not in text


@needs_library
def test_cuda_lowering_of_grad_uses_the_kernel_both_ways():
    x = jax.ShapeDtypeStruct((2, 5, 7, 3), jnp.float32)
    text = cuda_text(jax.grad(lambda a: jnp.sum(jaxcnn.to_layout(a, "NHWC", "CHWN") ** 2)), x)
    assert text.count("custom_call @jaxcnn_layout_transform(") == 2, text
    assert "stablehlo.transpose" not in text


def test_cpu_lowering_is_reference():
    x = jax.ShapeDtypeStruct((2, 5, 7, 3), jnp.float32)
    text = jax.jit(lambda a: jaxcnn.to_layout(a, "NHWC", "NCHW")).trace(x).lower(lowering_platforms=("cpu",)).as_text()
    assert "stablehlo.transpose" in text and "custom_call @jaxcnn" not in text


# ---------------------------------------------------------------- sharding

SHARDING_SCRIPT = textwrap.dedent(
    """
    import itertools
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import jaxcnn
    from jaxcnn.ops import layout_axes
    from batch_sharding import assert_no_gather, data_mesh

    mesh = data_mesh()
    logical = np.random.default_rng(0).standard_normal((16, 5, 3, 7)).astype(np.float32)

    def spec(layout):
        entries = [None] * 4
        entries[layout_axes.batch_axis(layout)] = "data"
        return P(*entries)

    for src, dst in itertools.permutations(layout_axes.LAYOUTS, 2):
        x = np.einsum("nchw->" + src.lower(), logical)
        want = np.einsum("nchw->" + dst.lower(), logical)
        xs = jax.device_put(x, NamedSharding(mesh, spec(src)))
        fwd = jax.jit(lambda a: jaxcnn.to_layout(a, src, dst))
        hlo = fwd.lower(xs).compile().as_text()
        assert_no_gather(hlo, src, dst)
        shard = layout_axes.shape_in(dst, N=2, C=5, H=3, W=7)
        assert "f32[" + ",".join(map(str, shard)) + "]" in hlo, (src, dst, "per-device 2-image shard", hlo)
        y = fwd(xs)
        assert y.sharding.is_equivalent_to(NamedSharding(mesh, spec(dst)), 4), (src, dst, y.sharding)
        np.testing.assert_array_equal(y, want)

        # The gradient is the inverse transform: batch-local too.
        loss = lambda a: jnp.sum(jaxcnn.to_layout(a, src, dst) ** 2)
        grad = jax.jit(jax.grad(loss))
        ghlo = grad.lower(xs).compile().as_text()
        assert_no_gather(ghlo, src, dst)
        np.testing.assert_allclose(grad(xs), 2 * x, rtol=1e-6)

        sm = jax.jit(jax.shard_map(lambda a: jaxcnn.to_layout(a, src, dst), mesh=mesh,
                                   in_specs=(spec(src),), out_specs=spec(dst)))
        np.testing.assert_array_equal(sm(xs), want)
    print("SHARDING OK")
    """
)


def test_batch_sharded_layout_transform_has_no_all_gather():
    assert "SHARDING OK" in run_on_8_host_devices(SHARDING_SCRIPT, timeout=600)
