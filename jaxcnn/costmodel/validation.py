"""Hold the model against measurements: bench_layers.json rows, the XLA baseline, ncu counters.

A measurement is one (layer, dtype, variant) device time. Its measured time is that of the
convolution kernel(s) alone (the model predicts one kernel); XLA's glue kernels around it (weight
transpose, memset, NCHW<->NHWC conversions, padding) are left out and the all-kernel total is
reported beside it. Rows whose convolution is not one implicit-GEMM kernel (FFT, XLA's own
depthwise kernel, cuDNN's direct engine) are outside the model: reported, not scored.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import sqlite3
import statistics
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxcnn.costmodel.calibration import Sample, calibrate
from jaxcnn.costmodel.conv_layer import ConvLayer
from jaxcnn.costmodel.factors import Factors
from jaxcnn.costmodel.model import BACKEND_IMPLS, predict, predict_family, predict_ms, stored_layer_info
from jaxcnn.costmodel.streaming import is_stream_family
from jaxcnn.costmodel.tiling import JAXCNN_DIRECT_64x64x16, Tiling, parse_kernel_tiling
from jaxcnn.costmodel.kernel_families import impl_of_kernel
from jaxcnn.costmodel.traffic import ceil_div
from jaxcnn.profile.gpu_specs import spec_by_name
from jaxcnn.store import Store

# Kernels XLA/cuDNN launch around the convolution itself.
_GLUE = re.compile(
    r"transpose|memset|_fusion|nhwcToNchw|nchwToNhwc|AddPadding|convertTensor", re.IGNORECASE
)
_OUT_OF_MODEL = (
    (re.compile(r"fft|cf32"), "FFT algorithm"),
    (re.compile(r"convolve_common_engine"), "cuDNN direct engine"),
    # Its time follows its tiles (GEMM-K padded to a chunk, channels to a block), which only the
    # library's plan on a GPU gives; profiles do not record it yet.
    (re.compile(r"conv_pool_stem_kernel"), "jaxcnn stem kernel"),
)
# bench_layers.json timing keys -> (impl, XLA precision)
BENCH_VARIANTS = {
    "jaxcnn": ("jaxcnn_direct", "default"),
    "jaxcnn_direct": ("jaxcnn_direct", "default"),  # algorithm="direct" forced
    "xla_default": ("xla", "default"),
    "xla_highest": ("xla", "highest"),
}


@dataclass(frozen=True)
class Measurement:
    label: str  # "<layer>/<dtype>/<variant>[/<source>]"
    layer: ConvLayer
    dtype: str  # as the bench names it: "bf16", "fp16", "fp32"
    variant: str  # bench timing key: "jaxcnn", "xla_default", "xla_highest"
    impl: str
    precision: str
    total_ms: float  # every kernel of the call
    kernel_ms: float | None  # the convolution kernel(s); None when no kernel list was kept
    main_kernel: str  # longest-running convolution kernel ("" if unknown)
    scope_note: str = ""  # why the model does not cover it; "" when it does
    source: str = "bench"
    counters: dict[str, float] = field(default_factory=dict)  # ncu bytes by level
    counters_kernel: str = ""  # the kernel ncu profiled (its run may have picked another)

    @property
    def in_scope(self) -> bool:
        return not self.scope_note

    @property
    def measured_ms(self) -> float:
        return self.kernel_ms if self.kernel_ms is not None else self.total_ms

    @property
    def tiling(self) -> Tiling | str:
        """The tiling the kernel name spells out, else "auto"."""
        return parse_kernel_tiling(self.main_kernel) or "auto"

    def sample(self) -> Sample:
        return Sample(self.layer, self.measured_ms, self.impl, self.precision, self.tiling)


def split_kernels(kernels: Iterable[tuple[str, float]]) -> tuple[float, str, str]:
    """(convolution kernels' us, main kernel name, out-of-model note) of a call's kernels."""
    conv = [(name, us) for name, us in kernels if not _GLUE.search(name)]
    if not conv:
        return 0.0, "", "no convolution kernel"
    main = max(conv, key=lambda kv: kv[1])[0]
    names = " ".join(name for name, _ in conv)
    note = next((why for pattern, why in _OUT_OF_MODEL if pattern.search(names)), "")
    if not note and impl_of_kernel(main) is None:
        note = "not an implicit-GEMM kernel"
    return sum(us for _, us in conv), main, note


def make_measurement(
    layer: ConvLayer,
    dtype: str,
    variant: str,
    total_ms: float,
    kernels: Sequence[tuple[str, float]] | None,
    source: str = "bench",
) -> Measurement:
    """A measurement of `variant` (a BENCH_VARIANTS key) with its call's (kernel, us) list;
    kernels None or empty: only the total is known."""
    impl, precision = BENCH_VARIANTS[variant]
    conv_us, main, note = split_kernels(kernels) if kernels else (0.0, "", "")
    if is_stream_family(impl_of_kernel(main) or ""):  # a stream family ran it, whichever backend
        impl = impl_of_kernel(main)
    suffix = "" if source == "bench" else f"/{source}"
    return Measurement(
        label=f"{layer.name}/{dtype}/{variant}{suffix}",
        layer=layer,
        dtype=dtype,
        variant=variant,
        impl=impl,
        precision=precision,
        total_ms=total_ms,
        kernel_ms=conv_us * 1e-3 if kernels else None,
        main_kernel=main,
        scope_note=note,
        source=source,
    )


def _kernel_list(kernels: Iterable[dict[str, Any]] | None) -> list[tuple[str, float]]:
    return [(k["name"], k["us_per_call"]) for k in kernels or []]


def measurements_from_bench(rows: Sequence[dict[str, Any]]) -> list[Measurement]:
    """From bench_layers.json rows (schema: scripts/bench_layers.py)."""
    found = []
    for row in rows:
        layer = ConvLayer.from_config(row["config"], row["dtype"], name=row["layer"])
        for variant, timing in (row.get("timings") or {}).items():
            if variant not in BENCH_VARIANTS or not timing or timing.get("median_ms") is None:
                continue
            kernels = _kernel_list(timing.get("kernels"))
            if variant == "jaxcnn" and kernels and not any(
                "conv2d_direct" in name for name, *_ in kernels
            ):
                continue  # "auto" ran another family (tensor-core, depthwise): not modelled
            time_ms = timing["median_ms"]
            found.append(make_measurement(layer, row["dtype"], variant, time_ms, kernels))
    return found


# The baseline's (time key, kernel-list key, dtype, bench variant).
_BASELINE_VARIANTS = (
    ("bf16_ms", "kernels_bf16", "bf16", "xla_default"),
    ("fp32_default_ms", None, "fp32", "xla_default"),
    ("fp32_highest_ms", "kernels_fp32_highest", "fp32", "xla_highest"),
)


def measurements_from_baseline(
    entries: Sequence[dict[str, Any]], configs: dict[str, dict[str, Any]]
) -> list[Measurement]:
    """From /work/shared/baseline/h200-xla-device-time-*.json (XLA only; names cut at 60
    characters, so no tile sizes: the tiling is auto). Shapes come from `configs` (layer ->
    bench config); entries without one (whole networks) are skipped."""
    found = []
    for entry in entries:
        config = configs.get(entry.get("layer", ""))
        if config is None:
            continue
        for time_key, kernels_key, dtype, variant in _BASELINE_VARIANTS:
            if entry.get(time_key) is None:
                continue
            layer = ConvLayer.from_config(config, dtype, name=entry["layer"])
            kernels = [tuple(k) for k in entry.get(kernels_key) or []] if kernels_key else None
            found.append(
                make_measurement(layer, dtype, variant, entry[time_key], kernels, "baseline")
            )
    return found


def measurements_from_store(path: str | Path) -> list[Measurement]:
    """Per-layer device times of conv2d layers in a profile store (scripts/profile_zoo.py), each
    as the model family of the kernel that ran (kernel_families.impl_of_kernel of its main
    kernel: a jaxcnn layer that ran XLA's cuDNN kernel is an XLA measurement), else, where no
    kernel is recorded or the model does not cover it, as its backend's (BACKEND_IMPLS)."""
    import pandas as pd  # kept here: a heavy import that only this reader of the store needs

    with Store(path, read_only=True) as store:  # a reader: never creates or migrates the file
        layers = store.layers()
        times = store.measurements(metric="device_time_ms")
    convs = {int(row.id): row for row in layers.itertuples() if row.op == "conv2d"}
    found = []
    for row in times.itertuples():
        kernels = _kernel_list((row.extra or {}).get("kernels"))
        main = split_kernels(kernels)[1] if kernels else ""
        impl = impl_of_kernel(main) or BACKEND_IMPLS.get(row.backend)
        layer_row = None if pd.isna(row.layer_id) else convs.get(int(row.layer_id))
        if layer_row is None or impl is None:
            continue
        info = stored_layer_info(layer_row._asdict(), name=f"run{row.run_id}:{layer_row.name}")
        layer = ConvLayer.from_layer_info(info)
        variant = "jaxcnn" if impl == "jaxcnn_direct" else "xla_default"
        time_ms = float(row.median)
        found.append(make_measurement(layer, layer.dtype, variant, time_ms, kernels, "store"))
    return found


# ---------------------------------------------------------------- ncu counters

NCU_METRICS = {"dram__bytes.sum": "dram", "lts__t_bytes.sum": "l2", "l1tex__t_bytes.sum": "l1"}
_UNIT_BYTES = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
               "kibyte": 1024, "mibyte": 1024**2, "gibyte": 1024**3}


@dataclass
class NcuKernel:
    """Byte counters of one kernel launch (raw ncu CSV) or of one kernel of one bench case
    (the tidy CSV of scripts/ncu_collect.py: layer, dtype, variant, kernel, metric, unit, value)."""

    name: str
    grid: str = ""
    layer: str = ""
    dtype: str = ""
    variant: str = ""
    bytes: dict[str, float] = field(default_factory=dict)  # level -> bytes

    @property
    def case(self) -> tuple[str, str, str]:
        return (self.layer, self.dtype, self.variant)


def base_kernel_name(name: str) -> str:
    """ "void ns::kern<float>(args)" -> "kern": what ncu's and the profiler's names share."""
    name = name.strip().removeprefix("void ").split("(")[0].split("<")[0]
    return name.split("::")[-1].strip()


def _bytes(value: str, unit: str) -> float:
    value = value.replace(",", "").strip()
    if value in ("", "n/a"):
        return 0.0
    return float(value) * _UNIT_BYTES.get(unit.strip().lower() or "byte", 1)


def read_ncu_csv(path: str | Path) -> list[NcuKernel]:
    """Either `ncu --csv --metrics dram__bytes.sum,lts__t_bytes.sum,l1tex__t_bytes.sum` output
    (one row per launch ID and metric) or scripts/ncu_collect.py's tidy CSV."""
    with open(path, newline="") as handle:
        text = [line for line in handle if line.strip() and not line.startswith("==")]
    rows = list(csv.DictReader(text))
    kernels: dict[tuple, NcuKernel] = {}
    for row in rows:
        tidy = "metric" in row
        level = NCU_METRICS.get(row["metric"] if tidy else row.get("Metric Name", ""))
        if level is None:
            continue
        if tidy:
            key = (row["layer"], row["dtype"], row["variant"], row["kernel"])
            kernel = kernels.setdefault(key, NcuKernel(row["kernel"], "", *key[:3]))
            value = _bytes(row["value"], row.get("unit", "byte"))
            kernel.bytes[level] = kernel.bytes.get(level, 0.0) + value  # repeated launches add up
        else:
            name, grid = row.get("Kernel Name", ""), row.get("Grid Size", "")
            kernel = kernels.setdefault((row["ID"],), NcuKernel(name, grid))
            value = _bytes(row.get("Metric Value", ""), row.get("Metric Unit", "byte"))
            kernel.bytes[level] = value
    return list(kernels.values())


def _sum_bytes(kernels: Iterable[NcuKernel]) -> dict[str, float]:
    total: dict[str, float] = defaultdict(float)
    for kernel in kernels:
        for level, value in kernel.bytes.items():
            total[level] += value
    return dict(total)


def _launch_runs(kernels: Sequence[NcuKernel]) -> dict[str, deque[list[NcuKernel]]]:
    """Runs of consecutive launches of one kernel base name and grid (a layer's repeats)."""
    runs: dict[str, deque[list[NcuKernel]]] = defaultdict(deque)
    previous = None
    for kernel in kernels:
        key = (base_kernel_name(kernel.name), kernel.grid)
        if key != previous:
            runs[key[0]].append([])
            previous = key
        runs[key[0]][-1].append(kernel)
    return runs


def _direct_kernel_grid(layer: ConvLayer) -> str:
    """The grid our direct kernel launches, (M tiles, groups x N tiles, 1), as ncu prints it."""
    tiling = JAXCNN_DIRECT_64x64x16
    tiles_n = layer.groups * ceil_div(layer.gemm_n, tiling.nt)
    return f"({ceil_div(layer.gemm_m, tiling.mt)}, {tiles_n}, 1)"


def _counters_in_order(m: Measurement, runs: dict[str, deque[list[NcuKernel]]]) -> dict[str, float]:
    """Raw ncu CSV, no case columns: ncu is assumed to have profiled the bench in bench order,
    so the k-th run of launches of a kernel goes to the k-th measurement whose main kernel it
    is (for our direct kernel, the next run with the grid the layer implies); mean per launch."""
    queue = runs.get(base_kernel_name(m.main_kernel))
    if not queue:
        return {}
    wanted = _direct_kernel_grid(m.layer) if m.impl == "jaxcnn_direct" else None
    index = next((i for i, run in enumerate(queue) if wanted in (None, run[0].grid)), None)
    if index is None:
        return {}
    run = queue[index]
    del queue[index]
    return {level: value / len(run) for level, value in _sum_bytes(run).items()}


def attach_counters(
    measurements: Sequence[Measurement], kernels: Sequence[NcuKernel]
) -> list[Measurement]:
    """Measurements with ncu bytes of their convolution kernels (glue kernels left out).

    Tidy CSV (scripts/ncu_collect.py): the kernels of the same (layer, dtype, variant) case.
    Raw ncu CSV: matched in order (_counters_in_order).
    """
    by_case: dict[tuple, list[NcuKernel]] = defaultdict(list)
    for kernel in kernels:
        if kernel.layer and not _GLUE.search(kernel.name):
            by_case[kernel.case].append(kernel)
    runs = _launch_runs([k for k in kernels if not k.layer])
    attached = []
    for m in measurements:
        if m.source != "bench":  # ncu profiles the bench suite
            attached.append(m)
            continue
        case = (m.layer.name, m.dtype, m.variant)
        if case in by_case:
            counters = _sum_bytes(by_case[case])
            profiled = max(by_case[case], key=lambda k: k.bytes.get("l2", 0.0)).name
        else:
            counters, profiled = _counters_in_order(m, runs), ""
        attached.append(dataclasses.replace(m, counters=counters, counters_kernel=profiled))
    return attached


# ---------------------------------------------------------------- predicted vs measured


def prediction_rows(
    measurements: Sequence[Measurement], gpu: str = "H200", factors: Factors | None = None
) -> list[dict[str, Any]]:
    """One row per measurement: predicted traffic and time next to the measured ones."""
    rows = []
    for m in measurements:
        if is_stream_family(m.impl):
            rows.append(_stream_prediction_row(m, gpu, factors))
            continue
        p = predict(m.layer, gpu, m.tiling, m.impl, m.precision, factors)
        # Bytes are predicted for the kernel ncu profiled (autotuning may differ between runs).
        ncu_tiling = parse_kernel_tiling(m.counters_kernel) if m.counters_kernel else None
        bytes_p = predict(m.layer, gpu, ncu_tiling, m.impl, m.precision, factors) if ncu_tiling else p
        row = _measurement_fields(m) | dict(
            tiling=p.tiling.name,
            predicted_ms=p.time_ms,
            bound=p.bound,
            bound_ms={k: v * 1e3 for k, v in p.times.bound_times().items()},
            latency_ms=p.times.latency_s * 1e3,
            ctas=p.traffic.grid.ctas,
            waves=p.traffic.grid.waves,
            # As ncu counts them (in-kernel: TMA past L1TEX, dirty output left in L2).
            predicted_bytes=dict(bytes_p.traffic.ncu_bytes),
            bytes_tiling=bytes_p.tiling.name,
        )
        rows.append(row)
    return rows


def _measurement_fields(m: Measurement) -> dict[str, Any]:
    return dict(label=m.label, layer=m.layer.name, dtype=m.dtype, variant=m.variant, impl=m.impl,
                precision=m.precision, source=m.source, kernel=m.main_kernel, in_scope=m.in_scope,
                scope_note=m.scope_note, measured_ms=m.measured_ms,
                measured_kind="kernel" if m.kernel_ms is not None else "total", total_ms=m.total_ms,
                ncu_bytes=dict(m.counters))


def _stream_prediction_row(m: Measurement, gpu: str, factors: Factors | None) -> dict[str, Any]:
    """prediction_rows' row of a measurement a stream family (costmodel.streaming) ran: its
    unique bytes at every level, no grid."""
    p = predict_family(m.layer, m.impl, gpu, factors)
    return _measurement_fields(m) | dict(
        tiling=f"stream:{p.family}", predicted_ms=p.time_ms, bound=p.bound,
        bound_ms=p.bound_ms, latency_ms=p.launch_ms, ctas=None, waves=None,
        predicted_bytes={"dram": p.dram_bytes, "l2": p.dram_bytes, "l1": p.dram_bytes},
        bytes_tiling=f"stream:{p.family}")


def cross_validated_ms(
    measurements: Sequence[Measurement], gpu: str = "H200", initial: Factors | None = None
) -> dict[str, float]:
    """Leave-one-layer-out: each measurement predicted with factors fitted on the other layers
    only (every dtype, impl and source of its layer left out together). label -> ms."""
    spec = spec_by_name(gpu)
    scored = [m for m in measurements if m.in_scope]
    predicted = {}
    for name in sorted({m.layer.name for m in scored}):
        training = [m.sample() for m in scored if m.layer.name != name]
        factors = calibrate(spec, training, initial).factors
        for m in scored:
            if m.layer.name == name:
                predicted[m.label] = predict_ms(m.layer, spec, m.tiling, m.impl, m.precision, factors)
    return predicted


def _abs_rel(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured


def _summary(errors: Sequence[float]) -> dict[str, Any]:
    if not errors:
        return dict(n=0, median_abs_rel_error=None, max_abs_rel_error=None)
    return dict(
        n=len(errors),
        median_abs_rel_error=statistics.median(errors),
        max_abs_rel_error=max(errors),
        within_10pct=sum(e <= 0.10 for e in errors),
    )


def validate(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per row |predicted - measured| / measured (time, and bytes per level where ncu gave
    them); the median / max over in-scope rows, overall and per impl."""
    scored = []
    for row in rows:
        row = dict(row)
        row["abs_rel_error"] = _abs_rel(row["predicted_ms"], row["measured_ms"])
        measured_bytes = row.get("ncu_bytes") or {}
        row["bytes_abs_rel_error"] = {
            level: _abs_rel(row["predicted_bytes"][level], value)
            for level, value in measured_bytes.items()
            if value and level in row.get("predicted_bytes", {})
        }
        scored.append(row)
    counted = [r for r in scored if r.get("in_scope", True)]
    by_impl = defaultdict(list)
    for r in counted:
        by_impl[r.get("impl", "")].append(r["abs_rel_error"])
    bytes_errors = defaultdict(list)
    for r in counted:
        for level, error in r["bytes_abs_rel_error"].items():
            bytes_errors[level].append(error)
    summary = _summary([r["abs_rel_error"] for r in counted])
    summary["by_impl"] = {impl: _summary(errors) for impl, errors in sorted(by_impl.items())}
    summary["bytes"] = {level: _summary(errors) for level, errors in sorted(bytes_errors.items())}
    summary["out_of_scope"] = len(scored) - len(counted)
    return dict(rows=scored, summary=summary)


# ---------------------------------------------------------------- report


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _mb(value: float | None) -> str:
    return "-" if not value else f"{value / 1e6:.1f}"


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return round(value, 3) if isinstance(value, float) else value


def to_markdown(report: dict[str, Any], title: str = "DeLTA model vs measurements") -> str:
    summary = report["summary"]
    lines = [f"# {title}", ""]
    if report.get("gpu"):
        lines.append(f"GPU: {report['gpu']}; factors: {report.get('factors_source', '')}")
        lines.append("")
    lines += [
        f"In-scope measurements: {summary['n']} (out of scope: {summary['out_of_scope']}); "
        f"median abs error {_pct(summary['median_abs_rel_error'])}, "
        f"max {_pct(summary['max_abs_rel_error'])}, "
        f"within 10%: {summary.get('within_10pct', 0)}.",
        "",
        "| impl | n | median | max |",
        "|---|---:|---:|---:|",
    ]
    summaries = dict(summary["by_impl"])
    summaries |= {f"bytes {level} (ncu)": s for level, s in summary["bytes"].items()}
    for what, s in summaries.items():
        median, worst = _pct(s["median_abs_rel_error"]), _pct(s["max_abs_rel_error"])
        lines.append(f"| {what} | {s['n']} | {median} | {worst} |")
    held_out = report.get("cross_validation")
    if held_out:
        by_impl = ", ".join(
            f"{impl} {_pct(s['median_abs_rel_error'])} / {_pct(s['max_abs_rel_error'])}"
            for impl, s in held_out["by_impl"].items()
        )
        lines += [
            "",
            f"Leave-one-layer-out (factors refitted without the layer): median "
            f"{_pct(held_out['median_abs_rel_error'])}, max {_pct(held_out['max_abs_rel_error'])} "
            f"over {held_out['n']} ({by_impl}).",
        ]
    by_model = report.get("cross_validation_by_model")
    if by_model:
        lines += [
            "",
            "Leave-one-model-out (factors refitted on the bench rows and the other zoo models, "
            "shapes of the held-out model removed): median "
            f"{_pct(by_model['median_abs_rel_error'])}, max {_pct(by_model['max_abs_rel_error'])}, "
            f"within 10%: {by_model.get('within_10pct', 0)} of {by_model['n']}.",
            "",
            "| held out | n | median | max |",
            "|---|---:|---:|---:|",
        ]
        for what, s in list(by_model["by_impl"].items()) + [
            (f"model {g}", s) for g, s in by_model.get("by_group", {}).items()
        ]:
            lines.append(
                f"| {what} | {s['n']} | {_pct(s['median_abs_rel_error'])} | "
                f"{_pct(s['max_abs_rel_error'])} |"
            )
    if report.get("factors"):
        lines += ["", "Factors: `" + json.dumps(_rounded(report["factors"])) + "`"]
    lines += [
        "",
        "Measured = the convolution kernel's device time (`total` = every kernel of the call "
        "where no kernel list was kept). Bytes in MB: predicted (ncu).",
        "",
        "| measurement | tiling | measured ms | total ms | predicted ms | error | bound "
        "| L1 MB | L2 MB | DRAM MB | note |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in report["rows"]:
        ncu = r.get("ncu_bytes") or {}
        cells = [
            f"{_mb(r['predicted_bytes'][lvl])}" + (f" ({_mb(ncu[lvl])})" if ncu.get(lvl) else "")
            for lvl in ("l1", "l2", "dram")
        ]
        note = r["scope_note"] or ("" if r["measured_kind"] == "kernel" else "total time")
        lines.append(
            f"| {r['label']} | {r['tiling']} | {r['measured_ms']:.4f} | {r['total_ms']:.4f} | "
            f"{r['predicted_ms']:.4f} | {_pct(r['abs_rel_error'])} | {r['bound']} | "
            + " | ".join(cells)
            + f" | {note} |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- grouped cross-validation


def shape_key(m: Measurement) -> tuple:
    """What makes two measurements the same experiment: the layer's shapes (not its name), the
    impl, the precision and the kernel's tiling (the zoo repeats shapes, e.g. vgg16 / vgg19)."""
    layer = dataclasses.replace(m.layer, name="")
    tiling = m.tiling
    return (layer, m.impl, m.precision, tiling.name if isinstance(tiling, Tiling) else tiling)


def deduplicated_samples(measurements: Sequence[Measurement]) -> list[Sample]:
    """One Sample per shape_key (in-scope rows only), at the median of its measured times, so
    that a shape the zoo repeats ten times does not weigh ten times in a fit."""
    times: dict[tuple, list[float]] = defaultdict(list)
    first: dict[tuple, Measurement] = {}
    for m in measurements:
        if not m.in_scope:
            continue
        key = shape_key(m)
        times[key].append(m.measured_ms)
        first.setdefault(key, m)
    return [
        dataclasses.replace(first[key].sample(), time_ms=statistics.median(ts))
        for key, ts in times.items()
    ]


def store_run_models(path: str | Path) -> dict[int, str]:
    """run id -> model name, from the profile store's runs table."""
    with sqlite3.connect(str(path)) as connection:
        rows = connection.execute("SELECT id, model FROM runs").fetchall()
    return {int(run_id): model or f"run{run_id}" for run_id, model in rows}


_RUN_LABEL = re.compile(r"^run(\d+):")


def model_group(m: Measurement, run_models: dict[int, str]) -> str:
    """The zoo model a store measurement belongs to (from its `run{id}:` layer name); bench
    and baseline rows form one group of their own ("bench")."""
    found = _RUN_LABEL.match(m.layer.name)
    if m.source != "store" or not found:
        return "bench"
    return run_models.get(int(found.group(1)), f"run{found.group(1)}")


def cross_validated_by_group(
    measurements: Sequence[Measurement],
    groups: dict[str, str],
    gpu: str = "H200",
    initial: Factors | None = None,
) -> dict[str, float]:
    """Leave-one-group-out (e.g. one zoo model): every in-scope measurement predicted with
    factors fitted on the other groups' deduplicated rows, with every shape the held-out group
    has removed from the training set too (no leak through a shape two models share).
    groups: label -> group. Returns label -> predicted ms."""
    spec = spec_by_name(gpu)
    scored = [m for m in measurements if m.in_scope]
    predicted = {}
    for group in sorted({groups[m.label] for m in scored}):
        held = [m for m in scored if groups[m.label] == group]
        held_keys = {shape_key(m) for m in held}
        training = [
            m for m in scored if groups[m.label] != group and shape_key(m) not in held_keys
        ]
        if not training:
            continue
        factors = calibrate(spec, deduplicated_samples(training), initial).factors
        for m in held:
            predicted[m.label] = predict_ms(m.layer, spec, m.tiling, m.impl, m.precision, factors)
    return predicted
