"""jaxcnn.layouts on the CPU: the rule, the chain DP against brute force, the autotune cache,
explain(), the model fallback, running a plan, and the `jaxcnn layouts` CLI."""

import itertools
import json
import math
import multiprocessing
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxcnn.layouts as L
from jaxcnn import cli
from jaxcnn.costmodel.roofline import KERNEL_FLOOR_MS
from jaxcnn.tuning import autotune_cache, case_timing, layer_autotune
from jaxcnn.tuning import measure as measuring
from jaxcnn.models import get_model, list_models

LAYOUTS = ("NHWC", "NCHW", "CHWN")


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("x,w,kw,want", [
    ((64, 56, 56, 64), (3, 3, 64, 128), {}, ("NHWC", "tensor_core")),
    ((1, 28, 28, 256), (1, 1, 256, 512), dict(dtype="float32"), ("NHWC", "tensor_core")),
    ((8, 28, 28, 64), (3, 3, 16, 64), dict(groups=4), ("NCHW", "direct")),  # grouped: no TC
    ((1, 224, 224, 3), (7, 7, 3, 64), {}, ("NHWC", "tensor_core")),  # stem: C zero-padded to 8
    ((1, 224, 224, 3), (3, 3, 3, 20), {}, ("NCHW", "direct")),       # K=20, small N: seed NCHW
    ((256, 224, 224, 3), (3, 3, 3, 20), {}, ("CHWN", "direct")),     # K=20, large N, small C
    ((256, 27, 27, 36), (3, 3, 36, 20), {}, ("NCHW", "direct")),     # large N but C >= 32
    ((8, 56, 56, 32), (3, 3, 1, 32), dict(groups=32), ("NHWC", "depthwise")),
    ((64, 56, 56, 6), (3, 3, 1, 6), dict(groups=6), ("CHWN", "depthwise")),   # odd C, N >= 32
    ((2, 56, 56, 6), (3, 3, 1, 12), dict(groups=6), ("NHWC", "depthwise")),   # odd C, small N
])
def test_rule_conv(x, w, kw, want):
    kw = dict(kw)
    dtype = kw.pop("dtype", "bfloat16")
    rule = L.rule_conv(x, w, dtype, **kw)
    assert (rule.layout, rule.algorithm) == want
    assert rule.reason and want[0] in rule.explain()


def test_rule_pool_follows_neighbours():
    assert L.rule_pool((8, 56, 56, 64), "float32").layout == "NHWC"
    rule = L.rule_pool((8, 56, 56, 64), "float32", neighbour_layout="CHWN")
    assert rule.layout == "CHWN" and "memory-bound" in rule.reason
    layer = L.pool_layer((8, 56, 56, 64), "float32", window=3, stride=2)
    assert L.rule_for(layer, "NCHW").layout == "NCHW"
    assert layer.y_shape == (8, 27, 27, 64)


def test_rule_bad_arguments():
    with pytest.raises(TypeError, match="dtype"):
        L.rule_conv((1, 8, 8, 8), (3, 3, 8, 8), "int32")
    with pytest.raises(ValueError, match="x_shape"):
        L.rule_conv((1, 8, 8), (3, 3, 8, 8))
    with pytest.raises(ValueError, match="groups"):
        L.rule_conv((1, 8, 8, 8), (3, 3, 8, 8), groups=3)
    with pytest.raises(ValueError, match="neighbour_layout"):
        L.rule_pool((1, 8, 8, 8), neighbour_layout="HWCN")
    with pytest.raises(TypeError, match="layer"):
        L.rule_for("conv")


# --------------------------------------------------------------------------- chain DP


def _brute_force(nodes, layouts, trans, input_layout, output_layout):
    best = math.inf
    for assign in itertools.product(layouts, repeat=len(nodes)):
        if any(lay not in n.times for n, lay in zip(nodes, assign)):
            continue
        cost, prev = 0.0, input_layout
        for n, lay in zip(nodes, assign):
            cost += (trans(n.x_shape, n.dtype, prev, lay) if prev != lay else 0.0) + n.times[lay]
            prev = lay
        cost += trans(nodes[-1].y_shape, nodes[-1].dtype, prev, output_layout) if prev != output_layout else 0.0
        best = min(best, cost)
    return best


@st.composite
def chains(draw):
    length = draw(st.integers(1, 6))
    layouts = draw(st.sampled_from([LAYOUTS, ("NHWC", "CHWN"), ("NCHW", "NHWC", "CHWN")]))
    shapes = [(1 + i, 2, 3, 4) for i in range(length + 1)]  # distinct shape per boundary
    cost = st.floats(0.0, 10.0, allow_nan=False, allow_infinity=False)
    nodes = []
    for i in range(length):
        present = draw(st.lists(st.sampled_from(LAYOUTS), min_size=1, max_size=3, unique=True))
        times = {lay: draw(cost) for lay in present}
        nodes.append(L.LayerCost(f"n{i}", shapes[i], shapes[i + 1], "float32", times,
                                 {lay: ("direct",) for lay in present}, (f"n{i}",)))
    table = {(s, a, b): draw(cost) for s in shapes for a in LAYOUTS for b in LAYOUTS if a != b}
    return nodes, layouts, table, draw(st.sampled_from(LAYOUTS)), draw(st.sampled_from(LAYOUTS))


@settings(max_examples=300, deadline=None)
@given(chains())
def test_chain_dp_matches_brute_force(case):
    nodes, layouts, table, input_layout, output_layout = case
    trans = lambda shape, dtype, a, b: table[(tuple(shape), a, b)]  # noqa: E731
    want = _brute_force(nodes, layouts, trans, input_layout, output_layout)
    if want == math.inf:
        with pytest.raises(ValueError, match="no assignment"):
            L.choose_chain(nodes, layouts=layouts, transform_costs=trans,
                           input_layout=input_layout, output_layout=output_layout)
        return
    plan = L.choose_chain(nodes, layouts=layouts, transform_costs=trans,
                          input_layout=input_layout, output_layout=output_layout)
    assert plan.total_ms == pytest.approx(want, rel=1e-9, abs=1e-9)
    # The reported plan adds up: its steps and transforms are its total, and each transform
    # sits exactly where consecutive layouts differ.
    assert plan.layer_ms + plan.transform_ms == pytest.approx(plan.total_ms, rel=1e-9, abs=1e-9)
    chain = [input_layout, *plan.layouts, output_layout]
    changes = [(i, a, b) for i, (a, b) in enumerate(zip(chain, chain[1:])) if a != b]
    assert [(t.before, t.src, t.dst) for t in plan.transforms] == changes
    assert all(lay in layouts for lay in plan.layouts)
    if all("NHWC" in n.times for n in nodes):
        assert plan.all_nhwc_ms >= plan.total_ms - 1e-9 or "NHWC" not in layouts


def test_chain_prefers_switch_only_when_it_pays():
    shape = (64, 28, 28, 3)
    a = L.LayerCost("a", shape, shape, "float32", {"NHWC": 1.0, "CHWN": 0.2})
    b = L.LayerCost("b", shape, shape, "float32", {"NHWC": 1.0, "CHWN": 0.2})
    cheap = L.choose_chain([a, b], transform_costs=lambda *args: 0.1)
    assert cheap.layouts == ("CHWN", "CHWN") and len(cheap.transforms) == 2
    assert cheap.total_ms == pytest.approx(0.6) and cheap.all_nhwc_ms == pytest.approx(2.0)
    dear = L.choose_chain([a, b], transform_costs=lambda *args: 1.0)
    assert dear.layouts == ("NHWC", "NHWC") and not dear.transforms


def test_choose_chain_errors():
    a = L.LayerCost("a", (1, 4, 4, 8), (1, 4, 4, 8), "float32", {"NHWC": 1.0})
    b = L.LayerCost("b", (1, 2, 2, 8), (1, 2, 2, 8), "float32", {"NHWC": 1.0})
    with pytest.raises(ValueError, match=r"layers\[1\]"):
        L.choose_chain([a, b])
    with pytest.raises(ValueError, match="costs"):
        L.choose_chain([a], costs="fast")
    with pytest.raises(ValueError, match="input_layout"):
        L.choose_chain([a], input_layout="NWHC")
    with pytest.raises(ValueError, match="non-empty"):
        L.choose_chain([])
    with pytest.raises(ValueError, match="no assignment"):
        L.choose_chain([a], layouts=("CHWN",))
    with pytest.raises(ValueError, match="time in NHWC"):
        L.LayerCost("c", (1, 4, 4, 8), (1, 4, 4, 8), "float32", {"NHWC": -1.0})
    with pytest.raises(ValueError, match="transform cost"):
        L.choose_chain([a], input_layout="CHWN", transform_costs=lambda *args: float("nan"))


def test_costs_callable_with_layout_dicts():
    layers = [L.conv_layer((2, 8, 8, 8), (3, 3, 8, 8), "float32", name="c1"),
              L.pool_layer((2, 8, 8, 8), "float32", name="p1")]
    plan = L.choose_chain(layers, costs=lambda layer: {"NHWC": 1.0, "NCHW": (0.1, "direct")},
                          transform_costs=lambda *args: 0.01)
    assert plan.layouts == ("NCHW", "NCHW") and plan.steps[0].algorithm == "direct"
    assert plan.source == "given"


# --------------------------------------------------------------------------- model fallback


def test_autotune_on_cpu_is_model_based(tmp_path):
    cache = tmp_path / "autotune.json"
    choice = L.autotune_conv((8, 28, 28, 64), (3, 3, 64, 128), "bfloat16", activation="relu",
                             cache=cache)
    assert choice.source == "model" and not choice.cached
    assert "H200" in choice.note and choice.device == "H200"
    assert {(c.layout, c.algorithm) for c in choice.candidates} == {
        ("NHWC", "tensor_core"), ("NHWC", "direct"), ("NCHW", "direct"), ("CHWN", "direct"),
        ("NHWC", "xla")}
    assert all(c.ok and c.time_ms > 0 and c.source == "model" for c in choice.candidates)
    xla = next(c for c in choice.candidates if c.algorithm == "xla")
    assert xla.time_ms == choice.xla_ms  # XLA's conv is a candidate of its own
    assert choice.best.time_ms == min(c.time_ms for c in choice.candidates)
    assert choice.xla_ms > 0 and set(choice.transforms) == {"NCHW", "CHWN"}
    assert not cache.exists()  # model estimates are not cached


def test_model_candidates_that_cannot_run():
    choice = L.autotune_conv((2, 16, 16, 6), (3, 3, 6, 10), "float32",
                             candidates=[("NHWC", "tensor_core"), ("NCHW", "tensor_core"),
                                         ("NHWC", "depthwise"), ("NCHW", "direct")])
    by = {(c.layout, c.algorithm): c for c in choice.candidates}
    assert not by[("NHWC", "tensor_core")].ok and "multiple of 8" in by[("NHWC", "tensor_core")].error
    assert not by[("NCHW", "tensor_core")].ok and not by[("NHWC", "depthwise")].ok
    assert choice.layout == "NCHW" and choice.algorithm == "direct"


def test_depthwise_candidates_and_pool():
    choice = L.autotune_conv((4, 14, 14, 32), (3, 3, 1, 32), "float32", groups=32)
    assert [c.algorithm for c in choice.candidates].count("depthwise") == 3
    assert choice.algorithm == "depthwise"
    pool = L.autotune_pool((4, 14, 14, 32), "float32", window=3, stride=2, padding=1)
    assert pool.source == "model" and len(pool.times_by_layout()) == 3


def test_autotune_bad_arguments():
    with pytest.raises(TypeError, match="candidates"):
        L.autotune_conv((1, 8, 8, 8), (3, 3, 8, 8), candidates="NHWC")
    with pytest.raises(ValueError, match="candidate algorithm"):
        L.autotune_conv((1, 8, 8, 8), (3, 3, 8, 8), candidates=[("NHWC", "winograd")])
    with pytest.raises(ValueError, match="candidate layout"):
        L.autotune_conv((1, 8, 8, 8), (3, 3, 8, 8), candidates=[("HWNC", "direct")])
    with pytest.raises(ValueError, match="iters"):
        L.autotune_conv((1, 8, 8, 8), (3, 3, 8, 8), iters=0)
    with pytest.raises(TypeError, match="cache"):
        L.autotune_conv((1, 8, 8, 8), (3, 3, 8, 8), cache=3.5)
    with pytest.raises(RuntimeError, match="CUDA"):
        L.autotune_conv((1, 8, 8, 8), (3, 3, 8, 8), measure=True)
    with pytest.raises(ValueError, match="gpu"):
        L.autotune_conv((1, 8, 8, 8), (3, 3, 8, 8), gpu="Z9000")


def test_transform_model():
    assert L.transform_ms((2, 8, 8, 8), "float32", "NHWC", "NHWC") == 0.0
    big = L.transform_ms((64, 56, 56, 64), "bfloat16", "NHWC", "CHWN", gpu="H200")
    assert big == pytest.approx(2 * 64 * 56 * 56 * 64 * 2 / 3.97e12 * 1e3)
    assert L.transform_ms((1, 1, 1, 1), "float32", "NHWC", "NCHW") == KERNEL_FLOOR_MS


# --------------------------------------------------------------------------- measured path


TC_ERROR = "jaxcnn.conv2d: algorithm='tensor_core' cannot run x (2, 8, 8, 16): not built"


@pytest.fixture
def fake_gpu(monkeypatch):
    """The measured code path on the CPU: the device is 'FakeGPU', the tensor-core family
    raises the lowering's "cannot run" ValueError, timings come from a table (each case still
    runs once, on the CPU reference), and every time_cases call is recorded."""
    import jaxcnn.ops

    calls = []
    fake = {("cand", "NHWC", "direct"): 0.30, ("cand", "NCHW", "direct"): 0.20,
            ("cand", "CHWN", "direct"): 0.50, ("cand", "NHWC", "xla"): 0.25, ("xla",): 0.25,
            # Pools: our kernel wins in NHWC, reduce_window in NCHW.
            ("NHWC", "jaxcnn"): 0.005, ("NCHW", "xla"): 0.004}

    def measure(cases, iters, warmup):
        calls.append([key for key, _, _ in cases])
        out = {}
        for key, fn, args in cases:
            if key[0] in ("cand", "xla"):  # the conv cases really run (transforms are slow here)
                jax.block_until_ready(fn(*args))
            out[key] = dict(time_ms=fake.get(key, 0.01), measured=True, note="trace/periodic",
                            kernels=["k"])
        return out

    real_conv2d = jaxcnn.ops.conv2d

    def conv2d(*args, algorithm="auto", **kwargs):
        if algorithm == "tensor_core":
            raise ValueError(TC_ERROR)
        return real_conv2d(*args, algorithm=algorithm, **kwargs)

    monkeypatch.setattr(jaxcnn.ops, "conv2d", conv2d)
    monkeypatch.setattr(measuring, "should_measure", lambda measure: measure is not False)
    monkeypatch.setattr(measuring, "device_kind", lambda: "FakeGPU")
    monkeypatch.setattr(case_timing, "time_cases", measure)
    return calls


def test_measured_path_records_errors_and_caches(fake_gpu, tmp_path):
    cache = L.AutotuneCache(tmp_path / "autotune.json")
    kwargs = dict(padding=1, activation="relu", cache=cache, iters=3, warmup=1, name="layer")
    choice = L.autotune_conv((2, 8, 8, 16), (3, 3, 16, 16), "float32", **kwargs)
    assert choice.source == "measured" and not choice.cached and choice.device == "FakeGPU"
    by = {(c.layout, c.algorithm): c for c in choice.candidates}
    assert not by[("NHWC", "tensor_core")].ok and "cannot run" in by[("NHWC", "tensor_core")].error
    assert (choice.layout, choice.algorithm, choice.time_ms) == ("NCHW", "direct", 0.20)
    assert by[("NHWC", "xla")].time_ms == 0.25  # XLA's conv competes as a candidate
    assert choice.xla_ms == 0.25 and choice.xla_ratio == pytest.approx(1.25)
    assert len(fake_gpu) == 1 and ("cand", "NHWC", "tensor_core") not in fake_gpu[0]
    assert ("in", "CHWN") in fake_gpu[0] and ("out", "NCHW") in fake_gpu[0]
    entries = cache.load()
    conv_entries = [json.loads(k) for k in entries if json.loads(k)["op"] == "conv2d"]
    assert len(conv_entries) == 1 and conv_entries[0]["device"] == "FakeGPU"
    assert sum(json.loads(k)["op"] == "to_layout" for k in entries) == 4
    assert "cannot run" in choice.explain()

    again = L.autotune_conv((2, 8, 8, 16), (3, 3, 16, 16), "float32", **kwargs)
    assert again.cached and len(fake_gpu) == 1  # no new measurement
    assert again.to_dict()["candidates"] == choice.to_dict()["candidates"]
    other = L.autotune_conv((2, 8, 8, 16), (3, 3, 16, 16), "float32", **dict(kwargs, activation=None))
    assert not other.cached and len(fake_gpu) == 2  # params are part of the key
    L.autotune_conv((2, 8, 8, 16), (3, 3, 16, 16), "float32", **dict(kwargs, refresh=True))
    assert len(fake_gpu) == 3
    # A candidate list the cached entry does not cover is measured again.
    L.autotune_conv((2, 8, 8, 16), (3, 3, 16, 16), "float32",
                    candidates=[("CHWN", "depthwise"), ("NHWC", "direct")], **kwargs)
    assert len(fake_gpu) == 4


def test_measured_chain_uses_cached_transforms(fake_gpu, tmp_path):
    cache = tmp_path / "autotune.json"
    layers = [L.conv_layer((2, 8, 8, 8), (3, 3, 8, 8), "float32", name="c1"),
              L.pool_layer((2, 8, 8, 8), "float32", name="p1"),
              L.conv_layer((2, 4, 4, 8), (1, 1, 8, 8), "float32", name="c2")]
    plan = L.choose_chain(layers, costs="measured", cache=cache, iters=2, warmup=1)
    assert plan.source == "measured"
    assert plan.layouts == ("NCHW", "NCHW", "NCHW")  # NCHW direct 0.2 beats NHWC 0.3 per conv
    assert len(plan.transforms) == 2 and all(t.time_ms == 0.01 for t in plan.transforms)
    # The pool runs in NCHW with whichever of our kernel / reduce_window measured faster there.
    assert plan.steps[1].algorithms == ("xla",) and plan.steps[1].time_ms == 0.004
    n_calls = len(fake_gpu)
    plan2 = L.choose_chain(layers, costs="measured", cache=cache, iters=2, warmup=1)
    assert len(fake_gpu) == n_calls and plan2.total_ms == plan.total_ms


# --------------------------------------------------------------------------- the cache


def test_cache_round_trip_and_corrupt_file(tmp_path):
    path = tmp_path / "sub" / "autotune.json"
    cache = L.AutotuneCache(path)
    assert cache.load() == {}
    key = cache.key(device="X", op="to_layout", x=[1, 2, 3, 4])
    assert key == cache.key(x=[1, 2, 3, 4], op="to_layout", device="X")  # order-free
    cache.put(key, {"time_ms": 1.5})
    assert L.AutotuneCache(path).get(key) == {"time_ms": 1.5}
    data = json.loads(path.read_text())
    assert data["version"] == autotune_cache.CACHE_VERSION and key in data["entries"]

    path.write_text("{not json")
    with pytest.warns(UserWarning, match="corrupt"):
        assert cache.load() == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get(key) is None  # the same corrupt file is reported once
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.put(key, {"time_ms": 2.0})  # overwrites the corrupt file, no exception
    assert cache.get(key) == {"time_ms": 2.0}
    path.write_text(json.dumps({"version": 999, "entries": {}}))
    with pytest.warns(UserWarning, match="version"):
        assert cache.load() == {}


def test_cache_default_path_env(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXCNN_AUTOTUNE_CACHE", str(tmp_path / "c.json"))
    assert L.default_cache_path() == tmp_path / "c.json"
    assert L.AutotuneCache().path == tmp_path / "c.json"
    monkeypatch.delenv("JAXCNN_AUTOTUNE_CACHE")
    assert L.default_cache_path().parts[-3:] == (".cache", "jaxcnn", "autotune.json")


def _write_entries(path, worker, count):
    cache = L.AutotuneCache(path)
    for i in range(count):
        cache.put(f"w{worker}-{i}", {"worker": worker, "i": i})


def test_cache_concurrent_writers(tmp_path):
    path = tmp_path / "autotune.json"
    threads = [threading.Thread(target=_write_entries, args=(path, w, 10)) for w in range(4)]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_entries, args=(path, 10 + w, 10)) for w in range(3)]
    for t in threads + procs:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    entries = L.AutotuneCache(path).load()
    assert len(entries) == 70
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]  # no stray temp files


# --------------------------------------------------------------------------- explain


def test_explain_contents():
    choice = L.autotune_conv((8, 28, 28, 3), (3, 3, 3, 12), "float32", padding="SAME", name="stem")
    text = choice.explain()
    for needle in ("stem", "NHWC", "NCHW", "CHWN", "direct", "tensor_core", "winner", "rule:",
                   "xla", "XLA/winner", "model", "transforms"):
        assert needle in text, needle
    assert "multiple of 8" in text  # the tensor-core candidate's reason it cannot run (K=12)
    d = choice.to_dict()
    json.dumps(d)
    assert d["winner"]["layout"] == choice.layout and d["rule"]["layout"] == "NCHW"
    assert L.explain(choice) == text
    assert "winner" in L.explain((8, 28, 28, 3), (3, 3, 3, 12), "float32")

    plan = L.plan_model_layouts("lenet5", batch=4, dtype="float32")
    ptext = plan.explain()
    for needle in ("lenet5", "total", "all-NHWC", "speedup", "XLA", "layers per layout"):
        assert needle in ptext, needle
    json.dumps(plan.to_dict())
    assert L.explain("lenet5", batch=4, dtype="float32") == ptext
    with pytest.raises(TypeError):
        L.explain(3.0)


# --------------------------------------------------------------------------- zoo


@pytest.mark.parametrize("model", list_models())
def test_model_chains_connect(model):
    chain = L.model_chain(model, batch=2, dtype="bfloat16")
    assert chain and all(isinstance(n, (L.Layer, L.Block)) for n in chain)
    for a, b in zip(chain, chain[1:]):
        assert a.y_shape == b.x_shape
    plan = L.plan_model_layouts(model, batch=2, dtype="bfloat16")
    table = get_model(model).layers(2, "bfloat16")
    four_d = [i.name for i in table if len(i.input_shapes[0]) == 4 and len(i.output_shape) == 4]
    assert list(plan.assignments()) == four_d
    assert plan.total_ms <= plan.all_nhwc_ms + 1e-12


def _forced_plan(model, batch, dtype, seed):
    """A valid plan with random layouts (so the executor sees every kind of switch)."""
    rng = np.random.default_rng(seed)

    def costs(item):
        base = L.layer_cost(item, costs="model")
        return L.LayerCost(base.name, base.x_shape, base.y_shape, base.dtype,
                           {lay: float(rng.uniform(0, 1)) for lay in base.times},
                           base.algorithms, base.members, "given", None, base.op)

    chain = L.model_chain(model, batch, dtype)
    plan = L.choose_chain(chain, costs=costs, transform_costs=lambda *a: 0.05)
    return plan.__class__(**{**plan.__dict__, "model": model})


@pytest.mark.parametrize("model,seed", [("lenet5", 0), ("squeezenet1_1", 1), ("mobilenetv2", 2)])
def test_apply_plan_matches_model(model, seed):
    spec = get_model(model)
    params = spec.init(0, jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(1), spec.input_shape(1), jnp.float32)
    plan = _forced_plan(model, 1, "float32", seed)
    assert len(set(plan.layouts)) > 1, "the forced plan should mix layouts"
    got = jax.jit(lambda p, x: L.apply_plan(plan, p, x))(params, x)
    want = jax.jit(lambda p, x: spec.apply(p, x, backend="xla"))(params, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-4, atol=2e-4)


def test_apply_plan_transforms_only_where_layouts_change():
    """The NHWC views of physical non-NHWC results are dead code: the jaxpr keeps exactly one
    transform per layout change of the plan."""
    plan = _forced_plan("lenet5", 2, "float32", 3)
    spec = get_model("lenet5")
    params = spec.init(0, jnp.float32)
    x = jnp.zeros(spec.input_shape(2), jnp.float32)
    closed = jax.make_jaxpr(lambda p, x: L.apply_plan(plan, p, x))(params, x)
    from jax._src.interpreters import partial_eval as pe

    jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
    count = sum(1 for eqn in jaxpr.eqns if eqn.primitive.name == "jaxcnn_layout_transform")
    assert count == len(plan.transforms)


# --------------------------------------------------------------------------- CLI


def test_cli_layouts(capsys, tmp_path):
    out_json = tmp_path / "plan.json"
    assert cli.main(["layouts", "squeezenet1_1", "--batch", "2", "--dtype", "fp32",
                     "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "squeezenet1_1 batch=2 float32" in text and "fire2" in text and "total" in text
    assert json.loads(out_json.read_text())["model"] == "squeezenet1_1"
    assert cli.main(["layouts", "lenet5", "--model-only", "--split-blocks"]) == 0
    assert cli.main(["layouts", "nonet"]) == 2
    assert "unknown model" in capsys.readouterr().err
    if jax.default_backend() != "gpu":
        assert cli.main(["layouts", "lenet5", "--autotune"]) == 2
        assert "CUDA" in capsys.readouterr().err


def test_autotune_transforms_batches_and_caches(fake_gpu, tmp_path, monkeypatch):
    # 3 inputs of the first shape fit a trace, 1 of the second (twice the size).
    monkeypatch.setattr(layer_autotune, "TRANSFORM_BATCH_BYTES", 3 * 2 * 4 * 4 * 8 * 4)
    shapes = [(2, 4, 4, 8), (2, 4, 4, 16)]
    cache = tmp_path / "autotune.json"
    got = L.autotune_transforms(shapes, "float32", cache=cache, iters=2, warmup=1)
    assert [len(c) for c in fake_gpu] == [6, 2, 2, 2]  # 2 shapes x 6 directions
    assert all(got[(tuple(s), a, b)] == (0.01, "measured") for s in shapes for a in LAYOUTS
               for b in LAYOUTS if a != b)
    assert got[((2, 4, 4, 8), "NHWC", "NHWC")] == (0.0, "model")
    L.autotune_transforms(shapes, "float32", cache=cache, iters=2, warmup=1)
    assert len(fake_gpu) == 4  # all from the cache
