"""Every dashboard page under Streamlit's AppTest: the shipped data, an empty DB, a corrupt file, a
foreign SQLite file, a store with tables missing, a real CPU-only run, and real memory plans.
A page must never raise: broken or missing data becomes a message on the page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("altair")

from streamlit.testing.v1 import AppTest  # noqa: E402

import dashboard_stores as stores  # noqa: E402
import profile_fn_models  # noqa: E402
from jaxcnn.dashboard import data  # noqa: E402
from jaxcnn.profile.function_profile import profile_function  # noqa: E402
from jaxcnn.store import SCHEMA_VERSION, Store  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
PAGES = ("runs", "speed", "roofline", "memory", "sparsity")
TITLES = {"runs": "Runs", "speed": "Speed", "roofline": "Roofline", "memory": "Memory", "sparsity": "Sparsity"}




def plan_metrics(measured: str) -> dict[str, str]:
    """The Memory page's plan metrics: role -> label (computed by the planner; XLA's arena is the
    temp size of its own compile, a measurement)."""
    return {"lower bound": "lower bound (computed)", "naive": "naive (computed)", "peer": "peer (best, computed)",
            "ours": "ours (computed)", "XLA": f"XLA ({measured})"}


# Run ids of the shipped store (exports imported oldest first): 21 donation / max-batch / remat
# runs, then 18 zoo profiles (each model at batch 1 then 64, in the export's order), then 36 plans.
SHIPPED_RUNS = 82
START_RUN = 31  # mobilenetv2 batch 64: the latest profile of the model with the most layers (99)
PROFILES_ONLY_START = 10  # the same run in a store of the zoo profiles alone
MOBILENET_TRAINING_PLAN = 75  # its pack_2d-vs-XLA plan on XLA's own buffers (training, HLO, 607 buffers)
RESNET50_B1, RESNET50_B64, VGG19_B1, VGG19_B64, LENET5_B64 = 32, 33, 38, 39, 23


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dashboard_dbs")
    cache = root / "cache"
    paths = {
        "missing": root / "no_such.sqlite",
        "empty": stores.empty_store(root / "empty.sqlite"),
        "corrupt": stores.corrupt_file(root / "corrupt.sqlite"),
        "foreign": stores.foreign_sqlite(root / "foreign.sqlite"),
        "cpu": stores.cpu_profile(root / "cpu.sqlite"),
    }
    paths["no_tables"] = stores.missing_tables(stores.shipped_copy(root, cache), root / "no_tables.sqlite")
    paths["plans"] = stores.shipped_with_plans(cache)
    paths["profiles"] = stores.profiles_only(root / "profiles.sqlite")
    return paths, cache


@pytest.fixture(autouse=True)
def _cache_env(dbs, monkeypatch):
    monkeypatch.setenv("JAXCNN_DASHBOARD_CACHE", str(dbs[1]))


def open_page(db: Path, page: str, **state) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.session_state["db_path"] = str(db)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    if page != "runs":
        at.switch_page(f"pages/{page}.py")
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == [TITLES[page]]
    return at


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def charts(at: AppTest) -> int:
    return len(chart_specs(at))


def chart_specs(at: AppTest) -> list[dict]:
    """The Vega-Lite specs the page sent (Altair charts arrive as vega_lite_chart elements)."""
    return [json.loads(e.proto.spec) for e in at.get("vega_lite_chart")]


def axis_titles(spec: dict) -> list[str]:
    """Every axis title anywhere in a (layered / faceted) spec."""
    found = []
    if isinstance(spec, dict):
        for key, value in spec.items():
            if key in ("x", "y") and isinstance(value, dict) and isinstance(value.get("title"), str):
                found.append(value["title"])
            else:
                found += axis_titles(value)
    elif isinstance(spec, list):
        for item in spec:
            found += axis_titles(item)
    return found


@pytest.mark.parametrize("which", ["missing", "empty"])
@pytest.mark.parametrize("page", PAGES)
def test_no_local_runs_show_the_shipped_h200_data(dbs, which, page):
    at = open_page(dbs[0][which], page)
    assert not at.error, texts(at.error)
    banner = texts(at.info)
    # What the shipped data is and what it was made from, on every page.
    assert "showing the shipped measurements (dashboard/shipped/: NVIDIA H200, made 2026-11-21 to 2026-11-29, " \
           "commits 1041c42, 37d5348-dirty, cc1624b-dirty)" in banner
    assert ("no store at" if which == "missing" else "holds no runs yet") in banner
    shown = metrics(at)
    # Every number a page shows says where it comes from; the shipped data is never called "measured" here.
    assert page == "runs" or all(label.endswith(")") for label in shown), shown  # the Runs page counts runs
    assert not any("(measured)" in label and "bandwidth" not in label and "compute" not in label for label in shown)
    subtitles = [spec["title"]["subtitle"] for spec in chart_specs(at)]
    assert all(t.startswith("source: ") and "measured" not in t for t in subtitles), subtitles
    if page == "runs":
        assert shown["Runs"] == str(SHIPPED_RUNS) and shown["GPUs"] == "NVIDIA H200"
        assert shown["Kinds"] == "plan, profile"
        runs_table = at.dataframe[1].value
        assert len(runs_table) == SHIPPED_RUNS and list(runs_table.columns) == list(data.RUN_SUMMARY_COLUMNS)
        assert runs_table.loc[0, "commit"] == "37d5348-dirty" and runs_table.loc[0, "where"] == "NVIDIA H200"
        provenance = at.dataframe[0].value
        assert provenance["schema_version"].tolist() == [SCHEMA_VERSION] * 4
        assert "Made from: **NVIDIA H200, made 2026-11-21" in texts(at.markdown)
        # Picked by default: the latest profile of the model with the most layers, not the
        # latest run (a remat plan run, with no layers for the other pages).
        assert at.multiselect(key="runs-pick").value == [START_RUN]
    elif page == "speed":
        assert at.selectbox(key="speed-run").value == START_RUN
        assert at.selectbox(key="speed-other").value == START_RUN - 1  # mobilenetv2 b1: same model
        assert {"xla device time (shipped)", "jaxcnn device time (shipped)",
                "speedup of jaxcnn over XLA (shipped)"} <= set(shown)
        assert all(v.endswith("ms") for k, v in shown.items() if "device time" in k)
        assert charts(at) == 4 and len(at.dataframe) == 4  # end to end, per layer, run A/B, run vs run
        header = at.dataframe[2].value
        assert header["run"].tolist() == ["A", "B"] and header["commit"].tolist() == ["cc1624b-dirty"] * 2
        assert header["where"].tolist() == ["NVIDIA H200"] * 2
        assert "Both runs are of commit cc1624b-dirty" in texts(at.caption)
        titles = [t for spec in chart_specs(at) for t in axis_titles(spec)]
        assert "device time (ms)" in titles and "time (ms)" in titles
        assert any(t.startswith("speedup (xla ms / jaxcnn ms") for t in titles)
        assert "**shipped** (measured on the GPU of the shipped data" in texts(at.caption)
    elif page == "roofline":
        assert at.selectbox(key="roofline-run").value == START_RUN
        assert shown["DRAM bandwidth (measured)"] == "3.97 TB/s"  # the ceiling's own source
        assert shown["bf16 compute (measured)"] == "708 TFLOP/s"
        assert shown["median |error| of the traffic model (model vs shipped)"].endswith("%")
        assert charts(at) == 3 and len(at.dataframe) == 2
        assert "**model** (predicted by jaxcnn.costmodel" in texts(at.caption)
        titles = [t for spec in chart_specs(at) for t in axis_titles(spec)]
        assert {"arithmetic intensity (FLOP/byte, log)", "achieved TFLOP/s (log)",
                "prediction error (% of measured)"} <= set(titles)
    elif page == "memory":
        # The shipped H200 plans: pack_2d vs XLA of the model picked on the Runs page (mobilenetv2).
        assert "No data yet" not in banner and "no data yet" not in banner
        plan = at.selectbox(key="memory-run")
        assert plan.value == MOBILENET_TRAINING_PLAN
        assert plan.options[plan.index] == (f"#{MOBILENET_TRAINING_PLAN} mobilenetv2 b64 float32 · NVIDIA H200 · plan "
                                            "(plans training hlo)")
        assert set(plan_metrics("shipped").values()) <= set(shown)
        mib = {k: float(shown[v].split()[0]) for k, v in plan_metrics("shipped").items()}
        assert mib["lower bound"] <= mib["ours"] <= mib["peer"] < mib["naive"]
        assert mib["ours"] < mib["XLA"]  # 3135.9 vs 3143.9 MiB on the H200 compile
        # vgg16 batch 1: 3194.5 MiB peak without donation, 1764.6 with it.
        assert shown["largest donation saving (shipped)"] == "1429.9 MiB"
        # Each of XLA's quantities is explained, with the formula its peak follows on the H200.
        notes = texts(at.markdown)
        assert all(f"`{name}`" in notes for name in data.MEMORY_QUANTITIES)
        assert "XLA's peak 319.1 MiB = argument + output - alias + temp" in notes  # mobilenetv2 b64, xla
        # pack_2d against XLA's own assignment (both with offsets) by default
        assert at.multiselect(key=f"memory-algorithms-{MOBILENET_TRAINING_PLAN}").value == ["pack_2d", "xla"]
        # arena bars, live bytes, 2 rectangle charts, XLA's memory analysis, donation, max batch
        assert charts(at) == 7
        titles = [spec.get("title") for spec in chart_specs(at)]
        assert {"Peak memory saved by buffer donation (MiB)", "Peak memory against batch (MiB)"} <= {
            t.get("text") if isinstance(t, dict) else t for t in titles}
        # plans, buffers, memory analysis, donation savings, plan measurements
        assert len(at.dataframe) == 5
        # The buffer table lists the buffers of the picked algorithms only.
        assert set(at.dataframe[1].value["algorithm"]) == {"pack_2d", "xla"}
    elif page == "sparsity":
        assert shown["max input zeros (shipped)"].endswith("%")
        assert "no sparse-kernel measurements yet" in banner
        assert charts(at) == 1 and len(at.dataframe) == 1


@pytest.mark.parametrize("page", PAGES)
def test_shipped_toggle_overrides_a_local_store(dbs, page):
    at = open_page(dbs[0]["cpu"], page, use_shipped=True)
    assert "shipped data chosen in the sidebar" in texts(at.info)
    assert not at.error, texts(at.error)


@pytest.mark.parametrize("which, message", [
    ("corrupt", "not a SQLite database"),
    ("foreign", "is not a jaxcnn profile store"),
])
@pytest.mark.parametrize("page", PAGES)
def test_unreadable_files_give_a_message_not_a_traceback(dbs, which, message, page):
    at = open_page(dbs[0][which], page)
    errors = texts(at.error)
    assert "Cannot read the profile store" in errors and message in errors
    assert len(at.dataframe) == 0


@pytest.mark.parametrize("page", PAGES)
def test_missing_tables_are_reported_where_needed(dbs, page):
    at = open_page(dbs[0]["no_tables"], page)
    if page == "runs":
        assert not at.error and len(at.dataframe[0].value) == SHIPPED_RUNS  # the runs table itself is intact
    elif page == "memory":
        # Nothing there to read: the planned and profiled sections say there is no data.
        assert "No data yet" in texts(at.info)
    else:
        # Runs list no measurements, so the page says what to record rather than failing.
        assert "No data yet" in texts(at.info) or "no such table" in texts(at.error)


def test_cpu_only_run(dbs):
    db = dbs[0]["cpu"]
    at = open_page(db, "runs")
    assert metrics(at)["GPUs"] == "none (CPU)" and "shipped" not in texts(at.info)
    assert at.dataframe[0].value.loc[0, "where"] == "CPU"
    at = open_page(db, "speed")
    shown = metrics(at)
    # The reference path's times, measured, and no speedup anywhere: not as a headline, a chart
    # or a column.
    assert set(shown) == {"xla host wall time (measured)", "jaxcnn host wall time (measured)"}
    assert all(v.endswith("ms") for v in shown.values())
    assert data.REFERENCE_PATH_NOTE in texts(at.warning)
    specs = chart_specs(at)
    assert not any("Speedup" in str(spec["title"]["text"]) for spec in specs)
    assert not any(t.startswith("speedup") for spec in specs for t in axis_titles(spec))
    assert all(spec["title"]["subtitle"] == "source: measured" for spec in specs)
    assert all("speedup" not in frame.value.columns for frame in at.dataframe)
    assert "Run vs run compares GPU device times" in texts(at.info)
    assert "speed-other" not in [w.key for w in at.selectbox]
    assert not at.error and charts(at) == 2  # end to end, per-layer times
    at = open_page(db, "roofline")
    assert "No roofline for this run: a CPU run" in texts(at.warning)
    assert not at.error and charts(at) == 0
    at = open_page(db, "memory")
    assert not at.error and charts(at) == 1  # XLA's memory analysis of the CPU compile
    assert "jaxcnn plan MODEL --db" in texts(at.info) and "jaxcnn maxbatch MODEL" in texts(at.info)
    # XLA's CPU peak leaves the temp allocation out, and the page says so.
    assert "= argument + output - alias (temp not counted)" in texts(at.markdown)
    at = open_page(db, "sparsity")
    assert not at.error and charts(at) == 1
    assert "timed on a CPU (the lax reference path)" in texts(at.info)


@pytest.fixture(scope="module")
def gpu_and_cpu(tmp_path_factory, dbs):
    """The shipped GPU runs, a CPU run of lenet5 and a GPU run of lenet5 b64 at another commit
    (the shipped run's copy with its times halved, as if a change made it twice as fast)."""
    root = tmp_path_factory.mktemp("gpu_and_cpu")
    path = stores.shipped_copy(root, dbs[1])
    stores.cpu_profile(path)
    export = next(f for f in data.shipped_files() if f.name.endswith("-zoo.json"))
    run = next(r for r in json.loads(export.read_text())["runs"] if r["model"] == "lenet5" and r["batch"] == 64)
    environment = dict(run["environment"], extra=dict(run["environment"]["extra"],
                                                      git={"commit": "abcdef0", "dirty": False}))
    run = dict(run, uid="later-commit", git_commit="abcdef0123456789", created_at="2026-11-30T00:00:00+00:00",
               environment=environment,
               measurements=[dict(m, **{k: m[k] / 2 for k in ("median", "p10", "p90", "min", "max") if k in m})
                             if m["metric"].endswith("_ms") else m for m in run["measurements"]])
    later = root / "later.json"
    later.write_text(json.dumps({"format": "jaxcnn-profile-store", "format_version": 1, "runs": [run]}))
    with Store(path) as store:
        store.import_json(later)
    return path


def test_run_vs_run_compares_gpu_runs_of_two_commits(gpu_and_cpu):
    cpu_run, later_run = SHIPPED_RUNS + 1, SHIPPED_RUNS + 2
    at = open_page(gpu_and_cpu, "runs")
    at.multiselect(key="runs-pick").set_value([later_run]).run()
    at.switch_page("pages/speed.py").run()
    assert not at.exception and not at.error, texts(at.error)
    other = at.selectbox(key="speed-other")
    # B starts at the same model, batch and dtype at the other commit (not lenet5 b1), and the CPU
    # run of lenet5 is not offered at all.
    assert other.value == LENET5_B64 and cpu_run not in other.options and later_run not in other.options
    header = at.dataframe[2].value
    assert header["commit"].tolist() == ["abcdef0", "cc1624b-dirty"]
    assert header["where"].tolist() == ["NVIDIA H200", "NVIDIA H200"]
    compared = at.dataframe[3].value
    assert compared["b_over_a"].dropna().round(6).eq(2.0).all()  # B (cc1624b) took twice as long
    assert "Both runs are of commit" not in texts(at.caption)
    # Picking the CPU run as A: nothing to compare with, and the page says why.
    at.selectbox(key="speed-run").set_value(cpu_run).run()
    assert not at.exception and not at.error
    assert "Run vs run compares GPU device times" in texts(at.info)
    assert "speedup of jaxcnn over XLA (measured)" not in metrics(at)


def test_memory_page_of_a_profile_only_store_says_what_to_run(dbs):
    # The shipped zoo profiles alone: XLA's memory analysis, and what to run for the rest.
    at = open_page(dbs[0]["profiles"], "memory")
    assert not at.error, texts(at.error)
    info = texts(at.info)
    assert "No data yet: no memory plans in this store. Run `jaxcnn plan MODEL --db DB`" in info
    assert "No data yet: no max-batch or donation results in this store" in info and "jaxcnn maxbatch MODEL" in info
    assert charts(at) == 1 and len(at.dataframe) == 1 and not at.metric
    assert at.selectbox(key="memory-stats-run").value == PROFILES_ONLY_START


def test_memory_page_with_real_plans(dbs):
    at = open_page(dbs[0]["plans"], "memory")
    assert not at.error, texts(at.error)
    assert at.selectbox(key="memory-run").value == MOBILENET_TRAINING_PLAN
    # The plan recorded by dashboard_stores (jaxpr buffers of squeezenet1_1 on this CPU) comes
    # after the shipped runs.
    at.selectbox(key="memory-run").set_value(SHIPPED_RUNS + 1).run()
    assert not at.exception and not at.error, texts(at.error)
    shown = metrics(at)
    labels = plan_metrics("measured")
    assert set(labels.values()) <= set(shown)
    assert all(v.endswith("MiB") for v in shown.values() if v != "n/a")
    bound, ours, naive = (float(shown[labels[k]].split()[0]) for k in ("lower bound", "ours", "naive"))
    assert bound <= ours < naive
    # XLA's CPU plan has no offsets: pack_2d against the best peer by default
    assert at.multiselect(key=f"memory-algorithms-{SHIPPED_RUNS + 1}").value[0] == "pack_2d"
    assert len(at.multiselect(key=f"memory-algorithms-{SHIPPED_RUNS + 1}").value) == 2
    # arena bars, live bytes, rectangles of the two default algorithms, XLA's memory analysis of
    # the shipped profile, donation savings, max-batch curve
    assert charts(at) == 7
    assert "xla: the plan records no buffer offsets" not in texts(at.info)
    assert "largest donation saving (measured)" in shown
    # plans, buffers, memory analysis, donation savings, plan measurements
    assert len(at.dataframe) == 5
    at.multiselect(key=f"memory-algorithms-{SHIPPED_RUNS + 1}").set_value(["xla"]).run()
    assert "xla: the plan records no buffer offsets." in texts(at.info)


def test_runs_picked_on_the_runs_page_drive_the_other_pages(dbs):
    at = open_page(dbs[0]["missing"], "runs")
    at.multiselect(key="runs-pick").set_value([RESNET50_B1, RESNET50_B64]).run()
    at.switch_page("pages/speed.py").run()
    assert not at.exception
    assert at.selectbox(key="speed-run").value == RESNET50_B1
    assert at.selectbox(key="speed-other").value == RESNET50_B64
    at.switch_page("pages/roofline.py").run()
    assert at.selectbox(key="roofline-run").value == RESNET50_B1
    at.switch_page("pages/memory.py").run()
    assert not at.exception
    plan = at.selectbox(key="memory-run")
    assert plan.options[plan.index].endswith("resnet50 b64 float32 · NVIDIA H200 · plan (plans training hlo)")


def test_compare_defaults_to_a_run_of_the_same_model(dbs):
    at = open_page(dbs[0]["missing"], "runs")
    at.multiselect(key="runs-pick").set_value([VGG19_B1]).run()
    at.switch_page("pages/speed.py").run()
    assert at.selectbox(key="speed-other").value == VGG19_B64  # the same model, not the latest run
    assert "b_over_a < 1 means run B is faster" in texts(at.caption)


@pytest.mark.slow
def test_a_profiled_function_shows_like_a_zoo_model(tmp_path):
    # `jaxcnn profile --fn`'s Python API on a raw-lax CNN: its conv sites are the layers.
    fn, args = profile_fn_models.lax_nchw_cnn(batch=2)
    db = tmp_path / "fn.sqlite"
    profile_function(fn, args, name="raw_lax", iters=2, warmup=1, store=db)
    at = open_page(db, "runs")
    assert at.dataframe[0].value.loc[0, "model"] == "raw_lax"
    at = open_page(db, "speed")
    assert not at.error, texts(at.error)
    long_chart = next(spec for spec in chart_specs(at) if spec["title"]["text"].startswith("Per-layer"))
    assert long_chart["encoding"]["x"]["sort"] == ["conv0", "conv1"]  # the sites in program order
    at = open_page(db, "sparsity")
    assert not at.error and charts(at) == 1
