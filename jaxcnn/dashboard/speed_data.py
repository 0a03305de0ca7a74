"""Speed frames of a run: per-layer times and speedups, whole-model times, two runs compared,
and the roofline (points with the traffic model's predictions, the GPU's ceilings).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from jaxcnn.costmodel.kernel_families import impl_of_kernel
from jaxcnn.dashboard.runs_data import reference_path_run, run_where, timed_runs
from jaxcnn.dashboard.sources import MIB, NoData, _sql, _text
from jaxcnn.store import Store

TIME_METRICS = ("device_time_ms", "wall_time_ms")  # preferred first: GPU runs record device time


# -- speed ---------------------------------------------------------------------------------------


def time_metric(store: Store, run_id: int) -> str:
    """device_time_ms where the run has per-layer device times (GPU), else wall_time_ms (CPU)."""
    found = _sql(store, "SELECT DISTINCT metric FROM measurements WHERE run_id = ? AND layer_id IS NOT NULL",
                 (int(run_id),))["metric"].tolist()
    for metric in TIME_METRICS:
        if metric in found:
            return metric
    raise NoData(f"run {run_id} has no per-layer times: run `jaxcnn profile MODEL --db DB` to record some")


def short_kernel_name(name: str) -> str:
    """'void jaxcnn::conv2d_direct::conv2d_direct_kernel<bf16>(...)' -> 'conv2d_direct_kernel'."""
    name = re.sub(r"^void\s+", "", name.strip())
    name = name.split("(")[0].split("<")[0]
    return name.rsplit("::", 1)[-1] or name


def _main_kernel(row: dict[str, Any]) -> str:
    """The full name of the kernel that took most of a measurement's time, "" when none is recorded."""
    kernels = (row.get("extra") or {}).get("kernels") if isinstance(row.get("extra"), dict) else None
    if not kernels:
        return ""
    return max(kernels, key=lambda k: k.get("us_per_call") or 0.0).get("name", "")


def _variant(row: dict[str, Any]) -> str:
    """The kernel/layout the backend ran: the variant column, else the main kernel's name."""
    if _text(row.get("variant")):
        return row["variant"]
    return short_kernel_name(_main_kernel(row))


def _shape_text(shape: Any) -> str:
    if not shape:
        return ""
    if isinstance(shape[0], (list, tuple)):
        return " + ".join("×".join(map(str, s)) for s in shape)
    return "×".join(map(str, shape))


def layer_table(store: Store, run_id: int) -> pd.DataFrame:
    """Layers of a run in program order with printable shapes, GFLOP and MiB."""
    layers = store.layers(int(run_id))
    if layers.empty:
        raise NoData(f"run {run_id} has no layers recorded")
    return pd.DataFrame({
        "idx": layers["idx"].astype("int64"),
        "layer": layers["name"],
        "op": layers["op"],
        "input_shapes": [_shape_text(s) for s in layers["input_shapes"]],
        "weight_shape": [_shape_text(s) for s in layers["weight_shape"]],
        "output_shape": [_shape_text(s) for s in layers["output_shape"]],
        "flops": layers["flops"].astype("float64"),
        "bytes": layers["bytes"].astype("float64"),
        "gflop": layers["flops"].astype("float64") / 1e9,
        "mib": layers["bytes"].astype("float64") / MIB,
    })


def layer_times(store: Store, run_id: int) -> tuple[pd.DataFrame, str]:
    """Per-layer times in long form (one row per layer and backend) and the metric used.

    Columns: idx, layer, op, input_shapes, weight_shape, output_shape, gflop, mib, backend,
    time_ms, p10_ms, p90_ms, variant, kernel (the main kernel's full name, "" if not recorded).
    """
    metric = time_metric(store, run_id)
    rows = store.measurements(int(run_id), metric=metric)
    rows = rows[rows["layer_id"].notna()]
    # A layer measured twice on one backend: the latest row counts (as in Store.compare).
    rows = rows.drop_duplicates(["layer", "backend"], keep="last")
    records = rows.to_dict("records")
    times = pd.DataFrame({
        "layer": rows["layer"], "backend": rows["backend"], "time_ms": rows["median"].astype("float64"),
        "p10_ms": rows["p10"].astype("float64"), "p90_ms": rows["p90"].astype("float64"),
        "variant": [_variant(r) for r in records], "kernel": [_main_kernel(r) for r in records],
    })
    table = layer_table(store, run_id).merge(times, on="layer", how="inner")
    return table.sort_values(["idx", "backend"], ignore_index=True), metric


def speedup_table(long: pd.DataFrame, baseline: str = "xla", candidate: str = "jaxcnn") -> pd.DataFrame:
    """Wide per-layer table: time of each backend, speedup = baseline / candidate (>1: candidate
    faster), and the variant each backend ran."""
    if long.empty:
        return pd.DataFrame(columns=["idx", "layer", "op", "speedup"])
    keys = ["idx", "layer", "op", "input_shapes", "weight_shape", "output_shape", "gflop", "mib"]
    times = long.pivot_table(index=keys, columns="backend", values="time_ms", aggfunc="last")
    times.columns = [f"{b}_ms" for b in times.columns]
    variants = long.pivot_table(index=keys, columns="backend", values="variant", aggfunc="last")
    variants.columns = [f"{b}_variant" for b in variants.columns]
    wide = times.join(variants).reset_index().sort_values("idx", ignore_index=True)
    if f"{baseline}_ms" in wide and f"{candidate}_ms" in wide:
        wide["speedup"] = wide[f"{baseline}_ms"] / wide[f"{candidate}_ms"]
    else:
        wide["speedup"] = float("nan")
    return wide


def end_to_end(store: Store, run_id: int) -> pd.DataFrame:
    """Whole-model times: device time (GPU runs) and host latency (wall time), per backend."""
    rows = store.measurements(int(run_id))
    rows = rows[rows["layer_id"].isna() & rows["metric"].isin(TIME_METRICS)]
    rows = rows.drop_duplicates(["backend", "metric"], keep="last")
    what = {"device_time_ms": "device time", "wall_time_ms": "host latency"}
    return pd.DataFrame({
        "backend": rows["backend"], "metric": rows["metric"], "what": rows["metric"].map(what),
        "time_ms": rows["median"].astype("float64"), "p10_ms": rows["p10"].astype("float64"),
        "p90_ms": rows["p90"].astype("float64"), "n": rows["n"],
    }).reset_index(drop=True)


def compare_refusal(run_a: dict[str, Any], run_b: dict[str, Any]) -> str | None:
    """Why two runs' times must not be compared (None: they may): run vs run compares GPU device
    times; a CPU run timed the lax reference path with host wall time."""
    cpu = [r for r in (run_a, run_b) if reference_path_run(r)]
    if not cpu:
        return None
    if len(cpu) == 2:
        return (f"runs #{run_a['id']} and #{run_b['id']} were both timed on a CPU (the lax reference path, host "
                "wall time): their ratio says nothing about jaxcnn's kernels. Compare two GPU runs.")
    gpu = run_b if cpu[0] is run_a else run_a
    return (f"run #{cpu[0]['id']} was timed on a CPU (the lax reference path, host wall time) and run #{gpu['id']} "
            f"on {run_where(gpu) or 'a GPU'} (device time): the two are not comparable. Compare two GPU runs.")


def compare_candidates(runs: pd.DataFrame, run: dict[str, Any]) -> pd.DataFrame:
    """Runs that `run` may be compared with: timed ones (layers and measurements) other than it,
    none for a CPU run (compare_refusal)."""
    timed = timed_runs(runs)
    timed = timed[timed["id"] != run["id"]]
    return timed[[compare_refusal(run, other) is None for other in timed.to_dict("records")]]


def default_compare_id(candidates: pd.DataFrame, run: dict[str, Any]) -> int | None:
    """Run B to start from: the latest run of the same model, batch and dtype at another commit
    (what a code change did), else the latest run of the same model, else None."""
    same_model = candidates[candidates["model"] == run.get("model")]
    same_setup = same_model[(same_model["batch"] == run.get("batch")) & (same_model["dtype"] == run.get("dtype"))]
    other_commit = same_setup[same_setup["commit"] != _text(run.get("commit"))]
    for choice in (other_commit, same_model):
        if not choice.empty:
            return int(choice["id"].max())
    return None


def compare_header(run_a: dict[str, Any], run_b: dict[str, Any]) -> pd.DataFrame:
    """The two runs of a comparison: label, commit, GPU and when each was recorded."""
    return pd.DataFrame([
        {"run": side, "label": r.get("label"), "commit": _text(r.get("commit")) or "not recorded",
         "where": run_where(r), "recorded": str(r.get("created_at") or "")[:16]}
        for side, r in (("A", run_a), ("B", run_b))])


def compare_runs(store: Store, run_a: int, run_b: int) -> tuple[pd.DataFrame, str]:
    """Per-layer times of two runs side by side (Store.compare), in the metric both have.
    ValueError (compare_refusal's reason) for a CPU run."""
    runs = store.runs().set_index("id")
    for run_id in (run_a, run_b):
        if int(run_id) not in runs.index:
            raise NoData(f"no run {run_id} in this store")
    refusal = compare_refusal(dict(runs.loc[int(run_a)], id=int(run_a)), dict(runs.loc[int(run_b)], id=int(run_b)))
    if refusal is not None:
        raise ValueError(refusal)
    metrics = [_metric_or_none(store, r) for r in (run_a, run_b)]
    if None in metrics:
        raise NoData("both runs need per-layer times to be compared")
    metric = metrics[0] if metrics[0] == metrics[1] else "wall_time_ms"
    table = store.compare(int(run_a), int(run_b), metric=metric)
    if table.empty or table[["median_a", "median_b"]].dropna().empty:
        raise NoData(f"runs {run_a} and {run_b} share no layer measured with {metric} on the same backend")
    table = table.rename(columns={"median_a": "a_ms", "median_b": "b_ms", "ratio": "b_over_a"})
    return table.drop(columns=["unit"]), metric


def _metric_or_none(store: Store, run_id: int) -> str | None:
    try:
        return time_metric(store, run_id)
    except NoData:
        return None


# -- roofline ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ceilings:
    gpu: str
    precision: str  # bf16 / fp16 / tf32 / fp32
    memory_bytes_per_s: float
    compute_flops_per_s: float
    memory_source: str
    compute_source: str

    @property
    def ridge_flop_per_byte(self) -> float:
        return self.compute_flops_per_s / self.memory_bytes_per_s


def run_ceilings(run: dict[str, Any]) -> Ceilings | None:
    """The roofline of the run's GPU (jaxcnn.profile.gpu_specs; measured ceilings where the entry
    has them), None for CPU runs or GPUs without an entry."""
    from jaxcnn.profile.gpu_specs import lookup_gpu_spec, precision_class

    gpu = _text(run.get("gpu_name"))
    if not gpu or run.get("device") == "cpu":
        return None
    spec = lookup_gpu_spec(gpu)
    if spec is None:
        return None
    dtype = _text(run.get("dtype")) or "float32"
    try:
        precision = precision_class(dtype)
    except ValueError:
        return None
    # XLA's DEFAULT precision runs float32 convolutions on TF32 tensor cores.
    precision = "tf32" if precision == "fp32" and "tf32" in spec.compute else precision
    compute = spec.compute.get(precision) or spec.fp32_fma_peak
    return Ceilings(spec.name, precision, spec.memory.per_s, compute.per_s, spec.memory.source, compute.source)


def roofline_points(store: Store, run_id: int) -> pd.DataFrame:
    """One point per (layer, backend): arithmetic intensity, achieved TFLOP/s and GB/s, and the
    traffic model's predictions beside the measurement.

    pred_floor_ms: the roofline floor (max of bytes/bandwidth and FLOPs/peak); pred_model_ms:
    the traffic/time model ('delta') of the kernel family that ran (costmodel.impl_of_kernel of
    the measured main kernel: a jaxcnn layer that ran XLA's cuDNN kernel gets XLA's prediction),
    where the model covers that family and the store holds its prediction; error_pct = 100 *
    (predicted - measured) / measured of the model (else the floor); model_family: the family
    ("" where the model does not cover the kernel).
    """
    long, metric = layer_times(store, run_id)
    if metric != "device_time_ms":
        raise NoData(f"run {run_id} was timed on the host (wall time, no GPU): a roofline needs device "
                     "times; run `jaxcnn profile MODEL --db DB` on a GPU machine")
    points = long[(long["flops"] > 0) & (long["bytes"] > 0)].copy()
    points["flop_per_byte"] = points["flops"] / points["bytes"]
    points["tflops"] = points["flops"] / (points["time_ms"] * 1e-3) / 1e12
    points["gb_per_s"] = points["bytes"] / (points["time_ms"] * 1e-3) / 1e9
    predictions = store.predictions(int(run_id))
    floor = predictions[predictions["model"] == "roofline"].drop_duplicates("layer", keep="last")
    points = points.merge(floor[["layer", "time_ms"]].rename(columns={"time_ms": "pred_floor_ms"}),
                          on="layer", how="left")
    model = predictions[predictions["model"] != "roofline"].copy()
    # A prediction is of a layer run by one kernel family (its impl), whichever backend ran it.
    model["model_family"] = [(e or {}).get("impl") if isinstance(e, dict) else None for e in model["extra"]]
    model = model.dropna(subset=["model_family"]).drop_duplicates(["layer", "model_family"], keep="last")
    model = model[["layer", "model_family", "time_ms", "dram_bytes", "l2_bytes"]].rename(columns={
        "time_ms": "pred_model_ms", "dram_bytes": "pred_dram_bytes", "l2_bytes": "pred_l2_bytes"})
    points["model_family"] = [impl_of_kernel(k) or "" for k in points["kernel"]]
    points = points.merge(model, on=["layer", "model_family"], how="left")
    predicted = points["pred_model_ms"].fillna(points["pred_floor_ms"])
    points["prediction"] = points["pred_model_ms"].notna().map({True: "traffic model", False: "roofline floor"})
    points.loc[predicted.isna(), "prediction"] = ""
    points["error_pct"] = 100 * (predicted - points["time_ms"]) / points["time_ms"]
    points["pct_of_floor"] = 100 * points["pred_floor_ms"] / points["time_ms"]
    return points.reset_index(drop=True)


def ceiling_lines(ceilings: Ceilings, lo: float, hi: float, n: int = 64) -> pd.DataFrame:
    """The roof min(peak, intensity * bandwidth) in TFLOP/s over [lo, hi] FLOP/byte (log-spaced,
    with the ridge point included so the corner is sharp)."""
    lo, hi = max(lo, 1e-3), max(hi, lo * 10)
    xs = [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]
    ridge = ceilings.ridge_flop_per_byte
    if lo < ridge < hi:
        xs = sorted([*xs, ridge])
    return pd.DataFrame({
        "flop_per_byte": xs,
        "tflops": [min(ceilings.compute_flops_per_s, x * ceilings.memory_bytes_per_s) / 1e12 for x in xs],
    })
