"""jaxcnn.dashboard.charts: the Vega-Lite specs the pure chart functions build (encodings, units in
axis titles, tooltips with layer names, shapes and bytes, data passed through unchanged)."""

from __future__ import annotations

import pandas as pd
import pytest

pytest.importorskip("altair")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from jaxcnn.dashboard import charts, data  # noqa: E402


def layers_long(times=((0.5, 0.25), (0.2, 0.4))) -> pd.DataFrame:
    rows = []
    for i, pair in enumerate(times):
        for backend, t in zip(("xla", "jaxcnn"), pair):
            rows.append(dict(idx=i, layer=f"conv{i}", op="conv2d", input_shapes="1×8×8×4", weight_shape="3×3×4×8",
                             output_shape="1×8×8×8", flops=2e9, bytes=4e6, gflop=2.0, mib=4e6 / 2**20,
                             backend=backend, time_ms=t, p10_ms=t * 0.9, p90_ms=t * 1.1, variant=f"{backend}_k"))
    return pd.DataFrame(rows)


def layers_of(spec: dict) -> list[dict]:
    """The unit specs of a (possibly layered / faceted) chart."""
    if "layer" in spec:
        return [s for sub in spec["layer"] for s in layers_of(sub)]
    if "spec" in spec:
        return layers_of(spec["spec"])
    return [spec]


def tooltip_titles(unit: dict) -> list[str]:
    return [t.get("title", t.get("field")) for t in unit["encoding"].get("tooltip", [])]


def data_of(chart, unit: dict) -> list[dict]:
    spec = chart.to_dict()
    name = unit.get("data", spec.get("data", {})).get("name")
    return spec["datasets"][name]


def test_layer_time_bars():
    long = layers_long()
    chart = charts.layer_time_bars(long, "device_time_ms")
    unit, = layers_of(chart.to_dict())
    enc = unit["encoding"]
    assert unit["mark"]["type"] == "bar"
    assert enc["y"]["title"] == "device time (ms)" and enc["y"]["field"] == "time_ms"
    assert enc["x"]["sort"] == ["conv0", "conv1"] and enc["xOffset"]["field"] == "backend"
    assert enc["color"]["scale"]["domain"] == ["jaxcnn", "xla"]
    assert enc["color"]["scale"]["range"] == [charts.BACKEND_COLORS["jaxcnn"], charts.BACKEND_COLORS["xla"]]
    assert {"layer", "input shape", "weight shape", "output shape", "GFLOP", "traffic (MiB)",
            "device time (ms)", "kernel / variant"} <= set(tooltip_titles(unit))
    assert len(data_of(chart, unit)) == 4
    assert charts.layer_time_bars(long, "wall_time_ms").to_dict()["encoding"]["y"]["title"] == "host wall time (ms)"


def test_speedup_bars_colour_the_faster_backend():
    wide = data.speedup_table(layers_long())
    chart = charts.speedup_bars(wide)
    bars, rule = layers_of(chart.to_dict())
    assert bars["encoding"]["y"]["scale"]["type"] == "log"
    assert bars["encoding"]["y"]["title"] == "speedup (xla ms / jaxcnn ms, ×)"
    rows = {r["layer"]: r for r in data_of(chart, bars)}
    assert rows["conv0"]["speedup"] == pytest.approx(2.0) and rows["conv0"]["faster"] == "jaxcnn faster"
    assert rows["conv1"]["faster"] == "xla faster"
    assert rule["mark"]["type"] == "rule" and data_of(chart, rule) == [{"speedup": 1.0}]
    assert {"xla (ms)", "jaxcnn (ms)", "xla kernel", "jaxcnn kernel"} <= set(tooltip_titles(bars))


def test_end_to_end_bars_have_whiskers_and_a_facet_per_measure():
    e2e = pd.DataFrame(dict(backend=["xla", "jaxcnn"] * 2, metric=["device_time_ms"] * 2 + ["wall_time_ms"] * 2,
                            what=["device time"] * 2 + ["host latency"] * 2, time_ms=[1.0, 2.0, 3.0, 4.0],
                            p10_ms=[0.9, 1.9, 2.9, 3.9], p90_ms=[1.1, 2.1, 3.1, 4.1], n=[10] * 4))
    spec = charts.end_to_end_bars(e2e).to_dict()
    assert spec["facet"]["column"]["field"] == "what"
    bars, whiskers = layers_of(spec)
    assert bars["encoding"]["y"]["title"] == "time (ms)"
    assert whiskers["encoding"]["y"]["field"] == "p10_ms" and whiskers["encoding"]["y2"]["field"] == "p90_ms"


def test_roofline_chart_is_log_log_under_the_roof():
    points = layers_long().assign(flop_per_byte=500.0, tflops=1.0, gb_per_s=2.0, pred_floor_ms=0.1,
                                  pct_of_floor=20.0)
    ceilings = data.Ceilings("H200", "bf16", 3.97e12, 708e12, "measured", "measured")
    roof = data.ceiling_lines(ceilings, 1, 1e4)
    chart = charts.roofline_chart(points, roof, ceilings)
    line, bandwidth, compute, dots = layers_of(chart.to_dict())
    assert [r["text"] for r in data_of(chart, bandwidth)] == ["DRAM 3.97 TB/s (measured)"]
    assert [r["text"] for r in data_of(chart, compute)] == ["bf16 708 TFLOP/s (measured)"]
    assert (bandwidth["mark"]["align"], compute["mark"]["align"]) == ("left", "right")
    for unit in (line, dots):
        assert unit["encoding"]["x"]["scale"]["type"] == "log" and unit["encoding"]["y"]["scale"]["type"] == "log"
    assert dots["encoding"]["x"]["title"] == "arithmetic intensity (FLOP/byte, log)"
    assert dots["encoding"]["y"]["title"] == "achieved TFLOP/s (log)"
    assert {"layer", "output shape", "traffic (MiB)", "TFLOP/s", "GB/s", "% of floor"} <= set(tooltip_titles(dots))
    assert max(r["tflops"] for r in data_of(chart, line)) == pytest.approx(708.0)
    assert "H200" in chart.to_dict()["title"]["text"]


def test_model_error_and_predicted_vs_measured():
    points = layers_long().assign(pred_model_ms=[0.4, None, 0.3, None], pred_floor_ms=0.05,
                                  prediction=["traffic model", "roofline floor"] * 2)
    points["error_pct"] = 100 * (points["pred_model_ms"].fillna(points["pred_floor_ms"]) / points["time_ms"] - 1)
    bars, zero = layers_of(charts.model_error_bars(points).to_dict())
    assert bars["encoding"]["y"]["title"] == "prediction error (% of measured)"
    assert bars["encoding"]["opacity"]["field"] == "prediction"
    chart = charts.predicted_vs_measured(points)
    diagonal, dots = layers_of(chart.to_dict())
    assert [r["predicted_ms"] for r in data_of(chart, dots)] == pytest.approx([0.4, 0.05, 0.3, 0.05])
    ends = data_of(chart, diagonal)
    assert ends[0]["time_ms"] == ends[0]["predicted_ms"] == pytest.approx(0.05)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2**22), st.integers(0, 40), st.integers(0, 6), st.integers(0, 2**24)),
                min_size=1, max_size=20))
def test_buffer_rectangles_span_lifetime_and_bytes(specs):
    buffers = pd.DataFrame([dict(algorithm="pack_2d", name=f"b{i}", start_step=s, end_step=s + n, size_bytes=size,
                                 size_mib=size / 2**20, offset_mib=off / 2**20)
                            for i, (size, s, n, off) in enumerate(specs)])
    arena = float((buffers["offset_mib"] + buffers["size_mib"]).max())
    chart = charts.buffer_rectangles(buffers, "pack_2d", arena)
    rects, top = layers_of(chart.to_dict())
    enc = rects["encoding"]
    assert (enc["x"]["field"], enc["x2"]["field"], enc["y"]["field"], enc["y2"]["field"]) == (
        "start_step", "end_exclusive", "offset_mib", "top_mib")
    assert enc["y"]["title"] == "arena offset (MiB)" and enc["x"]["title"] == "program step"
    for row, (size, s, n, off) in zip(data_of(chart, rects), specs):
        assert row["end_exclusive"] == s + n + 1  # inclusive lifetimes drawn to the end of the last step
        assert row["top_mib"] == pytest.approx((off + size) / 2**20)
    assert {"buffer", "size (MiB)", "bytes", "offset (MiB)", "first step", "last step"} <= set(tooltip_titles(rects))
    assert data_of(chart, top) == [{"arena_mib": arena}]


def test_live_bytes_chart_marks_peak_and_bound():
    curve = pd.DataFrame({"step": [0, 1, 2, 3], "live_mib": [1.0, 3.0, 2.0, 0.5]})
    chart = charts.live_bytes_chart(curve, 3.0, {"pack_2d": 3.25, "xla": 4.0})
    area, rules, peak = layers_of(chart.to_dict())
    assert area["encoding"]["y"]["title"] == "live bytes (MiB)"
    assert data_of(chart, peak)[0]["step"] == 1 and data_of(chart, peak)[0]["live_mib"] == 3.0
    assert {(r["what"], r["mib"]) for r in data_of(chart, rules)} == {("lower bound", 3.0), ("pack_2d", 3.25),
                                                                       ("xla", 4.0)}


def test_live_bytes_chart_draws_only_the_steps_where_live_bytes_change():
    curve = pd.DataFrame({"step": range(7), "live_mib": [1.0, 1.0, 3.0, 3.0, 3.0, 0.5, 0.5]})
    chart = charts.live_bytes_chart(curve, 3.0)
    area = layers_of(chart.to_dict())[0]
    # The same step-after drawing: each change, and the last step so the curve reaches the end.
    assert [(p["step"], p["live_mib"]) for p in data_of(chart, area)] == [(0, 1.0), (2, 3.0), (5, 0.5), (6, 0.5)]


def test_arena_bars_order_and_roles():
    summary = pd.DataFrame(dict(algorithm=["pack_2d", "naive", "xla", "greedy_by_size"],
                                arena_mib=[3.0, 16.0, 6.0, 3.2], lower_bound_mib=[3.0] * 4,
                                over_bound_pct=[0, 433, 100, 6.7], saved_vs_naive_pct=[81, 0, 62, 80]))
    summary["role"] = summary["algorithm"].map(data.algorithm_role)
    chart = charts.arena_bars(summary)
    bars, bound = layers_of(chart.to_dict())
    assert bars["encoding"]["x"]["sort"] == ["naive", "greedy_by_size", "pack_2d", "xla"]
    assert bars["encoding"]["y"]["title"] == "arena (MiB)"
    assert data_of(chart, bound) == [{"lower_bound_mib": 3.0}]


def test_memory_stats_max_batch_sparsity_and_crossover_charts():
    stats = pd.DataFrame(dict(backend=["xla"], argument_mib=[2.0], output_mib=[0.1], temp_mib=[1.5], alias_mib=[0.0],
                              peak_memory_mib=[3.6]))
    unit, = layers_of(charts.memory_stats_bars(stats).to_dict())
    assert unit["encoding"]["y"]["title"] == "MiB"
    curve = pd.DataFrame(dict(model=["lenet5"] * 3, series=["not donated"] * 3, batch=[1, 2, 4],
                              peak_mib=[1.0, 1.5, 2.5]))
    chart = charts.max_batch_chart(curve, budget_mib=2.0)
    lines, budget = layers_of(chart.to_dict())
    assert lines["encoding"]["y"]["title"] == "peak memory (MiB)" and data_of(chart, budget) == [{"budget_mib": 2.0}]
    table = pd.DataFrame(dict(idx=[0], layer=["conv1"], op=["conv2d"], input_shapes=["1×8×8×3"],
                              output_shape=["1×8×8×4"], input_zero_pct=[0.0], output_zero_pct=[48.0]))
    chart = charts.sparsity_bars(table)
    unit, = layers_of(chart.to_dict())
    assert unit["encoding"]["y"]["scale"]["domain"] == [0, 100]
    assert {(r["tensor"], r["zero_pct"]) for r in data_of(chart, unit)} == {("input", 0.0), ("output", 48.0)}
    decisions = pd.DataFrame(dict(layer=["a", "b"], input_zero_pct=[20.0, 80.0], dense_ms=[1.0, 1.0],
                                  sparse_ms=[1.5, 0.5], sparse_over_dense=[1.5, 0.5], decision=["dense", "sparse"]))
    chart = charts.crossover_chart(decisions, 50.0)
    dots, one, crossing = layers_of(chart.to_dict())
    assert dots["encoding"]["y"]["scale"]["type"] == "log" and data_of(chart, crossing) == [{"x": 50.0}]
    assert len(layers_of(charts.crossover_chart(decisions, None).to_dict())) == 2


def test_donation_bars_show_saved_mib_per_model_and_batch():
    savings = pd.DataFrame(dict(run_id=[1, 2], model=["vgg16", "vgg16"], batch=[1, 64],
                                undonated_peak_mib=[3194.5, 10470.8], donated_peak_mib=[1764.6, 9193.4],
                                donated_mib=[1583.4, 1583.4], saved_mib=[1429.9, 1277.3], saved_pct=[44.8, 12.2],
                                label=["vgg16 b1", "vgg16 b64"]))
    chart = charts.donation_bars(savings)
    spec = chart.to_dict()
    assert spec["encoding"]["y"]["field"] == "saved_mib" and spec["encoding"]["y"]["title"] == "peak saved by donation (MiB)"
    assert spec["encoding"]["xOffset"]["field"] == "batch"
    assert {(r["batch"], r["saved_mib"]) for r in data_of(chart, spec)} == {(1, 1429.9), (64, 1277.3)}


def every_chart(source: str | None) -> dict[str, dict]:
    """One spec of every chart function, made with `source`."""
    long = layers_long()
    wide = data.speedup_table(long)
    points = long.assign(flop_per_byte=500.0, tflops=1.0, gb_per_s=2.0, pred_floor_ms=0.1, pct_of_floor=20.0,
                         pred_model_ms=0.3, prediction="traffic model", error_pct=5.0)
    ceilings = data.Ceilings("H200", "bf16", 3.97e12, 708e12, "measured", "measured")
    e2e = pd.DataFrame(dict(backend=["xla", "jaxcnn"], metric=["device_time_ms"] * 2, what=["device time"] * 2,
                            time_ms=[1.0, 2.0], p10_ms=[0.9, 1.9], p90_ms=[1.1, 2.1], n=[10, 10]))
    compare = pd.DataFrame(dict(layer=["conv0"], idx=[0], op=["conv2d"], backend=["xla"], a_ms=[1.0], b_ms=[0.5],
                                b_over_a=[0.5]))
    buffers = pd.DataFrame(dict(algorithm=["pack_2d"], name=["b0"], start_step=[0], end_step=[2], size_bytes=[2**20],
                                size_mib=[1.0], offset_mib=[0.0]))
    summary = pd.DataFrame(dict(algorithm=["pack_2d", "naive"], arena_mib=[1.0, 2.0], lower_bound_mib=[1.0, 1.0],
                                over_bound_pct=[0.0, 100.0], saved_vs_naive_pct=[50.0, 0.0], role=["ours", "naive"]))
    sparsity = pd.DataFrame(dict(idx=[0], layer=["conv1"], op=["conv2d"], input_shapes=["1×8×8×3"],
                                 output_shape=["1×8×8×4"], input_zero_pct=[0.0], output_zero_pct=[48.0]))
    decisions = pd.DataFrame(dict(layer=["a", "b"], input_zero_pct=[20.0, 80.0], dense_ms=[1.0, 1.0],
                                  sparse_ms=[1.5, 0.5], sparse_over_dense=[1.5, 0.5], decision=["dense", "sparse"]))
    charts_made = {
        "layer_time_bars": charts.layer_time_bars(long, source=source),
        "speedup_bars": charts.speedup_bars(wide, source=source),
        "end_to_end_bars": charts.end_to_end_bars(e2e, source=source),
        "compare_bars": charts.compare_bars(compare, "#14 mobilenetv2 b64 bfloat16 · NVIDIA H200 · profile",
                                            "#13 mobilenetv2 b1 bfloat16 · NVIDIA H200 · profile", source=source),
        "roofline_chart": charts.roofline_chart(points, data.ceiling_lines(ceilings, 1, 1e4), ceilings, source=source),
        "model_error_bars": charts.model_error_bars(points, source=source),
        "predicted_vs_measured": charts.predicted_vs_measured(points, source=source),
        "buffer_rectangles": charts.buffer_rectangles(buffers, "pack_2d", 1.0, source=source),
        "live_bytes_chart": charts.live_bytes_chart(pd.DataFrame({"step": [0, 1], "live_mib": [1.0, 0.5]}), 1.0,
                                                    source=source),
        "arena_bars": charts.arena_bars(summary, source=source),
        "memory_stats_bars": charts.memory_stats_bars(pd.DataFrame(dict(backend=["xla"], temp_mib=[1.0])),
                                                      source=source),
        "donation_bars": charts.donation_bars(pd.DataFrame(dict(model=["m"], batch=[1], saved_mib=[1.0])),
                                              source=source),
        "max_batch_chart": charts.max_batch_chart(pd.DataFrame(dict(model=["m"], series=["s"], batch=[1],
                                                                    peak_mib=[1.0])), source=source),
        "sparsity_bars": charts.sparsity_bars(sparsity, source=source),
        "crossover_chart": charts.crossover_chart(decisions, 50.0, source=source),
    }
    return {name: chart.to_dict() for name, chart in charts_made.items()}


def test_every_chart_title_names_its_source_and_is_never_cut():
    specs = every_chart("shipped")
    public = {name for name in dir(charts) if not name.startswith("_") and callable(getattr(charts, name))
              and getattr(charts, name).__module__ == charts.__name__} - {"chart_title"}
    assert public == set(specs)  # a new chart function must be added here
    for name, spec in specs.items():
        title = spec["title"]
        assert title["subtitle"] == "source: shipped", name
        lines = title["text"] if isinstance(title["text"], list) else [title["text"]]
        assert all(0 < len(line) <= charts.TITLE_LINE_CHARS for line in lines), (name, lines)
        if "facet" not in spec:
            # Width fits the page; the height grows by labels and title instead of squeezing them out.
            assert spec["autosize"] == {"type": "fit-x", "contains": "padding"}, name
    # Run vs run names both runs in full, each on its own line.
    assert specs["compare_bars"]["title"]["text"][1:] == [
        "A = #14 mobilenetv2 b64 bfloat16 · NVIDIA H200 · profile", "B = #13 mobilenetv2 b1 bfloat16 · NVIDIA H200 · profile"]
    assert all("subtitle" not in spec["title"] for spec in every_chart(None).values())


@settings(max_examples=30, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cc", "Cs", "Zs"]) | st.just(" "),
               min_size=1, max_size=400))
def test_long_titles_wrap_without_losing_text(text):
    title = charts.chart_title(text).to_dict()
    lines = title["text"] if isinstance(title["text"], list) else [title["text"]]
    assert all(len(line) <= charts.TITLE_LINE_CHARS for line in lines)
    assert "".join("".join(lines).split()) == "".join(text.split())  # only whitespace may move
