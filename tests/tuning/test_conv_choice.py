"""conv2d(algorithm="auto") through the decision owner (jaxcnn/tuning/conv_choice.py): XLA's
own convolution is a candidate, the rule keeps XLA where only the CUDA-core direct kernel would
run, measured records are cached per GPU and configuration, and a corrupt cache is survived."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcnn
from jaxcnn._native import library
from jaxcnn.ops.conv2d.config import make_config
from jaxcnn.tuning import conv_choice as C
from jaxcnn.tuning import decision as D
from jaxcnn.tuning import measure
from cuda_lowering import cuda_text, custom_calls, needs_library

CONV2D_TARGETS = ("jaxcnn_conv2d_fwd", "jaxcnn_conv2d_fwd_nobias", "jaxcnn_conv2d_fwd_residual")


# A dilated NHWC conv the tensor-core family takes (K a multiple of 8).
X = jax.ShapeDtypeStruct((2, 15, 17, 16), jnp.bfloat16)
W = jax.ShapeDtypeStruct((3, 3, 16, 32), jnp.bfloat16)
B = jax.ShapeDtypeStruct((32,), jnp.bfloat16)
DILATED = dict(padding="SAME", dilation=2, activation="relu")


def cfg_of(x=X, w=W, **kw):
    return make_config(x.shape, w.shape, **{**DILATED, **kw})


def conv_calls(text):
    """The lines calling any of conv2d's FFI targets."""
    return [line for t in CONV2D_TARGETS for line in custom_calls(text, t)]


@pytest.fixture
def cache_path(tmp_path, monkeypatch):
    path = tmp_path / "autotune.json"
    monkeypatch.setenv("JAXCNN_AUTOTUNE_CACHE", str(path))
    return path


@pytest.fixture
def fake_gpu(monkeypatch):
    """A GPU whose measurements are given: (times by candidate, list of measured keys)."""
    state = {"times": {}, "calls": []}

    def measure_sites(pending):
        state["calls"].append(sorted(pending))
        return {key: {"op": "site", "times_ms": {c.name: state["times"].get(c.name) for c in s.candidates},
                      "errors": {}} for key, s in pending.items()}

    monkeypatch.setattr(D, "_measure_sites", measure_sites)
    monkeypatch.setattr(D, "device_kind", lambda: "GPU-A")
    monkeypatch.setattr(D, "can_read_measurements", lambda: True)
    monkeypatch.setattr(D, "can_measure", lambda: True)
    return state


def test_site_fields_separate_every_configuration():
    base = C.site_fields(X, W, B, None, cfg_of())
    variants = [
        C.site_fields(jax.ShapeDtypeStruct(X.shape, jnp.float32), W, B, None, cfg_of()),
        C.site_fields(X, W, None, None, cfg_of()),
        C.site_fields(X, W, B, None, cfg_of(dilation=1)),
        C.site_fields(X, W, B, None, cfg_of(activation="silu")),
        C.site_fields(X, W, B, None, cfg_of(precision="highest")),
        C.site_fields(X, W, B, None, cfg_of(padding="VALID")),
    ]
    keys = {D.site_key("GPU-A", f) for f in [base, *variants]}
    assert len(keys) == 1 + len(variants)
    assert D.site_key("GPU-A", base) != D.site_key("GPU-B", base)
    assert json.loads(json.dumps(base)) == base  # the fields are plain JSON


def test_candidates_are_xla_and_the_families():
    site = C.conv_site(X, W, B, None, cfg_of())
    names = [c.name for c in site.candidates]
    assert names[0] == D.BASELINE and set(names[1:]) <= set(C.FAMILIES) and len(names) > 1
    if library.handlers_registered():  # the library says which families take the conv
        assert "tensor_core" in names and "depthwise" not in names


def test_measure_env_turns_automatic_measurement_off(monkeypatch):
    monkeypatch.setattr(library, "cuda_available", lambda: True)
    monkeypatch.setenv(measure.MEASURE_ENV, "0")
    assert measure.should_measure(None) is False
    monkeypatch.setenv(measure.MEASURE_ENV, "1")
    assert measure.should_measure(None) is True


@needs_library
def test_rule_keeps_xla_where_only_the_direct_kernel_runs():
    x = jax.ShapeDtypeStruct((2, 9, 10, 6), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((3, 3, 6, 7), jnp.bfloat16)  # K=7: off the tensor-core multiple
    cfg = make_config(x.shape, w.shape, stride=2, activation="relu")
    assert C.accepted_families(x, w, None, cfg) == ("direct",)
    choice, why = C.rule(x, w, None, cfg)
    assert choice == "xla" and "direct" in why
    text = cuda_text(lambda a, b: jaxcnn.conv2d(a, b, stride=2, activation="relu"), x, w)
    assert not conv_calls(text) and "stablehlo.convolution" in text


@needs_library
def test_rule_leaves_a_grouped_conv_to_the_direct_kernel():
    x = jax.ShapeDtypeStruct((2, 9, 10, 6), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((3, 3, 3, 8), jnp.bfloat16)
    cfg = make_config(x.shape, w.shape, stride=2, groups=2, activation="relu")
    assert C.accepted_families(x, w, None, cfg) == ("direct",)
    assert C.rule(x, w, None, cfg)[0] == C.HANDLER_PICK
    (call,) = conv_calls(cuda_text(lambda a, b: jaxcnn.conv2d(a, b, stride=2, groups=2, activation="relu"), x, w))
    assert "algorithm = 0 : i64" in call


@needs_library
def test_rule_leaves_a_dense_conv_to_the_handler():
    assert C.rule(X, W, None, cfg_of())[0] == C.HANDLER_PICK
    (call,) = conv_calls(cuda_text(lambda *a: jaxcnn.conv2d(*a, **DILATED), X, W, B))
    assert "algorithm = 0 : i64" in call


@needs_library
def test_measured_xla_win_lowers_a_dilated_conv_to_xla(cache_path, fake_gpu):
    fake_gpu["times"] = {"xla": 1.0, "tensor_core": 3.0, "direct": 20.0, "stem": None, "wgmma": None}
    text = cuda_text(lambda *a: jaxcnn.conv2d(*a, **DILATED), X, W, B)
    assert not conv_calls(text) and "stablehlo.convolution" in text
    assert "rhs_dilate = [2, 2]" in text
    assert len(fake_gpu["calls"]) == 1
    record = next(iter(json.loads(cache_path.read_text())["entries"].values()))
    assert record["times_ms"]["xla"] == 1.0
    # A second trace (or process) reads the cache: no new measurement.
    cuda_text(lambda *a: jaxcnn.conv2d(*a, **DILATED), X, W, B)
    assert len(fake_gpu["calls"]) == 1


@needs_library
def test_measured_family_win_lowers_to_that_family(cache_path, fake_gpu):
    fake_gpu["times"] = {"xla": 1.0, "tensor_core": 0.5, "direct": 20.0}
    (call,) = conv_calls(cuda_text(lambda *a: jaxcnn.conv2d(*a, **DILATED), X, W, B))
    assert "algorithm = 2 : i64" in call  # tensor_core's code
    d = C.decide_conv(X, W, B, None, cfg_of())
    assert (d.choice, d.source) == ("tensor_core", "cached") and "2.00x" in d.reason


@needs_library
def test_a_win_below_min_gain_keeps_xla(cache_path, fake_gpu):
    fake_gpu["times"] = {"xla": 1.0, "tensor_core": 1.0 - D.MIN_GAIN / 2}
    assert C.decide_conv(X, W, B, None, cfg_of()).choice == "xla"


@needs_library
def test_measurement_off_reads_the_cache_else_the_rule(cache_path, fake_gpu, monkeypatch):
    monkeypatch.setattr(D, "can_measure", lambda: False)
    d = C.decide_conv(X, W, B, None, cfg_of())
    assert d.source == "rule" and not fake_gpu["calls"]
    fake_gpu["times"] = {"xla": 1.0, "tensor_core": 3.0}
    C.decide_conv(X, W, B, None, cfg_of(), measure=True)
    d = C.decide_conv(X, W, B, None, cfg_of())
    assert (d.choice, d.source) == ("xla", "cached")


@pytest.mark.parametrize("garbage", [b"\xff\xfe not json", b'{"entries": 7}', b"[]"])
def test_a_corrupt_cache_is_survived_and_rewritten(cache_path, fake_gpu, garbage, recwarn):
    cache_path.write_bytes(garbage)
    fake_gpu["times"] = {"xla": 1.0, "tensor_core": 3.0, "direct": 9.0}
    d = C.decide_conv(X, W, B, None, cfg_of())
    assert d.choice == "xla" and d.source == "measured"
    entries = json.loads(cache_path.read_text())["entries"]
    assert len(entries) == 1


def test_auto_decided_xla_matches_the_reference_with_gradients(cache_path, fake_gpu):
    fake_gpu["times"] = {"xla": 1.0, "tensor_core": 3.0, "direct": 9.0}
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 15, 17, 16)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 3, 16, 32)) / 12, jnp.float32)
    b = jnp.asarray(rng.standard_normal(32), jnp.float32)

    def loss(algorithm):
        return lambda x, w, b: jnp.sum(jaxcnn.conv2d(x, w, b, precision="highest", algorithm=algorithm,
                                                     **DILATED) ** 2)

    got = jax.value_and_grad(loss("auto"), argnums=(0, 1, 2))(x, w, b)
    want = jax.value_and_grad(loss("xla"), argnums=(0, 1, 2))(x, w, b)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
