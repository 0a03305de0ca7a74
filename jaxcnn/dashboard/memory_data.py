"""Memory frames of a run: XLA's memory statistics and what its peak sums, the planner's
arenas and buffers, bytes live per step, donation savings and peak bytes against batch.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from jaxcnn.dashboard.sources import MIB, NoData, _present, _sql, _text
from jaxcnn.store import Store

# How plan and profile runs name their memory numbers (jaxcnn.memory; profile's memory_analysis).
MEMORY_STAT_METRICS = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes",
                       "generated_code_bytes", "peak_memory_bytes")
PLAN_HINT = "run `jaxcnn plan MODEL --db DB` to record memory plans"  # what a run without plans needs
# What each column of memory_stats holds, for the Memory page's notes.
MEMORY_QUANTITIES = {
    "argument_mib": "the call's inputs (parameters and batch) as XLA holds them",
    "output_mib": "the call's results",
    "alias_mib": "outputs written into donated inputs: counted in both argument and output",
    "temp_mib": "the size of the one buffer XLA packs the program's intermediates into (its temp allocation, "
                "gaps between packed buffers included)",
    "peak_memory_mib": "XLA's own peak: the most bytes its buffer assignment holds live at once (see its "
                       "formula per backend below)",
    "generated_code_mib": "the compiled program's own code, as XLA reports it (not part of the footprint)",
    "footprint_mib": "argument + output - alias + temp: what one call needs if every buffer is allocated at once "
                     "(what jaxcnn.memory calls a compiled program's peak)",
}
MEMORY_ARENA_NOTE = ("The arenas of the Arena packing section are the jaxcnn planner's packings of the program's "
                     "own buffers (jaxpr or compiled HLO) into one block; the lower bound is the most bytes live at "
                     "once, which no packing can beat. XLA's temp size is XLA's packing of its intermediates.")


def memory_stats(store: Store, run_id: int) -> pd.DataFrame:
    """XLA's compiled memory_analysis of the whole model per backend (profile runs), in MiB, with
    footprint_mib (argument + output - alias + temp) and which sum XLA's peak is (peak_is)."""
    rows = store.measurements(int(run_id))
    rows = rows[rows["layer_id"].isna() & rows["metric"].isin(MEMORY_STAT_METRICS)]
    if rows.empty:
        raise NoData(f"run {run_id} has no memory statistics")
    wide = rows.pivot_table(index="backend", columns="metric", values="median", aggfunc="last") / MIB
    wide.columns = [c.replace("_bytes", "_mib") for c in wide.columns]
    wide = wide.reset_index()
    parts = [wide[c] if c in wide.columns else 0.0 for c in ("argument_mib", "output_mib", "alias_mib", "temp_mib")]
    wide["footprint_mib"] = parts[0] + parts[1] - parts[2] + parts[3]
    wide["peak_is"] = [peak_formula(r) for r in wide.to_dict("records")]
    return wide


# Within this fraction a recorded peak equals a sum of the other quantities (MiB rounding aside).
_PEAK_MATCH = 0.01


def peak_formula(stats: dict[str, Any]) -> str:
    """Which sum of a backend's memory_analysis XLA's peak equals, in words. XLA's GPU backend
    computes the peak over every buffer (argument + output - alias + temp on these programs);
    its CPU backend leaves the temp allocation out (argument + output), so there the peak can
    be below the temp size."""
    peak = stats.get("peak_memory_mib")
    if not _present(peak):
        return "no peak recorded"
    value = {k: float(stats.get(k) or 0.0) for k in ("argument_mib", "output_mib", "alias_mib", "temp_mib")}
    candidates = {
        "argument + output - alias + temp": value["argument_mib"] + value["output_mib"] - value["alias_mib"]
        + value["temp_mib"],
        "argument + output - alias (temp not counted)": value["argument_mib"] + value["output_mib"]
        - value["alias_mib"],
    }
    for formula, total in candidates.items():
        if abs(total - peak) <= _PEAK_MATCH * max(abs(peak), 1e-9):
            return formula
    full = next(iter(candidates.values()))
    return ("below argument + output - alias + temp: XLA's schedule never holds all of it live at once"
            if peak < full else "above argument + output - alias + temp")


def plan_summary(store: Store, run_id: int) -> pd.DataFrame:
    """Each algorithm's arena against the lower bound and naive (no reuse), in MiB."""
    plans = store.plans(int(run_id))
    if plans.empty:
        raise NoData(f"run {run_id} has no memory plans: {PLAN_HINT}")
    summary = pd.DataFrame({
        "algorithm": plans["algorithm"],
        "arena_mib": plans["arena_bytes"].astype("float64") / MIB,
        "lower_bound_mib": plans["lower_bound_bytes"].astype("float64") / MIB,
        "buffers": plans["n_buffers"].astype("int64"),
        "seconds": plans["seconds"].astype("float64"),
    })
    summary["over_bound_pct"] = 100 * (summary["arena_mib"] / summary["lower_bound_mib"] - 1)
    naive = summary.loc[summary["algorithm"] == "naive", "arena_mib"]
    summary["saved_vs_naive_pct"] = 100 * (1 - summary["arena_mib"] / naive.iloc[0]) if len(naive) else float("nan")
    summary["role"] = summary["algorithm"].map(algorithm_role)
    return summary


def algorithm_role(algorithm: str) -> str:
    """naive / peer / ours / XLA, for the summary the issue asks for."""
    name = algorithm.lower()
    if name == "naive":
        return "naive"
    if "pack_2d" in name or name.startswith("jaxcnn") or name == "ours":
        return "ours"
    # 'xla_best_fit' is our re-implementation of XLA's heuristic (a peer); 'xla' is XLA's own.
    if name == "xla" or (name.startswith("xla") and "best_fit" not in name):
        return "XLA"
    return "peer"


def plan_runs(store: Store) -> pd.DataFrame:
    """One row per run with plans: run_id, its algorithms (comma separated), the most buffers any
    of its plans packs, whether it has our plan (pack_2d) and XLA's own to compare, and whether
    XLA's places each buffer (offsets from its buffer assignment: the same buffers as ours, drawn
    side by side) rather than giving only its total."""
    plans = store.plans()
    if plans.empty:
        return pd.DataFrame({"run_id": pd.Series(dtype="int64"), "algorithms": pd.Series(dtype="object"),
                             "buffers": pd.Series(dtype="int64"), "ours_vs_xla": pd.Series(dtype="bool"),
                             "xla_placed": pd.Series(dtype="bool")})
    placed = plans.assign(placed=[algorithm_role(a) == "XLA" and bool((e or {}).get("offsets_from"))
                                  for a, e in zip(plans["algorithm"], plans["extra"])])
    rows = placed.groupby("run_id", as_index=False).agg(algorithms=("algorithm", ",".join),
                                                         buffers=("n_buffers", "max"), xla_placed=("placed", "any"))
    rows["run_id"] = rows["run_id"].astype("int64")
    roles = [{algorithm_role(a) for a in names.split(",")} for names in rows["algorithms"]]
    rows["ours_vs_xla"] = [{"ours", "XLA"} <= r for r in roles]
    return rows[["run_id", "algorithms", "buffers", "ours_vs_xla", "xla_placed"]]


def default_plan_run_id(planned: pd.DataFrame, plans: pd.DataFrame, model: str | None = None) -> int | None:
    """The plan the Memory page starts from: a run with our plan and XLA's (of `model` when it has
    one), XLA's buffers placed where any run has them, the one packing the most buffers (a real
    model, not LeNet), the latest among equals."""
    if planned.empty:
        return None
    compared = plans.loc[plans["ours_vs_xla"], ["run_id", "buffers", "xla_placed"]].rename(columns={"run_id": "id"})
    candidates = planned.merge(compared, on="id")
    if candidates.empty:
        return int(planned["id"].max())
    if model is not None and (candidates["model"] == model).any():
        candidates = candidates[candidates["model"] == model]
    if candidates["xla_placed"].any():
        candidates = candidates[candidates["xla_placed"]]
    most = candidates[candidates["buffers"] == candidates["buffers"].max()]
    return int(most["id"].max())


def plan_buffers(store: Store, run_id: int) -> pd.DataFrame:
    """Buffers of every plan of the run: lifetime (inclusive steps) and placement, MiB."""
    buffers = store.buffers(int(run_id))
    if buffers.empty:
        raise NoData(f"run {run_id} has no planned buffers: {PLAN_HINT}")
    return pd.DataFrame({
        "algorithm": buffers["algorithm"], "name": buffers["name"],
        "start_step": buffers["start_step"].astype("int64"), "end_step": buffers["end_step"].astype("int64"),
        "size_bytes": buffers["size_bytes"].astype("int64"),
        "size_mib": buffers["size_bytes"].astype("float64") / MIB,
        "offset_mib": buffers["offset_bytes"].astype("float64") / MIB,
    })


def live_bytes_curve(buffers: pd.DataFrame) -> pd.DataFrame:
    """Bytes alive at each program step (inclusive lifetimes), in MiB; its max is the lower bound."""
    if buffers.empty:
        return pd.DataFrame({"step": pd.Series(dtype="int64"), "live_mib": pd.Series(dtype="float64")})
    steps = int(buffers["end_step"].max()) + 2
    delta = [0] * steps
    for start, end, size in zip(buffers["start_step"], buffers["end_step"], buffers["size_bytes"]):
        delta[int(start)] += int(size)
        delta[int(end) + 1] -= int(size)
    live, total = [], 0
    for d in delta[:-1]:
        total += d
        live.append(total / MIB)
    return pd.DataFrame({"step": range(steps - 1), "live_mib": live})


def plan_measurements(store: Store) -> pd.DataFrame:
    """Measurements of kind='plan' runs (max-batch curves, donation): one row each, with the
    run's model and batch; batch taken from the measurement's extra['batch'] where it has one."""
    rows = _sql(store, """
        SELECT m.run_id, r.model, r.batch AS run_batch, r.note, r.extra AS run_extra, m.backend, m.metric,
               m.median, m.unit, m.variant, m.extra
        FROM measurements m JOIN runs r ON r.id = m.run_id
        WHERE r.kind = 'plan' ORDER BY m.run_id, m.id""")
    if rows.empty:
        return rows
    # NULL extra comes back as None or NaN depending on the column's other values.
    extras = [json.loads(e) if isinstance(e, str) and e else {} for e in rows["extra"]]
    batch = [e.get("batch") if isinstance(e, dict) else None for e in extras]
    rows["batch"] = pd.Series(batch, dtype="float64").fillna(rows["run_batch"].astype("float64"))
    rows["extra"] = extras
    run_extras = [json.loads(e) if isinstance(e, str) and e else {} for e in rows.pop("run_extra")]
    # max_batch and remat runs say whether they sized a training step or inference.
    rows["train"] = [e.get("train") if isinstance(e, dict) else None for e in run_extras]
    return rows


def donation_savings(plan_rows: pd.DataFrame) -> pd.DataFrame:
    """Per donation run (planner/records.py): peak MiB without and with the planned donation, the
    bytes donated and saved (peak undonated - donated), with the run's model and batch."""
    rows = plan_rows[(plan_rows["note"] == "donation") & plan_rows["variant"].isin(("undonated", "donated"))]
    if rows.empty:
        raise NoData("no donation results yet: run the planner's donation tuning "
                     "(jaxcnn.memory.records.record_donation) into the store")
    wide = rows.pivot_table(index=["run_id", "model", "batch"], columns=["metric", "variant"], values="median",
                            aggfunc="last")

    def column(metric: str, variant: str) -> pd.Series:
        key = (metric, variant)
        return wide[key] / MIB if key in wide.columns else pd.Series(float("nan"), index=wide.index)

    table = pd.DataFrame({
        "undonated_peak_mib": column("peak_bytes", "undonated"), "donated_peak_mib": column("peak_bytes", "donated"),
        "donated_mib": column("donated_bytes", "donated"), "saved_mib": column("saved_bytes", "donated"),
    }).reset_index()
    table["batch"] = table["batch"].astype("int64")
    table["saved_pct"] = 100 * table["saved_mib"] / table["undonated_peak_mib"]
    table["label"] = [f"{m} b{b}" for m, b in zip(table["model"], table["batch"])]
    return table.sort_values(["model", "batch"], ignore_index=True)


def max_batch_curve(plan_rows: pd.DataFrame, model: str | None = None) -> pd.DataFrame:
    """Peak bytes against batch (metric peak_bytes / peak_memory_bytes), MiB, per backend/variant."""
    if plan_rows.empty:
        raise NoData("no max-batch data yet: run `jaxcnn maxbatch MODEL --budget 8GiB --db DB`")
    rows = plan_rows[plan_rows["metric"].isin(("peak_bytes", "peak_memory_bytes")) & plan_rows["batch"].notna()]
    if model is not None:
        rows = rows[rows["model"] == model]
    if rows.empty:
        raise NoData("no peak-bytes-per-batch measurements yet: run `jaxcnn maxbatch MODEL --budget 8GiB --db DB`")
    # `jaxcnn maxbatch` runs (planner/records.py) label each compiled point variant "batch=N":
    # those points are the curve, one series per run; other rows are one series per variant.
    compiled = rows["variant"].astype(str).str.fullmatch(r"batch=\d+")
    if compiled.any():
        rows = rows[compiled]
        what = {True: "training · ", False: "inference · "}
        series = [f"{_text(m)} · {what.get(t, '')}run {r}" for m, t, r in
                  zip(rows["model"], rows.get("train", [None] * len(rows)), rows["run_id"])]
    else:
        series = [_text(v) or _text(b) for v, b in zip(rows["variant"], rows["backend"])]
    return pd.DataFrame({"model": rows["model"], "series": series, "batch": rows["batch"].astype("int64"),
                         "peak_mib": rows["median"].astype("float64") / MIB}).sort_values(
        ["model", "series", "batch"], ignore_index=True)
