"""jaxcnn.inception on the reference (CPU) path: equal to the zoo's unfused GoogLeNet block and
to a float64 NumPy oracle on random shapes, validation errors, grads, vmap, batch sharding on 8
forced host devices, and the CUDA lowering text (split 1x1 GEMM + jaxcnn kernels + concat)."""

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
from jaxcnn.models.backends import XLA_OPS
from jaxcnn.models.googlenet import INCEPTION
from jaxcnn.models.googlenet import inception as zoo_inception
from jaxcnn.models.layers import Net
from jaxcnn.ops.inception.api import inception_block
from jaxcnn.ops.inception.config import BRANCH_LAYERS
from arrays import BAD_NHWC_X, as_f64, check_trace_raises, he_normal, normal, sds
from cuda_lowering import cuda_text, custom_calls, needs_library
from host_devices import run_on_8_host_devices
from reference64 import ALLCLOSE_TOL as TOL
from vmap_batching import check_folds_into_batch

# The zoo's XLA layers round each conv output before the bias (two roundings per layer).
ZOO_TOL = {**TOL, "bfloat16": dict(rtol=5e-2, atol=5e-2), "float16": dict(rtol=1e-2, atol=1e-2)}


def operands(seed, n, h, w, c, filters, k3=3, k5=5, dtype=jnp.float32):
    """x, the six HWIO weights (He-scaled) and six biases of an inception block."""
    n1, r3, n3, r5, n5, npool = filters
    shapes = [(1, 1, c, n1), (1, 1, c, r3), (k3, k3, r3, n3), (1, 1, c, r5), (k5, k5, r5, n5),
              (1, 1, c, npool)]
    keys = jax.random.split(jax.random.PRNGKey(seed), 13)
    x = normal(keys[0], (n, h, w, c), dtype=dtype)
    ws = [he_normal(k, s, dtype) for k, s in zip(keys[1:7], shapes)]
    bs = [normal(k, s[-1:], 0.2, dtype) for k, s in zip(keys[7:], shapes)]
    return (x, *ws, *bs)


def zoo_params(ops, name="i"):
    ws, bs = ops[1:7], ops[7:]
    return {f"{name}/{r}": {"w": w, "b": b} for r, w, b in zip(BRANCH_LAYERS, ws, bs)}


def filters_of(ops):
    return tuple(w.shape[3] for w in ops[1:7])


def zoo_xla(ops):
    """The zoo's unfused inception block on XLA's ops (what a plain JAX GoogLeNet runs)."""
    return zoo_inception(Net(XLA_OPS, zoo_params(ops)), "i", ops[0], filters=filters_of(ops))


def _conv_f64(x, w, b):
    k = w.shape[0]
    p = k // 2
    n, h, wd, _ = x.shape
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    y = sum(np.einsum("nhwc,ck->nhwk", xp[:, dy:dy + h, dx:dx + wd], w[dy, dx])
            for dy in range(k) for dx in range(k))
    return np.maximum(y + b, 0)


def oracle_f64(ops):
    """Independent float64 NumPy block; reduce outputs rounded to x's dtype like the kernels'."""
    dtype = ops[0].dtype
    x, w1, w3r, w3, w5r, w5, wp, b1, b3r, b3, b5r, b5, bp = (as_f64(a) for a in ops)
    rnd = lambda a: as_f64(jnp.asarray(a, jnp.float32).astype(dtype))  # noqa: E731
    n, h, w, c = x.shape
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    pooled = np.max([xp[:, dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)], axis=0)
    return np.concatenate([_conv_f64(x, w1, b1), _conv_f64(rnd(_conv_f64(x, w3r, b3r)), w3, b3),
                           _conv_f64(rnd(_conv_f64(x, w5r, b5r)), w5, b5), _conv_f64(pooled, wp, bp)],
                          axis=-1)


# GoogLeNet's blocks scaled down by 8 in channels (sizes kept distinct, none below 1).
SCALED = {stage: tuple(max(1, f // 8) for f in filters) for stage, filters in INCEPTION.items()}


@pytest.mark.parametrize("stage", ["3a", "4e", "5b"])
def test_equals_zoo_block_float32(stage):
    ops = operands(1, 2, 7, 6, 24, SCALED[stage])
    got = jax.jit(jaxcnn.inception)(*ops)
    assert got.shape == (2, 7, 6, sum(SCALED[stage][i] for i in (0, 2, 4, 5)))
    np.testing.assert_allclose(got, zoo_xla(ops), **TOL["float32"])
    np.testing.assert_allclose(as_f64(got), oracle_f64(ops), **TOL["float32"])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_equals_zoo_block_half_types(dtype):
    ops = operands(2, 2, 9, 5, 32, (16, 8, 16, 8, 8, 8), dtype=jnp.dtype(dtype))
    got = jaxcnn.inception(*ops)
    assert got.dtype == jnp.dtype(dtype)
    np.testing.assert_allclose(as_f64(got), as_f64(zoo_xla(ops)), **ZOO_TOL[dtype])
    np.testing.assert_allclose(as_f64(got), oracle_f64(ops), **TOL[dtype])


@st.composite
def block_shapes(draw):
    return dict(n=draw(st.integers(1, 3)), h=draw(st.integers(1, 9)), w=draw(st.integers(1, 9)),
                c=draw(st.integers(1, 12)), filters=tuple(draw(st.integers(1, 6)) for _ in range(6)),
                k3=draw(st.sampled_from([1, 3, 5])), k5=draw(st.sampled_from([3, 5])),
                seed=draw(st.integers(0, 2**16)))


@pytest.mark.slow
@settings(max_examples=6, deadline=None)
@given(block_shapes())
def test_random_shapes_match_float64_oracle(case):
    ops = operands(case["seed"], case["n"], case["h"], case["w"], case["c"], case["filters"],
                   case["k3"], case["k5"])
    np.testing.assert_allclose(as_f64(jaxcnn.inception(*ops)), oracle_f64(ops), **TOL["float32"])


def test_torchvision_3x3_third_branch():
    """torchvision's "5x5" branch is a 3x3: any odd kernel works, padding k // 2."""
    ops = operands(3, 1, 6, 6, 8, (4, 4, 4, 4, 4, 4), k3=3, k5=3)
    np.testing.assert_allclose(as_f64(jaxcnn.inception(*ops)), oracle_f64(ops), **TOL["float32"])


def test_branch_channel_order():
    """Channels: [1x1 | 3x3 | 5x5 | pool_proj]; zeroing all but one branch isolates its slice."""
    ops = list(operands(4, 1, 5, 5, 8, (3, 4, 5, 4, 6, 7)))
    y = jaxcnn.inception(*ops)
    only_pool = ops.copy()
    for i in (7, 9, 11):  # branch outputs 1x1, 3x3, 5x5 forced to 0 by -1 biases and zero weights
        only_pool[i] = jnp.full_like(ops[i], -1.0)
        only_pool[i - 6] = jnp.zeros_like(ops[i - 6])
    z = jaxcnn.inception(*only_pool)
    np.testing.assert_array_equal(z[..., :3 + 5 + 6], 0.0)
    np.testing.assert_allclose(z[..., 14:], y[..., 14:], rtol=1e-6)


def test_zoo_block_runs_fused_through_backends_table():
    ops = operands(5, 2, 6, 6, 16, (4, 4, 8, 2, 4, 4))
    params = zoo_params(ops)
    body = lambda net, x: net.block("inception", "i", zoo_inception, x,  # noqa: E731
                                    filters=filters_of(ops))
    fused_net = Net({**XLA_OPS, "inception": inception_block}, params)
    fused = body(fused_net, ops[0])
    np.testing.assert_allclose(fused, body(Net(XLA_OPS, params), ops[0]), **TOL["float32"])
    assert [i.name.split("/")[1] for i in fused_net.layers] == [
        "1x1", "3x3_reduce", "3x3", "5x5_reduce", "5x5", "pool", "pool_proj", "concat"]
    jaxpr = str(jax.make_jaxpr(lambda x: body(Net({**XLA_OPS, "inception": inception_block}, params), x))(ops[0]))
    assert jaxpr.count("jaxcnn_inception") == 1 and "conv_general_dilated" not in jaxpr


def test_none_biases_are_zero():
    ops = operands(6, 1, 4, 4, 8, (4, 4, 4, 4, 4, 4))
    zeros = [jnp.zeros((4,))] * 6
    np.testing.assert_array_equal(jaxcnn.inception(*ops[:7]), jaxcnn.inception(*ops[:7], *zeros))


def test_algorithms_agree_on_cpu():
    ops = operands(7, 1, 5, 4, 8, (4, 4, 4, 4, 4, 4))
    eager = jaxcnn.inception(*ops)
    for algorithm in ("tensor_core", "direct"):
        np.testing.assert_array_equal(jaxcnn.inception(*ops, algorithm=algorithm), eager)
    np.testing.assert_array_equal(jaxcnn.inception(*ops, precision="highest"), eager)


# ---------------------------------------------------------------- validation


GOOD = dict(x=sds((2, 8, 8, 16)), w_1x1=sds((1, 1, 16, 4)), w_3x3_reduce=sds((1, 1, 16, 6)),
            w_3x3=sds((3, 3, 6, 8)), w_5x5_reduce=sds((1, 1, 16, 2)), w_5x5=sds((5, 5, 2, 4)),
            w_pool_proj=sds((1, 1, 16, 4)), b_1x1=sds((4,)), b_3x3_reduce=sds((6,)),
            b_3x3=sds((8,)), b_5x5_reduce=sds((2,)), b_5x5=sds((4,)), b_pool_proj=sds((4,)))


@pytest.mark.parametrize(
    "changes,error,match",
    [
        *BAD_NHWC_X,
        (dict(w_1x1=sds((1, 1, 15, 4))), ValueError, "w_1x1 must have 16 input channels"),
        (dict(w_1x1=sds((3, 3, 16, 4))), ValueError, r"w_1x1 must be a 1x1 conv"),
        (dict(w_3x3_reduce=sds((16, 6))), ValueError, "w_3x3_reduce must be rank 4 HWIO"),
        (dict(w_3x3=sds((3, 3, 5, 8))), ValueError, "w_3x3 must have 6 input channels"),
        (dict(w_3x3=sds((2, 2, 6, 8))), ValueError, "w_3x3 must have a square odd kernel"),
        (dict(w_5x5=sds((5, 3, 2, 4))), ValueError, "w_5x5 must have a square odd kernel"),
        (dict(w_pool_proj=sds((1, 1, 16, 4), jnp.bfloat16)), TypeError, "w_pool_proj dtype bfloat16 must equal"),
        (dict(b_3x3=sds((7,))), ValueError, r"b_3x3 must have shape \(8,\)"),
        (dict(b_pool_proj=sds((4, 1))), ValueError, "b_pool_proj must have shape"),
        (dict(b_5x5=sds((4,), jnp.float16)), TypeError, "b_5x5 dtype"),
    ],
)
def test_bad_arguments_raise_at_trace_time(changes, error, match):
    check_trace_raises(jaxcnn.inception, GOOD, changes, error, match)


@pytest.mark.parametrize("kwargs,match", [(dict(algorithm="xla"), "algorithm must be one of"),
                                          (dict(precision="fast"), "precision must be")])
def test_bad_keywords(kwargs, match):
    with pytest.raises(ValueError, match=match):
        jax.jit(lambda *a: jaxcnn.inception(*a, **kwargs)).trace(*GOOD.values())


def test_primitive_bind_validates_too():
    from jaxcnn.ops.inception.api import InceptionPrimitive
    from jaxcnn.ops.inception.config import OPERAND_NAMES, InceptionConfig

    bad = {**GOOD, "b_1x1": sds((5,))}
    with pytest.raises(ValueError, match="b_1x1 must have shape"):
        jax.eval_shape(lambda *a: InceptionPrimitive.outer.bind(
            *a, cfg=InceptionConfig(), operand_names=OPERAND_NAMES), *bad.values())


def test_inception_block_names_missing_convs():
    ops = operands(8, 1, 4, 4, 8, (2, 2, 2, 2, 2, 2))
    from jaxcnn.models.layers import describe

    net = describe(lambda n, x: zoo_inception(n, "i", x, filters=filters_of(ops)), ops[0])
    with pytest.raises(ValueError, match=r"no \['5x5'\] conv"):
        inception_block([i for i in net.layers if not i.name.endswith("/5x5")], zoo_params(ops), ops[0])


# ---------------------------------------------------------------- grads and vmap


def test_grads_match_zoo_composition():
    ops = operands(9, 2, 5, 6, 8, (3, 4, 5, 2, 3, 4))
    loss = lambda f: lambda *a: jnp.sum(f(a) ** 2)  # noqa: E731
    argnums = tuple(range(13))
    got = jax.jit(jax.grad(loss(lambda a: jaxcnn.inception(*a)), argnums=argnums))(*ops)
    want = jax.grad(loss(zoo_xla), argnums=argnums)(*ops)
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, rtol=1e-4, atol=1e-4)


def test_check_grads_numerically():
    # Large positive biases keep ReLU inputs off the kink (finite differences break there);
    # distinct x values keep the max pool's argmax stable.
    ops = operands(10, 1, 4, 4, 3, (2, 2, 2, 2, 2, 2), k5=3)
    x = jnp.arange(48.0).reshape(1, 4, 4, 3) / 48.0
    ws = ops[1:7]
    biases = [jnp.full((2,), 4.0)] * 6
    f = lambda x, *w: jaxcnn.inception(x, *w, *biases)  # noqa: E731
    check_grads(f, (x, *ws), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("in_axis", [0, 3])
def test_vmap_over_x_folds_into_batch(in_axis):
    ops = operands(11, 2, 5, 4, 8, (4, 4, 4, 4, 4, 4))
    check_folds_into_batch(lambda x: jaxcnn.inception(x, *ops[1:]), ops[0], in_axis,
                           primitive="jaxcnn_inception", folded="f32[6,5,4,8]")


def test_vmap_over_weights():
    ops = operands(12, 1, 4, 4, 8, (4, 4, 4, 4, 4, 4))
    w3s = jnp.stack([ops[3], 2 * ops[3]])
    bps = jnp.stack([ops[12], -ops[12]])
    f = jax.vmap(lambda w3, bp: jaxcnn.inception(*ops[:3], w3, *ops[4:12], bp))
    got = jax.jit(f)(w3s, bps)
    for i in range(2):
        np.testing.assert_allclose(got[i], jaxcnn.inception(*ops[:3], w3s[i], *ops[4:12], bps[i]),
                                   rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- sharding

SHARDING_SCRIPT = textwrap.dedent(
    """
    import jax
    import jaxcnn
    from batch_sharding import check_forward, check_grads, data_mesh, shard_batch

    shapes = [(1, 1, 12, 4), (1, 1, 12, 6), (3, 3, 6, 8), (1, 1, 12, 2), (5, 5, 2, 4), (1, 1, 12, 4)]
    k = jax.random.split(jax.random.PRNGKey(0), 13)
    x = jax.random.normal(k[0], (16, 7, 5, 12))
    ws = [jax.random.normal(kk, s) * 0.3 for kk, s in zip(k[1:7], shapes)]
    bs = [jax.random.normal(kk, s[-1:]) * 0.1 for kk, s in zip(k[7:], shapes)]
    xs = shard_batch(x, data_mesh())
    check_forward(jaxcnn.inception, x, xs, *ws, *bs, local="f32[2,7,5,20]")
    # The weight gradients sum over the batch's 16*7*5 positions (per device, then all-reduced)
    # after the longest forward chain: the 1x1 reduce over 12 channels, the 3x3 over 3*3*6.
    check_grads(jaxcnn.inception, (0, 1, 3), x, xs, *ws, *bs, n_terms=16 * 7 * 5 + 12 + 3 * 3 * 6)
    print("SHARDING OK")
    """
)


@pytest.mark.slow
def test_batch_sharded_inception_has_no_all_gather():
    assert "SHARDING OK" in run_on_8_host_devices(SHARDING_SCRIPT, timeout=600)


# ---------------------------------------------------------------- CUDA lowering

# Channel counts multiples of 8, so every family (tensor cores included) can run each conv.
GOOD8 = dict(x=sds((2, 8, 8, 16)), w_1x1=sds((1, 1, 16, 8)), w_3x3_reduce=sds((1, 1, 16, 8)),
             w_3x3=sds((3, 3, 8, 16)), w_5x5_reduce=sds((1, 1, 16, 8)), w_5x5=sds((5, 5, 8, 8)),
             w_pool_proj=sds((1, 1, 16, 8)), b_1x1=sds((8,)), b_3x3_reduce=sds((8,)),
             b_3x3=sds((16,)), b_5x5_reduce=sds((8,)), b_5x5=sds((8,)), b_pool_proj=sds((8,)))


@needs_library
@pytest.mark.parametrize("algorithm,code", [("auto", 0), ("direct", 1), ("tensor_core", 2)])
def test_cuda_lowering_is_split_gemm_and_jaxcnn_kernels(algorithm, code):
    from jaxcnn.ops.conv2d.config import ALGORITHMS

    assert ALGORITHMS.index(algorithm) == code
    ops = [sds(a.shape, jnp.bfloat16) for a in GOOD8.values()]
    text = cuda_text(lambda *a: jaxcnn.inception(*a, algorithm=algorithm), *ops)
    convs = custom_calls(text, "jaxcnn_conv2d_fwd")
    pools = custom_calls(text, "jaxcnn_max_pool2d_fwd")
    # Split: one 1x1 GEMM over the three 1x1 weights (K = 8 + 8 + 8 = 24) reads x once; then
    # the 3x3, the 5x5 and the pool projection: four convs instead of six, one pool.
    assert len(convs) == 4 and len(pools) == 1, text
    assert sum("tensor<2x8x8x24xbf16>" in line for line in convs) == 1
    assert all(re.search(rf"algorithm = {code} : i64", line) for line in convs)
    # No XLA convolution or reduce_window is left; the merge is one concatenate into 40 channels.
    assert "stablehlo.convolution" not in text and "reduce_window" not in text
    assert re.search(r"stablehlo.concatenate.*tensor<2x8x8x40xbf16>", text), text


@needs_library
def test_cuda_lowering_tensor_core_refuses_unaligned_channels():
    ops = [sds(a.shape, jnp.bfloat16) for a in GOOD.values()]  # split K = 4 + 6 + 2 = 12
    with pytest.raises(ValueError, match="algorithm='tensor_core' cannot run"):
        cuda_text(lambda *a: jaxcnn.inception(*a, algorithm="tensor_core"), *ops)


def test_exported_from_package():
    assert jaxcnn.inception is jaxcnn.ops.inception
    assert "inception" in jaxcnn.ops.__all__
