"""jaxcnn.dashboard.data: which store is shown, and the frames read from it."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import dashboard_stores as stores
from jaxcnn.dashboard import data
from jaxcnn.memory import Buffer, live_bytes_lower_bound
from jaxcnn.store import SCHEMA_VERSION, Store, StoreError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("dashboard_cache")


@pytest.fixture(scope="module")
def shipped(cache):
    return Store(data.shipped_store(cache=cache))


def _shipped_runs() -> list[dict]:
    """The exported runs in the order the shipped store imports them (oldest export first)."""
    runs = []
    for file in sorted(data.shipped_files(), key=lambda f: min(r["created_at"] for r in json.loads(f.read_text())["runs"])):
        runs += json.loads(file.read_text())["runs"]
    return runs


def _run_id(model: str, batch: int, kind: str = "profile") -> int:
    """The shipped store's id of the first run of `kind` of `model` at `batch` (ids follow
    _shipped_runs' order)."""
    return next(i for i, r in enumerate(_shipped_runs(), 1) if (r["kind"], r["model"], r.get("batch")) == (kind, model, batch))


@pytest.fixture(scope="module")
def profiles_only(tmp_path_factory):
    """A store holding only the shipped zoo profiles: no plans, no donation or max-batch runs."""
    root = tmp_path_factory.mktemp("profiles_only")
    (root / "shipped").mkdir()
    export = next(f for f in data.shipped_files() if f.name.endswith("-zoo.json"))
    (root / "shipped" / export.name).write_bytes(export.read_bytes())
    return Store(data.shipped_store(root / "shipped", root / "cache"))


# -- which store --------------------------------------------------------------------------------


def test_shipped_store_is_built_once_and_named_by_content(cache):
    first = data.shipped_store(cache=cache)
    mtime = first.stat().st_mtime_ns
    assert data.shipped_store(cache=cache) == first and first.stat().st_mtime_ns == mtime
    assert first.name.startswith("shipped-") and not list(cache.glob("*.tmp"))
    with Store(first) as store:
        assert len(store.runs()) == len(_shipped_runs())


def test_shipped_store_changes_with_the_exports(tmp_path):
    exports = tmp_path / "shipped"
    exports.mkdir()
    runs = _shipped_runs()
    (exports / "a.json").write_text(json.dumps({"format": "jaxcnn-profile-store", "format_version": 1,
                                                "runs": runs[:1]}))
    one = data.shipped_store(exports, tmp_path / "cache")
    (exports / "b.json").write_text(json.dumps({"format": "jaxcnn-profile-store", "format_version": 1,
                                                "runs": runs[1:3]}))
    three = data.shipped_store(exports, tmp_path / "cache")
    assert one != three
    with Store(three) as store:
        assert len(store.runs()) == 3


def test_no_shipped_exports_is_a_clear_error(tmp_path):
    with pytest.raises(data.NoData, match="no shipped data"):
        data.shipped_store(tmp_path, tmp_path / "cache")


def test_choose_source(tmp_path, cache):
    missing = data.choose_source(tmp_path / "none.sqlite", cache=cache)
    assert missing.shipped and "no store at" in missing.note and not (tmp_path / "none.sqlite").exists()
    (tmp_path / "zero.sqlite").write_bytes(b"")
    assert data.choose_source(tmp_path / "zero.sqlite", cache=cache).shipped
    empty = data.choose_source(stores.empty_store(tmp_path / "empty.sqlite"), cache=cache)
    assert empty.shipped and "holds no runs yet" in empty.note
    with Store(tmp_path / "local.sqlite") as store:
        store.add_run("profile", model="lenet5")
    local = data.choose_source(tmp_path / "local.sqlite", cache=cache)
    assert not local.shipped and local.path == tmp_path / "local.sqlite"
    assert data.choose_source(tmp_path / "local.sqlite", use_shipped=True, cache=cache).shipped
    with pytest.raises(StoreError, match="not a SQLite database"):
        data.choose_source(stores.corrupt_file(tmp_path / "bad.sqlite"), cache=cache)
    with pytest.raises(StoreError, match="not a jaxcnn profile store"):
        data.choose_source(stores.foreign_sqlite(tmp_path / "foreign.sqlite"), cache=cache)
    with pytest.raises(StoreError, match="is a directory"):
        data.choose_source(tmp_path, cache=cache)


def test_shipped_data_is_at_the_store_schema_version():
    """Fails when a store migration lands without the shipped data regenerated: the dashboard
    would otherwise show data whose tables no longer match what the code records."""
    provenance = data.shipped_provenance()
    assert len(provenance) == len(data.shipped_files()) > 0
    behind = provenance[provenance["schema_version"] != SCHEMA_VERSION]
    assert behind.empty, (f"dashboard/shipped/ exports at schema version(s) {sorted(set(behind['schema_version']))}, "
                          f"the store is at {SCHEMA_VERSION}: regenerate them ({', '.join(behind['file'])})")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def test_shipped_profiles_are_of_todays_kernels():
    """Fails when cuda_ops/ changed after the commit the shipped profiles were made from: the
    dashboard would show kernels that no longer run (regenerate: scripts/make_shipped.py)."""
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("no git checkout to compare commits in")
    kernels = _git("log", "-1", "--format=%H", "--", "cuda_ops").stdout.strip()
    commits = {r["git_commit"] for r in _shipped_runs() if r["kind"] == "profile"}
    assert commits and all(commits), "every shipped profile records its commit"
    for commit in commits:
        if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            pytest.skip(f"commit {commit[:7]} is not in this clone (shallow?)")
        behind = _git("merge-base", "--is-ancestor", kernels, commit).returncode != 0
        assert not behind, (f"shipped profiles made from {commit[:7]}, before the kernels' last change "
                            f"{kernels[:7]}: regenerate dashboard/shipped/ (scripts/make_shipped.py)")


def test_shipped_provenance_says_what_the_data_was_made_from(tmp_path):
    provenance = data.shipped_provenance().set_index("file")
    profiles = provenance.loc["h200-2026-11-29-zoo.json"]
    assert (profiles["runs"], profiles["kinds"], profiles["gpu"]) == (18, "profile", "NVIDIA H200")
    # Made on the GPU machine from a copy of the tree whose git metadata says uncommitted: said so.
    assert (profiles["made"], profiles["commits"], profiles["schema_version"]) == ("2026-11-29", "cc1624b-dirty", 1)
    assert provenance.loc["h200-2026-11-21-memory.json", "commits"] == "37d5348-dirty"
    plans = provenance.loc["h200-2026-11-29-plans.json"]
    assert (plans["runs"], plans["no_commit"], plans["gpu"]) == (36, 0, "NVIDIA H200")
    assert data.shipped_summary(provenance.reset_index()) == (
        "NVIDIA H200, made 2026-11-21 to 2026-11-29, commits 1041c42, 37d5348-dirty, cc1624b-dirty")
    unrecorded = provenance.reset_index().assign(no_commit=[0, 36, 0, 0])
    assert data.shipped_summary(unrecorded).endswith("(36 of 82 runs record no commit)")
    # A store exported here records the schema version and the commit of each run.
    with Store(tmp_path / "s.sqlite") as store:
        store.add_run("profile", model="m", device="gpu", git_commit="0123456789abcdef",
                      environment={"gpu_name": "NVIDIA H100 80GB HBM3", "extra": {"git": {"dirty": False}}},
                      created_at="2026-12-01T10:00:00+00:00")
        (tmp_path / "shipped").mkdir()
        store.export_json(tmp_path / "shipped" / "new.json")
    mine = data.shipped_provenance(tmp_path / "shipped")
    assert mine.loc[0, "schema_version"] == SCHEMA_VERSION
    assert data.shipped_summary(mine) == "NVIDIA H100 80GB HBM3, made 2026-12-01, commit 0123456"
    assert data.shipped_summary(data.shipped_provenance(tmp_path / "none")) == "no shipped exports"


def test_every_quantity_column_has_a_source():
    frame = pd.DataFrame(dict(idx=[0], layer=["conv1"], time_ms=[1.0], p10_ms=[0.9], gflop=[2.0], mib=[3.0],
                              pred_floor_ms=[0.5], pred_model_ms=[0.8], error_pct=[-20.0], pct_of_floor=[50.0],
                              arena_mib=[4.0], input_zero_pct=[10.0], n=[10], faster=[True]))
    assert data.column_sources(frame, data.SHIPPED) == {
        data.SHIPPED: ["time_ms", "p10_ms", "input_zero_pct"],
        data.COMPUTED: ["gflop", "mib", "arena_mib"],
        data.MODEL: ["pred_floor_ms", "pred_model_ms", "error_pct", "pct_of_floor"]}
    caption = data.sources_caption(frame)
    assert caption.startswith("Sources: **measured** (timed, or read from XLA's compiled program")
    assert "**model** (predicted by jaxcnn.costmodel" in caption and caption.endswith("Units are in the column names.")
    assert data.sources_caption(frame[["idx", "layer", "n"]]) == ""


def test_default_db_path_follows_the_cli(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXCNN_DB", str(tmp_path / "x.sqlite"))
    assert data.default_db_path() == tmp_path / "x.sqlite"
    monkeypatch.delenv("JAXCNN_DB")
    monkeypatch.chdir(tmp_path)
    assert data.default_db_path() == tmp_path / "jaxcnn_profiles.sqlite"


# -- runs and speed -----------------------------------------------------------------------------


def test_runs_table_counts_what_each_run_holds(shipped):
    runs = data.runs_table(shipped)
    exported = _shipped_runs()
    assert runs["layers"].tolist() == [len(r["layers"]) for r in exported]
    assert runs["measurements"].tolist() == [len(r["measurements"]) for r in exported]
    assert runs["sparsity"].tolist() == [len(r["sparsity"]) for r in exported]
    assert runs["plans"].tolist() == [len(r["plans"]) for r in exported]
    # Imported oldest export first, so a new export's runs come after every older one: the
    # memory planning (2026-11-21) keeps ids 1-21, then the zoo profiles, the buffer plans and
    # the third-party models' profiles.
    recorded = pd.to_datetime(runs["created_at"])
    blocks = [recorded.iloc[:21], recorded.iloc[21:39], recorded.iloc[39:75], recorded.iloc[75:]]
    assert all(older.max() < newer.min() for older, newer in zip(blocks, blocks[1:]))
    profiles = [*range(21, 39), *range(75, 82)]
    assert (runs["kind"].iloc[profiles] == "profile").all() and (runs["kind"].drop(profiles) == "plan").all()
    assert set(runs["model"].iloc[75:]) == {"linen_resnet50", "nnx_resnet18", "equinox_resnet18", "keras_resnet50",
                                            "keras_vgg16", "keras_mobilenetv2", "keras_inceptionv3"}
    assert runs.loc[21, "label"] == "#22 lenet5 b1 bfloat16 · NVIDIA H200 · profile"
    # 36 plan runs (each zoo model, inference and training, buffers from the jaxpr and from XLA's
    # HLO; 5 plans each: naive, 3 peers/ours, XLA) and 21 donation/max-batch/remat runs.
    assert (runs["plans"] == 5).sum() == 36 and set(runs.loc[runs["plans"] == 0, "kind"]) == {"profile", "plan"}
    trained = runs[(runs["model"] == "resnet50") & (runs["note"] == "plans training hlo")].iloc[0]
    assert trained["label"] == f"#{trained['id']} resnet50 b64 float32 · NVIDIA H200 · plan (plans training hlo)"


def test_pages_start_from_the_latest_profile_of_the_biggest_model(shipped):
    runs = data.runs_table(shipped)
    start = runs[runs["id"] == data.default_run_id(runs)].iloc[0]
    # mobilenetv2 has the most layers (99); its batch-64 run is the later one. Not a plan run
    # (the latest runs are), which has no layers to show.
    assert (start["kind"], start["model"], start["batch"], start["layers"]) == ("profile", "mobilenetv2", 64, 99)
    planned = runs[runs["plans"] > 0]
    plans = data.plan_runs(shipped)
    assert plans["ours_vs_xla"].all() and len(plans) == 36
    # XLA places the buffers of its own HLO (its buffer assignment), not those of the jaxpr.
    notes = runs.set_index("id").loc[plans["run_id"], "note"]
    assert (plans["xla_placed"].to_numpy() == notes.str.endswith(" hlo").to_numpy()).all()
    # Where XLA's buffers are placed, the plan with the most buffers: googlenet training (756).
    biggest = runs[runs["id"] == data.default_plan_run_id(planned, plans)].iloc[0]
    assert (biggest["model"], biggest["note"]) == ("googlenet", "plans training hlo")
    same = runs[runs["id"] == data.default_plan_run_id(planned, plans, "resnet50")].iloc[0]
    assert (same["model"], same["note"]) == ("resnet50", "plans training hlo")
    unplaced = runs[runs["id"] == data.default_plan_run_id(planned, plans.assign(xla_placed=False))].iloc[0]
    assert (unplaced["model"], unplaced["note"]) == ("mobilenetv2", "plans training jaxpr")  # 1163 buffers
    assert data.default_plan_run_id(planned, plans, "no_such_model") == biggest["id"]
    assert data.default_run_id(runs.iloc[0:0]) is None


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["profile", "plan"]), st.integers(0, 5)), min_size=1, max_size=12))
def test_default_run_is_the_latest_profile_with_the_most_layers(kinds_layers):
    runs = pd.DataFrame({"id": range(1, len(kinds_layers) + 1), "kind": [k for k, _ in kinds_layers],
                         "layers": [n for _, n in kinds_layers]})
    chosen = data.default_run_id(runs)
    profiles = runs[runs["kind"] == "profile"]
    if profiles.empty:
        assert chosen == len(runs)
    else:
        row = runs[runs["id"] == chosen].iloc[0]
        assert row["kind"] == "profile" and row["layers"] == profiles["layers"].max()
        assert not ((profiles["layers"] == row["layers"]) & (profiles["id"] > chosen)).any()


def test_layer_times_and_speedup_match_the_export(shipped):
    run_id = _run_id("squeezenet1_1", 1)
    run = _shipped_runs()[run_id - 1]
    long, metric = data.layer_times(shipped, run_id)
    assert metric == "device_time_ms"
    expected = {(m["layer"], m["backend"]): m["median"] for m in run["measurements"]
                if m.get("layer") and m["metric"] == "device_time_ms"}
    got = {(r.layer, r.backend): r.time_ms for r in long.itertuples()}
    assert got == pytest.approx(expected)
    assert long.loc[long["layer"] == "conv1", "input_shapes"].iloc[0] == "1×224×224×3"
    wide = data.speedup_table(long)
    conv1 = wide[wide["layer"] == "conv1"].iloc[0]
    assert conv1["speedup"] == pytest.approx(expected[("conv1", "xla")] / expected[("conv1", "jaxcnn")])
    assert conv1["jaxcnn_variant"] == "conv_pool_stem_kernel"  # the stem conv, its pool fused
    assert wide["idx"].is_monotonic_increasing and len(wide) == len(run["layers"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-4, 10), st.floats(1e-4, 10)), min_size=1, max_size=12))
def test_speedup_is_baseline_over_candidate(times):
    long = pd.DataFrame([
        dict(idx=i, layer=f"l{i}", op="conv2d", input_shapes="", weight_shape="", output_shape="", gflop=1.0,
             mib=1.0, backend=backend, time_ms=t, variant=f"{backend}_kernel")
        for i, pair in enumerate(times) for backend, t in zip(("xla", "jaxcnn"), pair)])
    wide = data.speedup_table(long)
    assert wide["speedup"].to_numpy() == pytest.approx([x / j for x, j in times])
    assert wide["xla_variant"].eq("xla_kernel").all()


def test_short_kernel_names():
    assert data.short_kernel_name("void jaxcnn::conv2d_direct::conv2d_direct_kernel<__nv_bfloat16>(int)") == \
        "conv2d_direct_kernel"
    assert data.short_kernel_name("nvjet_sm90_tst_64x8_64x16_1x4_h_bz_relubias_TNT") == \
        "nvjet_sm90_tst_64x8_64x16_1x4_h_bz_relubias_TNT"


def test_runs_summary_fits_the_page(shipped):
    runs = data.runs_table(shipped)
    summary = data.runs_summary(runs)
    assert list(summary.columns) == list(data.RUN_SUMMARY_COLUMNS) and len(summary) == len(runs)
    first = summary.iloc[0]
    assert (first["recorded"], first["where"], first["commit"]) == ("2026-11-21 11:14", "NVIDIA H200", "37d5348-dirty")
    profile = summary[runs["kind"] == "profile"].iloc[0]
    assert (profile["recorded"], profile["commit"]) == ("2026-11-29 04:45", "cc1624b-dirty")
    assert set(summary["dtype"]) == {"bf16", "fp32"}  # short, as the reports write them
    # The memory-planning runs were made from a tree with uncommitted changes.
    assert set(summary.loc[runs["note"] == "donation", "commit"]) == {"37d5348-dirty"}
    # Narrow enough for one page: no cell is long (the environment is in each run's panel).
    assert max(len(str(cell)) for cell in summary.to_numpy().ravel()) <= data.SUMMARY_CELL_CHARS
    long = runs.head(1).assign(note="no GPU device time: CPU reference path, host wall time")
    assert data.runs_summary(long).loc[0, "note"] == "no GPU device time: CPU ref…"


@pytest.mark.slow
def test_cpu_runs_are_reference_path_runs_and_never_compared(shipped, tmp_path):
    path = stores.cpu_profile(tmp_path / "cpu.sqlite")
    with Store(path) as cpu_store:
        cpu = data.runs_table(cpu_store).iloc[0].to_dict()
        _, metric = data.layer_times(cpu_store, cpu["id"])
    assert data.reference_path_run(cpu) and metric == "wall_time_ms"
    runs = data.runs_table(shipped)
    gpu = runs[runs["id"] == _run_id("squeezenet1_1", 1)].iloc[0].to_dict()
    assert not data.reference_path_run(gpu)
    assert data.compare_refusal(gpu, dict(gpu, id=99)) is None
    assert "were both timed on a CPU" in data.compare_refusal(cpu, dict(cpu, id=2))
    mixed = data.compare_refusal(gpu, cpu)
    assert mixed == data.compare_refusal(cpu, gpu)
    assert f"run #{cpu['id']} was timed on a CPU" in mixed and "on NVIDIA H200 (device time)" in mixed
    runs = pd.DataFrame([gpu, dict(gpu, id=2), cpu | {"id": 3}])
    assert data.compare_candidates(runs, gpu)["id"].tolist() == [2]
    assert data.compare_candidates(runs, cpu | {"id": 3}).empty
    # A store holding both: compare_runs refuses, naming why.
    with Store(tmp_path / "both.sqlite") as both:
        both.import_json(next(f for f in data.shipped_files() if f.name.endswith("-zoo.json")))
    stores.cpu_profile(tmp_path / "both.sqlite")
    with Store(tmp_path / "both.sqlite") as both:
        with pytest.raises(ValueError, match="was timed on a CPU .* not comparable"):
            data.compare_runs(both, 18, 19)  # the last shipped profile vs the CPU one


def test_default_compare_prefers_the_same_setup_at_another_commit(shipped):
    runs = data.runs_table(shipped)
    b64, b1 = _run_id("mobilenetv2", 64), _run_id("mobilenetv2", 1)
    run = runs[runs["id"] == b64].iloc[0].to_dict()
    candidates = data.compare_candidates(runs, run)
    assert data.default_compare_id(candidates, run) == b1  # the same model (b1): no other commit exists
    later = candidates[candidates["id"] == b1].assign(id=999, batch=64, commit="abcdef0")
    assert data.default_compare_id(pd.concat([candidates, later]), run) == 999
    assert data.default_compare_id(candidates[candidates["model"] != "mobilenetv2"], run) is None
    header = data.compare_header(run, later.iloc[0].to_dict())
    assert header.to_dict("list") == {"run": ["A", "B"], "label": [run["label"], run["label"].replace(f"#{b64}", f"#{b1}")
                                                                    .replace("b64", "b1")],
                                      "commit": ["cc1624b-dirty", "abcdef0"], "where": ["NVIDIA H200"] * 2,
                                      "recorded": [str(run["created_at"])[:16], str(later["created_at"].iloc[0])[:16]]}


def test_end_to_end_and_compare(shipped):
    b1, b64, vgg19 = _run_id("squeezenet1_1", 1), _run_id("squeezenet1_1", 64), _run_id("vgg19", 1)
    e2e = data.end_to_end(shipped, b1)
    assert set(zip(e2e["backend"], e2e["what"])) == {(b, w) for b in ("xla", "jaxcnn")
                                                     for w in ("device time", "host latency")}
    assert (e2e["p10_ms"] <= e2e["time_ms"]).all() and (e2e["time_ms"] <= e2e["p90_ms"]).all()
    table, metric = data.compare_runs(shipped, b1, b64)
    assert metric == "device_time_ms"
    assert (table["b_over_a"] == table["b_ms"] / table["a_ms"]).all()
    with pytest.raises(data.NoData, match="share no layer"):
        data.compare_runs(shipped, b1, vgg19)  # no common layer names


# -- roofline -----------------------------------------------------------------------------------


def test_roofline_points_and_ceilings(shipped):
    runs = data.runs_table(shipped)
    run = runs[runs["id"] == _run_id("squeezenet1_1", 1)].iloc[0].to_dict()
    ceilings = data.run_ceilings(run)
    assert (ceilings.gpu, ceilings.precision) == ("H200", "bf16")
    assert ceilings.memory_source == ceilings.compute_source == "measured"
    points = data.roofline_points(shipped, run["id"])
    squeeze = points[(points["layer"] == "fire2/squeeze1x1") & (points["backend"] == "xla")].iloc[0]
    assert squeeze["flop_per_byte"] == pytest.approx(squeeze["flops"] / squeeze["bytes"])
    assert squeeze["tflops"] == pytest.approx(squeeze["flops"] / (squeeze["time_ms"] / 1e3) / 1e12)
    assert (squeeze["model_family"], squeeze["prediction"]) == ("xla", "traffic model")  # a cuBLAS GEMM
    assert squeeze["error_pct"] == pytest.approx(100 * (squeeze["pred_model_ms"] / squeeze["time_ms"] - 1))
    # A prediction is the family's of the kernel that ran: jaxcnn's layers that ran XLA's kernels
    # get XLA's prediction; the stem kernel (conv + pool) and cuDNN's direct engine have no model.
    convs = points[points["op"] == "conv2d"].set_index(["layer", "backend"])
    ran_xla = convs.xs("jaxcnn", level="backend")
    ran_xla = ran_xla[ran_xla["model_family"] == "xla"]
    assert len(ran_xla) > 20 and (ran_xla["pred_model_ms"] == convs.xs("xla", level="backend").loc[
        ran_xla.index, "pred_model_ms"]).all()
    assert convs.loc[("conv1", "jaxcnn"), "variant"] == "conv_pool_stem_kernel"
    for backend in ("jaxcnn", "xla"):
        stem = convs.loc[("conv1", backend)]
        assert (stem["model_family"], stem["prediction"]) == ("", "roofline floor") and pd.isna(stem["pred_model_ms"])
    roof = data.ceiling_lines(ceilings, 0.1, 1e4)
    ridge = roof[np.isclose(roof["flop_per_byte"], ceilings.ridge_flop_per_byte)]
    assert len(ridge) == 1 and ridge["tflops"].iloc[0] == pytest.approx(708.0)
    assert roof["tflops"].is_monotonic_increasing and roof["tflops"].max() == pytest.approx(708.0)


def test_no_roofline_for_cpu_or_unknown_gpus():
    assert data.run_ceilings({"gpu_name": None, "device": "cpu", "dtype": "float32"}) is None
    assert data.run_ceilings({"gpu_name": "Tesla K80", "device": "gpu", "dtype": "float32"}) is None
    fp32 = data.run_ceilings({"gpu_name": "NVIDIA H100 80GB HBM3", "device": "gpu", "dtype": "float32"})
    assert fp32.precision == "tf32"  # XLA's default precision for float32 convolutions


def test_cpu_run_has_no_roofline(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        run = store.add_run("profile", model="m", device="cpu")
        layer, = store.add_layers(run, [dict(idx=0, name="c", op="conv2d", flops=10, bytes=10)])
        store.add_measurements(run, [dict(layer_id=layer, backend="xla", metric="wall_time_ms", median=1.0)])
        with pytest.raises(data.NoData, match="wall time, no GPU"):
            data.roofline_points(store, run)


# -- memory -------------------------------------------------------------------------------------


buffer_lists = st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 30), st.integers(0, 10)),
                        min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(buffer_lists)
def test_live_bytes_curve_peaks_at_the_planner_lower_bound(specs):
    buffers = [Buffer(f"b{i}", size, start, start + length) for i, (size, start, length) in enumerate(specs)]
    frame = pd.DataFrame({"start_step": [b.start for b in buffers], "end_step": [b.end for b in buffers],
                          "size_bytes": [b.size_bytes for b in buffers]})
    curve = data.live_bytes_curve(frame)
    assert curve["live_mib"].max() * data.MIB == pytest.approx(live_bytes_lower_bound(buffers))
    step = int(curve["step"].iloc[len(curve) // 2])
    alive = sum(b.size_bytes for b in buffers if b.start <= step <= b.end)
    assert curve.loc[curve["step"] == step, "live_mib"].iloc[0] * data.MIB == pytest.approx(alive)
    assert curve["live_mib"].iloc[-1] > 0 or all(b.end < len(curve) - 1 for b in buffers)


def test_plans_and_batch_curve_from_real_compiles(tmp_path):
    with Store(tmp_path / "p.sqlite") as store:
        plan_run = stores.add_packing_plans(store, "lenet5")
        stores.add_batch_curve(store)
        summary = data.plan_summary(store, plan_run)
        buffers = data.plan_buffers(store, plan_run)
        rows = data.plan_measurements(store)
    roles = dict(zip(summary["algorithm"], summary["role"]))
    assert roles == {"naive": "naive", "greedy_by_size": "peer", "best_fit_decreasing": "peer",
                     "pack_2d": "ours", "xla": "XLA"}
    pack = summary.set_index("algorithm")
    assert pack.loc["pack_2d", "arena_mib"] <= pack.loc["greedy_by_size", "arena_mib"]
    assert pack.loc["pack_2d", "arena_mib"] >= pack.loc["pack_2d", "lower_bound_mib"]
    assert pack.loc["naive", "saved_vs_naive_pct"] == 0
    curve = data.live_bytes_curve(buffers[buffers["algorithm"] == "naive"])
    assert curve["live_mib"].max() == pytest.approx(pack.loc["naive", "lower_bound_mib"])
    assert buffers.loc[buffers["algorithm"] == "xla", "offset_mib"].isna().all()
    batch_curve = data.max_batch_curve(rows)
    assert batch_curve["batch"].tolist() == list(stores.CURVE_BATCHES)
    assert batch_curve["peak_mib"].is_monotonic_increasing  # bigger batches never need less
    alias = rows[rows["metric"] == "alias_bytes"]["median"]
    assert len(alias) == 1 and alias.iloc[0] > 0  # the donated params are aliased to the outputs


def test_memory_readers_say_what_to_run(shipped, profiles_only):
    with pytest.raises(data.NoData, match="jaxcnn plan MODEL --db"):
        data.plan_summary(shipped, _run_id("squeezenet1_1", 1))  # a profile run
    with pytest.raises(data.NoData, match="jaxcnn maxbatch"):
        data.max_batch_curve(data.plan_measurements(profiles_only))
    with pytest.raises(data.NoData, match="no donation results yet"):
        data.donation_savings(data.plan_measurements(profiles_only))
    assert data.plan_runs(profiles_only).empty
    stats = data.memory_stats(shipped, _run_id("squeezenet1_1", 1))
    assert set(stats["backend"]) == {"xla", "jaxcnn"}
    exported = _shipped_runs()[_run_id("squeezenet1_1", 1) - 1]["measurements"]
    argument = next(m["median"] for m in exported if m["metric"] == "argument_bytes" and m["backend"] == "xla")
    assert stats.set_index("backend").loc["xla", "argument_mib"] == pytest.approx(argument / data.MIB)


@pytest.mark.parametrize("stats, formula", [
    # H200 compile of mobilenetv2 b64 (shipped): XLA's peak is the whole footprint.
    (dict(argument_mib=25.0, output_mib=0.1, alias_mib=0.0, temp_mib=294.0, peak_memory_mib=319.1),
     "argument + output - alias + temp"),
    # CPU compile of squeezenet1_1 b8: the peak leaves the temp allocation out, so it is below temp.
    (dict(argument_mib=9.31, output_mib=0.03, alias_mib=0.0, temp_mib=29.97, peak_memory_mib=9.34),
     "argument + output - alias (temp not counted)"),
    (dict(argument_mib=10.0, output_mib=1.0, alias_mib=0.0, temp_mib=20.0, peak_memory_mib=25.0),
     "below argument + output - alias + temp: XLA's schedule never holds all of it live at once"),
    (dict(argument_mib=1.0, temp_mib=1.0), "no peak recorded"),
])
def test_peak_formula_says_what_xla_peak_counts(stats, formula):
    assert data.peak_formula(stats) == formula


def test_memory_stats_explain_peak_and_footprint(shipped, tmp_path):
    stats = data.memory_stats(shipped, _run_id("mobilenetv2", 64)).set_index("backend")
    assert stats.loc["xla", "footprint_mib"] == pytest.approx(
        stats.loc["xla", ["argument_mib", "output_mib", "temp_mib"]].sum() - stats.loc["xla", "alias_mib"])
    assert set(stats["peak_is"]) == {"argument + output - alias + temp"}
    cpu = stores.cpu_profile(tmp_path / "cpu.sqlite")
    with Store(cpu) as store:
        assert set(data.memory_stats(store, 1)["peak_is"]) == {"argument + output - alias (temp not counted)"}
    assert set(data.MEMORY_QUANTITIES) >= {c for c in stats.columns if c.endswith("_mib")}


def test_shipped_h200_plans_match_the_export(shipped):
    runs = data.runs_table(shipped)
    exported = _shipped_runs()
    for run_id in runs.loc[runs["plans"] > 0, "id"]:
        plans = {p["algorithm"]: p for p in exported[run_id - 1]["plans"]}
        summary = data.plan_summary(shipped, run_id).set_index("algorithm")
        assert summary["arena_mib"].to_dict() == pytest.approx(
            {a: p["arena_bytes"] / data.MIB for a, p in plans.items()})
        bound = summary.loc["pack_2d", "lower_bound_mib"]
        assert bound <= summary.loc["pack_2d", "arena_mib"] <= summary.loc["naive", "arena_mib"]
        # Our packing never needs more than the peers it is compared with on these programs.
        assert summary.loc["pack_2d", "arena_mib"] <= summary.loc[["greedy_by_size", "best_fit_decreasing"],
                                                                  "arena_mib"].min()
    resnet = runs[(runs["model"] == "resnet50") & (runs["note"] == "plans training hlo")]["id"].iloc[0]
    buffers = data.plan_buffers(shipped, resnet)
    assert buffers.groupby("algorithm").size().eq(634).all() and buffers["offset_mib"].notna().all()
    curve = data.live_bytes_curve(buffers[buffers["algorithm"] == "pack_2d"])
    assert curve["live_mib"].max() == pytest.approx(data.plan_summary(shipped, resnet)["lower_bound_mib"].max())


def test_shipped_donation_savings_and_max_batch_curves(shipped):
    rows = data.plan_measurements(shipped)
    savings = data.donation_savings(rows)
    exported = {(r["model"], r["batch"]): {(m["metric"], m["variant"]): m["median"] for m in r["measurements"]}
                for r in _shipped_runs() if r.get("note") == "donation"}
    assert len(savings) == len(exported) == 12
    for row in savings.itertuples():
        measured = exported[(row.model, row.batch)]
        assert row.saved_mib * data.MIB == pytest.approx(measured[("saved_bytes", "donated")])
        assert row.saved_mib == pytest.approx(row.undonated_peak_mib - row.donated_peak_mib)
        assert 0 < row.saved_mib <= row.undonated_peak_mib
    curve = data.max_batch_curve(rows)
    assert set(curve["model"]) == {"squeezenet1_1", "resnet50", "vgg16"}
    assert curve["series"].nunique() == 6  # one per max_batch run, inference and training
    assert {s.split(" · ")[1] for s in curve["series"]} == {"inference", "training"}
    assert all(s.startswith(f"{m} · ") for m, s in zip(curve["model"], curve["series"]))
    for _, points in curve.groupby("series"):
        assert points["batch"].is_unique and points["peak_mib"].is_monotonic_increasing


@pytest.mark.parametrize("algorithm, role", [("naive", "naive"), ("tflite_greedy", "peer"), ("xla_best_fit", "peer"),
                                             ("best_fit_decreasing", "peer"), ("pack_2d", "ours"),
                                             ("jaxcnn_2d", "ours"), ("xla", "XLA"), ("xla_hlo", "XLA")])
def test_algorithm_roles(algorithm, role):
    assert data.algorithm_role(algorithm) == role


# -- sparsity -----------------------------------------------------------------------------------


def test_sparsity_table_matches_the_export(shipped):
    run_id = _run_id("squeezenet1_1", 1)
    table = data.sparsity_table(shipped, run_id)
    expected = {s["layer"]: s["zero_fraction"] for s in _shipped_runs()[run_id - 1]["sparsity"]}
    assert dict(zip(table["layer"], table["input_zero_pct"] / 100)) == pytest.approx(expected)
    assert table["output_zero_pct"].between(0, 100).all()


def _sparse_store(path, ratios_by_zero):
    """A run timing a dense and a sparse variant of each layer at a given input sparsity."""
    store = Store(path)
    run = store.add_run("profile", model="m", device="gpu")
    ids = store.add_layers(run, [dict(idx=i, name=f"l{i}", op="conv2d", flops=1, bytes=1)
                                 for i in range(len(ratios_by_zero))])
    rows, sparsity = [], []
    for layer, (zero, ratio) in zip(ids, ratios_by_zero):
        rows += [dict(layer_id=layer, backend="jaxcnn", variant="dense_nhwc", metric="device_time_ms", median=1.0),
                 dict(layer_id=layer, backend="jaxcnn_sparse", metric="device_time_ms", median=ratio)]
        sparsity.append(dict(layer_id=layer, zero_fraction=zero))
    store.add_measurements(run, rows)
    store.add_sparsity(run, sparsity)
    return store, run


@settings(max_examples=25, deadline=None)
@given(st.floats(10, 90), st.floats(0.005, 0.05), st.lists(st.floats(0, 100), min_size=2, max_size=8, unique=True))
def test_crossover_recovers_a_linear_ratio(tmp_path_factory, crossing, slope, zeros):
    """ratio = 1 - slope * (zero% - crossing): sparse wins above the crossing, and the fit finds it."""
    assume(max(zeros) - min(zeros) >= 1.0)  # zero fractions a few ulps apart give a flat fit
    ratios = [(z / 100, max(1.0 - slope * (z - crossing), 1e-3)) for z in zeros]
    if any(r == 1e-3 for _, r in ratios):
        return  # clipped: not linear any more
    store, run = _sparse_store(tmp_path_factory.mktemp("sparse") / "s.sqlite", ratios)
    with store:
        decisions = data.dense_sparse_decisions(store, run)
    assert decisions["decision"].tolist() == ["sparse" if r < 1 else "dense" for _, r in ratios]
    assert data.crossover_zero_pct(decisions) == pytest.approx(crossing, abs=1e-6)


def test_no_sparse_measurements_says_so(shipped):
    with pytest.raises(data.NoData, match="no sparse-kernel measurements"):
        data.dense_sparse_decisions(shipped, _run_id("squeezenet1_1", 1))
    one = pd.DataFrame({"input_zero_pct": [50.0], "sparse_over_dense": [0.8]})
    assert data.crossover_zero_pct(one) is None
    flat = pd.DataFrame({"input_zero_pct": [10.0, 90.0], "sparse_over_dense": [2.0, 2.0]})
    assert data.crossover_zero_pct(flat) is None
    assert not math.isnan(data.crossover_zero_pct(pd.DataFrame(
        {"input_zero_pct": [10.0, 90.0], "sparse_over_dense": [1.5, 0.5]})))


def test_jaxcnn_dashboard_says_what_to_install(monkeypatch, capsys):
    import importlib.util

    from jaxcnn import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "streamlit" else real(name, *a))
    assert cli.main(["dashboard", "--db", "x.sqlite"]) == 2
    assert "the dashboard needs streamlit: pip install 'jaxcnn[dashboard]'" in capsys.readouterr().err


def test_max_batch_curve_reads_jaxcnn_maxbatch_runs(tmp_path):
    # The rows `jaxcnn maxbatch --db` writes (planner.records), from a real search on LeNet.
    from jaxcnn.memory import max_batch
    from jaxcnn.memory.records import record_max_batch
    from jaxcnn.store import Store

    result = max_batch("lenet5", "4MiB", dtype="float32", limit=512)
    with Store(tmp_path / "mb.sqlite") as store:
        record_max_batch(store, result, model="lenet5", dtype="float32", train=False)
        curve = data.max_batch_curve(data.plan_measurements(store))
    assert set(curve["series"]) == {"lenet5 · inference · run 1"}  # one series per run, not one per point
    assert sorted(curve["batch"]) == sorted(result.stats)
    assert curve["peak_mib"].is_monotonic_increasing
    assert curve["peak_mib"].max() * 2**20 > 4 * 2**20 >= curve.loc[curve["batch"] == result.batch, "peak_mib"].iloc[0] * 2**20
