"""The decision owner (jaxcnn.tuning.decision): rule decisions off GPU, measured decisions that
keep XLA's own subgraph unless a candidate beats it, the on-disk cache and its keys."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxcnn
from jaxcnn.tuning import decision as D
from jaxcnn.tuning import measure


def site(name="a", rule=("xla", "rule says so")):
    fields = dict(kind="test", name=name)
    cands = [D.Candidate("xla", lambda x: x + 1), D.Candidate("jaxcnn:auto", lambda x: x + 1)]
    return D.Site(fields, cands, [jax.ShapeDtypeStruct((4,), jnp.float32)], lambda: rule)


@pytest.mark.parametrize("times, want", [
    ({"xla": 1.0, "jaxcnn:auto": 0.5}, "jaxcnn:auto"),
    ({"xla": 1.0, "jaxcnn:auto": 0.99}, "xla"),  # within MIN_GAIN: not worth a rewrite
    ({"xla": 1.0, "jaxcnn:auto": 2.0}, "xla"),
    ({"xla": 1.0, "jaxcnn:auto": None}, "xla"),  # a candidate that failed
    ({"xla": None, "jaxcnn:auto": 0.1}, "xla"),  # no baseline: keep as traced
])
def test_choose_keeps_the_baseline_unless_beaten(times, want):
    assert D.choose(times)[0] == want


def test_rule_decides_where_nothing_is_measured():
    (d,) = D.decide_all([site(rule=("jaxcnn:auto", "the rule"))], measure=False)
    assert (d.choice, d.source, d.reason) == ("jaxcnn:auto", "rule", "the rule")


def fake_measure(times_by_name, calls):
    def measure(pending):
        calls.append(sorted(pending))
        return {key: dict(op="site", times_ms=dict(times_by_name), errors={}) for key in pending}
    return measure


def test_measured_then_cached_per_device(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(D, "_measure_sites", fake_measure({"xla": 1.0, "jaxcnn:auto": 0.4}, calls))
    monkeypatch.setattr(D, "device_kind", lambda: "GPU-A")
    cache = tmp_path / "tune.json"
    (d,) = D.decide_all([site()], cache=cache, measure=True)
    assert (d.choice, d.source) == ("jaxcnn:auto", "measured") and d.times_ms["xla"] == 1.0
    (d,) = D.decide_all([site()], cache=cache, measure=True)
    assert d.source == "cached" and len(calls) == 1
    monkeypatch.setattr(D, "device_kind", lambda: "GPU-B")  # another GPU measures again
    D.decide_all([site()], cache=cache, measure=True)
    assert len(calls) == 2
    keys = json.loads(cache.read_text())["entries"]
    assert len(keys) == 2 and all('"device":"GPU-' in k for k in keys)


def test_sites_measured_together_and_deduplicated(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(D, "_measure_sites", fake_measure({"xla": 1.0, "jaxcnn:auto": 2.0}, calls))
    monkeypatch.setattr(D, "device_kind", lambda: "GPU-A")
    ds = D.decide_all([site("a"), site("b"), site("a")], cache=tmp_path / "c.json", measure=True)
    assert [d.choice for d in ds] == ["xla"] * 3
    assert len(calls) == 1 and len(calls[0]) == 2


def test_record_missing_a_candidate_is_measured_again(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(D, "_measure_sites", fake_measure({"xla": 1.0}, calls))  # lacks jaxcnn:auto
    monkeypatch.setattr(D, "device_kind", lambda: "GPU-A")
    cache = tmp_path / "c.json"
    D.decide_all([site()], cache=cache, measure=True)
    D.decide_all([site()], cache=cache, measure=True)
    assert len(calls) == 2


def test_corrupt_cache_is_ignored_and_rewritten(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(D, "_measure_sites", fake_measure({"xla": 1.0, "jaxcnn:auto": 0.4}, calls))
    monkeypatch.setattr(D, "device_kind", lambda: "GPU-A")
    cache = tmp_path / "c.json"
    cache.write_bytes(b"\xff\xfe not json")
    with pytest.warns(Warning):
        (d,) = D.decide_all([site()], cache=cache, measure=True)
    assert d.choice == "jaxcnn:auto"
    assert json.loads(cache.read_text())["entries"]


def test_optimize_reports_measured_decisions(tmp_path, monkeypatch):
    """optimize(policy="auto") sends each conv site (with its epilogue) to the decision owner."""
    from jaxcnn.optimize import rewrite

    seen = []

    def decide_all(sites, **kw):
        seen.extend(sites)
        return [D.Decision("xla_folded" if s.key_fields["folded"] else "xla", "measured", "fake") for s in sites]

    monkeypatch.setattr(rewrite, "decide_all", decide_all)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(1, 6, 6, 4)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(3, 3, 4, 4)), jnp.float32)
    s = jnp.asarray(rng.uniform(0.5, 1.5, 4), jnp.float32)

    def fn(x, w, s):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        z = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jax.nn.relu(y * s + 1.0), z

    opt = jaxcnn.optimize(fn)
    text = opt.explain(x, w, s)
    assert len(seen) == 2
    assert [c.name for c in seen[0].candidates][:2] == ["xla", "xla_folded"]
    assert "algorithm='xla'" in text and "kept as traced" in text
    got, want = jax.jit(opt)(x, w, s), fn(x, w, s)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("program_choice", ["xla", "jaxcnn"])
def test_whole_program_runs_rewritten_only_where_measured_faster(monkeypatch, program_choice):
    """Sites measured alone do not always add up: the rewritten program as a whole is measured
    against fn's own, and fn runs unchanged where it is not faster."""
    from jaxcnn.optimize import rewrite

    calls = []

    def decide_all(sites, **kw):
        out = []
        for s in sites:
            if s.key_fields["kind"] == "program":
                out.append(D.Decision(program_choice, "measured", "fake"))
            else:
                out.append(D.Decision("jaxcnn:auto", "measured", "fake"))
        return out

    monkeypatch.setattr(rewrite, "decide_all", decide_all)
    monkeypatch.setattr(rewrite, "can_measure", lambda: True)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(1, 6, 6, 4)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(3, 3, 4, 4)), jnp.float32)

    def fn(x, w):
        calls.append(1)
        return jax.nn.relu(lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))

    opt = jaxcnn.optimize(fn)
    got = opt(x, w)
    np.testing.assert_allclose(got, fn(x, w), rtol=1e-5, atol=1e-5)
    text = opt.explain(x, w)
    if program_choice == "xla":
        assert "fn runs unchanged" in text
        assert len(calls) == 3  # traced once, run unchanged once, called above once
    else:
        assert "the rewrites run" in text
        assert len(calls) == 2  # traced once, called above once


def test_measurement_costs_record_what_each_measurement_took(tmp_path, monkeypatch):
    """The real measurement (here on the CPU: host wall time) reports its sites, runs and the
    seconds spent compiling and timing them to every recorder open around it, and only to those."""
    monkeypatch.setattr(D, "device_kind", lambda: "GPU-A")
    with D.measurement_costs() as outer:
        with D.measurement_costs() as inner:
            D.decide_all([site("a"), site("b")], cache=tmp_path / "c.json", measure=True)
        D.decide_all([site("a"), site("b")], cache=tmp_path / "c.json", measure=True)  # cached: no cost
        D.decide_all([site("c")], cache=tmp_path / "c.json", measure=True)
    D.decide_all([site("d")], cache=tmp_path / "c.json", measure=True)
    assert [(c.sites, c.runs) for c in inner] == [(2, 4)]
    assert [(c.sites, c.runs) for c in outer] == [(2, 4), (1, 2)]
    assert all(c.compile_s > 0 and c.timing_s > 0 for c in outer)
    assert not D._COST_RECORDERS  # closed recorders are gone


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32, jnp.float64])
def test_random_inputs_are_varied_positive_and_shared_per_shape(dtype, monkeypatch):
    monkeypatch.setattr(measure, "RANDOM_BLOCK", 1000)  # an array larger than the block repeats it
    random_input = D.RandomInputs()
    aval = jax.ShapeDtypeStruct((64, 33), dtype)
    x = np.asarray(random_input(aval), np.float64)
    assert x.dtype == np.float64 and np.all((x >= 0.5) & (x < 1.0))
    assert len(np.unique(x)) > 64 and abs(x.mean() - 0.75) < 0.02  # uniform, not a constant
    np.testing.assert_array_equal(x.ravel()[1000:2000], x.ravel()[:1000])
    assert random_input(jax.ShapeDtypeStruct((64, 33), dtype)) is random_input(aval)
    assert random_input(jax.ShapeDtypeStruct((33, 64), dtype)).shape == (33, 64)
    ints = np.asarray(random_input(jax.ShapeDtypeStruct((3,), jnp.int32)))
    assert ints.dtype == np.int32 and not ints.any()


def test_candidates_prepared_alike_share_one_preparation_and_shared_work(monkeypatch):
    """Two candidates of a site with the same prepared_as: one prepare, one timing of the shared
    work and its floor, charged to both; a third prepared otherwise gets its own."""
    prepares, timed = [], []

    class T:
        def __init__(self, ms):
            self.median_ms, self.is_device_time, self.note = ms, True, ""

    def device_times(cases, **kw):
        timed.extend(key for key, _, _ in cases)
        return {key: T({"base": 1.0, "ours": 0.5, "alone": 0.3, "floor": 0.1}[f.__name__]) for key, f, _ in cases}

    def prepare(tag):
        def make(x):
            prepares.append(tag)
            return (x / 2,)
        return make

    def base(x):
        return x + 1

    def ours(x):
        return x * 2

    def alone(x):
        return x

    def floor(x):
        return x[:1]

    monkeypatch.setattr(D, "device_times", device_times)
    cands = [D.Candidate("xla", base)] + [
        D.Candidate(name, ours, prepare=prepare(spec), shared=alone, shared_floor=floor, prepared_as=spec)
        for name, spec in (("jaxcnn:auto", "HWIO"), ("jaxcnn:stem", "HWIO"), ("xla_folded", "OHWI"))]
    sites = {"a": D.Site(dict(kind="test"), cands, [jax.ShapeDtypeStruct((4,), jnp.float32)], lambda: ("xla", "r"))}
    records = D._measure_sites(sites)
    assert sorted(prepares) == ["HWIO", "OHWI"]
    shared = sorted(k[1:] for k in timed if k[-1] in ("shared", "floor"))
    assert shared == [(("prepared as", "HWIO"), "floor"), (("prepared as", "HWIO"), "shared"),
                      (("prepared as", "OHWI"), "floor"), (("prepared as", "OHWI"), "shared")]
    assert records["a"]["times_ms"] == {"xla": 1.0, "jaxcnn:auto": pytest.approx(0.7),
                                       "jaxcnn:stem": pytest.approx(0.7), "xla_folded": pytest.approx(0.7)}


def test_compile_threads_come_from_the_environment(monkeypatch):
    monkeypatch.delenv(D.COMPILE_THREADS_ENV, raising=False)
    assert D.compile_threads() == D.COMPILE_THREADS
    monkeypatch.setenv(D.COMPILE_THREADS_ENV, " 2 ")
    assert D.compile_threads() == 2
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv(D.COMPILE_THREADS_ENV, bad)
        with pytest.raises(ValueError, match="JAXCNN_COMPILE_THREADS must be a positive integer"):
            D.compile_threads()


def test_programs_xla_autotunes_compile_one_at_a_time(monkeypatch):
    """Convolutions and GEMMs make XLA autotune: their compiles hold AUTOTUNE_LOCK, so two never
    overlap; elementwise programs (and jaxcnn's custom calls) compile without it."""
    x = jnp.ones((1, 8, 8, 4), jnp.float32)
    w = jnp.ones((3, 3, 4, 4), jnp.float32)

    def conv(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    assert measure.autotunes(conv, (x, w))
    assert measure.autotunes(lambda a, b: a.reshape(64, 4) @ b.reshape(36, 4).T, (x, w))
    assert not measure.autotunes(lambda a: jnp.maximum(a * 2.0, 0.0), (x,))

    held = []

    class Lock:
        def __enter__(self):
            held.append(True)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(measure, "AUTOTUNE_LOCK", Lock())
    assert measure.try_run(conv, (x, w)) == ""
    assert held == [True]
    assert measure.try_run(lambda a: a + 1.0, (x,)) == ""
    assert held == [True]
    assert measure.try_run(lambda a: a.reshape(3, 5), (x,)).startswith("TypeError")
