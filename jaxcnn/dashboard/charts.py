"""Charts of the dashboard: small pure functions from jaxcnn.dashboard.data frames to Altair charts.

Each returns an ``alt.Chart`` (or layer/concat) built from its arguments only, so tests can
check ``chart.to_dict()``: encodings, units in axis titles, tooltips. Axis titles always carry the
unit; tooltips carry the layer name, shapes and bytes where the frame has them; the title's
subtitle says where the numbers come from (`source`, jaxcnn.dashboard.data's labels).
"""

from __future__ import annotations

import textwrap

import altair as alt
import pandas as pd

# Same colour for a backend on every chart.
BACKEND_COLORS = {"xla": "#4c78a8", "jaxcnn": "#f58518"}
# Room above the plot: without it Streamlit's frame clips the top of some chart titles.
_PADDING = {"top": 14, "left": 5, "right": 5, "bottom": 5}
# Streamlit fits a chart that names no autosize into its height as a whole: long axis labels
# then squeeze the plot to a sliver and push the title out of the frame. fit-x fits the width
# to the page and lets the height grow by the labels and the title.
_AUTOSIZE = alt.AutoSizeParams(type="fit-x", contains="padding")
TITLE_LINE_CHARS = 90  # a title line longer than this is wrapped (a title is never cut short)
ALGORITHM_ORDER = ("naive", "greedy_by_size", "best_fit_decreasing", "pack_2d", "xla")


def _backend_color(backends, title: str = "backend") -> alt.Color:
    names = sorted(set(backends), key=lambda b: (b not in BACKEND_COLORS, b))
    palette = ["#54a24b", "#e45756", "#72b7b2", "#b279a2", "#9d755d"]
    colors = [BACKEND_COLORS.get(b) or palette[i % len(palette)] for i, b in enumerate(names)]
    return alt.Color("backend:N", title=title, scale=alt.Scale(domain=names, range=colors))


def chart_title(text: str | list[str], source: str | None = None) -> alt.TitleParams:
    """The title, wrapped to TITLE_LINE_CHARS per line, with 'source: ...' as its subtitle."""
    lines = [text] if isinstance(text, str) else list(text)
    wrapped = [part for line in lines for part in textwrap.wrap(line, TITLE_LINE_CHARS) or [""]]
    return alt.TitleParams(wrapped if len(wrapped) > 1 else wrapped[0], anchor="start",
                           subtitle=f"source: {source}" if source else alt.Undefined)


def _framed(chart, title: str | list[str], height: int, source: str | None):
    """A single-view or layered chart with its title, source, plot height and sizing; each view
    carries only the columns it draws."""
    return _drawn_columns_only(chart).properties(title=chart_title(title, source), height=height, padding=_PADDING,
                                                autosize=_AUTOSIZE)


def _encoded_fields(encoding: object) -> set[str]:
    """Every field name an encoding (as a dict, nested channels and tooltips included) refers to."""
    if isinstance(encoding, list):
        return set().union(*map(_encoded_fields, encoding)) if encoding else set()
    if not isinstance(encoding, dict):
        return set()
    found = {encoding["field"]} if isinstance(encoding.get("field"), str) else set()
    return found.union(*map(_encoded_fields, encoding.values()))


def _drawn_columns_only(chart):
    """`chart` with each view's DataFrame cut to the columns its encoding uses (marks and
    tooltips): the rest of a frame (shapes, other backends' columns) would only be sent to the
    browser and decoded there. Views with transforms keep their data whole."""
    if isinstance(chart, alt.LayerChart):
        chart.layer = [_drawn_columns_only(view) for view in chart.layer]
    elif (isinstance(chart, alt.Chart) and isinstance(chart.data, pd.DataFrame)
          and chart.encoding is not alt.Undefined and chart.transform is alt.Undefined):
        used = _encoded_fields(chart.encoding.to_dict(validate=False))
        chart.data = chart.data[[c for c in chart.data.columns if c in used]]
    return chart


def _layer_tooltip(frame: pd.DataFrame, *extra: alt.Tooltip) -> list[alt.Tooltip]:
    """Layer identity and size first, then the chart's own values."""
    tips = [alt.Tooltip("layer:N", title="layer")]
    for column, title, fmt in (("op", "op", None), ("input_shapes", "input shape", None),
                               ("weight_shape", "weight shape", None), ("output_shape", "output shape", None),
                               ("gflop", "GFLOP", ".4g"), ("mib", "traffic (MiB)", ".4g")):
        if column in frame.columns:
            tips.append(alt.Tooltip(f"{column}:{'Q' if fmt else 'N'}", title=title, **({"format": fmt} if fmt else {})))
    return tips + list(extra)


def _layer_axis(frame: pd.DataFrame) -> alt.X:
    """Layers along x in program order."""
    order = frame.sort_values("idx")["layer"].drop_duplicates().tolist()
    return alt.X("layer:N", sort=order, title="layer (program order)", axis=alt.Axis(labelAngle=-60, labelLimit=140))


def layer_time_bars(long: pd.DataFrame, metric: str = "device_time_ms", source: str | None = None) -> alt.Chart:
    """Per-layer time of each backend side by side (grouped bars), ms."""
    what = "device time" if metric == "device_time_ms" else "host wall time"
    chart = alt.Chart(long).mark_bar().encode(
        x=_layer_axis(long),
        xOffset=alt.XOffset("backend:N"),
        y=alt.Y("time_ms:Q", title=f"{what} (ms)"),
        color=_backend_color(long["backend"]),
        tooltip=_layer_tooltip(long, alt.Tooltip("backend:N"), alt.Tooltip("time_ms:Q", title=f"{what} (ms)", format=".4f"),
                               alt.Tooltip("variant:N", title="kernel / variant")),
    )
    return _framed(chart, f"Per-layer {what}, ms", 320, source)


def speedup_bars(wide: pd.DataFrame, baseline: str = "xla", candidate: str = "jaxcnn",
                 source: str | None = None) -> alt.LayerChart:
    """speedup = baseline time / candidate time per layer; a rule at 1x. Green: candidate faster."""
    frame = wide.dropna(subset=["speedup"]).assign(one=1.0, faster=lambda f: f["speedup"].ge(1).map(
        {True: f"{candidate} faster", False: f"{baseline} faster"}))
    # On a log axis a bar cannot start at 0: each bar runs from 1× to its speedup, up or down.
    bars = alt.Chart(frame).mark_bar().encode(
        x=_layer_axis(frame),
        y=alt.Y("speedup:Q", title=f"speedup ({baseline} ms / {candidate} ms, ×)", scale=alt.Scale(type="log")),
        y2="one:Q",
        color=alt.Color("faster:N", title="", scale=alt.Scale(
            domain=[f"{candidate} faster", f"{baseline} faster"], range=["#54a24b", "#e45756"])),
        tooltip=_layer_tooltip(frame, alt.Tooltip("speedup:Q", title="speedup (×)", format=".3f"),
                               *[alt.Tooltip(f"{b}_ms:Q", title=f"{b} (ms)", format=".4f")
                                 for b in (baseline, candidate) if f"{b}_ms" in frame.columns],
                               *[alt.Tooltip(f"{b}_variant:N", title=f"{b} kernel")
                                 for b in (baseline, candidate) if f"{b}_variant" in frame.columns]),
    )
    one = alt.Chart(pd.DataFrame({"speedup": [1.0]})).mark_rule(strokeDash=[4, 3], color="black").encode(y="speedup:Q")
    return _framed(bars + one, f"Speedup of {candidate} over {baseline} per layer (log scale, ×)", 300, source)


def end_to_end_bars(e2e: pd.DataFrame, source: str | None = None) -> alt.LayerChart:
    """Whole-model device time and host latency per backend, ms, with p10-p90 whiskers."""
    base = alt.Chart(e2e)
    bars = base.mark_bar().encode(
        x=alt.X("backend:N", title=None), y=alt.Y("time_ms:Q", title="time (ms)"),
        color=_backend_color(e2e["backend"]),
        tooltip=[alt.Tooltip("backend:N"), alt.Tooltip("what:N", title="measure"),
                 alt.Tooltip("time_ms:Q", title="median (ms)", format=".4f"),
                 alt.Tooltip("p10_ms:Q", title="p10 (ms)", format=".4f"), alt.Tooltip("p90_ms:Q", title="p90 (ms)", format=".4f"),
                 alt.Tooltip("n:Q", title="samples")],
    )
    whiskers = base.mark_rule(color="black").encode(x="backend:N", y="p10_ms:Q", y2="p90_ms:Q")
    # Faceted: Streamlit sizes it by its content (pad) and leaves the autosize alone.
    return alt.layer(bars, whiskers).properties(width=180, height=240).facet(
        column=alt.Column("what:N", title=None)).resolve_scale(y="independent").properties(
        title=chart_title("Whole-model time per backend, ms (median, p10-p90)", source), padding=_PADDING)


def compare_bars(table: pd.DataFrame, label_a: str, label_b: str, source: str | None = None) -> alt.LayerChart:
    """Per-layer ratio run B / run A of each backend (log scale; <1: B faster)."""
    frame = table.dropna(subset=["b_over_a"]).assign(one=1.0)
    bars = alt.Chart(frame).mark_bar().encode(
        x=alt.X("layer:N", sort=frame.sort_values("idx")["layer"].drop_duplicates().tolist(),
                title="layer (program order)", axis=alt.Axis(labelAngle=-60, labelLimit=140)),
        xOffset="backend:N",
        y=alt.Y("b_over_a:Q", title="time B / time A (×, log)", scale=alt.Scale(type="log")),
        y2="one:Q",  # bars from 1× (log axis)
        color=_backend_color(frame["backend"]),
        tooltip=[alt.Tooltip("layer:N"), alt.Tooltip("op:N"), alt.Tooltip("backend:N"),
                 alt.Tooltip("a_ms:Q", title="A (ms)", format=".4f"), alt.Tooltip("b_ms:Q", title="B (ms)", format=".4f"),
                 alt.Tooltip("b_over_a:Q", title="B / A (×)", format=".3f")],
    )
    one = alt.Chart(pd.DataFrame({"b_over_a": [1.0]})).mark_rule(strokeDash=[4, 3], color="black").encode(y="b_over_a:Q")
    return _framed(bars + one, ["Time of run B / run A per layer (log scale, ×)", f"A = {label_a}",
                                f"B = {label_b}"], 300, source)


def roofline_chart(points: pd.DataFrame, roof: pd.DataFrame, ceilings, source: str | None = None) -> alt.LayerChart:
    """Layers as points (achieved TFLOP/s against FLOP/byte, log-log) under the GPU's roof
    (`roof` from data.ceiling_lines, `ceilings` a data.Ceilings), both ceilings labelled."""
    x = alt.X("flop_per_byte:Q", title="arithmetic intensity (FLOP/byte, log)", scale=alt.Scale(type="log"))
    y = alt.Y("tflops:Q", title="achieved TFLOP/s (log)", scale=alt.Scale(type="log"))
    line = alt.Chart(roof).mark_line(color="black").encode(
        x=x, y=y, tooltip=[alt.Tooltip("flop_per_byte:Q", title="FLOP/byte", format=".3g"),
                           alt.Tooltip("tflops:Q", title="ceiling (TFLOP/s)", format=".4g")])
    first, last = roof.iloc[0], roof.iloc[-1]
    labels = pd.DataFrame({
        "flop_per_byte": [first["flop_per_byte"], last["flop_per_byte"]],
        "tflops": [first["tflops"], last["tflops"]],
        "text": [f"DRAM {ceilings.memory_bytes_per_s / 1e12:.2f} TB/s ({ceilings.memory_source})",
                 f"{ceilings.precision} {ceilings.compute_flops_per_s / 1e12:.0f} TFLOP/s ({ceilings.compute_source})"],
    })
    # The bandwidth label starts at the left end of the slope, the compute label ends at the right.
    text = alt.layer(*[alt.Chart(labels.iloc[[i]]).mark_text(dy=-10, fontSize=12, align=align).encode(
        x=x, y=y, text="text:N") for i, align in enumerate(("left", "right"))])
    dots = alt.Chart(points).mark_point(size=70, opacity=0.85, filled=True).encode(
        x=x, y=y, color=_backend_color(points["backend"]), shape=alt.Shape("op:N", title="op"),
        tooltip=_layer_tooltip(points, alt.Tooltip("backend:N"), alt.Tooltip("variant:N", title="kernel / variant"),
                               alt.Tooltip("time_ms:Q", title="measured (ms)", format=".4f"),
                               alt.Tooltip("tflops:Q", title="TFLOP/s", format=".3g"),
                               alt.Tooltip("gb_per_s:Q", title="GB/s", format=".4g"),
                               alt.Tooltip("pred_floor_ms:Q", title="roofline floor (ms)", format=".4f"),
                               alt.Tooltip("pct_of_floor:Q", title="% of floor", format=".1f")),
    )
    return _framed(line + text + dots, f"Roofline of {ceilings.gpu} ({ceilings.precision} compute ceiling, DRAM "
                                       "bandwidth)", 420, source)


def model_error_bars(points: pd.DataFrame, source: str | None = None) -> alt.LayerChart:
    """Signed error of the prediction per layer and backend, % of the measured time."""
    frame = points.dropna(subset=["error_pct"])
    bars = alt.Chart(frame).mark_bar().encode(
        x=_layer_axis(frame), xOffset="backend:N",
        y=alt.Y("error_pct:Q", title="prediction error (% of measured)"),
        color=_backend_color(frame["backend"]),
        opacity=alt.Opacity("prediction:N", title="predicted by", scale=alt.Scale(
            domain=["traffic model", "roofline floor"], range=[1.0, 0.35])),
        tooltip=_layer_tooltip(frame, alt.Tooltip("backend:N"), alt.Tooltip("prediction:N", title="predicted by"),
                               alt.Tooltip("time_ms:Q", title="measured (ms)", format=".4f"),
                               alt.Tooltip("pred_model_ms:Q", title="traffic model (ms)", format=".4f"),
                               alt.Tooltip("pred_floor_ms:Q", title="roofline floor (ms)", format=".4f"),
                               alt.Tooltip("error_pct:Q", title="error (%)", format=".1f")),
    )
    zero = alt.Chart(pd.DataFrame({"error_pct": [0.0]})).mark_rule(color="black").encode(y="error_pct:Q")
    return _framed(bars + zero, "Model error per layer, % (negative: predicted faster than measured)", 300, source)


def predicted_vs_measured(points: pd.DataFrame, source: str | None = None) -> alt.LayerChart:
    """Predicted against measured time (log-log) with the y = x diagonal."""
    frame = points.assign(predicted_ms=points["pred_model_ms"].fillna(points["pred_floor_ms"])).dropna(
        subset=["predicted_ms"])
    lo = float(min(frame["predicted_ms"].min(), frame["time_ms"].min())) if len(frame) else 1e-3
    hi = float(max(frame["predicted_ms"].max(), frame["time_ms"].max())) if len(frame) else 1.0
    scale = alt.Scale(type="log")
    diagonal = alt.Chart(pd.DataFrame({"time_ms": [lo, hi], "predicted_ms": [lo, hi]})).mark_line(
        color="gray", strokeDash=[4, 3]).encode(x="time_ms:Q", y="predicted_ms:Q")
    dots = alt.Chart(frame).mark_point(size=60, opacity=0.85, filled=True).encode(
        x=alt.X("time_ms:Q", title="measured device time (ms, log)", scale=scale),
        y=alt.Y("predicted_ms:Q", title="predicted time (ms, log)", scale=scale),
        color=_backend_color(frame["backend"]),
        shape=alt.Shape("prediction:N", title="predicted by"),
        tooltip=_layer_tooltip(frame, alt.Tooltip("backend:N"), alt.Tooltip("prediction:N", title="predicted by"),
                               alt.Tooltip("time_ms:Q", title="measured (ms)", format=".4f"),
                               alt.Tooltip("predicted_ms:Q", title="predicted (ms)", format=".4f")),
    )
    return _framed(diagonal + dots, "Predicted vs measured per layer (ms)", 360, source)


def buffer_rectangles(buffers: pd.DataFrame, algorithm: str, arena_mib: float | None = None,
                      source: str | None = None) -> alt.LayerChart:
    """One plan's buffers as rectangles: program step (x, inclusive lifetimes) × arena offset (y, MiB)."""
    frame = buffers.assign(end_exclusive=buffers["end_step"] + 1,
                           top_mib=buffers["offset_mib"] + buffers["size_mib"])
    rects = alt.Chart(frame).mark_rect(stroke="white", strokeWidth=0.3).encode(
        x=alt.X("start_step:Q", title="program step"), x2="end_exclusive:Q",
        y=alt.Y("offset_mib:Q", title="arena offset (MiB)"), y2="top_mib:Q",
        color=alt.Color("size_mib:Q", title="size (MiB)", scale=alt.Scale(scheme="viridis")),
        tooltip=[alt.Tooltip("name:N", title="buffer"), alt.Tooltip("size_mib:Q", title="size (MiB)", format=".4f"),
                 alt.Tooltip("size_bytes:Q", title="bytes", format=","),
                 alt.Tooltip("offset_mib:Q", title="offset (MiB)", format=".4f"),
                 alt.Tooltip("start_step:Q", title="first step"), alt.Tooltip("end_step:Q", title="last step")],
    )
    layers = [rects]
    if arena_mib is not None:
        top = alt.Chart(pd.DataFrame({"arena_mib": [arena_mib]})).mark_rule(color="red").encode(
            y="arena_mib:Q", tooltip=[alt.Tooltip("arena_mib:Q", title="arena (MiB)", format=".3f")])
        layers.append(top)
    title = f"{algorithm}: buffers by lifetime × offset" + (f" (arena {arena_mib:.2f} MiB)" if arena_mib is not None else "")
    return _framed(alt.layer(*layers), title, 260, source)


def live_bytes_chart(curve: pd.DataFrame, lower_bound_mib: float, arenas: dict[str, float] | None = None,
                     source: str | None = None) -> alt.LayerChart:
    """Live MiB over program order, the lower bound (its max) marked, and each plan's arena as a rule."""
    # A step-after curve needs a point only where the value changes (and its last step): the
    # same drawing with fewer points for the browser.
    if len(curve):
        changes = curve["live_mib"].ne(curve["live_mib"].shift())
        changes.iloc[-1] = True
        curve = curve[changes]
    area = alt.Chart(curve).mark_area(line=True, opacity=0.35, interpolate="step-after").encode(
        x=alt.X("step:Q", title="program step"), y=alt.Y("live_mib:Q", title="live bytes (MiB)"),
        tooltip=[alt.Tooltip("step:Q", title="step"), alt.Tooltip("live_mib:Q", title="live (MiB)", format=".3f")])
    peak_step = int(curve.loc[curve["live_mib"].idxmax(), "step"]) if len(curve) else 0
    peak = alt.Chart(pd.DataFrame({"step": [peak_step], "live_mib": [lower_bound_mib],
                                   "label": [f"peak = lower bound {lower_bound_mib:.2f} MiB"]})).mark_point(
        color="red", size=120, filled=True).encode(x="step:Q", y="live_mib:Q", tooltip=["label:N"])
    rules = pd.DataFrame({"what": ["lower bound", *(arenas or {})],
                          "mib": [lower_bound_mib, *(arenas or {}).values()]})
    lines = alt.Chart(rules).mark_rule(strokeDash=[5, 3]).encode(
        y="mib:Q", color=alt.Color("what:N", title="arena of"),
        tooltip=[alt.Tooltip("what:N", title="plan"), alt.Tooltip("mib:Q", title="MiB", format=".3f")])
    return _framed(area + lines + peak, "Live bytes over program order (MiB)", 300, source)


def arena_bars(summary: pd.DataFrame, source: str | None = None) -> alt.LayerChart:
    """Arena per algorithm (MiB) with the lower bound as a rule; colour by naive / peer / ours / XLA."""
    order = [a for a in ALGORITHM_ORDER if a in set(summary["algorithm"])] + sorted(
        set(summary["algorithm"]) - set(ALGORITHM_ORDER))
    bars = alt.Chart(summary).mark_bar().encode(
        x=alt.X("algorithm:N", sort=order, title=None, axis=alt.Axis(labelAngle=0)),
        y=alt.Y("arena_mib:Q", title="arena (MiB)"),
        color=alt.Color("role:N", title="", scale=alt.Scale(domain=["naive", "peer", "ours", "XLA"],
                                                           range=["#bab0ac", "#4c78a8", "#f58518", "#54a24b"])),
        tooltip=[alt.Tooltip("algorithm:N"), alt.Tooltip("arena_mib:Q", title="arena (MiB)", format=".3f"),
                 alt.Tooltip("over_bound_pct:Q", title="over lower bound (%)", format=".1f"),
                 alt.Tooltip("saved_vs_naive_pct:Q", title="saved vs naive (%)", format=".1f")],
    )
    bound = float(summary["lower_bound_mib"].max())
    rule = alt.Chart(pd.DataFrame({"lower_bound_mib": [bound]})).mark_rule(color="red", strokeDash=[5, 3]).encode(
        y="lower_bound_mib:Q", tooltip=[alt.Tooltip("lower_bound_mib:Q", title="lower bound (MiB)", format=".3f")])
    return _framed(bars + rule, "Arena per packing algorithm (MiB); red: live-bytes lower bound", 280, source)


def memory_stats_bars(stats: pd.DataFrame, source: str | None = None) -> alt.Chart:
    """XLA's memory_analysis per backend (MiB): arguments, outputs, temporaries, aliased, XLA's
    peak and the footprint (argument + output - alias + temp) where the frame has it."""
    parts = [c for c in ("argument_mib", "output_mib", "temp_mib", "alias_mib", "peak_memory_mib", "footprint_mib")
             if c in stats.columns]
    long = stats.melt(id_vars="backend", value_vars=parts, var_name="part", value_name="mib")
    long["part"] = long["part"].str.replace("_mib", "").str.replace("_", " ")
    chart = alt.Chart(long).mark_bar().encode(
        x=alt.X("part:N", title=None, sort=[p.replace("_mib", "").replace("_", " ") for p in parts]),
        xOffset="backend:N", y=alt.Y("mib:Q", title="MiB"), color=_backend_color(long["backend"]),
        tooltip=[alt.Tooltip("backend:N"), alt.Tooltip("part:N"), alt.Tooltip("mib:Q", title="MiB", format=".3f")],
    )
    return _framed(chart, "XLA memory_analysis of the compiled model (MiB)", 260, source)


def donation_bars(savings: pd.DataFrame, source: str | None = None) -> alt.Chart:
    """Peak MiB saved by donation per model, one bar per batch (the table has the small ones)."""
    chart = alt.Chart(savings).mark_bar().encode(
        x=alt.X("model:N", title=None, axis=alt.Axis(labelAngle=0)), xOffset="batch:N",
        y=alt.Y("saved_mib:Q", title="peak saved by donation (MiB)"),
        color=alt.Color("batch:N", title="batch"),
        tooltip=[alt.Tooltip("model:N"), alt.Tooltip("batch:Q"),
                 alt.Tooltip("undonated_peak_mib:Q", title="peak, not donated (MiB)", format=".2f"),
                 alt.Tooltip("donated_peak_mib:Q", title="peak, donated (MiB)", format=".2f"),
                 alt.Tooltip("donated_mib:Q", title="donated arguments (MiB)", format=".2f"),
                 alt.Tooltip("saved_mib:Q", title="saved (MiB)", format=".2f"),
                 alt.Tooltip("saved_pct:Q", title="saved (% of peak)", format=".1f")],
    )
    return _framed(chart, "Peak memory saved by buffer donation (MiB)", 260, source)


def max_batch_chart(curve: pd.DataFrame, budget_mib: float | None = None, source: str | None = None) -> alt.LayerChart:
    """Peak MiB against batch per series; the budget as a rule when given."""
    lines = alt.Chart(curve).mark_line(point=True).encode(
        x=alt.X("batch:Q", title="batch"), y=alt.Y("peak_mib:Q", title="peak memory (MiB)"),
        color=alt.Color("series:N", title="", legend=alt.Legend(labelLimit=400)),
        strokeDash=alt.StrokeDash("model:N", legend=None),  # the model is in the tooltip (and series names)
        tooltip=[alt.Tooltip("model:N"), alt.Tooltip("series:N"), alt.Tooltip("batch:Q"),
                 alt.Tooltip("peak_mib:Q", title="peak (MiB)", format=".2f")])
    layers = [lines]
    if budget_mib is not None:
        layers.append(alt.Chart(pd.DataFrame({"budget_mib": [budget_mib]})).mark_rule(color="red").encode(
            y="budget_mib:Q", tooltip=[alt.Tooltip("budget_mib:Q", title="budget (MiB)", format=".1f")]))
    return _framed(alt.layer(*layers), "Peak memory against batch (MiB)", 300, source)


def sparsity_bars(table: pd.DataFrame, source: str | None = None) -> alt.Chart:
    """Zero fraction of each layer's input and output activation, %."""
    long = table.melt(id_vars=["idx", "layer", "op", "input_shapes", "output_shape"],
                      value_vars=["input_zero_pct", "output_zero_pct"], var_name="tensor", value_name="zero_pct")
    long["tensor"] = long["tensor"].map({"input_zero_pct": "input", "output_zero_pct": "output"})
    chart = alt.Chart(long).mark_bar().encode(
        x=_layer_axis(long), xOffset="tensor:N",
        y=alt.Y("zero_pct:Q", title="zeros (% of elements)", scale=alt.Scale(domain=[0, 100])),
        color=alt.Color("tensor:N", title="activation"),
        tooltip=_layer_tooltip(long, alt.Tooltip("tensor:N", title="activation"),
                               alt.Tooltip("zero_pct:Q", title="zeros (%)", format=".1f")),
    )
    return _framed(chart, "Activation sparsity per layer (% zeros)", 300, source)


def crossover_chart(decisions: pd.DataFrame, crossover_pct: float | None, source: str | None = None) -> alt.LayerChart:
    """sparse/dense time ratio against input zero %, one point per layer; 1x rule and the crossover."""
    dots = alt.Chart(decisions).mark_circle(size=70).encode(
        x=alt.X("input_zero_pct:Q", title="input zeros (%)", scale=alt.Scale(domain=[0, 100])),
        y=alt.Y("sparse_over_dense:Q", title="sparse time / dense time (×, log)", scale=alt.Scale(type="log")),
        color=alt.Color("decision:N", title="faster", scale=alt.Scale(domain=["dense", "sparse"],
                                                                       range=["#4c78a8", "#f58518"])),
        tooltip=[alt.Tooltip("layer:N"), alt.Tooltip("input_zero_pct:Q", title="input zeros (%)", format=".1f"),
                 alt.Tooltip("dense_ms:Q", title="dense (ms)", format=".4f"),
                 alt.Tooltip("sparse_ms:Q", title="sparse (ms)", format=".4f"), alt.Tooltip("decision:N")])
    layers = [dots, alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[4, 3]).encode(y="y:Q")]
    if crossover_pct is not None:
        layers.append(alt.Chart(pd.DataFrame({"x": [crossover_pct]})).mark_rule(color="red").encode(
            x="x:Q", tooltip=[alt.Tooltip("x:Q", title="measured crossover (% zeros)", format=".1f")]))
    return _framed(alt.layer(*layers), "Dense vs sparse kernel time against activation sparsity", 300, source)
