"""GPU suite for the fire module (`pytest -m gpu`): the CUDA kernels (fused tensor-core
bf16/fp16, the wgmma path (squeeze + one merged expand launch, or three convs), the two-phase cooperative kernel, CUDA-core fp32 and
fallback) against XLA's unfused composition computed in float32
and a float64 oracle, over random shapes (odd H/W, N = 1), every SqueezeNet 1.0/1.1 fire,
NaN-poisoned outputs, grads and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcnn
from poisoned_output import run_poisoned
from test_fire import (SQUEEZENET_FIRES, TOL, as_f64, chain_operands, fire_operands, oracle_f64,
                       zoo_fire_xla)

pytestmark = pytest.mark.gpu

TARGET = "jaxcnn_fire_fwd"
DTYPES = ("bfloat16", "float16", "float32")
# Against XLA's composition in float32 (no intermediate rounding), the kernel's squeeze is
# rounded to the dtype: allow a few ulps of the dtype on O(1) values.
XLA_F32_TOL = {"float32": dict(rtol=2e-5, atol=2e-5), "bfloat16": dict(rtol=4e-2, atol=4e-2),
               "float16": dict(rtol=5e-3, atol=5e-3)}


def xla_f32(ops):
    """XLA's unfused fire module on the same (rounded) values, in float32 at HIGHEST
    precision (XLA's DEFAULT would use TF32 for the convs)."""
    with jax.default_matmul_precision("highest"):
        return jax.jit(zoo_fire_xla)(tuple(jnp.asarray(a, jnp.float32) for a in ops))


def check(ops, algorithm="auto"):
    dtype = ops[0].dtype.name
    # The custom call's first result (the second is its workspace) is the program's output.
    got = run_poisoned(lambda *a: jaxcnn.fire(*a, algorithm=algorithm), *ops, target=TARGET, scratch=True)
    assert got.dtype == ops[0].dtype and not np.isnan(as_f64(got)).any()
    np.testing.assert_allclose(as_f64(got), as_f64(xla_f32(ops)), **XLA_F32_TOL[dtype])
    np.testing.assert_allclose(as_f64(got), oracle_f64(ops), **TOL[dtype])


@st.composite
def gpu_cases(draw):
    mult8 = st.integers(1, 8).map(lambda v: 8 * v)
    return dict(
        n=draw(st.sampled_from([1, 1, 2, 3])), h=draw(st.integers(1, 40)), w=draw(st.integers(1, 40)),
        c=draw(st.one_of(mult8, st.sampled_from([96, 128, 136, 200, 256]))),
        s=draw(st.sampled_from([8, 16, 24, 32, 40, 48, 56, 64])),
        e1=draw(st.one_of(mult8, st.sampled_from([128, 192, 200, 256]))),
        e3=draw(st.one_of(mult8, st.sampled_from([128, 192, 256]))),
        dtype=draw(st.sampled_from(["bfloat16", "float16"])), seed=draw(st.integers(0, 2**16)))


def check_drawn(case, algorithm):
    """check() on the operands of one gpu_cases() draw."""
    ops = fire_operands(case["seed"], *(case[k] for k in ("n", "h", "w", "c", "s", "e1", "e3")),
                        jnp.dtype(case["dtype"]))
    check(ops, algorithm)


@settings(max_examples=60, deadline=None)
@given(gpu_cases())
def test_tensor_core_kernel_random_shapes(case):
    check_drawn(case, "tensor_core")


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 20), st.integers(1, 20), st.integers(1, 40),
       st.integers(1, 20), st.integers(1, 20), st.integers(1, 20), st.sampled_from(DTYPES))
def test_any_channel_counts_run_on_cuda_cores(n, h, w, c, s, e1, e3, dtype):
    ops = fire_operands(n * h + c, n, h, w, c, s, e1, e3, jnp.dtype(dtype))
    check(ops)  # auto: counts off multiples of 8 (and fp32) take the CUDA-core kernel


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c,s,e", SQUEEZENET_FIRES)
@pytest.mark.parametrize("n,hw", [(1, 13), (2, 27), (1, 55)])
def test_squeezenet_fires(n, hw, c, s, e, dtype):
    check(fire_operands(c + s + hw, n, hw, hw, c, s, e, e, jnp.dtype(dtype)))


def test_headline_fire_module_n64_bf16():
    check(fire_operands(0, 64, 55, 55, 128, 32, 128, 128, jnp.bfloat16))


@settings(max_examples=40, deadline=None)
@given(gpu_cases())
def test_wgmma_path_random_shapes(case):
    check_drawn(case, "wgmma")


@pytest.mark.parametrize("c,s,e", SQUEEZENET_FIRES)
@pytest.mark.parametrize("n,hw", [(1, 13), (4, 27)])
def test_wgmma_squeezenet_fires(n, hw, c, s, e):
    check(fire_operands(c + s + hw + 1, n, hw, hw, c, s, e, e, jnp.bfloat16), "wgmma")


def one_launch_expected(c, s, e1, e3):
    """Whether the wgmma path should run the whole module as one launch, by the constraints
    fire_fused_wgmma.h documents: 32 squeeze channels, C % 32, E1 and E3 positive multiples of
    64 whose weights (4 KB a tap per 64-channel block: 1 tap for the 1x1, 9 for the 3x3) and
    fp32 biases fit the 90880 bytes of shared memory its tiles and two pipeline stages leave."""
    resident = (e1 // 64 + 9 * (e3 // 64)) * 4096 + 4 * (e1 + e3)
    return (s == 32 and c % 32 == 0 and e1 > 0 and e3 > 0 and e1 % 64 == 0 and e3 % 64 == 0
            and resident <= 90880)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 1, 2, 3]), st.integers(1, 60), st.integers(1, 60),
       st.sampled_from([16, 64, 96, 128, 136]), st.sampled_from([32, 64, 96]),
       st.sampled_from([64, 128, 192, 256]), st.sampled_from([64, 128, 192, 256]),
       st.sampled_from(["bfloat16", "float16"]), st.integers(0, 2**16))
def test_wgmma_merged_expand_random_shapes(n, h, w, c, s, e1, e3, dtype, seed):
    """S a multiple of 32, E1 and E3 of 64: both expands run as one wgmma launch (1x1 blocks on
    the centre tap alone), 28x8 or 14x8 tiles over odd sizes; with S = 32, C % 32 and expand
    weights that fit shared memory, the whole module is one launch."""
    from jaxcnn._native import queries
    plan = queries.fire_plan((n, h, w, c), s, e1, e3, jnp.dtype(dtype), "wgmma")
    one = one_launch_expected(c, s, e1, e3)
    assert (plan.kernel, plan.launches) == ("wgmma", 1 if one else 2), plan.text
    check(fire_operands(seed, n, h, w, c, s, e1, e3, jnp.dtype(dtype)), "wgmma")


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 1, 2, 3]), st.integers(1, 70), st.integers(1, 70),
       st.sampled_from([32, 64, 96, 128, 160, 256]), st.sampled_from([64, 128, 192]),
       st.sampled_from([64, 128]), st.sampled_from(["bfloat16", "float16"]),
       st.integers(0, 2**16))
def test_wgmma_one_launch_random_shapes(n, h, w, c, e1, e3, dtype, seed):
    """S = 32: squeeze, both expands and the concatenation in one launch (s never leaves shared
    memory; 28x8 tiles whose halo pixels outside the image are zeroed), odd sizes, 1 to 8
    input chunks, 2 to 4 pipeline stages."""
    from jaxcnn._native import queries
    assert one_launch_expected(c, 32, e1, e3)
    plan = queries.fire_plan((n, h, w, c), 32, e1, e3, jnp.dtype(dtype), "wgmma")
    assert (plan.kernel, plan.launches, plan.workspace) == ("wgmma", 1, 0), plan.text
    check(fire_operands(seed, n, h, w, c, 32, e1, e3, jnp.dtype(dtype)), "wgmma")


def test_wgmma_expands_not_merged_off_the_channel_multiples():
    from jaxcnn._native import queries
    for s, e1, e3 in [(16, 64, 64), (48, 192, 192), (32, 64, 96), (32, 96, 64)]:
        plan = queries.fire_plan((2, 27, 27, 128), s, e1, e3, jnp.bfloat16, "wgmma")
        assert (plan.kernel, plan.launches) == ("wgmma", 3), (s, e1, e3, plan.text)
    check(fire_operands(5, 2, 27, 27, 128, 48, 192, 192, jnp.bfloat16), "wgmma")


@settings(max_examples=40, deadline=None)
@given(gpu_cases())
def test_two_phase_kernel_random_shapes(case):
    check_drawn(case, "two_phase")


@pytest.mark.parametrize("c,s,e", SQUEEZENET_FIRES)
@pytest.mark.parametrize("n,hw", [(1, 13), (1, 27), (3, 27)])
def test_two_phase_squeezenet_fires(n, hw, c, s, e):
    check(fire_operands(c + s + hw + 2, n, hw, hw, c, s, e, e, jnp.bfloat16), "two_phase")


def test_auto_plan_takes_wgmma_for_the_headline_fused_mid_size_and_two_phase_for_small():
    from jaxcnn._native import queries
    big = queries.fire_plan((64, 55, 55, 128), 32, 128, 128, jnp.bfloat16)
    mid = queries.fire_plan((1, 55, 55, 64), 16, 64, 64, jnp.bfloat16)
    small = queries.fire_plan((1, 13, 13, 256), 48, 192, 192, jnp.bfloat16)
    assert (big.kernel, big.launches) == ("wgmma", 1), big.text
    assert mid.kernel == "tensor_core", mid.text
    assert small.kernel == "two_phase", small.text
    # One launch: s stays in shared memory, no workspace.
    assert queries.fire_workspace_bytes((64, 55, 55, 128), 32, 128, 128, jnp.bfloat16, "auto") == 0
    assert queries.fire_workspace_bytes((64, 13, 13, 384), 64, 256, 256, jnp.bfloat16, "auto") == \
        64 * 13 * 13 * 64 * 2
    assert queries.fire_workspace_bytes((1, 55, 55, 64), 16, 64, 64, jnp.bfloat16, "auto") == 0
    # s packed [169][48] bf16, rounded up to 256 bytes.
    assert queries.fire_workspace_bytes((1, 13, 13, 256), 48, 192, 192, jnp.bfloat16, "auto") == \
        -(-13 * 13 * 48 * 2 // 256) * 256


def test_forced_wgmma_on_float32_is_a_python_error():
    ops = fire_operands(2, 1, 8, 8, 16, 8, 8, 8, jnp.float32)
    with pytest.raises(Exception, match="wgmma fire path is bf16/fp16 only"):
        jax.block_until_ready(jaxcnn.fire(*ops, algorithm="wgmma"))


@pytest.mark.parametrize("algorithm", ["tensor_core", "fma", "wgmma", "two_phase"])
def test_forced_algorithms_agree(algorithm):
    check(fire_operands(1, 2, 17, 23, 64, 16, 64, 64, jnp.bfloat16), algorithm)


def test_forced_tensor_core_on_float32_is_a_python_error():
    ops = fire_operands(2, 1, 8, 8, 16, 8, 8, 8, jnp.float32)
    with pytest.raises(Exception, match="tensor-core fire kernel is bf16/fp16 only"):
        jax.block_until_ready(jaxcnn.fire(*ops, algorithm="tensor_core"))
    with pytest.raises(Exception, match="two-phase fire kernel is bf16/fp16 only"):
        jax.block_until_ready(jaxcnn.fire(*ops, algorithm="two_phase"))
    wide = fire_operands(2, 1, 8, 8, 16, 72, 8, 8, jnp.bfloat16)
    with pytest.raises(Exception, match="two-phase fire kernel supports 8 to 64 squeeze"):
        jax.block_until_ready(jaxcnn.fire(*wide, algorithm="two_phase"))


def test_handler_errors_become_python_exceptions():
    ops = fire_operands(3, 1, 4, 4, 8, 8, 8, 8, jnp.bfloat16)
    # The custom call's results: y and the (wgmma path's) workspace.
    scratch = jax.ShapeDtypeStruct((0,), jnp.uint8)
    call = jax.ffi.ffi_call(TARGET, (jax.ShapeDtypeStruct((1, 4, 4, 17), jnp.bfloat16), scratch))
    with pytest.raises(Exception, match="output y must have shape"):
        jax.block_until_ready(jax.jit(lambda *a: call(*a, algorithm=np.int64(0)))(*ops))
    ok = jax.ffi.ffi_call(TARGET, (jax.ShapeDtypeStruct((1, 4, 4, 16), jnp.bfloat16), scratch))
    with pytest.raises(Exception, match="algorithm must be"):
        jax.block_until_ready(jax.jit(lambda *a: ok(*a, algorithm=np.int64(9)))(*ops))
    # A forced wgmma run without its workspace is refused, not run.
    big = fire_operands(3, 1, 16, 16, 16, 16, 16, 16, jnp.bfloat16)
    call = jax.ffi.ffi_call(TARGET, (jax.ShapeDtypeStruct((1, 16, 16, 32), jnp.bfloat16), scratch))
    with pytest.raises(Exception, match="the wgmma path needs"):
        jax.block_until_ready(jax.jit(lambda *a: call(*a, algorithm=np.int64(3)))(*big))
    with pytest.raises(Exception, match="the two-phase kernel needs"):
        jax.block_until_ready(jax.jit(lambda *a: call(*a, algorithm=np.int64(4)))(*big))
    # The process is still healthy afterwards.
    check(big, "wgmma")
    check(big, "two_phase")


def test_deterministic():
    ops = fire_operands(4, 2, 27, 27, 256, 48, 192, 192, jnp.bfloat16)
    f = jax.jit(jaxcnn.fire)
    np.testing.assert_array_equal(f(*ops), f(*ops))


def test_grads_through_kernel_match_xla():
    ops = fire_operands(5, 2, 13, 11, 64, 16, 64, 64, jnp.float32)
    loss = lambda f: lambda *a: jnp.sum(f(a) ** 2)  # noqa: E731
    got = jax.jit(jax.grad(loss(lambda a: jaxcnn.fire(*a)), argnums=tuple(range(7))))(*ops)
    want = jax.jit(jax.grad(loss(zoo_fire_xla), argnums=tuple(range(7))))(*ops)
    for g, w in zip(got, want):
        # XLA's fp32 convs on GPU may use TF32 (DEFAULT precision) in the backward.
        np.testing.assert_allclose(g, w, rtol=2e-2, atol=2e-2 * float(jnp.max(jnp.abs(w))))


def test_vmap_on_gpu():
    ops = fire_operands(6, 2, 9, 10, 32, 16, 32, 32, jnp.bfloat16)
    xs = jnp.stack([ops[0], -ops[0], ops[0] * 2])
    got = jax.jit(jax.vmap(lambda x: jaxcnn.fire(x, *ops[1:])))(xs)
    for i in range(3):
        np.testing.assert_array_equal(got[i], jaxcnn.fire(xs[i], *ops[1:]))


@pytest.mark.parametrize("algorithm", ["auto", "tensor_core", "fma", "wgmma", "two_phase"])
@pytest.mark.parametrize("n,h,w,c,m,k", [(1, 13, 13, 64, 16, 64), (2, 9, 21, 72, 24, 40),
                                         (3, 27, 27, 128, 32, 128), (1, 1, 1, 8, 8, 8)])
def test_straight_conv1x1_conv3x3(algorithm, n, h, w, c, m, k):
    ops = chain_operands(n + h + c, n, h, w, c, m, k, jnp.bfloat16)
    got = run_poisoned(lambda *a: jaxcnn.conv1x1_conv3x3(*a, algorithm=algorithm), *ops, target=TARGET,
                       scratch=True)
    assert got.shape == (n, h, w, k) and not np.isnan(as_f64(got)).any()
    x, w1, w3, b1, b3 = ops
    want = oracle_f64((x, w1, jnp.zeros((1, 1, m, 0), x.dtype), w3, b1, jnp.zeros((0,), x.dtype), b3))
    np.testing.assert_allclose(as_f64(got), want, **TOL["bfloat16"])
