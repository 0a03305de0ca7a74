"""jaxcnn.sparse_conv2d / sparse_conv2d_pool on the reference (CPU) path: float64 oracle over
random shapes x sparsity levels (no zeros to all zeros), layouts, validation errors naming the
argument, grads, vmap, batch sharding on 8 forced host devices, the CUDA lowering text (one
FFI custom call, its attributes and mask scratch), the stale-library fallback, and the
profile-guided dense/sparse dispatch on a fake crossover table."""

import importlib
import re
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import jaxcnn
from jaxcnn.tuning import sparse_dispatch
from jaxcnn._native import library
from jaxcnn.ops.sparse_conv2d.config import mask_bytes
from arrays import as_f64, sds
from cuda_lowering import cuda_text, custom_calls, needs_library
from reference64 import ALLCLOSE_TOL as TOL
from reference64 import conv2d_f64
from host_devices import run_on_8_host_devices
from vmap_batching import check_folds_into_batch

# The module of the primitive and its entries (the package re-exports only the entries).
sparse_module = importlib.import_module("jaxcnn.ops.sparse_conv2d.api")

SPARSITIES = (0.0, 0.5, 0.9, 0.99, 1.0)


def sparse_x(seed, shape, sparsity, dtype=jnp.float32, *, signed=True):
    """Exactly round(sparsity * size) zeros; nonzeros of either sign (|v| >= 1/64)."""
    rng = np.random.default_rng(seed)
    v = rng.uniform(1 / 64, 1.0, shape) * (rng.choice([-1.0, 1.0], shape) if signed else 1.0)
    flat = v.reshape(-1)
    flat[rng.permutation(flat.size)[: int(round(sparsity * flat.size))]] = 0.0
    return jnp.asarray(flat.reshape(shape), dtype)


def weights(seed, r, s, c, k, dtype=jnp.float32):
    rng = np.random.default_rng(seed + 1000)
    w = rng.normal(size=(r, s, c, k)) * np.sqrt(2.0 / (r * s * c))
    b = rng.normal(size=(k,)) * 0.1
    return jnp.asarray(w, dtype), jnp.asarray(b, dtype)


def pool_f64(y, window, stride, padding):
    with jax.enable_x64(True):
        return np.asarray(lax.reduce_window(jnp.asarray(y, jnp.float64), -np.inf, lax.max,
                                            (1, *window, 1), (1, *stride, 1),
                                            ((0, 0), *padding, (0, 0))))


def check_close(got, want, dtype):
    np.testing.assert_allclose(as_f64(got), want, **TOL[jnp.dtype(dtype).name])


# ---------------------------------------------------------------- numerics


@st.composite
def conv_cases(draw):
    r = draw(st.sampled_from([1, 3, 5]))
    return dict(
        n=draw(st.integers(1, 3)), h=draw(st.integers(1, 12)), w=draw(st.integers(1, 12)),
        c=draw(st.integers(1, 70)), k=draw(st.integers(1, 40)), r=r, s=draw(st.sampled_from([1, r])),
        stride=draw(st.integers(1, 2)), dilation=draw(st.integers(1, 2)),
        padding=draw(st.sampled_from(["SAME", "VALID", 1, (2, 0)])),
        activation=draw(st.sampled_from([None, "relu"])),
        sparsity=draw(st.sampled_from(SPARSITIES)), dtype=draw(st.sampled_from(["float32", "bfloat16", "float16"])),
        bias=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(conv_cases())
def test_random_shapes_and_sparsity_match_float64(case):
    c = case
    span = (c["dilation"] * (c["r"] - 1) + 1, c["dilation"] * (c["s"] - 1) + 1)
    pads = {"SAME": span, "VALID": (0, 0), 1: (2, 2), (2, 0): (4, 0)}[c["padding"]]  # both sides
    if c["h"] + pads[0] < span[0] or c["w"] + pads[1] < span[1]:
        return  # the window does not fit (a validation error, tested below)
    dtype = jnp.dtype(c["dtype"])
    x = sparse_x(c["seed"], (c["n"], c["h"], c["w"], c["c"]), c["sparsity"], dtype)
    w, b = weights(c["seed"], c["r"], c["s"], c["c"], c["k"], dtype)
    b = b if c["bias"] else None
    kw = dict(stride=c["stride"], padding=c["padding"], dilation=c["dilation"], activation=c["activation"])
    got = jaxcnn.sparse_conv2d(x, w, b, **kw)
    assert got.dtype == dtype
    check_close(got, conv2d_f64(as_f64(x), as_f64(w), None if b is None else as_f64(b), **kw), dtype)


@pytest.mark.parametrize("sparsity", SPARSITIES)
def test_equals_dense_conv2d_at_each_sparsity(sparsity):
    x = sparse_x(1, (2, 11, 9, 48), sparsity)
    w, b = weights(1, 3, 3, 48, 72)
    got = jaxcnn.sparse_conv2d(x, w, b, activation="relu")
    want = jaxcnn.conv2d(x, w, b, activation="relu", precision="highest")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_all_zero_input_gives_activation_of_bias():
    x = jnp.zeros((1, 5, 7, 33), jnp.bfloat16)
    w, b = weights(2, 3, 3, 33, 20, jnp.bfloat16)
    y = jaxcnn.sparse_conv2d(x, w, b, activation="relu")
    np.testing.assert_array_equal(as_f64(y), np.broadcast_to(np.maximum(as_f64(b), 0), y.shape))


@pytest.mark.parametrize("layout", ["NCHW", "CHWN"])
def test_other_layouts_transpose_around_the_nhwc_op(layout):
    x = sparse_x(3, (2, 8, 7, 12), 0.7)
    w, b = weights(3, 3, 3, 12, 10)
    want = jaxcnn.sparse_conv2d(x, w, b, stride=2, activation="relu")
    xl = jaxcnn.to_layout(x, "NHWC", layout)
    got = jaxcnn.sparse_conv2d(xl, w, b, stride=2, activation="relu", layout=layout)
    np.testing.assert_array_equal(jaxcnn.to_layout(got, layout, "NHWC"), want)


POOLS = [((2, 2), None, "VALID"), ((3, 3), (2, 2), "VALID"), ((3, 3), (2, 2), "SAME"),
         ((2, 3), (1, 2), ((1, 0), (0, 1))), ((4, 4), None, "VALID")]


@pytest.mark.parametrize("window,stride,padding", POOLS)
@pytest.mark.parametrize("sparsity", [0.0, 0.9, 1.0])
def test_pool_equals_conv_then_reduce_window(window, stride, padding, sparsity):
    x = sparse_x(4, (2, 13, 12, 20), sparsity)
    w, b = weights(4, 3, 3, 20, 24)
    got = jaxcnn.sparse_conv2d_pool(x, w, b, pool_window=window, pool_stride=stride, pool_padding=padding)
    conv = jaxcnn.sparse_conv2d(x, w, b, activation="relu")
    want = lax.reduce_window(conv, -jnp.inf, lax.max, (1, *window, 1), (1, *(stride or window), 1),
                             padding if isinstance(padding, str) else ((0, 0), *padding, (0, 0)))
    np.testing.assert_array_equal(got, want)
    pads = lax.padtype_to_pads(conv.shape[1:3], window, stride or window, padding) \
        if isinstance(padding, str) else padding
    ref = pool_f64(conv2d_f64(as_f64(x), as_f64(w), as_f64(b), padding="SAME", activation="relu"),
                   window, stride or window, pads)
    np.testing.assert_allclose(as_f64(got), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_pool_half_types_round_once(dtype):
    x = sparse_x(5, (1, 10, 10, 16), 0.8, jnp.dtype(dtype))
    w, b = weights(5, 3, 3, 16, 8, jnp.dtype(dtype))
    got = jaxcnn.sparse_conv2d_pool(x, w, b, stride=1, pool_window=3, pool_stride=2)
    ref = pool_f64(conv2d_f64(as_f64(x), as_f64(w), as_f64(b), activation="relu"), (3, 3), (2, 2), ((0, 0), (0, 0)))
    assert got.dtype == jnp.dtype(dtype) and got.shape == (1, 4, 4, 8)
    check_close(got, ref, dtype)


def test_pool_with_strided_conv_and_no_bias():
    x = sparse_x(6, (2, 17, 15, 9), 0.5)
    w, _ = weights(6, 3, 3, 9, 5)
    got = jaxcnn.sparse_conv2d_pool(x, w, stride=2, padding=1, pool_window=2)
    ref = pool_f64(conv2d_f64(as_f64(x), as_f64(w), stride=2, padding=1, activation="relu"), (2, 2), (2, 2),
                   ((0, 0), (0, 0)))
    np.testing.assert_allclose(as_f64(got), ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- validation


X, W, B = sds((2, 8, 8, 16)), sds((3, 3, 16, 4)), sds((4,))


@pytest.mark.parametrize(
    "args,kwargs,error,match",
    [
        ((sds((8, 8, 16)), W, B), {}, ValueError, "x must be rank 4"),
        ((X, sds((3, 3, 15, 4)), B), {}, ValueError, r"w input channels \(15\)"),
        ((X, W, sds((5,))), {}, ValueError, r"bias must have shape \(4,\)"),
        ((sds((2, 8, 8, 16), jnp.int32), sds((3, 3, 16, 4), jnp.int32), None), {}, TypeError, "x dtype"),
        ((X, sds((3, 3, 16, 4), jnp.bfloat16), B), {}, TypeError, "w dtype bfloat16 must match"),
        ((X, W, B), dict(stride=0), ValueError, "stride must be >= 1"),
        ((X, W, B), dict(padding="FULL"), ValueError, "padding must be"),
        ((X, W, B), dict(activation="gelu"), ValueError, "activation must be one of"),
        ((X, W, B), dict(layout="NWHC"), ValueError, "layout must be one of"),
        ((X, W, B), dict(precision="fast"), ValueError, "precision must be"),
        ((X, W, B), dict(dilation=(1, 0)), ValueError, "dilation must be >= 1"),
    ],
)
def test_bad_arguments_name_the_argument(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        jax.jit(lambda *a: jaxcnn.sparse_conv2d(*a, **kwargs)).trace(*args)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(pool_window=0), ValueError, "pool_window must be >= 1"),
        (dict(pool_window=(2, 2, 2)), TypeError, "pool_window must be an int or a pair"),
        (dict(pool_window=2, pool_stride=0), ValueError, "pool_stride must be >= 1"),
        (dict(pool_window=2, pool_padding="FULL"), ValueError, "pool_padding must be"),
        (dict(pool_window=2, pool_padding=2), ValueError, "pool_padding .* must be smaller than pool_window"),
        (dict(pool_window=9), ValueError, "pool_window .* does not fit"),
    ],
)
def test_bad_pool_arguments_name_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        jax.jit(lambda *a: jaxcnn.sparse_conv2d_pool(*a, **kwargs)).trace(X, W, B)


def test_primitive_bind_validates_too():
    from jaxcnn.ops.conv2d.config import make_config
    from jaxcnn.ops.sparse_conv2d.config import OPERAND_NAMES, SparseConfig

    cfg = SparseConfig(make_config(X.shape, W.shape))
    with pytest.raises(ValueError, match="bias must have shape"):
        jax.eval_shape(lambda *a: sparse_module.SparseConv2dPrimitive.outer.bind(
            *a, cfg=cfg, operand_names=OPERAND_NAMES), X, W, sds((3,)))
    with pytest.raises(ValueError, match="groups must be 1"):
        jax.eval_shape(lambda *a: sparse_module.SparseConv2dPrimitive.outer.bind(
            *a, cfg=SparseConfig(cfg.conv.replace(groups=2)), operand_names=OPERAND_NAMES), X, W, B)


# ---------------------------------------------------------------- grads and vmap


def test_grads_match_dense_conv2d():
    x = sparse_x(7, (2, 7, 6, 10), 0.6)
    w, b = weights(7, 3, 3, 10, 6)
    loss = lambda f: lambda x, w, b: jnp.sum(f(x, w, b) ** 2)  # noqa: E731
    sparse = jax.jit(jax.grad(loss(lambda *a: jaxcnn.sparse_conv2d(*a, stride=2, activation="relu")),
                              argnums=(0, 1, 2)))(x, w, b)
    dense = jax.grad(loss(lambda *a: jaxcnn.conv2d(*a, stride=2, activation="relu", precision="highest")),
                     argnums=(0, 1, 2))(x, w, b)
    for g, want in zip(sparse, dense):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)


def test_pool_grads_match_the_unfused_composition():
    x = sparse_x(8, (1, 9, 8, 6), 0.5)
    w, b = weights(8, 3, 3, 6, 4)
    fused = lambda x, w, b: jnp.sum(jaxcnn.sparse_conv2d_pool(x, w, b, pool_window=3, pool_stride=2) ** 2)  # noqa: E731

    def unfused(x, w, b):
        y = jaxcnn.conv2d(x, w, b, activation="relu", precision="highest")
        return jnp.sum(lax.reduce_window(y, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "VALID") ** 2)

    for g, want in zip(jax.grad(fused, argnums=(0, 1, 2))(x, w, b), jax.grad(unfused, argnums=(0, 1, 2))(x, w, b)):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("in_axis", [0, 3])
def test_vmap_over_x_folds_into_batch(in_axis):
    x = sparse_x(9, (2, 6, 5, 8), 0.5)
    w, b = weights(9, 3, 3, 8, 4)
    check_folds_into_batch(lambda x: jaxcnn.sparse_conv2d(x, w, b), x, in_axis,
                           primitive="jaxcnn_sparse_conv2d", folded="f32[6,6,5,8]")


def test_vmap_over_weights_and_pool():
    x = sparse_x(10, (2, 6, 6, 8), 0.5)
    w, b = weights(10, 3, 3, 8, 4)
    ws = jnp.stack([w, -w])
    f = jax.jit(jax.vmap(lambda w: jaxcnn.sparse_conv2d_pool(x, w, b)))
    got = f(ws)
    for i in range(2):
        np.testing.assert_allclose(got[i], jaxcnn.sparse_conv2d_pool(x, ws[i], b), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- sharding

SHARDING_SCRIPT = textwrap.dedent(
    """
    import jax
    import jaxcnn
    from batch_sharding import check_forward, check_grads, check_shard_map, data_mesh, shard_batch

    k = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.nn.relu(jax.random.normal(k[0], (16, 9, 7, 12)))
    # The weight gradient sums over the batch's 16*9*7 conv outputs (per device, then
    # all-reduced) after the forward's 3*3*12 terms.
    n_terms = 16 * 9 * 7 + 3 * 3 * 12
    w = jax.random.normal(k[1], (3, 3, 12, 10)) * 0.2
    b = jax.random.normal(k[2], (10,)) * 0.1
    xs = shard_batch(x, data_mesh())
    for name, fn, shard in (
        ("conv", lambda x, w, b: jaxcnn.sparse_conv2d(x, w, b, activation="relu"), "f32[2,9,7,10]"),
        ("pool", lambda x, w, b: jaxcnn.sparse_conv2d_pool(x, w, b, pool_window=3, pool_stride=2),
         "f32[2,4,3,10]"),
    ):
        check_forward(fn, x, xs, w, b, local=shard, name=name)
        check_grads(fn, (0, 1), x, xs, w, b, n_terms=n_terms, name=name)
    check_shard_map(lambda x, w, b: jaxcnn.sparse_conv2d(x, w, b), x, xs, w, b)
    print("SHARDING OK")
    """
)


@pytest.mark.slow
def test_batch_sharded_sparse_conv_has_no_all_gather():
    assert "SHARDING OK" in run_on_8_host_devices(SHARDING_SCRIPT, timeout=600)


# ---------------------------------------------------------------- CUDA lowering

@pytest.fixture
def handler_present(monkeypatch):
    """Lower as a library with the sparse handler does. Lowering only names the target, so
    this also runs where the loaded library predates the op (a rebuild adds the symbol)."""
    monkeypatch.setattr(library, "target_registered", lambda target: True)


@needs_library
def test_cuda_lowering_is_one_ffi_call_with_mask_scratch(handler_present):
    x, w, b = sds((2, 9, 7, 40), jnp.bfloat16), sds((3, 3, 40, 24), jnp.bfloat16), sds((24,), jnp.bfloat16)
    text = cuda_text(lambda *a: jaxcnn.sparse_conv2d(*a, stride=2, padding=((1, 0), (2, 1)),
                                                      activation="relu"), x, w, b)
    calls = custom_calls(text, "jaxcnn_sparse_conv2d_fwd")
    assert len(calls) == 1, text
    call = calls[0]
    for attr, value in (("stride_h", 2), ("stride_w", 2), ("pad_h", 1), ("pad_w", 2), ("activation", 1),
                        ("pool_window_h", 0), ("conv_out_h", 4), ("conv_out_w", 4)):
        assert re.search(rf"{attr} = {value} : i64", call), (attr, call)
    # Result: y and the nonzero masks (one uint32 per pixel per 32 channels: 2 groups).
    assert f"tensor<{mask_bytes((2, 9, 7, 40))}xui8>" in call and mask_bytes((2, 9, 7, 40)) == 2 * 9 * 7 * 2 * 4
    assert "tensor<2x4x4x24xbf16>" in call
    assert "convolution" not in text


@needs_library
def test_cuda_lowering_of_pool_has_no_reduce_window(handler_present):
    x, w, b = sds((2, 12, 12, 16)), sds((3, 3, 16, 8)), sds((8,))
    text = cuda_text(lambda *a: jaxcnn.sparse_conv2d_pool(*a, pool_window=3, pool_stride=2,
                                                           pool_padding="SAME"), x, w, b)
    calls = custom_calls(text, "jaxcnn_sparse_conv2d_fwd")
    assert len(calls) == 1, text
    for attr, value in (("pool_window_h", 3), ("pool_stride_w", 2), ("pool_pad_h", 0), ("conv_out_h", 12)):
        assert re.search(rf"{attr} = {value} : i64", calls[0]), (attr, calls[0])
    assert "tensor<2x6x6x8xf32>" in calls[0]
    assert "reduce_window" not in text and "convolution" not in text


@needs_library
def test_library_without_the_handler_falls_back_to_the_reference(monkeypatch):
    monkeypatch.setattr(library, "target_registered", lambda target: False)
    monkeypatch.delenv("JAXCNN_STRICT", raising=False)
    sparse_module._warn_fallback_once.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = cuda_text(lambda *a: jaxcnn.sparse_conv2d(*a), X, W, B)
    assert "jaxcnn_sparse_conv2d_fwd" not in text and "convolution" in text
    assert any("jaxcnn_sparse_conv2d" in str(w.message) for w in caught)
    monkeypatch.setenv("JAXCNN_STRICT", "1")
    with pytest.raises(RuntimeError, match="without its handler"):
        cuda_text(lambda *a: jaxcnn.sparse_conv2d(*a), X, W, B)


def test_ffi_target_is_in_the_handler_table():
    assert library.FFI_TARGETS["jaxcnn_sparse_conv2d_fwd"] == "JaxcnnSparseConv2dFwd"


def test_missing_symbols_do_not_block_other_targets():
    state = library.library_state()
    if not state.registered:
        pytest.skip(state.reason)
    for target in library.FFI_TARGETS:
        assert library.target_registered(target) == (target not in state.missing_targets)
    assert library.target_registered("jaxcnn_conv2d_fwd")


# ---------------------------------------------------------------- dispatch


def fake_record(dense_ms=1.0, device="FakeGPU", x=(1, 56, 56, 64), w=(3, 3, 64, 64), dtype="float32"):
    """Sparse time linear in density: 2.0 ms at 0% zeros, 0.2 ms at 100%."""
    grid = (0.0, 0.5, 0.9, 1.0)
    sparse_ms = tuple(0.2 + 1.8 * (1 - s) for s in grid)
    key = sparse_dispatch.layer_key(x, w, dtype, stride=(1, 1), padding=((1, 1), (1, 1)))
    return sparse_dispatch.Crossover(device, key, grid, sparse_ms, dense_ms, "xla",
                                     {"jaxcnn": dense_ms * 1.1, "xla": dense_ms},
                                     sparse_dispatch.find_crossover(grid, sparse_ms, dense_ms))


def test_find_crossover_interpolates():
    assert sparse_dispatch.find_crossover((0.0, 0.5, 1.0), (2.0, 1.0, 0.2), 1.5) == pytest.approx(0.25)
    assert sparse_dispatch.find_crossover((0.0, 1.0), (0.5, 0.1), 1.0) == 0.0
    assert sparse_dispatch.find_crossover((0.0, 1.0), (2.0, 1.5), 1.0) is None
    rec = fake_record()
    assert rec.crossover == pytest.approx(1 - 0.8 / 1.8)


@pytest.mark.parametrize("sparsity,want", [(0.0, False), (0.5, False), (0.6, True), (0.9, True), (0.99, True)])
def test_choose_uses_the_stored_crossover(tmp_path, sparsity, want):
    table = sparse_dispatch.CrossoverTable(tmp_path / "cross.json")
    table.put(fake_record())
    d = sparse_dispatch.choose((1, 56, 56, 64), (3, 3, 64, 64), "float32", sparsity, table=table,
                               device="FakeGPU")
    assert d.sparse is want
    assert "FakeGPU" in d.explain() and "crossover 55.6% zeros" in d.explain()
    # The pick is never more than MARGIN slower than the better predicted time.
    best = min(d.predicted_dense_ms, d.predicted_sparse_ms)
    picked = d.predicted_sparse_ms if d.sparse else d.predicted_dense_ms
    assert picked <= best * (1 + sparse_dispatch.MARGIN) + 1e-12


def test_margin_keeps_dense_when_sparse_is_barely_faster():
    rec = fake_record()
    s = 1 - (0.98 - 0.2) / 1.8  # predicted sparse 0.98 ms vs dense 1.0 ms
    d = sparse_dispatch.choose_from(rec, s, device="FakeGPU")
    assert not d.sparse and "inside the 5% margin" in d.reason
    assert sparse_dispatch.choose_from(rec, s, device="FakeGPU", margin=0.0).sparse


def test_unmeasured_layer_is_dense_and_says_why(tmp_path):
    table = sparse_dispatch.CrossoverTable(tmp_path / "cross.json")
    table.put(fake_record())
    d = sparse_dispatch.choose((1, 28, 28, 64), (3, 3, 64, 64), "float32", 0.99, table=table, device="FakeGPU")
    assert not d.sparse and "no crossover measured" in d.explain()
    other_gpu = sparse_dispatch.choose((1, 56, 56, 64), (3, 3, 64, 64), "float32", 0.99, table=table,
                                       device="OtherGPU")
    assert not other_gpu.sparse


def test_table_persists_per_gpu(tmp_path):
    path = tmp_path / "cross.json"
    sparse_dispatch.CrossoverTable(path).put(fake_record(device="A"))
    sparse_dispatch.CrossoverTable(path).put(fake_record(device="B", dense_ms=3.0))
    table = sparse_dispatch.CrossoverTable(path)
    assert {e.device for e in table.entries()} == {"A", "B"}
    assert table.get("B", fake_record().key).dense_ms == 3.0


def test_conv2d_auto_sparse_modes(tmp_path):
    table = sparse_dispatch.CrossoverTable(tmp_path / "cross.json")
    table.put(fake_record())
    x = sparse_x(11, (1, 56, 56, 64), 0.9, signed=False)
    w, b = weights(11, 3, 3, 64, 64)
    dense = jaxcnn.conv2d(x, w, b, precision="highest")
    for mode in ("auto", True, False):
        got = sparse_dispatch.conv2d_auto_sparse(x, w, b, sparse=mode, sparsity=0.9, table=table,
                                                 device="FakeGPU", precision="highest")
        np.testing.assert_allclose(got, dense, rtol=1e-5, atol=1e-5)
    jaxpr = str(jax.make_jaxpr(lambda x: sparse_dispatch.conv2d_auto_sparse(
        x, w, b, sparsity=0.9, table=table, device="FakeGPU"))(x))
    assert "jaxcnn_sparse_conv2d" in jaxpr
    jaxpr = str(jax.make_jaxpr(lambda x: sparse_dispatch.conv2d_auto_sparse(
        x, w, b, sparsity=0.1, table=table, device="FakeGPU"))(x))
    assert "jaxcnn_sparse_conv2d" not in jaxpr
    with pytest.raises(ValueError, match="needs the layer's measured input sparsity"):
        sparse_dispatch.conv2d_auto_sparse(x, w, b, table=table, device="FakeGPU")
    with pytest.raises(ValueError, match="sparse must be"):
        sparse_dispatch.conv2d_auto_sparse(x, w, b, sparse="yes", sparsity=0.5)
    with pytest.raises(ValueError, match="sparsity must be in"):
        sparse_dispatch.choose_from(None, 1.5)


def test_measure_sparsity_of_a_zoo_model():
    layers = sparse_dispatch.measure_sparsity("lenet5", batch=2)
    assert [layer.name for layer in layers] == [i.name for i in jaxcnn.models.layer_table("lenet5", 2)
                                                if i.op == "conv2d"]
    assert layers[0].sparsity < 0.05  # the normalized image has (almost) no exact zeros
    assert all(0.2 < layer.sparsity < 0.95 for layer in layers[1:])  # ReLU outputs
    plan = sparse_dispatch.plan_model("lenet5", table=sparse_dispatch.CrossoverTable(False),
                                      device="FakeGPU", sparsities=layers)
    assert not any(d.sparse for _, d in plan)
    assert "no crossover measured" in sparse_dispatch.explain_plan(plan)


def test_measure_crossover_with_a_fake_timer(tmp_path):
    table = sparse_dispatch.CrossoverTable(tmp_path / "cross.json")
    calls = []

    def timer(fn, *args):
        x = args[0]
        calls.append(float(jnp.mean(x == 0)))
        if len(calls) <= 2:  # the two dense paths
            return 1.0 if len(calls) == 1 else 0.8
        return 0.1 + 1.0 * (1 - calls[-1])

    rec = sparse_dispatch.measure_crossover((1, 8, 8, 16), (3, 3, 16, 8), sparsities=(0.0, 0.5, 0.9),
                                            table=table, timer=timer)
    assert rec.dense_path == "xla" and rec.dense_ms == 0.8
    assert rec.crossover == pytest.approx(0.5 + 0.4 * (0.6 - 0.8) / (0.6 - 0.2))
    np.testing.assert_allclose(calls[2:], [0.0, 0.5, 0.9], atol=1e-3)
    assert table.get(rec.device, rec.key) == rec


def test_sparsity_and_crossovers_go_into_the_store(tmp_path):
    from jaxcnn.store import Store

    layers = [sparse_dispatch.LayerSparsity(0, "c1", (1, 8, 8, 4), (3, 3, 4, 8), (1, 1), ((1, 1), (1, 1)), 0.25),
              sparse_dispatch.LayerSparsity(1, "c2", (1, 8, 8, 8), (3, 3, 8, 8), (1, 1), ((1, 1), (1, 1)), 0.75)]
    with Store(tmp_path / "s.sqlite") as store:
        run = sparse_dispatch.record_sparsity(store, "toy", layers, batch=1, dtype="float32", device="FakeGPU")
        sp = store.sparsity(run)
        assert sorted(sp["zero_fraction"]) == [0.25, 0.75]
        run2 = sparse_dispatch.record_crossover(store, fake_record(), name="vgg/conv")
        m = store.measurements(run2)
        assert set(m["backend"]) == {"jaxcnn", "xla", "jaxcnn_sparse"}
        assert sorted(m[m["backend"] == "jaxcnn_sparse"]["variant"]) == [
            "sparsity=0", "sparsity=0.5", "sparsity=0.9", "sparsity=1"]
