"""jaxcnn.fire on the reference (CPU) path: equal to the zoo's unfused fire module and to a
float64 NumPy oracle, shapes and validation errors, grads, vmap, batch sharding on 8 forced
host devices, and the CUDA lowering text (the FFI custom call)."""

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
from jaxcnn._native import library
from jaxcnn.models.backends import XLA_OPS
from jaxcnn.models.layers import Net
from jaxcnn.models.squeezenet import fire as zoo_fire
from jaxcnn.ops.fire.api import fire_block
from arrays import BAD_NHWC_X, as_f64, check_trace_raises, he_normal, normal, sds
from cuda_lowering import cuda_text, custom_calls, needs_library
from host_devices import run_on_8_host_devices
from reference64 import ALLCLOSE_TOL as TOL
from vmap_batching import check_folds_into_batch

# The zoo's XLA layers round each conv's output to the dtype before adding the bias (two
# roundings per layer, one per layer here), so half types differ by a few ulps more.
ZOO_TOL = {**TOL, "bfloat16": dict(rtol=5e-2, atol=5e-2), "float16": dict(rtol=1e-2, atol=1e-2)}


def fire_operands(seed, n, h, w, c, s, e1, e3, dtype=jnp.float32):
    """x and (w, b) of the three convs, He-scaled so activations stay O(1)."""
    k = jax.random.split(jax.random.PRNGKey(seed), 7)
    return (normal(k[0], (n, h, w, c), dtype=dtype), he_normal(k[1], (1, 1, c, s), dtype),
            he_normal(k[2], (1, 1, s, e1), dtype), he_normal(k[3], (3, 3, s, e3), dtype),
            normal(k[4], (s,), 0.2, dtype), normal(k[5], (e1,), 0.2, dtype),
            normal(k[6], (e3,), 0.2, dtype))


def zoo_params(ops):
    _, wsq, we1, we3, bsq, be1, be3 = ops
    return {"f/squeeze1x1": {"w": wsq, "b": bsq}, "f/expand1x1": {"w": we1, "b": be1},
            "f/expand3x3": {"w": we3, "b": be3}}


def zoo_fire_xla(ops):
    """The zoo's unfused fire module on XLA's ops (what a plain JAX SqueezeNet runs)."""
    x = ops[0]
    _, _, we1, we3, *_ = ops
    return zoo_fire(Net(XLA_OPS, zoo_params(ops)), "f", x, squeeze=ops[1].shape[3],
                    expand1x1=we1.shape[3], expand3x3=we3.shape[3])


def oracle_f64(ops):
    """Independent float64 NumPy fire module; the squeeze rounded to x's dtype."""
    x, wsq, we1, we3, bsq, be1, be3 = (as_f64(a) for a in ops)
    dtype = ops[0].dtype
    s = np.maximum(np.einsum("nhwc,cs->nhws", x, wsq[0, 0]) + bsq, 0)
    s = np.asarray(jnp.asarray(s, jnp.float32).astype(dtype).astype(jnp.float32), np.float64)
    y1 = np.maximum(np.einsum("nhws,sk->nhwk", s, we1[0, 0]) + be1, 0)
    n, h, w, _ = s.shape
    sp = np.pad(s, ((0, 0), (1, 1), (1, 1), (0, 0)))
    y3 = sum(np.einsum("nhws,sk->nhwk", sp[:, dy:dy + h, dx:dx + w], we3[dy, dx])
             for dy in range(3) for dx in range(3))
    return np.concatenate([y1, np.maximum(y3 + be3, 0)], axis=-1)


# SqueezeNet 1.0 / 1.1 fire modules: (C, squeeze, expand) as in torchvision.
SQUEEZENET_FIRES = [(96, 16, 64), (128, 16, 64), (128, 32, 128), (256, 32, 128),
                    (256, 48, 192), (384, 48, 192), (384, 64, 256), (512, 64, 256), (64, 16, 64)]


@pytest.mark.parametrize("c,s,e", SQUEEZENET_FIRES)
def test_equals_zoo_fire_module_float32(c, s, e):
    ops = fire_operands(c + s, 2, 7, 6, c, s, e, e)
    got = jax.jit(jaxcnn.fire)(*ops)
    assert got.shape == (2, 7, 6, 2 * e) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, zoo_fire_xla(ops), **TOL["float32"])
    np.testing.assert_allclose(as_f64(got), oracle_f64(ops), **TOL["float32"])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_equals_zoo_fire_module_half_types(dtype):
    ops = fire_operands(3, 2, 9, 11, 128, 32, 128, 128, jnp.dtype(dtype))
    got = jaxcnn.fire(*ops)
    assert got.dtype == jnp.dtype(dtype)
    np.testing.assert_allclose(as_f64(got), as_f64(zoo_fire_xla(ops)), **ZOO_TOL[dtype])
    np.testing.assert_allclose(as_f64(got), oracle_f64(ops), **TOL[dtype])


def test_channel_order_is_expand1x1_then_expand3x3():
    x, wsq, we1, we3, bsq, be1, be3 = fire_operands(4, 1, 5, 5, 8, 8, 8, 16)
    y = jaxcnn.fire(x, wsq, we1, we3, bsq, be1, be3)
    only_e1 = jaxcnn.fire(x, wsq, we1, jnp.zeros_like(we3), bsq, be1, jnp.full_like(be3, -1.0))
    np.testing.assert_array_equal(y[..., :8], only_e1[..., :8])
    np.testing.assert_array_equal(only_e1[..., 8:], 0.0)


def test_zoo_block_runs_fused():
    """Net.block with an op table mapping "fire" to fire_block gives the unfused result."""
    ops = fire_operands(5, 2, 8, 8, 16, 8, 16, 16)
    params = zoo_params(ops)
    fused_ops = {**XLA_OPS, "fire": fire_block}
    body = lambda net, x: net.block("fire", "f", zoo_fire, x, squeeze=8, expand1x1=16,  # noqa: E731
                                    expand3x3=16)
    fused = body(Net(fused_ops, params), ops[0])
    np.testing.assert_allclose(fused, body(Net(XLA_OPS, params), ops[0]), **TOL["float32"])


@st.composite
def fire_shapes(draw):
    return dict(n=draw(st.integers(1, 3)), h=draw(st.integers(1, 12)), w=draw(st.integers(1, 12)),
                c=draw(st.integers(1, 24)), s=draw(st.integers(1, 12)), e1=draw(st.integers(1, 12)),
                e3=draw(st.integers(1, 12)), seed=draw(st.integers(0, 2**16)))


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(fire_shapes())
def test_random_shapes_match_float64_oracle(case):
    ops = fire_operands(case["seed"], *(case[k] for k in ("n", "h", "w", "c", "s", "e1", "e3")))
    got = jaxcnn.fire(*ops)
    np.testing.assert_allclose(as_f64(got), oracle_f64(ops), **TOL["float32"])


def test_none_biases_are_zero():
    x, wsq, we1, we3, *_ = fire_operands(6, 1, 4, 4, 8, 8, 8, 8)
    zeros = [jnp.zeros((8,))] * 3
    np.testing.assert_array_equal(jaxcnn.fire(x, wsq, we1, we3), jaxcnn.fire(x, wsq, we1, we3, *zeros))


def test_jit_and_eager_agree_and_algorithms_agree_on_cpu():
    ops = fire_operands(7, 2, 6, 5, 16, 8, 8, 8)
    eager = jaxcnn.fire(*ops)
    np.testing.assert_array_equal(jax.jit(jaxcnn.fire)(*ops), eager)
    for algorithm in ("tensor_core", "fma", "wgmma", "two_phase"):
        np.testing.assert_array_equal(jaxcnn.fire(*ops, algorithm=algorithm), eager)


# ---------------------------------------------------------------- validation


GOOD = dict(x=sds((2, 8, 8, 16)), squeeze_w=sds((1, 1, 16, 8)), expand1_w=sds((1, 1, 8, 4)),
            expand3_w=sds((3, 3, 8, 6)), squeeze_b=sds((8,)), expand1_b=sds((4,)),
            expand3_b=sds((6,)))


@pytest.mark.parametrize(
    "changes,error,match",
    [
        *BAD_NHWC_X,
        (dict(squeeze_w=sds((1, 1, 15, 8))), ValueError, r"squeeze_w must have shape \(1, 1, 16, 8\)"),
        (dict(squeeze_w=sds((3, 3, 16, 8))), ValueError, "squeeze_w must be rank 4 HWIO"),
        (dict(squeeze_w=sds((16, 8))), ValueError, "squeeze_w must be rank 4 HWIO"),
        (dict(squeeze_w=sds((1, 1, 16, 8), jnp.bfloat16)), TypeError, "squeeze_w dtype bfloat16 must equal x"),
        (dict(expand1_w=sds((1, 1, 7, 4))), ValueError, "expand1_w must have shape"),
        (dict(expand1_w=sds((3, 3, 8, 4))), ValueError, "expand1_w must be rank 4 HWIO"),
        (dict(expand3_w=sds((1, 1, 8, 6))), ValueError, r"expand3_w must be rank 4 HWIO \[3, 3"),
        (dict(expand3_w=sds((3, 3, 9, 6))), ValueError, "expand3_w must have shape"),
        (dict(squeeze_b=sds((7,))), ValueError, "squeeze_b must have shape"),
        (dict(expand1_b=sds((4, 1))), ValueError, "expand1_b must have shape"),
        (dict(expand3_b=sds((6,), jnp.float16)), TypeError, "expand3_b dtype"),
    ],
)
def test_bad_arguments_raise_at_trace_time(changes, error, match):
    check_trace_raises(jaxcnn.fire, GOOD, changes, error, match)


def test_bad_algorithm():
    with pytest.raises(ValueError, match="algorithm must be one of"):
        jax.jit(lambda *a: jaxcnn.fire(*a, algorithm="mma")).trace(*GOOD.values())


def test_primitive_bind_validates_too():
    from jaxcnn.ops.fire.api import FirePrimitive
    from jaxcnn.ops.fire.config import OPERAND_NAMES, FireConfig

    bad = {**GOOD, "expand1_b": sds((5,))}
    with pytest.raises(ValueError, match="expand1_b must have shape"):
        jax.eval_shape(lambda *a: FirePrimitive.outer.bind(*a, cfg=FireConfig(), operand_names=OPERAND_NAMES),
                       *bad.values())


# ---------------------------------------------------------------- grads and vmap


@pytest.mark.slow
def test_grads_match_zoo_composition():
    ops = fire_operands(8, 2, 6, 7, 12, 8, 6, 10)
    loss = lambda f: lambda *a: jnp.sum(f(a) ** 2)  # noqa: E731
    got = jax.jit(jax.grad(loss(lambda a: jaxcnn.fire(*a)), argnums=tuple(range(7))))(*ops)
    want = jax.grad(loss(zoo_fire_xla), argnums=tuple(range(7)))(*ops)
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, rtol=1e-4, atol=1e-4)


def test_check_grads_numerically():
    # Positive biases keep ReLU inputs away from the kink, where finite differences break.
    x, wsq, we1, we3, _, _, _ = fire_operands(9, 1, 4, 5, 4, 3, 2, 3)
    f = lambda x, wsq, we1, we3: jaxcnn.fire(x, wsq, we1, we3, jnp.full((3,), 3.0),  # noqa: E731
                                             jnp.full((2,), 5.0), jnp.full((3,), 9.0))
    check_grads(f, (x, wsq, we1, we3), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("in_axis", [0, 2])
def test_vmap_over_x_folds_into_batch(in_axis):
    ops = fire_operands(10, 2, 5, 6, 8, 8, 8, 8)
    check_folds_into_batch(lambda x: jaxcnn.fire(x, *ops[1:]), ops[0], in_axis,
                           primitive="jaxcnn_fire", folded="f32[6,5,6,8]")


def test_vmap_over_weights():
    ops = fire_operands(11, 2, 5, 4, 8, 8, 8, 8)
    we3s = jnp.stack([ops[3], 2 * ops[3]])
    be1s = jnp.stack([ops[5], -ops[5]])
    f = jax.vmap(lambda we3, be1: jaxcnn.fire(*ops[:3], we3, ops[4], be1, ops[6]))
    got = jax.jit(f)(we3s, be1s)
    for i in range(2):
        np.testing.assert_allclose(got[i], jaxcnn.fire(*ops[:3], we3s[i], ops[4], be1s[i], ops[6]),
                                   rtol=1e-6, atol=1e-6)


def test_vmap_of_grad():
    ops = fire_operands(12, 1, 4, 4, 8, 8, 8, 8)
    xs = jnp.stack([ops[0], -ops[0]])
    g = jax.vmap(jax.grad(lambda x: jnp.sum(jaxcnn.fire(x, *ops[1:]) ** 2)))(xs)
    for i in range(2):
        want = jax.grad(lambda x: jnp.sum(zoo_fire_xla((x, *ops[1:])) ** 2))(xs[i])
        np.testing.assert_allclose(g[i], want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- sharding

SHARDING_SCRIPT = textwrap.dedent(
    """
    import jax
    import jaxcnn
    from batch_sharding import check_forward, check_grads, check_shard_map, data_mesh, shard_batch

    k = jax.random.split(jax.random.PRNGKey(0), 7)
    x = jax.random.normal(k[0], (16, 9, 7, 12))
    ws = (jax.random.normal(k[1], (1, 1, 12, 8)) * 0.4, jax.random.normal(k[2], (1, 1, 8, 6)) * 0.5,
          jax.random.normal(k[3], (3, 3, 8, 10)) * 0.2, jax.random.normal(k[4], (8,)) * 0.1,
          jax.random.normal(k[5], (6,)) * 0.1, jax.random.normal(k[6], (10,)) * 0.1)
    xs = shard_batch(x, data_mesh())
    check_forward(jaxcnn.fire, x, xs, *ws, local="f32[2,9,7,16]")
    # The weight gradients sum over the batch's 16*9*7 positions (per device, then all-reduced)
    # after the forward's squeeze over 12 channels and 3x3 expand over 3*3*8.
    check_grads(jaxcnn.fire, (0, 1, 3), x, xs, *ws, n_terms=16 * 9 * 7 + 12 + 3 * 3 * 8)
    check_shard_map(jaxcnn.fire, x, xs, *ws)
    print("SHARDING OK")
    """
)


@pytest.mark.slow
def test_batch_sharded_fire_has_no_all_gather():
    assert "SHARDING OK" in run_on_8_host_devices(SHARDING_SCRIPT, timeout=600)


# ---------------------------------------------------------------- CUDA lowering

@needs_library
@pytest.mark.parametrize("algorithm,code",
                         [("auto", 0), ("tensor_core", 1), ("fma", 2), ("wgmma", 3),
                          ("two_phase", 4)])
def test_cuda_lowering_is_one_ffi_custom_call(algorithm, code):
    ops = [sds(a.shape, jnp.bfloat16) for a in GOOD.values()]
    text = cuda_text(lambda *a: jaxcnn.fire(*a, algorithm=algorithm), *ops)
    calls = custom_calls(text, "jaxcnn_fire_fwd")
    assert len(calls) == 1, text
    assert re.search(rf"algorithm = {code} : i64", calls[0]), calls[0]
    assert "tensor<2x8x8x10xbf16>" in calls[0]
    # Merge fusion: no concatenate and no XLA convolution left in the forward.
    assert "concatenate" not in text and "convolution" not in text


def test_cuda_lowering_target_is_registered_with_the_library():
    assert library.FFI_TARGETS["jaxcnn_fire_fwd"] == "JaxcnnFireFwd"


# ----------------------------------------------------- straight fusion: conv1x1 -> conv3x3
def chain_operands(seed, n, h, w, c, m, k, dtype=jnp.float32):
    """(x, w1, w3, b1, b3) of the 1x1 -> 3x3 chain: fire operands with an empty expand1."""
    x, w1, _, w3, b1, _, b3 = fire_operands(seed, n, h, w, c, m, 0, k, dtype)
    return x, w1, w3, b1, b3


def chain_lax(x, w1, w3, b1, b3):
    dn = ("NHWC", "HWIO", "NHWC")
    conv = lambda a, w, pad: jax.lax.conv_general_dilated(  # noqa: E731
        a, w, (1, 1), pad, dimension_numbers=dn, precision="highest")
    s = jax.nn.relu(conv(x, w1, "VALID") + b1)
    return jax.nn.relu(conv(s, w3, "SAME") + b3)


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(fire_shapes())
def test_conv1x1_conv3x3_matches_float64_oracle_and_lax(case):
    n, h, w, c, m, k = (case[key] for key in ("n", "h", "w", "c", "s", "e3"))
    x, w1, w3, b1, b3 = chain_operands(case["seed"], n, h, w, c, m, k)
    got = jaxcnn.conv1x1_conv3x3(x, w1, w3, b1, b3)
    assert got.shape == (n, h, w, k)
    empty = jnp.zeros((1, 1, m, 0), x.dtype)
    want = oracle_f64((x, w1, empty, w3, b1, jnp.zeros((0,), x.dtype), b3))
    np.testing.assert_allclose(as_f64(got), want, **TOL["float32"])
    np.testing.assert_allclose(got, chain_lax(x, w1, w3, b1, b3), **TOL["float32"])


def test_conv1x1_conv3x3_grads_match_lax():
    ops = chain_operands(11, 2, 5, 7, 6, 4, 5)
    loss = lambda f: lambda *a: jnp.sum(f(*a) ** 2)  # noqa: E731
    got = jax.grad(loss(jaxcnn.conv1x1_conv3x3), argnums=tuple(range(5)))(*ops)
    want = jax.grad(loss(chain_lax), argnums=tuple(range(5)))(*ops)
    for g, wnt in zip(got, want):
        np.testing.assert_allclose(g, wnt, rtol=1e-4, atol=1e-4 * float(jnp.max(jnp.abs(wnt))))


def test_conv1x1_conv3x3_bad_arguments_name_the_argument():
    x, w1, w3, b1, b3 = chain_operands(12, 1, 4, 4, 8, 8, 8)
    with pytest.raises(ValueError, match="expand3_w must have shape"):
        jaxcnn.conv1x1_conv3x3(x, w1, w3[:, :, :4], b1, b3)
    with pytest.raises(ValueError, match="expand3_w must have >= 1 output channels"):
        jaxcnn.conv1x1_conv3x3(x, w1, w3[..., :0], b1, b3[:0])
    # An empty expand1 alone is fine; an empty expand3 is not (fire needs its 3x3).
    with pytest.raises(ValueError, match="expand3_w must have >= 1 output channels"):
        jaxcnn.fire(x, w1, jnp.zeros((1, 1, 8, 4)), w3[..., :0], b1, jnp.zeros(4), b3[:0])


@needs_library
def test_conv1x1_conv3x3_cuda_lowering_is_one_fire_call_without_concatenate():
    x, w1, w3, b1, b3 = (sds(a.shape, jnp.bfloat16) for a in chain_operands(13, 2, 8, 8, 16, 8, 8))
    text = cuda_text(jaxcnn.conv1x1_conv3x3, x, w1, w3, b1, b3)
    calls = custom_calls(text, "jaxcnn_fire_fwd")
    assert len(calls) == 1 and "tensor<2x8x8x8xbf16>" in calls[0], text
    assert "convolution" not in text and "concatenate" not in text
