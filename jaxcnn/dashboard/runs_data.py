"""The runs of a store: the Runs page's table, each run's label and where it ran, and the
run a page starts from.

A run timed on a CPU ran both backends on the lax reference path (``reference_path_run``): its
times are real, a ratio of them says nothing about jaxcnn's kernels, so the pages show none.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from jaxcnn.dashboard.sources import _present, _run_commit, _sql, _text
from jaxcnn.store import Store

RUN_COLUMNS = ("id", "created_at", "kind", "model", "backend", "batch", "dtype", "device", "gpu_name",
               "gpu_count", "driver", "cuda_version", "jax_version", "jaxlib_version", "jaxcnn_version",
               "python", "platform", "hostname", "git_commit", "note")
# What the Runs page lists per run (the rest of RUN_COLUMNS is in each run's environment panel),
# few and narrow enough that the table fits the page.
RUN_SUMMARY_COLUMNS = ("id", "recorded", "kind", "model", "batch", "dtype", "where", "commit", "note",
                       "layers", "measurements", "plans")
SUMMARY_CELL_CHARS = 28  # a longer text cell of the Runs table is cut (with …) so the table fits the page
# The Runs table's dtypes, short as the reports write them (the table fits the page with the
# third-party models' longer names).
SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


def runs_table(store: Store) -> pd.DataFrame:
    """One row per run with its environment and what was recorded under it (counts per table)."""
    runs = store.runs()
    if runs.empty:
        return pd.DataFrame(columns=[*RUN_COLUMNS, "layers", "measurements", "predictions", "plans",
                                     "sparsity", "label"])
    # Count what each run holds; a table missing from a damaged store counts as empty here (the
    # page that needs it says so).
    present = set(_sql(store, "SELECT name FROM sqlite_master WHERE type = 'table'")["name"])
    counted = ("layers", "measurements", "predictions", "plans", "sparsity")
    counts = _sql(store, "SELECT r.id, " + ", ".join(
        f"(SELECT count(*) FROM {t} WHERE run_id = r.id) AS {t}" if t in present else f"0 AS {t}" for t in counted
    ) + " FROM runs r")
    table = runs[[c for c in RUN_COLUMNS if c in runs.columns]].copy()
    table["id"] = table["id"].astype("int64")
    environments = runs["environment_extra"] if "environment_extra" in runs.columns else [None] * len(runs)
    table["commit"] = [_run_commit(run, {"extra": extra}) for run, extra in
                       zip(table.to_dict("records"), environments)]
    table = table.merge(counts, on="id", how="left")
    table["label"] = [run_label(row) for row in table.to_dict("records")]
    return table.sort_values("id", ignore_index=True)


def runs_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """The Runs page's table: RUN_SUMMARY_COLUMNS of runs_table's rows (recorded: UTC, to the
    minute; dtype: SHORT_DTYPES; where: the GPU, or CPU), text cut to SUMMARY_CELL_CHARS (the
    run's panel has it all)."""
    recorded = pd.to_datetime(runs["created_at"], utc=True)
    summary = runs.assign(recorded=recorded.dt.strftime("%Y-%m-%d %H:%M"),
                          dtype=[SHORT_DTYPES.get(_text(d), _text(d)) for d in runs["dtype"]],
                          where=[run_where(r) for r in runs.to_dict("records")])
    summary = summary[list(RUN_SUMMARY_COLUMNS)].reset_index(drop=True)
    for column in ("kind", "model", "dtype", "where", "note"):
        summary[column] = [_cut(_text(v), SUMMARY_CELL_CHARS) for v in summary[column]]
    return summary


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 1] + "…"


def run_where(run: dict[str, Any]) -> str:
    """The GPU a run was measured on, 'CPU', or the device column when neither is recorded."""
    return _text(run.get("gpu_name")) or ("CPU" if run.get("device") == "cpu" else _text(run.get("device")))


def reference_path_run(run: dict[str, Any]) -> bool:
    """Whether the run timed the lax reference path on a CPU (host wall time): jaxcnn's CUDA
    kernels did not run, so its backends ran the same kind of code and no ratio of its times
    says anything about them. The profiler records device='cpu' for every such run."""
    return run.get("device") == "cpu"


REFERENCE_PATH_NOTE = ("CPU run: jaxcnn's CUDA kernels do not run on a CPU, so both backends ran the lax reference "
                       "path; times are host wall times of that path. No speedup is shown: a ratio of these times "
                       "says nothing about jaxcnn's kernels. Profile on a GPU for that.")


def timed_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows of runs_table that timed layers (they have layers and measurements): the runs the
    Speed and Roofline pages show and run vs run compares."""
    return runs[(runs["layers"] > 0) & (runs["measurements"] > 0)]


def default_run_id(runs: pd.DataFrame) -> int | None:
    """The run a page starts from: the latest profile run with the most layers (a real model,
    not a plan run, which has none, nor the smallest zoo model), else the latest run."""
    if runs.empty:
        return None
    profiles = runs[runs["kind"] == "profile"]
    if profiles.empty:
        return int(runs["id"].max())
    most = profiles[profiles["layers"] == profiles["layers"].max()]
    return int(most["id"].max())


def run_label(run: dict[str, Any]) -> str:
    """'#3 resnet50 b64 bfloat16 · NVIDIA H200 · profile' (absent fields left out)."""
    parts = [f"#{run['id']}", _text(run.get("model")) or "(no model)"]
    if _present(run.get("batch")):
        parts.append(f"b{int(run['batch'])}")
    if _text(run.get("dtype")):
        parts.append(run["dtype"])
    where = run_where(run)
    # A plan run's note says which analysis it holds (donation, max_batch, remat, training...).
    note = f" ({run['note']})" if run.get("kind") == "plan" and _text(run.get("note")) else ""
    return " ".join(parts) + (f" · {where}" if where else "") + f" · {run.get('kind')}{note}"
