"""GPU suite for jaxcnn.inception (`pytest -m gpu`): the CUDA composition (split 1x1 GEMM,
branch convs, max pool, projection through jaxcnn's kernels, merged by concatenate) against
XLA's unfused zoo block computed in float32 and a float64 oracle, over random shapes and
channel counts (odd H/W, N = 1), every GoogLeNet block, every kernel family, grads, vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcnn
from test_inception import SCALED, TOL, as_f64, operands, oracle_f64, zoo_xla

from jaxcnn.models.googlenet import INCEPTION

pytestmark = pytest.mark.gpu

# Against XLA's block in float32 (no intermediate rounding), the composition rounds the reduce
# outputs to the dtype: a few ulps of the dtype on O(1) values.
XLA_F32_TOL = {"float32": dict(rtol=2e-5, atol=2e-5), "bfloat16": dict(rtol=4e-2, atol=4e-2),
               "float16": dict(rtol=5e-3, atol=5e-3)}


def xla_f32(ops):
    with jax.default_matmul_precision("highest"):
        return jax.jit(zoo_xla)(tuple(jnp.asarray(a, jnp.float32) for a in ops))


def check(ops, algorithm="auto", precision=None):
    dtype = ops[0].dtype.name
    fn = jax.jit(lambda *a: jaxcnn.inception(*a, algorithm=algorithm, precision=precision))
    hlo = fn.lower(*ops).compile().as_text()
    assert "jaxcnn_conv2d_fwd" in hlo and "jaxcnn_max_pool2d_fwd" in hlo, hlo[:2000]
    got = fn(*ops)
    assert got.dtype == ops[0].dtype and np.isfinite(as_f64(got)).all()
    # The zoo block has GoogLeNet's 3x3 and 5x5 branches; other kernel sizes have the float64
    # oracle alone.
    if (ops[3].shape[0], ops[5].shape[0]) == (3, 5):
        np.testing.assert_allclose(as_f64(got), as_f64(xla_f32(ops)), **XLA_F32_TOL[dtype])
    np.testing.assert_allclose(as_f64(got), oracle_f64(ops), **TOL[dtype])


@st.composite
def gpu_cases(draw):
    mult8 = st.integers(1, 12).map(lambda v: 8 * v)
    return dict(n=draw(st.sampled_from([1, 1, 2, 3])), h=draw(st.integers(1, 30)), w=draw(st.integers(1, 30)),
                c=draw(mult8), filters=tuple(draw(mult8) for _ in range(6)),
                k3=draw(st.sampled_from([3, 5])), k5=draw(st.sampled_from([3, 5])),
                dtype=draw(st.sampled_from(["bfloat16", "float16"])), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=30, deadline=None)
@given(gpu_cases())
def test_tensor_core_composition_random_shapes(case):
    ops = operands(case["seed"], case["n"], case["h"], case["w"], case["c"], case["filters"],
                   case["k3"], case["k5"], jnp.dtype(case["dtype"]))
    check(ops, "tensor_core")


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(1, 17), st.integers(1, 17), st.integers(1, 24),
       st.tuples(*[st.integers(1, 12)] * 6), st.sampled_from(["bfloat16", "float16", "float32"]))
def test_any_channel_counts_on_auto(n, h, w, c, filters, dtype):
    """Channel counts that are not multiples of 8: "auto" falls back to CUDA-core kernels."""
    ops = operands(n * h + c, n, h, w, c, filters, dtype=jnp.dtype(dtype))
    check(ops, "auto", precision="highest" if dtype == "float32" else None)


@pytest.mark.parametrize("stage", list(INCEPTION))
@pytest.mark.parametrize("n", [1, 4])
def test_every_googlenet_block_bf16(stage, n):
    hw = {"3": 28, "4": 14, "5": 7}[stage[0]]
    c = {"3a": 192, "3b": 256, "4a": 480, "4b": 512, "4c": 512, "4d": 512, "4e": 528,
         "5a": 832, "5b": 832}[stage]
    ops = operands(n + hw, n, hw, hw, c, INCEPTION[stage], dtype=jnp.bfloat16)
    check(ops)


@pytest.mark.parametrize("algorithm", ["direct", "auto"])
def test_fp32_direct_and_auto(algorithm):
    ops = operands(3, 2, 9, 7, 24, SCALED["4e"], dtype=jnp.float32)
    check(ops, algorithm, precision="highest")


def test_grads_and_vmap_on_gpu():
    ops = operands(4, 2, 7, 5, 16, (8, 8, 16, 8, 8, 8))
    loss = lambda f: lambda *a: jnp.sum(f(a) ** 2)  # noqa: E731
    with jax.default_matmul_precision("highest"):
        got = jax.jit(jax.grad(loss(lambda a: jaxcnn.inception(*a, precision="highest")), argnums=(0, 1, 3)))(*ops)
        want = jax.grad(loss(zoo_xla), argnums=(0, 1, 3))(*ops)
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, rtol=1e-3, atol=1e-3)
    xs = jnp.stack([ops[0], -ops[0]])
    f = jax.jit(jax.vmap(lambda x: jaxcnn.inception(x, *ops[1:], precision="highest")))
    for i in range(2):
        np.testing.assert_allclose(f(xs)[i], jaxcnn.inception(xs[i], *ops[1:], precision="highest"),
                                   rtol=1e-6, atol=1e-6)
