"""scripts/bench_conv_sweep.py (issue 33) on the CPU: the random shape generator (deterministic per
seed, covering what the sweep must cover, within its work bounds), the float64 reference it
judges auto against, its tolerance, its goals and report, and (slow) a --quick run end to end."""

import dataclasses
import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import jax
import numpy as np
import pytest
from jax import lax

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))

pytest.importorskip("jaxcnn.tuning.conv_choice")  # the decision owner the sweep exercises

import bench_conv_sweep as sweep  # noqa: E402


@pytest.fixture(scope="module")
def cases():
    return sweep.random_cases()


def _padding_form(padding) -> str:
    if isinstance(padding, str):
        return padding
    if isinstance(padding, int):
        return "int"
    return "explicit" if isinstance(padding[0], tuple) else "pair"


def test_random_cases_are_the_same_for_a_seed_and_differ_between_seeds(cases):
    assert sweep.random_cases() == cases
    assert sweep.random_cases(sweep.DEFAULT_SEED + 1) != cases
    assert sweep.random_cases(sweep.DEFAULT_SEED, 8) == sweep.random_cases(sweep.DEFAULT_SEED, 8)


def test_random_cases_cover_the_sweep_issue_33_asks_for(cases):
    assert len(cases) >= 300 and len({c.name for c in cases}) == len(cases)
    assert {c.layout for c in cases} == {"NHWC", "NCHW", "CHWN"}
    assert set(Counter(c.kind for c in cases)) == {"bf16", "fp16", "fp32", "fp32_highest"}
    assert {c.precision for c in cases if c.kind == "fp32_highest"} == {"highest"}
    assert {c.dilation for c in cases} >= {(1, 1), (2, 2), (3, 3)}
    assert {c.stride for c in cases} >= {(1, 1), (2, 2)} and {(1, 2), (2, 1)} & {c.stride for c in cases}
    assert {_padding_form(c.padding) for c in cases} == {"SAME", "VALID", "int", "pair", "explicit"}
    assert any(c.padding[0][0] != c.padding[0][1] for c in cases if _padding_form(c.padding) == "explicit")
    depthwise = [c for c in cases if c.groups > 1 and c.groups == c.c]
    assert depthwise and {2, 4} <= {c.groups for c in cases}
    assert any(c.h % 2 for c in cases) and any(c.w % 2 for c in cases) and any(c.h != c.w for c in cases)
    assert any(c.c % 2 for c in cases) and any(c.k % 2 for c in cases)
    assert any(c.c % 64 == 0 for c in cases) and any(c.k % 32 == 0 and c.k % 64 for c in cases)
    assert {c.r for c in cases} == {1, 3, 5, 7} and any(c.r != c.s for c in cases)
    assert {c.n for c in cases} == {1, 2, 4, 8, 16, 32, 64}
    assert set(c.activation for c in cases) == set(sweep.ACTIVATIONS)
    assert any(c.residual for c in cases) and not all(c.residual for c in cases)


def test_random_cases_stay_within_their_work_bounds(cases):
    for c in cases:
        out = c.out_nhwc()  # the window fits the padded input
        assert min(out) >= 1 and 5 <= c.h <= 80 and 5 <= c.w <= 80
        assert c.c % c.groups == 0 and c.k % c.groups == 0
        assert c.flops() <= sweep.LIMITS.flops and c.reference_flops() <= sweep.LIMITS.reference_flops
        assert max(math.prod(c.x_nhwc), math.prod(out)) <= sweep.LIMITS.elements


def test_zoo_cases_take_every_distinct_conv_layer_in_each_kind():
    from jaxcnn.models import layer_table, list_models

    layers = sweep.zoo_layers(1)
    convs = [i for m in list_models() for i in layer_table(m, 1) if i.op == "conv2d"]
    assert len(layers) + sum(len(c.also) for c in layers) == len(convs)
    cases = sweep.zoo_cases([1], sweep.ZOO_KINDS)
    assert len(cases) == 3 * len(layers) and {c.kind for c in cases} == set(sweep.ZOO_KINDS)
    # fp32 at both precisions draws the same inputs (and shares the float64 reference)
    assert cases[1].input_key == cases[2].input_key != cases[0].input_key
    assert len(sweep.zoo_cases([1], sweep.ZOO_KINDS, quick=True)) == 3 * sweep.QUICK_ZOO_LAYERS


def test_the_float64_reference_matches_lax_on_every_geometry(cases):
    rng = np.random.default_rng(0)
    picked = [c for c in cases if c.groups > 1 and c.dilation != (1, 1)][:1] + [c for c in cases if c.groups == c.c][:1]
    picked += [c for c in cases if _padding_form(c.padding) == "explicit" and c.stride != (1, 1) and c.residual][:1]
    assert len(picked) == 3
    for c in picked:
        c = dataclasses.replace(c, n=1)
        x = rng.standard_normal(c.x_nhwc)
        w = rng.standard_normal(c.w_shape)
        b = rng.standard_normal(c.k)
        res = rng.standard_normal(c.out_nhwc()) if c.residual else None
        with jax.enable_x64(True):
            want = np.asarray(lax.conv_general_dilated(
                x, w, c.stride, sweep.explicit_padding(c), rhs_dilation=c.dilation,
                dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=c.groups))
        want = sweep.ACTIVATIONS_F64[c.activation](want + b + (0 if res is None else res))
        np.testing.assert_allclose(sweep.reference_f64(c, x, w, b, res), want, rtol=1e-12, atol=1e-12,
                                   err_msg=c.describe())


def test_tolerance_follows_the_dtype_precision_and_reduction_length(cases):
    c = next(c for c in cases if c.kind == "bf16")
    tol = {kind: sweep.tolerance(dataclasses.replace(c, kind=kind)) for kind in sweep.KINDS}
    assert tol["bf16"] > max(tol["fp16"], tol["fp32"]) and min(tol["fp16"], tol["fp32"]) > tol["fp32_highest"]
    assert tol["bf16"] <= 2e-2 and tol["fp16"] <= 2.5e-3 and tol["fp32"] <= 5e-3  # the test suites' bounds
    deeper = dataclasses.replace(c, kind="fp32_highest", c=c.c * 16, groups=1)
    assert sweep.tolerance(deeper) > sweep.tolerance(dataclasses.replace(c, kind="fp32_highest", groups=1))
    assert sweep.rel_error([1.0, np.nan], np.array([1.0, 1.0])) == math.inf


def _row(name, source, kind, ratio, c=128, choice="tensor_core", err=1e-6):
    return dict(name=name, source=source, kind=kind, ratio=ratio, c=c, n=64, device_time=True,
                description=name, decision=dict(choice=choice, source="measured", times_ms={"xla": 1.0, choice: 0.5}),
                timings={v: dict(median_ms=1.0, p10_ms=0.9, p90_ms=1.1) for v in ("auto", "xla")},
                correctness=dict(rel_err_auto=err, rel_err_xla=err, tolerance=1e-3, finite=True, ok=True))


def test_goals_judge_the_random_sweep_and_the_zoo_only_on_device_time():
    rows = [_row(f"r{i:03d}", "random", "bf16", 1.0 + i / 100) for i in range(20)]
    rows += [_row("zoo/a", "zoo", "fp32_highest", 3.0), _row("zoo/b", "zoo", "fp32_highest", 2.2),
             _row("zoo/c", "zoo", "bf16", 0.97, choice="xla"), _row("zoo/d", "zoo", "fp32_highest", 1.5, c=3)]
    got = {g["goal"]: g for g in sweep.goals(rows, dict(jaxcnn_cuda_available=True))}
    assert got["random sweep median >= 1.05x"]["met"] is True
    assert got["random sweep min >= 0.9x"]["value"] == 1.0
    assert got["every zoo layer >= 1.0x"]["met"] is False and "worst zoo/c" in got["every zoo layer >= 1.0x"]["detail"]
    geo = got["fp32 highest geomean >= 2.5x over zoo layers with C >= 64"]
    assert geo["value"] == pytest.approx(math.sqrt(3.0 * 2.2)) and geo["met"] is True  # zoo/d has C = 3
    cpu = sweep.goals(rows, dict(jaxcnn_cuda_available=False))
    assert all(g["met"] is None for g in cpu)


def test_markdown_names_the_goals_distributions_and_worst_cases():
    rows = [_row(f"r{i:03d}", "random", kind, 0.8 + i / 50) for i, kind in enumerate(list(sweep.KINDS) * 4)]
    rows[3]["correctness"].update(ok=False, rel_err_auto=1e-2)
    env = dict(jaxcnn_cuda_available=True, device_kind="NVIDIA H100", jax="x", jaxlib="x", date_utc="today")
    meta = dict(seed=1, random_cases=16, zoo_cases=0, planned=16, ran=16, zoo_batches=[], zoo_kinds=[], iters=20,
                cache_dir="c", budget_s=270, seconds=dict(decide=1, compile=2, time=3, time_and_reference=3, total=6))
    md = sweep.render_markdown(env, rows, meta)
    for section in ("## Setup", "## Goals (issue 33)", "## Ratio distribution", f"## The {sweep.WORST} worst cases",
                    "## Correctness failures", "## Decisions"):
        assert section in md
    assert "| r000 |" in md and "| random fp16 |" in md and "random, auto chose tensor_core" in md
    assert "- r003 " in md  # the correctness failure is named
    cpu_env = dict(env, jaxcnn_cuda_available=False, jaxcnn_cuda_unavailable_reason="cpu")
    cpu = sweep.render_markdown(cpu_env, rows, meta)
    assert "| r000 |" not in cpu and "not shown" in cpu and "WARNING" in cpu


@pytest.mark.slow
def test_quick_run_on_the_cpu_writes_its_report(tmp_path):
    subprocess.run([sys.executable, "scripts/bench_conv_sweep.py", "--quick", "--out", str(tmp_path)], cwd=REPO_ROOT,
                   check=True, timeout=1500, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    (report,) = tmp_path.glob("*-conv_sweep.json")
    md = report.with_suffix(".md").read_text()
    for section in ("## Setup", "## Goals (issue 33)", "## Ratio distribution", "## Correctness failures",
                    "## Decisions", "WARNING: jaxcnn's CUDA kernels are NOT available"):
        assert section in md
    data = json.loads(report.read_text())
    assert {"environment", "meta", "goals", "distributions", "rows"} <= set(data)
    rows = data["rows"]
    assert len(rows) == sweep.QUICK_CASES + 3 * len(sweep.ZOO_BATCHES) * sweep.QUICK_ZOO_LAYERS
    for row in rows:
        assert row["ok"] and "error" not in row, row.get("traceback")
        assert row["decision"]["source"] == "rule" and row["trace_decision"]["choice"] == row["decision"]["choice"]
        assert row["correctness"]["rel_err_auto"] <= row["correctness"]["tolerance"]
        assert row["timings"]["auto"]["median_ms"] > 0 and row["ratio"] > 0 and not row["device_time"]
    assert all(g["met"] is None for g in data["goals"])
