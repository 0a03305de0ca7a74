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

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
PAGES = ("runs", "speed", "roofline", "memory", "sparsity")
TITLES = {"runs": "Runs", "speed": "Speed", "roofline": "Roofline", "memory": "Memory", "sparsity": "Sparsity"}


SHIPPED_RUNS = 57  # 18 zoo profiles, 18 planner-zoo plans, 21 donation / max-batch / remat runs
START_RUN = 14  # mobilenetv2 batch 64: the latest profile of the model with the most layers (99)
MOBILENET_TRAINING_PLAN = 26  # its pack_2d-vs-XLA plan (planner_zoo training, 607 buffers)


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
    assert "shipped H200 measurements" in banner
    assert ("no store at" if which == "missing" else "holds no runs yet") in banner
    shown = metrics(at)
    if page == "runs":
        assert shown["Runs"] == str(SHIPPED_RUNS) and shown["GPUs"] == "NVIDIA H200"
        assert shown["Kinds"] == "plan, profile"
        assert len(at.dataframe) == 1 and len(at.dataframe[0].value) == SHIPPED_RUNS
        # Picked by default: the latest profile of the model with the most layers, not the
        # latest run (a remat plan run, with no layers for the other pages).
        assert at.multiselect(key="runs-pick").value == [START_RUN]
    elif page == "speed":
        assert at.selectbox(key="speed-run").value == START_RUN
        assert at.selectbox(key="speed-other").value == START_RUN - 1  # mobilenetv2 b1: same model
        assert {"xla (device time)", "jaxcnn (device time)", "speedup of jaxcnn over XLA"} <= set(shown)
        assert all(v.endswith("ms") for k, v in shown.items() if "device time" in k)
        assert charts(at) == 4 and len(at.dataframe) == 3  # end to end, per layer, speedup, run vs run
        titles = [t for spec in chart_specs(at) for t in axis_titles(spec)]
        assert "device time (ms)" in titles and "time (ms)" in titles
        assert any(t.startswith("speedup (xla ms / jaxcnn ms") for t in titles)
    elif page == "roofline":
        assert at.selectbox(key="roofline-run").value == START_RUN
        assert shown["DRAM bandwidth (measured)"] == "3.97 TB/s"
        assert shown["bf16 compute (measured)"] == "708 TFLOP/s"
        assert shown["median |error| of the traffic model"].endswith("%")
        assert charts(at) == 3 and len(at.dataframe) == 2
        titles = [t for spec in chart_specs(at) for t in axis_titles(spec)]
        assert {"arithmetic intensity (FLOP/byte, log)", "achieved TFLOP/s (log)",
                "prediction error (% of measured)"} <= set(titles)
    elif page == "memory":
        # The shipped H200 plans: pack_2d vs XLA of the model picked on the Runs page (mobilenetv2).
        assert "No data yet" not in banner and "no data yet" not in banner
        plan = at.selectbox(key="memory-run")
        assert plan.value == MOBILENET_TRAINING_PLAN
        assert plan.options[plan.index] == f"#{MOBILENET_TRAINING_PLAN} mobilenetv2 b64 float32 · gpu · plan (planner_zoo training)"
        assert {"lower bound", "naive", "peer (best)", "ours", "XLA"} <= set(shown)
        mib = {k: float(v.split()[0]) for k, v in shown.items() if v.endswith("MiB")}
        assert mib["lower bound"] <= mib["ours"] <= mib["peer (best)"] < mib["naive"]
        assert mib["ours"] < mib["XLA"]  # 3135.9 vs 3143.9 MiB on the H200 compile
        # vgg16 batch 1: 3194.5 MiB peak without donation, 1764.6 with it.
        assert shown["largest donation saving"] == "1429.9 MiB"
        # pack_2d against XLA's own assignment (both with offsets) by default
        assert at.multiselect(key=f"memory-algorithms-{MOBILENET_TRAINING_PLAN}").value == ["pack_2d", "xla"]
        # arena bars, live bytes, 2 rectangle charts, XLA's memory analysis, donation, max batch
        assert charts(at) == 7
        titles = [spec.get("title") for spec in chart_specs(at)]
        assert {"Peak memory saved by buffer donation (MiB)", "Peak memory against batch (MiB)"} <= {
            t.get("text") if isinstance(t, dict) else t for t in titles}
        # plans, buffers, memory analysis, donation savings, plan measurements
        assert len(at.dataframe) == 5
    elif page == "sparsity":
        assert shown["max input zeros"].endswith("%")
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
    at = open_page(db, "speed")
    shown = metrics(at)
    assert {"xla (host wall time)", "jaxcnn (host wall time)"} <= set(shown)
    assert "host wall times of the reference path" in texts(at.caption)
    assert not at.error and charts(at) >= 3
    at = open_page(db, "roofline")
    assert "No roofline for this run: a CPU run" in texts(at.warning)
    assert not at.error and charts(at) == 0
    at = open_page(db, "memory")
    assert not at.error and charts(at) == 1  # XLA's memory analysis of the CPU compile
    assert "jaxcnn plan MODEL --db" in texts(at.info) and "jaxcnn maxbatch MODEL" in texts(at.info)
    at = open_page(db, "sparsity")
    assert not at.error and charts(at) == 1


def test_memory_page_of_a_profile_only_store_says_what_to_run(dbs):
    # The shipped zoo profiles alone: XLA's memory analysis, and what to run for the rest.
    at = open_page(dbs[0]["profiles"], "memory")
    assert not at.error, texts(at.error)
    info = texts(at.info)
    assert "No data yet: no memory plans in this store. Run `jaxcnn plan MODEL --db DB`" in info
    assert "No data yet: no max-batch or donation results in this store" in info and "jaxcnn maxbatch MODEL" in info
    assert charts(at) == 1 and len(at.dataframe) == 1 and not at.metric
    assert at.selectbox(key="memory-stats-run").value == START_RUN


def test_memory_page_with_real_plans(dbs):
    at = open_page(dbs[0]["plans"], "memory")
    assert not at.error, texts(at.error)
    assert at.selectbox(key="memory-run").value == MOBILENET_TRAINING_PLAN
    # The plan recorded by dashboard_stores (jaxpr buffers of squeezenet1_1 on this CPU) comes
    # after the shipped runs.
    at.selectbox(key="memory-run").set_value(SHIPPED_RUNS + 1).run()
    assert not at.exception and not at.error, texts(at.error)
    shown = metrics(at)
    assert {"lower bound", "naive", "peer (best)", "ours", "XLA"} <= set(shown)
    assert all(v.endswith("MiB") for v in shown.values() if v != "n/a")
    bound = float(shown["lower bound"].split()[0])
    ours = float(shown["ours"].split()[0])
    naive = float(shown["naive"].split()[0])
    assert bound <= ours < naive
    # XLA's CPU plan has no offsets: pack_2d against the best peer by default
    assert at.multiselect(key=f"memory-algorithms-{SHIPPED_RUNS + 1}").value[0] == "pack_2d"
    assert len(at.multiselect(key=f"memory-algorithms-{SHIPPED_RUNS + 1}").value) == 2
    # arena bars, live bytes, rectangles of the two default algorithms, XLA's memory analysis of
    # the shipped profile, donation savings, max-batch curve
    assert charts(at) == 7
    assert "xla: the plan records no buffer offsets" not in texts(at.info)
    assert "largest donation saving" in shown
    # plans, buffers, memory analysis, donation savings, plan measurements
    assert len(at.dataframe) == 5
    at.multiselect(key=f"memory-algorithms-{SHIPPED_RUNS + 1}").set_value(["xla"]).run()
    assert "xla: the plan records no buffer offsets." in texts(at.info)


def test_runs_picked_on_the_runs_page_drive_the_other_pages(dbs):
    at = open_page(dbs[0]["missing"], "runs")
    at.multiselect(key="runs-pick").set_value([5, 6]).run()  # resnet50 batch 1 and batch 64
    at.switch_page("pages/speed.py").run()
    assert not at.exception
    assert at.selectbox(key="speed-run").value == 5 and at.selectbox(key="speed-other").value == 6
    at.switch_page("pages/roofline.py").run()
    assert at.selectbox(key="roofline-run").value == 5
    at.switch_page("pages/memory.py").run()
    assert not at.exception
    plan = at.selectbox(key="memory-run")
    assert plan.options[plan.index].endswith("resnet50 b64 float32 · gpu · plan (planner_zoo training)")


def test_compare_defaults_to_a_run_of_the_same_model(dbs):
    at = open_page(dbs[0]["missing"], "runs")
    at.multiselect(key="runs-pick").set_value([3]).run()  # vgg19 batch 1
    at.switch_page("pages/speed.py").run()
    assert at.selectbox(key="speed-other").value == 4  # vgg19 batch 64, not the latest run (lenet5)
    assert "b_over_a < 1 means run B is faster" in texts(at.caption)
