"""jaxcnn.fusion on the CPU: group finding on the zoo (squeezenet1_0/1_1, googlenet, vgg16),
cost-model decisions, the measured path and its cache (with a fake device), explain() text,
plan.apply == the unfused model numerically, the straight conv->pool kind with a stand-in
conv2d_pool module, MobileNetV2's expand->depthwise groups (and their CUDA lowering), and the
`jaxcnn fuse` CLI. Fire groups in a user's own jaxpr: test_fusion_planner_user_jaxprs.py."""

import dataclasses
import json
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcnn import cli, fusion, layouts as L
from jaxcnn._native import library
from jaxcnn.costmodel import fusion_cost as cost
from jaxcnn.tuning import fusion_plan as P
from jaxcnn.models import get_model
from jaxcnn.models.mobilenet import INVERTED_RESIDUAL_STAGES
from jaxcnn.models.squeezenet import SQUEEZENET1_0_LAYERS, SQUEEZENET1_1_LAYERS
from jaxcnn.tuning import case_timing
from jaxcnn.tuning import measure as M
from jaxcnn.tuning.tuner_args import resolve_spec

# The block kinds these tests are about (conv_pool groups have their own tests).
BLOCKS = ("fire", "inception")

FIRE_MEMBERS = "squeeze1x1,expand1x1,expand3x3,concat"


def fire_configs(layers):
    return [layer for layer in layers if layer != "pool"]


@pytest.mark.parametrize("model,layers", [("squeezenet1_0", SQUEEZENET1_0_LAYERS),
                                          ("squeezenet1_1", SQUEEZENET1_1_LAYERS)])
def test_squeezenet_has_its_eight_fire_groups(model, layers):
    groups, skipped = fusion.find_groups(model, batch=2, dtype="bfloat16", kinds=BLOCKS)
    assert [g.name for g in groups] == [f"fire{i}" for i in range(2, 10)]
    assert all(g.kind == "fire" and g.short_members() == FIRE_MEMBERS for g in groups)
    assert [(g.attrs["squeeze"], g.attrs["expand1x1"], g.attrs["expand3x3"]) for g in groups] == \
        fire_configs(layers)
    table = {i.name: i for i in get_model(model).layers(2, "bfloat16")}
    for g in groups:
        assert g.x_shape == table[f"{g.name}/squeeze1x1"].input_shape
        assert g.y_shape == table[f"{g.name}/concat"].output_shape
        assert g.modes == ("straight", "split", "merge") and g.dtype == "bfloat16"
    if not fusion.conv_pool_available()[0]:
        assert "conv2d_pool" in skipped["conv_pool"]


def test_googlenet_has_nine_inception_groups():
    groups, _ = fusion.find_groups("googlenet", batch=1, dtype="float32", kinds=BLOCKS)
    assert [g.name for g in groups] == [f"inception{s}" for s in
                                        ("3a", "3b", "4a", "4b", "4c", "4d", "4e", "5a", "5b")]
    g = groups[0]
    assert g.kind == "inception" and g.modes == ("split", "merge")
    assert g.attrs["filters"] == (64, 96, 128, 16, 32, 32)
    assert g.x_shape == (1, 28, 28, 192) and g.y_shape == (1, 28, 28, 256)
    assert g.role("5x5").weight_shape == (5, 5, 16, 32)  # the zoo's third branch is a true 5x5


def test_models_without_blocks_have_no_groups_unless_conv_pool_exists():
    for model in ("vgg16", "resnet50"):
        groups, _ = fusion.find_groups(model, kinds=("fire", "inception"))
        assert groups == []


def test_kinds_are_validated():
    with pytest.raises(ValueError, match="kinds must be among"):
        fusion.find_groups("squeezenet1_1", kinds=("fire", "winograd"))
    with pytest.raises(TypeError, match="kinds must be a sequence"):
        fusion.find_groups("squeezenet1_1", kinds="fire")
    with pytest.raises(ValueError, match="batch must be an int >= 1"):
        fusion.find_groups("squeezenet1_1", batch=0, kinds=BLOCKS)
    with pytest.raises(ValueError, match="unknown model"):
        fusion.find_groups("squeezenet2", kinds=BLOCKS)


# ---------------------------------------------------------------- the cost model


def fire_plan_or_skip(group, spec):
    """The library's plan for `group` on `spec`'s GPU (the cost model's source), or a skip when
    the library (or its plan_for_device export) is not loaded."""
    plan = cost.fire_plan(group, spec)
    if plan is None:
        pytest.skip("the library's jaxcnn_fire_plan_for_device is not loaded")
    return plan


def test_fire_cost_model_counts_saved_bytes_and_launches():
    """Small fires, and big ones with a 16-channel squeeze, run the single fused kernel (saves
    s's round trip and the concatenate); big ones with a wider squeeze on Hopper the wgmma
    path: with S = 32 the whole module as one launch (s on chip, as the fused kernel), else the
    squeeze, then both expands as one launch (saves the concatenate and one read of s) where
    S % 32 and E % 64, else one launch each (saves the concatenate only)."""
    spec = resolve_spec("H200", False)[0]
    item = 2
    # (batch, fire index in squeezenet1_1, spatial size, squeeze, expand, launches, wgmma)
    for batch, index, hw, s, e, launches, wgmma in (
            (2, 0, 55, 16, 64, 1, False), (64, 0, 55, 16, 64, 1, False),
            (64, 2, 27, 32, 128, 1, True), (64, 6, 13, 64, 256, 2, True),
            (64, 4, 13, 48, 192, 3, True)):
        groups, _ = fusion.find_groups("squeezenet1_1", batch=batch, dtype="bfloat16", kinds=BLOCKS)
        g = groups[index]
        assert g.attrs["squeeze"] == s and g.x_shape[1] == hw
        fused, xla = fusion.fused_cost(g, spec), fusion.unfused_cost(g, spec)
        assert (fused.launches, xla.launches) == (launches, 4)
        plan = fire_plan_or_skip(g, spec)
        assert (plan.kernel == "wgmma") == wgmma, plan.text
        if wgmma:  # one launch with S = 32, merged expands with S % 32, else one conv each
            assert plan.launches == launches, plan.text
        squeeze = batch * hw * hw * s * item
        y = batch * hw * hw * 2 * e * item
        # The concatenate's copy (read + write of y); the fused kernel also keeps s on chip
        # (written once, read by both expands).
        saved = 2 * y + {1: 3 * squeeze, 2: squeeze, 3: 0}[launches]
        assert xla.dram_bytes - fused.dram_bytes == pytest.approx(saved)
        assert fused.time_ms < xla.time_ms
        assert fused.launch_ms == pytest.approx(launches * cost.LAUNCH_MS)


def test_fire_cost_model_takes_two_phase_for_small_problems():
    """Up to 1024 output pixels (N = 1 SqueezeNet 1.1 fires 4-9) "auto" runs the two-phase
    kernel: one launch, s's three transfers as XLA's, the concatenate gone."""
    spec = resolve_spec("H200", False)[0]
    groups, _ = fusion.find_groups("squeezenet1_1", batch=1, dtype="bfloat16", kinds=BLOCKS)
    small = [g for g in groups if g.x_shape[1] * g.x_shape[2] <= 1024]  # fire.cu kTwoPhaseMaxPixels
    assert [g.x_shape[1] for g in small] == [27, 27, 13, 13, 13, 13]
    for g in groups:
        assert (fire_plan_or_skip(g, spec).kernel == "two_phase") == (g in small)
    g = small[-1]
    fused, xla = fusion.fused_cost(g, spec), fusion.unfused_cost(g, spec)
    assert fused.launches == 1
    y = 13 * 13 * 512 * 2
    assert xla.dram_bytes - fused.dram_bytes == pytest.approx(2 * y)
    # fp32 and off-multiple channels never take it.
    g32, _ = fusion.find_groups("squeezenet1_1", batch=1, dtype="float32", kinds=BLOCKS)
    assert all(fire_plan_or_skip(g, spec).kernel == "fma" for g in g32)


def test_fire_model_reads_the_launchers_two_cta_layout():
    """The cost model's fused fire is the library's plan for the spec's GPU: SqueezeNet 1.1
    fire2/fire3 at N=64 on H200 run the fused kernel two CTAs per SM unsplit (the planner's
    answers: smem=109632 and 112704), so they stay off the wgmma path; the same fires on an
    A100 (no wgmma) keep the fused kernel too."""
    spec = resolve_spec("H200", False)[0]
    groups, _ = fusion.find_groups("squeezenet1_1", batch=64, dtype="bfloat16", kinds=BLOCKS)
    for g, smem in zip(groups[:2], (109632, 112704)):
        plan = fire_plan_or_skip(g, spec)
        assert (plan.kernel, plan.ctas_per_sm, plan.split, plan.smem) == ("tensor_core", 2, 1, smem)
        assert fusion.fused_cost(g, spec).config == f"library plan: {plan.text}"
    a100 = resolve_spec("A100 SXM 80GB", False)[0]
    assert fire_plan_or_skip(groups[2], a100).kernel == "tensor_core"
    assert fire_plan_or_skip(groups[2], spec).kernel == "wgmma"


def test_fp32_fire_at_large_batch_is_left_to_xla_by_the_model():
    """fp32 runs the fused fire on CUDA-core FMA; at N=64 that is compute-bound and slower than
    XLA's TF32 tensor-core convs, so the model keeps XLA; bf16 fuses every fire."""
    fp32 = fusion.plan_fusion("squeezenet1_0", batch=64, dtype="float32", costs="model", kinds=BLOCKS)
    bf16 = fusion.plan_fusion("squeezenet1_0", batch=64, dtype="bfloat16", costs="model", kinds=BLOCKS)
    assert set(bf16.choices().values()) == {"fused"}
    assert "xla" in fp32.choices().values()
    d = next(d for d in fp32.decisions if d.choice == "xla")
    assert "CUDA-core FMA" in d.reason and d.time("fused") >= d.time("xla")


def test_inception_model_is_honest_about_the_composition():
    (g, *_), _ = fusion.find_groups("googlenet", batch=64, dtype="bfloat16", kinds=BLOCKS)
    spec = resolve_spec("H200", False)[0]
    fused, xla = fusion.fused_cost(g, spec), fusion.unfused_cost(g, spec)
    # Two convs fewer, two slice copies more; x read once instead of three times.
    assert fused.launches == xla.launches == 8
    x_bytes = 64 * 28 * 28 * 192 * 2
    copies = 2 * 64 * 28 * 28 * (96 + 16) * 2
    assert xla.dram_bytes - fused.dram_bytes == pytest.approx(2 * x_bytes - copies)


# ---------------------------------------------------------------- plans and explain()


def test_plan_explain_lists_every_group_with_candidates_and_reasons():
    plan = fusion.plan_fusion("squeezenet1_1", batch=64, dtype="bf16", costs="model", kinds=BLOCKS)
    text = plan.explain()
    assert plan.source == "model" and plan.fused_groups == tuple(f"fire{i}" for i in range(2, 10))
    assert text.splitlines()[0].startswith("squeezenet1_1 batch=64 bfloat16: fusion plan (model costs")
    for header in ("group", "members", "fused ms", "XLA ms", "DRAM MiB XLA->fused", "choice", "why"):
        assert header in text
    # N=64 on Hopper: fire2/fire3 (16-channel squeeze) one fused kernel; the others the wgmma
    # path: one launch (S 32: fire4/5), squeeze + merged expands (S 64: fire8/9) or a conv per
    # expand (S 48).
    assert text.count(FIRE_MEMBERS) == 8 and text.count("4->1") == 4
    assert text.count("4->2") == 2 and text.count("4->3") == 2
    assert "groups: 8 of 8 fused" in text and "launch (assumed)" in text
    assert "saves" in text and "kernel launches" in text
    d = plan.to_dict()
    assert json.loads(json.dumps(d))["fused_groups"] == list(plan.fused_groups)
    assert d["chosen_ms"] < d["xla_ms"]


def test_plan_without_groups_says_so():
    text = fusion.plan_fusion("vgg16", costs="model", kinds=("fire", "inception")).explain()
    assert "no fusable group" in text


def test_plan_fusion_validates_arguments():
    with pytest.raises(ValueError, match="costs must be one of"):
        fusion.plan_fusion("squeezenet1_1", costs="guess", kinds=BLOCKS)
    with pytest.raises(TypeError, match="dtype must be"):
        fusion.plan_fusion("squeezenet1_1", dtype="int8", kinds=BLOCKS)
    with pytest.raises(ValueError, match="iters must be >= 1"):
        fusion.plan_fusion("squeezenet1_1", iters=0, kinds=BLOCKS)
    with pytest.raises(TypeError, match="cache must be"):
        fusion.plan_fusion("squeezenet1_1", cache=3, kinds=BLOCKS)
    with pytest.raises(RuntimeError, match="CUDA"):
        if not __import__("jaxcnn").cuda_available():
            fusion.plan_fusion("squeezenet1_1", costs="measured", kinds=BLOCKS)
        else:
            raise RuntimeError("CUDA here: nothing to check")


# ---------------------------------------------------------------- apply


def run_both(model, plan, batch, dtype, rest="xla"):
    spec = get_model(model)
    params = spec.init(0, dtype)
    x = jax.random.normal(jax.random.PRNGKey(1), spec.input_shape(batch)).astype(dtype)
    got = jax.jit(lambda p, x: plan.apply(p, x, rest=rest))(params, x)
    want = jax.jit(lambda p, x: spec.apply(p, x, backend="xla"))(params, x)
    return got, want, params, x


def test_apply_squeezenet_equals_the_unfused_model():
    plan = fusion.plan_fusion("squeezenet1_0", batch=2, dtype="float32", costs="model", kinds=BLOCKS)
    assert len(plan.fused_groups) == 8
    got, want, params, x = run_both("squeezenet1_0", plan, 2, jnp.float32)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    jaxpr = str(jax.make_jaxpr(plan.apply)(params, x))
    assert jaxpr.count("jaxcnn_fire") == 8


@pytest.mark.slow
def test_apply_googlenet_runs_chosen_inception_blocks_fused():
    plan = fusion.plan_fusion("googlenet", batch=1, dtype="float32", costs="model", kinds=BLOCKS)
    # Force a mix: the first two blocks fused, the third on jaxcnn's per-layer kernels.
    decisions = list(plan.decisions)
    for i, choice in enumerate(("fused", "fused", "jaxcnn")):
        decisions[i] = P.dataclasses.replace(decisions[i], choice=choice)
    for i in range(3, len(decisions)):
        decisions[i] = P.dataclasses.replace(decisions[i], choice="xla")
    mixed = P.dataclasses.replace(plan, decisions=tuple(decisions))
    got, want, params, x = run_both("googlenet", mixed, 1, jnp.float32)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    jaxpr = str(jax.make_jaxpr(mixed.apply)(params, x))
    assert jaxpr.count("jaxcnn_inception") == 2
    assert jaxpr.count("jaxcnn_conv2d") == 6  # inception4a's six convs, one kernel each


def test_apply_rest_jaxcnn_and_bad_rest():
    plan = fusion.plan_fusion("squeezenet1_1", batch=1, dtype="float32", costs="model", kinds=BLOCKS)
    got, want, params, x = run_both("squeezenet1_1", plan, 1, jnp.float32, rest="jaxcnn")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="rest must be one of"):
        plan.apply(params, x, rest="cudnn")


# ---------------------------------------------------------------- measured path (fake device)


@pytest.fixture
def fake_gpu(monkeypatch):
    """The measured path on the CPU: device 'FakeGPU'; every case is traced once (a
    stand-in for measure.try_run) and gets a time from a table: fused wins fire2, XLA wins the rest."""
    calls = []

    def measure(cases, iters, warmup):
        calls.append([key for key, _, _ in cases])
        out = {}
        for key, fn, args in cases:
            group, version = key
            t = {"fused": 0.010 if group == "fire2" else 0.050, "xla": 0.030, "jaxcnn": 0.040}[version]
            out[key] = dict(time_ms=t, measured=True, note="trace/periodic", kernels=["k"])
        return out

    def try_run(fn, args):
        # Trace only (a candidate that cannot run raises while tracing/lowering): compiling
        # 24 block programs on the CPU would only slow the test down.
        try:
            jax.eval_shape(fn, *args)
        except ValueError as err:
            return f"ValueError: {err}"
        return ""

    # The planner measures through jaxcnn.tuning.measure and times through case_timing.
    monkeypatch.setattr(M, "should_measure", lambda measure: measure is not False)
    monkeypatch.setattr(M, "device_kind", lambda: "FakeGPU")
    monkeypatch.setattr(M, "try_run", try_run)
    monkeypatch.setattr(case_timing, "time_cases", measure)
    return calls


def test_measured_decisions_and_cache(fake_gpu, tmp_path):
    cache = L.AutotuneCache(tmp_path / "autotune.json")
    plan = fusion.plan_fusion("squeezenet1_1", batch=1, dtype="float32", cache=cache, iters=2, warmup=1, kinds=BLOCKS)
    assert plan.source == "measured" and plan.device == "FakeGPU"
    assert plan.choices()["fire2"] == "fused" and plan.choices()["fire3"] == "xla"
    assert len(fake_gpu) == 1 and len(fake_gpu[0]) == 8 * 3  # every candidate of every group, one trace
    d = plan.decisions[1]
    assert "measured: xla fastest" in d.reason and "overrules the model" in d.reason
    text = plan.explain()
    assert "0.0100" in text and "0.0500" in text and "0.0400" in text and "launch (assumed)" not in text
    entries = cache.load()
    keys = [json.loads(k) for k in entries]
    assert sum(k["op"] == "fusion_group" and k["device"] == "FakeGPU" for k in keys) == 8
    again = fusion.plan_fusion("squeezenet1_1", batch=1, dtype="float32", cache=cache, iters=2, warmup=1, kinds=BLOCKS)
    assert len(fake_gpu) == 1 and "(cache)" in again.decisions[0].reason
    assert again.choices() == plan.choices()
    fusion.plan_fusion("squeezenet1_1", batch=1, dtype="float32", cache=cache, refresh=True, kinds=BLOCKS)
    assert len(fake_gpu) == 2


def test_outside_traces_runs_for_real_under_jit():
    """Inside a jit trace, jax ops (even on constants) are staged; tuning.measure.outside_traces runs
    its function in a fresh thread, where they execute."""
    def compute():
        return jax.jit(lambda v: v * 2)(jnp.arange(3.0))

    got = {}

    def traced(x):
        got["staged"], got["eager"] = compute(), M.outside_traces(compute)()
        return x + 1

    jax.jit(traced)(1.0)
    assert isinstance(got["staged"], jax.core.Tracer)  # what a measurement under jit used to time
    assert not isinstance(got["eager"], jax.core.Tracer)
    np.testing.assert_array_equal(got["eager"], [0.0, 2.0, 4.0])


def test_group_measurements_run_outside_an_enclosing_jit_trace(fake_gpu, monkeypatch):
    """optimize(fn) without example_args plans on its first (traced) call: the candidates'
    inputs must still be concrete arrays, or the timings are of nothing."""
    seen = []
    fake = case_timing.time_cases

    def measure(cases, iters, warmup):
        seen.extend(isinstance(leaf, jax.core.Tracer) for _, _, args in cases for leaf in jax.tree.leaves(args))
        return fake(cases, iters, warmup)

    monkeypatch.setattr(case_timing, "time_cases", measure)
    groups, _ = fusion.find_groups("squeezenet1_1", batch=1, dtype="float32", kinds=BLOCKS)
    sources = []

    def traced(x):
        sources.append(P.decide_groups(groups[:2], costs="measured", cache=False, iters=2, warmup=1)[1])
        return x + 1

    jax.jit(traced)(jnp.ones(3))
    assert seen and not any(seen)
    assert sources == ["measured"]


def test_measured_candidate_that_cannot_run_is_recorded(fake_gpu, tmp_path, monkeypatch):
    real = P.group_fn

    def broken(group, version):
        if version == "fused":
            def fn(p, x):
                raise ValueError("jaxcnn.fire: algorithm='tensor_core' cannot run")
            return fn
        return real(group, version)

    monkeypatch.setattr(P, "group_fn", broken)
    plan = fusion.plan_fusion("squeezenet1_1", batch=1, dtype="float32", cache=False, kinds=BLOCKS)
    assert set(plan.choices().values()) == {"xla"}
    assert "cannot run" in plan.explain() and "fused: cannot run" in plan.explain()


# ---------------------------------------------------------------- straight conv->pool


@pytest.fixture
def conv2d_pool_module(monkeypatch):
    """A stand-in jaxcnn.ops.conv2d_pool with the real one's signature: the unfused
    composition, recorded per call (no CUDA kernel needed to check the planner's plumbing)."""
    from jaxcnn.ops.conv2d.api import conv2d
    from jaxcnn.ops.pool2d.api import max_pool2d

    calls = []

    def conv2d_pool(x, w, bias=None, *, stride=1, padding="SAME", dilation=1, pool_window=2,
                    pool_stride=None, pool_padding="VALID", layout="NHWC", precision=None,
                    sparse=False, algorithm="auto"):
        calls.append((x.shape, w.shape, pool_window, pool_stride, pool_padding))
        y = conv2d(x, w, bias, stride=stride, padding=padding, dilation=dilation, activation="relu")
        return max_pool2d(y, pool_window, pool_stride, pool_padding)

    module = types.ModuleType("jaxcnn.ops.conv2d_pool")
    module.conv2d_pool = conv2d_pool
    monkeypatch.setitem(sys.modules, "jaxcnn.ops.conv2d_pool", module)
    return calls


def test_conv_pool_kind_is_skipped_cleanly_without_its_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "jaxcnn.ops.conv2d_pool", None)  # import fails
    groups, skipped = fusion.find_groups("vgg16")
    assert groups == [] and "not importable" in skipped["conv_pool"]
    assert "skipped kind conv_pool" in fusion.plan_fusion("vgg16", costs="model").explain()


def test_conv_pool_groups_on_vgg_and_squeezenet(conv2d_pool_module):
    groups, skipped = fusion.find_groups("vgg16", batch=1, dtype="float32")
    assert not skipped
    assert [g.name for g in groups] == ["conv1_2+pool1", "conv2_2+pool2", "conv3_3+pool3",
                                        "conv4_3+pool4", "conv5_3+pool5"]
    assert all(g.kind == "conv_pool" and g.modes == ("straight",) for g in groups)
    goog, _ = fusion.find_groups("googlenet", batch=1)
    assert [g.name for g in goog if g.kind == "conv_pool"] == ["conv1+maxpool1", "conv3+maxpool2"]
    sq, _ = fusion.find_groups("squeezenet1_1", batch=1)
    assert [g.kind for g in sq][:2] == ["conv_pool", "fire"] and sq[0].name == "conv1+maxpool1"


def test_conv_pool_cost_model_knows_the_tensor_core_rule():
    """conv2d_pool's tensor-core kernel takes any input channel count (the C=3 stem conv runs its
    flat-K mode, bf16 and fp32 as TF32) but needs K in 16-byte vectors: K=20 in bf16 runs on CUDA
    cores (fp32 FMA peak)."""
    spec = resolve_spec("H200", False)[0]
    first = lambda model, dtype: fusion.find_groups(model, 64, dtype, kinds=("conv_pool",))[0][0]  # noqa: E731
    stem, stem32, vgg = first("squeezenet1_1", "bfloat16"), first("squeezenet1_1", "float32"), first("vgg16", "bfloat16")
    assert stem.name == "conv1+maxpool1" and stem.members[0].input_shape[3] == 3
    for group in (stem, stem32, vgg):
        assert cost.conv_pool_uses_tensor_cores(group)
        assert [k.math for k in fusion.fused_cost(group, spec).kernels] == ["tensor"]
    conv, pool = stem.members
    k20 = P.dataclasses.replace(stem, members=(
        P.dataclasses.replace(conv, weight_shape=(*conv.weight_shape[:3], 20)), pool))
    assert not cost.conv_pool_uses_tensor_cores(k20)
    assert [k.math for k in fusion.fused_cost(k20, spec).kernels] == ["fma"]


def test_apply_with_conv_pool_equals_unfused(conv2d_pool_module):
    plan = fusion.plan_fusion("squeezenet1_1", batch=1, dtype="float32", costs="model")
    assert plan.choices()["conv1+maxpool1"] == "fused"
    got, want, _, _ = run_both("squeezenet1_1", plan, 1, jnp.float32)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    (x_shape, w_shape, window, stride, padding), = conv2d_pool_module[-1:]
    assert w_shape == (3, 3, 3, 64) and window == (3, 3) and stride == (2, 2)
    pool = next(i for i in get_model("squeezenet1_1").layers(1) if i.name == "maxpool1")
    assert padding == tuple(map(tuple, pool.padding))  # the zoo's (ceil-mode) pads, explicit
    # Measured fastest layer by layer on the "jaxcnn" backend: jaxcnn's conv, that table's pool.
    per_layer = P.dataclasses.replace(plan, decisions=tuple(
        P.dataclasses.replace(d, choice="jaxcnn" if d.group.kind == "conv_pool" else "xla")
        for d in plan.decisions))
    calls = len(conv2d_pool_module)
    got, want, params, x = run_both("squeezenet1_1", per_layer, 1, jnp.float32)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    jaxpr = str(jax.make_jaxpr(per_layer.apply)(params, x))
    assert jaxpr.count("jaxcnn_conv2d") == 1  # conv1 only; the rest is XLA
    assert len(conv2d_pool_module) == calls


# ---------------------------------------------------------------- expand->depthwise (MobileNetV2)

EXPAND_DW = ("expand_depthwise",)
EXPAND_DW_MEMBERS = "expand,expand.relu6,depthwise,depthwise.relu6"


def expanding_blocks():
    """MobileNetV2's inverted residual blocks with an expand conv (expand ratio != 1)."""
    names, index = [], 1
    for ratio, _, blocks, _ in INVERTED_RESIDUAL_STAGES:
        names += [f"features.{i}" for i in range(index, index + blocks) if ratio != 1]
        index += blocks
    return names


def test_mobilenetv2_has_an_expand_depthwise_group_per_expanding_block():
    groups, _ = fusion.find_groups("mobilenetv2", batch=2, dtype="bfloat16")
    assert [g.name for g in groups] == expanding_blocks() and len(groups) == 16
    table = {i.name: i for i in get_model("mobilenetv2").layers(2, "bfloat16")}
    for g in groups:
        ex, dw = table[f"{g.name}.expand"], table[f"{g.name}.depthwise"]
        assert g.kind == "expand_depthwise" and g.modes == ("straight",) and g.short_members() == EXPAND_DW_MEMBERS
        assert g.x_shape == ex.input_shape and g.y_shape == table[f"{g.name}.depthwise.relu6"].output_shape
        assert g.attrs == dict(stride=dw.stride[0], channels=ex.input_shape[3], hidden=6 * ex.input_shape[3])
        assert g.role("depthwise") is dw
    assert [g.attrs["stride"] for g in groups].count(2) == 4  # the first block of four stages
    assert fusion.find_groups("mobilenetv2", kinds=("fire", "inception", "conv_pool"))[0] == []


def test_expand_depthwise_cost_model_keeps_t_on_chip_where_the_kernel_runs():
    """XLA (as on H100): expand conv+bias+ReLU, clamp, depthwise conv, bias+ReLU+clamp, t and
    the depthwise's output each written and read twice; fused: one kernel, t on chip. Where
    jaxcnn.conv1x1_depthwise runs XLA's convs (fp32, C > 256) the fused version is XLA's and
    the model keeps XLA."""
    spec = resolve_spec("H200", False)[0]
    (g, *_), _ = fusion.find_groups("mobilenetv2", batch=64, dtype="bfloat16", kinds=EXPAND_DW)
    fused, xla = fusion.fused_cost(g, spec), fusion.unfused_cost(g, spec)
    assert (xla.launches, fused.launches) == (4, 1) and fused.time_ms < xla.time_ms
    t, y = 64 * 112 * 112 * 96 * 2, 64 * 56 * 56 * 96 * 2  # features.2's expanded t and output
    assert xla.dram_bytes - fused.dram_bytes == pytest.approx(4 * t + 2 * y)
    assert 1 < cost.expand_depthwise_recompute(g) < 2  # the 1x1 over each tile's halo
    wide = P.dataclasses.replace(g, x_shape=(*g.x_shape[:3], 264))
    assert cost.expand_depthwise_fused(g) and not cost.expand_depthwise_fused(wide)
    plan32 = fusion.plan_fusion("mobilenetv2", batch=1, dtype="float32", costs="model", kinds=EXPAND_DW)
    assert set(plan32.choices().values()) == {"xla"}
    d = plan32.decisions[0]
    assert "runs XLA's two convs" in d.reason and d.time("fused") == d.time("xla")


def test_plan_explain_shows_mobilenetv2_expand_depthwise():
    plan = fusion.plan_fusion("mobilenetv2", batch=64, dtype="bfloat16", costs="model")
    assert plan.fused_groups == tuple(expanding_blocks())
    text = plan.explain()
    rows = [line for line in text.splitlines() if "expand_depthwise" in line]
    assert len(rows) == 16 and rows[0].split()[:3] == ["0", "features.2", "expand_depthwise"]
    assert all(EXPAND_DW_MEMBERS in r and " 4->1 " in r and "model: fused" in r for r in rows)
    assert "groups: 16 of 16 fused" in text


def test_expand_depthwise_group_candidates_agree():
    (g, *_), _ = fusion.find_groups("mobilenetv2", 1, "float32", kinds=EXPAND_DW)
    params, x = fusion.group_params(g)
    outs = {v: jax.jit(fusion.group_fn(g, v))(params, x) for v in fusion.CANDIDATES}
    assert outs["xla"].shape == g.y_shape
    for v in ("fused", "jaxcnn"):
        np.testing.assert_allclose(outs[v], outs["xla"], rtol=1e-5, atol=1e-5)
    assert "jaxcnn_conv1x1_depthwise" in str(jax.make_jaxpr(fusion.group_fn(g, "fused"))(params, x))


def test_measured_expand_depthwise_groups(fake_gpu):
    plan = fusion.plan_fusion("mobilenetv2", batch=1, dtype="bfloat16", cache=False, iters=2, warmup=1,
                              kinds=EXPAND_DW)
    assert plan.source == "measured" and len(fake_gpu[0]) == 16 * 3
    assert set(plan.choices().values()) == {"xla"} and "overrules the model (fused)" in plan.decisions[0].reason


@pytest.mark.slow
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 5e-2)])
def test_apply_mobilenetv2_expand_depthwise_equals_the_unfused_model(dtype, tol):
    """Fused groups: one jaxcnn.conv1x1_depthwise, the block's project conv and add on the
    rest's ops; "jaxcnn" ones: expand and depthwise on jaxcnn.conv2d, the project on the rest's.
    bf16: the fused op rounds once after each conv, XLA after the conv and after the bias."""
    plan = fusion.plan_fusion("mobilenetv2", batch=1, dtype=dtype, costs="model", kinds=EXPAND_DW)
    mixed = P.dataclasses.replace(plan, decisions=tuple(
        P.dataclasses.replace(d, choice=("fused", "jaxcnn", "xla")[i % 3]) for i, d in enumerate(plan.decisions)))
    fused = P.dataclasses.replace(plan, decisions=tuple(
        P.dataclasses.replace(d, choice="fused") for d in plan.decisions))
    spec = get_model("mobilenetv2")
    params = spec.init(0, dtype)
    x = jax.random.normal(jax.random.PRNGKey(1), (1, 64, 64, 3)).astype(dtype)  # small: 2x2 at the end
    want = np.asarray(jax.jit(spec.apply)(params, x), np.float64)
    for p, rest in ((mixed, "xla"), (fused, "jaxcnn")):
        got = np.asarray(jax.jit(lambda p_, x_: p.apply(p_, x_, rest=rest))(params, x), np.float64)
        assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want))
    jaxpr = str(jax.make_jaxpr(mixed.apply)(params, x))
    assert jaxpr.count("jaxcnn_conv1x1_depthwise[") == 6 and jaxpr.count("jaxcnn_conv2d") == 2 * 5
    # rest="jaxcnn": every conv but the 32 fused ones (stem, features.1, projects, last) is jaxcnn's.
    jaxpr = str(jax.make_jaxpr(lambda p_, x_: fused.apply(p_, x_, rest="jaxcnn"))(params, x))
    assert jaxpr.count("jaxcnn_conv1x1_depthwise[") == 16 and jaxpr.count("jaxcnn_conv2d") == 52 - 32


@pytest.mark.skipif(not library.handlers_registered(), reason=library.library_state().reason or "library loaded")
def test_fused_mobilenetv2_lowers_to_conv1x1_depthwise_custom_calls(monkeypatch):
    # Lowering only names the target: also where the loaded library predates the op.
    monkeypatch.setattr(library, "target_registered", lambda target: True)
    plan = fusion.plan_fusion("mobilenetv2", batch=1, dtype="bfloat16", costs="model", kinds=EXPAND_DW)
    assert len(plan.fused_groups) == 16
    params = get_model("mobilenetv2").abstract_params(jnp.bfloat16)
    x = jax.ShapeDtypeStruct((1, 64, 64, 3), jnp.bfloat16)
    text = jax.jit(plan.apply).trace(params, x).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("custom_call @jaxcnn_conv1x1_depthwise_fwd(") == 16


# ---------------------------------------------------------------- CLI


def test_cli_fuse(capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert cli.main(["fuse", "squeezenet1_1", "--batch", "64", "--dtype", "bf16", "--model-only",
                     "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "squeezenet1_1 batch=64 bfloat16: fusion plan" in text and "fire9" in text
    assert "fire2" in json.loads(out.read_text())["fused_groups"]
    assert cli.main(["fuse", "googlenet", "--model-only"]) == 0
    assert "inception5b" in capsys.readouterr().out
    assert cli.main(["fuse", "nonet"]) == 2
    assert "unknown model" in capsys.readouterr().err
    if not __import__("jaxcnn").cuda_available():
        assert cli.main(["fuse", "squeezenet1_1", "--autotune"]) == 2
        assert "CUDA" in capsys.readouterr().err


def test_apply_with_a_layout_plan_for_the_rest():
    """rest=ChainPlan: fused fires, every other layer in the layout plan's layout and kernel;
    the plan's NCHW/CHWN layers really run in those layouts and the logits stay XLA's."""
    lplan = L.plan_model_layouts("squeezenet1_1", 2, "float32", costs="model")
    # Force a layout mix so transforms and the layer count of LayoutOps are exercised.
    steps = tuple(dataclasses.replace(s, layout="NCHW") if s.name in ("conv1", "maxpool1", "conv10")
                  else s for s in lplan.steps)
    lplan = dataclasses.replace(lplan, steps=steps)
    plan = fusion.plan_fusion("squeezenet1_1", batch=2, dtype="float32", costs="model", kinds=BLOCKS)
    got, want, params, x = run_both("squeezenet1_1", plan, 2, jnp.float32, rest=lplan)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    jaxpr = str(jax.make_jaxpr(lambda p, x: plan.apply(p, x, rest=lplan))(params, x))
    assert jaxpr.count("jaxcnn_fire") == 8 and "jaxcnn_layout_transform" in jaxpr
    with pytest.raises(ValueError, match="layout plan of 'vgg16'"):
        plan.apply(params, x, rest=dataclasses.replace(lplan, model="vgg16"))
    with pytest.raises(TypeError, match="ChainPlan"):
        plan.apply(params, x, rest=3)
