"""What the dashboard shows, as pandas frames read from a jaxcnn.store.Store.

Every reader takes an open Store (or its path) and returns a DataFrame whose column names carry
their unit (``time_ms``, ``size_mib``, ``tflops``...), so pages and charts never guess units.
Nothing here imports Streamlit.

Where the data comes from (``choose_source``): the DB the user names, or, when it does not
exist or holds no runs, the shipped store exports (dashboard/shipped/*.json, measured on a GPU
at a recorded commit: ``shipped_provenance``) imported once into a cached SQLite file.

Where each number comes from (``column_sources``): measured (timed or read from XLA's compile
on the machine of a run of this store), shipped (the same, from the shipped data), model
(jaxcnn.perfmodel's predictions and roofline floors) or computed (counted from shapes or
buffer lifetimes: FLOPs, compulsory bytes, packing arenas). A run timed on a CPU ran both
backends on the lax reference path (``reference_path_run``): its times are real, a ratio of them
says nothing about jaxcnn's kernels, so the pages show none.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from jaxcnn.store import DEFAULT_FILENAME, PATH_ENV_VAR, Store, StoreError, read_export
from jaxcnn.tuning import cache_file

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "dashboard" / "shipped"
CACHE_ENV_VAR = "JAXCNN_DASHBOARD_CACHE"
MIB = 2**20
TIME_METRICS = ("device_time_ms", "wall_time_ms")  # preferred first: GPU runs record device time
MEMORY_STAT_METRICS = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes",
                       "generated_code_bytes", "peak_memory_bytes")
RUN_COLUMNS = ("id", "created_at", "kind", "model", "backend", "batch", "dtype", "device", "gpu_name",
               "gpu_count", "driver", "cuda_version", "jax_version", "jaxlib_version", "jaxcnn_version",
               "python", "platform", "hostname", "git_commit", "note")
# What the Runs page lists per run (the rest of RUN_COLUMNS is in each run's environment panel),
# few and narrow enough that the table fits the page.
RUN_SUMMARY_COLUMNS = ("id", "recorded", "kind", "model", "batch", "dtype", "where", "commit", "note",
                       "layers", "measurements", "plans")
SHORT_COMMIT = 7  # hex digits of a commit shown
SUMMARY_CELL_CHARS = 28  # a longer text cell of the Runs table is cut (with …) so the table fits the page

# Where a number shown comes from.
MEASURED = "measured"
SHIPPED = "shipped"
MODEL = "model"
COMPUTED = "computed"
SOURCE_MEANINGS = {
    MEASURED: "timed, or read from XLA's compiled program, on the machine of a run in this store",
    SHIPPED: "measured on the GPU of the shipped data (dashboard/shipped/), at its recorded commit",
    MODEL: "predicted by jaxcnn.perfmodel (traffic/time model, roofline floor)",
    COMPUTED: "counted from shapes or buffer lifetimes (FLOPs, compulsory bytes, packing arenas)",
}
# Columns of the dashboard's frames that hold model or computed numbers; other numeric columns
# hold measurements, and these hold no quantity at all.
MODEL_COLUMNS = ("error_pct", "pct_of_floor")
MODEL_PREFIX = "pred_"
COMPUTED_COLUMNS = ("flops", "bytes", "gflop", "mib", "flop_per_byte", "arena_mib", "lower_bound_mib",
                    "over_bound_pct", "saved_vs_naive_pct", "buffers", "size_bytes", "size_mib", "offset_mib",
                    "start_step", "end_step", "live_mib", "step")
NOT_QUANTITIES = ("id", "idx", "run_id", "batch", "n", "layers", "measurements", "predictions", "plans",
                  "sparsity", "gpu_count", "schema_version", "runs", "no_commit")


class NoData(Exception):
    """The store has nothing for this view; the message says what to run to get it."""


# -- which store ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    path: Path  # the SQLite file to read
    shipped: bool  # True: the shipped data stands in for the user's DB
    requested: Path  # the DB the user asked for
    note: str  # why this source, for the page header

    @property
    def measured(self) -> str:
        """The source label of this store's measurements: shipped or measured."""
        return SHIPPED if self.shipped else MEASURED


def default_db_path() -> Path:
    """Where the CLI writes: $JAXCNN_DB, else ./jaxcnn_profiles.sqlite."""
    return Path(os.environ.get(PATH_ENV_VAR) or Path.cwd() / DEFAULT_FILENAME).expanduser()


def cache_dir() -> Path:
    """$JAXCNN_DASHBOARD_CACHE, else $XDG_CACHE_HOME/jaxcnn/dashboard, else ~/.cache/jaxcnn/dashboard."""
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "jaxcnn" / "dashboard"


def count_runs(path: Path) -> int:
    """Runs in the store at `path` (StoreError for a corrupt or foreign file, or no runs table).
    Read-only: the dashboard never creates, migrates or writes a user's store."""
    with Store(path, read_only=True, partial=True) as store:
        with _readonly(store) as conn:
            return conn.execute("SELECT count(*) FROM runs").fetchone()[0]


def choose_source(db_path: str | os.PathLike | None = None, *, use_shipped: bool = False,
                  shipped_dir: Path = SHIPPED_DIR, cache: Path | None = None) -> Source:
    """The store to show for the DB the user asked for.

    A missing file, an empty file or a store without runs falls back to the shipped data; a
    corrupt or foreign file raises StoreError (the user should hear about it, not see other data).
    """
    requested = Path(db_path).expanduser() if db_path else default_db_path()
    if not use_shipped:
        if requested.is_dir():
            raise StoreError(f"{requested} is a directory, not a profile store file")
        if requested.exists() and requested.stat().st_size > 0:
            if count_runs(requested) > 0:
                return Source(requested, False, requested, f"local store {requested}")
            reason = f"{requested} holds no runs yet"
        else:
            reason = f"no store at {requested} yet"
    else:
        reason = "shipped data chosen in the sidebar"
    path = shipped_store(shipped_dir, cache or cache_dir())
    made = shipped_summary(shipped_provenance(shipped_dir))
    return Source(path, True, requested, f"{reason}: showing the shipped measurements (dashboard/{shipped_dir.name}/: "
                                         f"{made})")


def shipped_files(shipped_dir: Path = SHIPPED_DIR) -> list[Path]:
    return sorted(shipped_dir.glob("*.json"))


def short_commit(commit: Any, dirty: Any = None) -> str:
    """'e40c6e2', 'e40c6e2-dirty' (made from a tree with uncommitted changes), '' if unknown."""
    text = _text(commit)[:SHORT_COMMIT]
    return f"{text}-dirty" if text and dirty is True else text


def _run_commit(run: dict[str, Any], environment: Any) -> str:
    """The short commit of an exported or stored run, marked where its tree had changes."""
    git = (environment or {}).get("extra", {}) if isinstance(environment, dict) else {}
    git = git.get("git") if isinstance(git, dict) else None
    return short_commit(run.get("git_commit"), (git or {}).get("dirty"))


def shipped_provenance(shipped_dir: Path = SHIPPED_DIR) -> pd.DataFrame:
    """One row per shipped export: what it holds and what it was made from (GPU, UTC dates,
    commits) and the store schema version it was written at."""
    rows = []
    for file in shipped_files(shipped_dir):
        export = read_export(file)
        runs = export.runs
        commits = [_run_commit(r, r.get("environment")) for r in runs]
        dates = sorted(str(r.get("created_at") or "")[:10] for r in runs if r.get("created_at"))
        # A run without a recorded GPU name adds nothing here unless it ran on a CPU.
        gpus = sorted({_text((r.get("environment") or {}).get("gpu_name")) or ("CPU" if r.get("device") == "cpu" else "")
                       for r in runs} - {""})
        made = "" if not dates else dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
        rows.append(dict(
            file=file.name, runs=len(runs), kinds=", ".join(sorted({str(r.get("kind")) for r in runs})),
            gpu=", ".join(gpus) or "not recorded", made=made,
            commits=", ".join(sorted({c for c in commits if c})) or "not recorded",
            no_commit=sum(not c for c in commits), schema_version=export.schema_version,
        ))
    return pd.DataFrame(rows, columns=["file", "runs", "kinds", "gpu", "made", "commits", "no_commit",
                                       "schema_version"])


def shipped_summary(provenance: pd.DataFrame) -> str:
    """'NVIDIA H200, made 2026-11-21, commits 37d5348-dirty, e40c6e2 (18 of 57 runs record no commit)'."""
    if provenance.empty:
        return "no shipped exports"
    gpus = sorted({g.strip() for text in provenance["gpu"] for g in text.split(",")} - {"not recorded"})
    days = sorted(day for made in provenance["made"] for day in made.split(" to ") if day)
    dates = "on unrecorded dates" if not days else days[0] if days[0] == days[-1] else f"{days[0]} to {days[-1]}"
    commits = sorted({c.strip() for text in provenance["commits"] for c in text.split(",")} - {"not recorded"})
    text = f"{', '.join(gpus) or 'GPU not recorded'}, made {dates}, commit{'s' if len(commits) != 1 else ''} {', '.join(commits) or 'not recorded'}"
    missing, total = int(provenance["no_commit"].sum()), int(provenance["runs"].sum())
    if missing and commits:
        text += f" ({missing} of {total} runs record no commit)"
    return text


def shipped_store(shipped_dir: Path = SHIPPED_DIR, cache: Path | None = None) -> Path:
    """A SQLite store holding every shipped export, built on first use and kept in the cache.

    The file name carries a hash of the exports' contents, so new shipped data gets a new store;
    it is built under a temporary name and renamed, so a half-built store is never read. A cached
    copy that is not a sound store of runs (any bytes written over it) is reported and rebuilt
    from the exports.
    """
    files = shipped_files(shipped_dir)
    if not files:
        raise NoData(f"no shipped data: {shipped_dir} has no *.json store exports")
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode())
        digest.update(file.read_bytes())
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"shipped-{digest.hexdigest()[:16]}.sqlite"
    if target.exists():
        problem = _shipped_copy_problem(target)
        if problem is None:
            return target
        cache_file.report(target, "cached copy of the shipped data", problem,
                          action=f"rebuilding it from {shipped_dir}")
        for sidecar in (f"{target}-wal", f"{target}-shm"):  # SQLite would apply them to the new file
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sidecar)
    with cache_file.replacing(target, sidecars=("-wal", "-shm")) as tmp:
        tmp.unlink()  # Store wants a new file, not an empty one it would have to check
        with Store(tmp) as store:
            # In recording order, so run ids follow time and a newer export never renumbers the
            # runs of an older one.
            for file in sorted(files, key=_first_recorded):
                store.import_json(file)
        # Fold the WAL into the main file so the renamed file is complete on its own.
        with sqlite3.connect(tmp) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return target


def _shipped_copy_problem(path: Path) -> str | None:
    """What makes the cached shipped store at `path` unusable (None: it is a sound store with runs)."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            check = conn.execute("PRAGMA quick_check").fetchone()
            if check != ("ok",):
                return f"SQLite quick_check: {check[0] if check else 'no answer'}"
            runs = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error as err:
        return f"{type(err).__name__}: {err}"
    return None if runs > 0 else "it holds no runs"


def _first_recorded(export: Path) -> tuple[str, str]:
    """(earliest created_at of the export's runs, file name): the order to import exports in."""
    runs = read_export(export).runs
    return min((str(r.get("created_at") or "") for r in runs), default=""), export.name


def column_sources(frame: pd.DataFrame, measured: str = MEASURED) -> dict[str, list[str]]:
    """Source label -> the frame's numeric columns holding numbers of that source; `measured` is
    the label of this store's measurements (Source.measured)."""
    found: dict[str, list[str]] = {}
    for column in frame.columns:
        name = str(column)
        if name in NOT_QUANTITIES or not pd.api.types.is_numeric_dtype(frame[column]) \
                or pd.api.types.is_bool_dtype(frame[column]):
            continue
        if name.startswith(MODEL_PREFIX) or name in MODEL_COLUMNS:
            label = MODEL
        elif name in COMPUTED_COLUMNS:
            label = COMPUTED
        else:
            label = measured
        found.setdefault(label, []).append(name)
    return found


def sources_caption(frame: pd.DataFrame, measured: str = MEASURED) -> str:
    """'Sources: measured (...): time_ms, p10_ms; model (...): pred_floor_ms' for a table."""
    parts = [f"**{label}** ({SOURCE_MEANINGS[label]}): {', '.join(columns)}"
             for label, columns in column_sources(frame, measured).items()]
    return ("Sources: " + "; ".join(parts) + ". Units are in the column names.") if parts else ""


class _readonly:
    """A read-only sqlite3 connection to the store's file, for queries Store has no method for."""

    def __init__(self, store: Store):
        self.path = store.path

    def __enter__(self) -> sqlite3.Connection:
        self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        return self.conn

    def __exit__(self, *exc_info) -> None:
        self.conn.close()
        if exc_info[0] is not None and issubclass(exc_info[0], sqlite3.Error):
            raise StoreError(f"profile store {self.path}: {exc_info[1]}") from exc_info[1]


def _sql(store: Store, sql: str, params: tuple = ()) -> pd.DataFrame:
    with _readonly(store) as conn:
        return pd.read_sql_query(sql, conn, params=params)


# -- runs ----------------------------------------------------------------------------------------


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
    minute; where: the GPU, or CPU), text cut to SUMMARY_CELL_CHARS (the run's panel has it all)."""
    recorded = pd.to_datetime(runs["created_at"], utc=True)
    summary = runs.assign(recorded=recorded.dt.strftime("%Y-%m-%d %H:%M"),
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


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and value is not pd.NA


def _text(value: Any) -> str:
    return str(value) if _present(value) and str(value) else ""


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


def _variant(row: dict[str, Any]) -> str:
    """The kernel/layout the backend ran: the variant column, else the main kernel's name."""
    if _text(row.get("variant")):
        return row["variant"]
    kernels = (row.get("extra") or {}).get("kernels") if isinstance(row.get("extra"), dict) else None
    if kernels:
        main = max(kernels, key=lambda k: k.get("us_per_call") or 0.0)
        return short_kernel_name(main.get("name", ""))
    return ""


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
    time_ms, p10_ms, p90_ms, variant.
    """
    metric = time_metric(store, run_id)
    rows = store.measurements(int(run_id), metric=metric)
    rows = rows[rows["layer_id"].notna()]
    # A layer measured twice on one backend: the latest row counts (as in Store.compare).
    rows = rows.drop_duplicates(["layer", "backend"], keep="last")
    times = pd.DataFrame({
        "layer": rows["layer"], "backend": rows["backend"], "time_ms": rows["median"].astype("float64"),
        "p10_ms": rows["p10"].astype("float64"), "p90_ms": rows["p90"].astype("float64"),
        "variant": [_variant(r) for r in rows.to_dict("records")],
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
    timed = runs[(runs["layers"] > 0) & (runs["measurements"] > 0) & (runs["id"] != run["id"])]
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
    the traffic/time model ('delta') for this backend's implementation, where it predicts the
    layer; error_pct = 100 * (predicted - measured) / measured of the model (else the floor).
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
    # The model names implementations more finely than backends ('jaxcnn_direct' for jaxcnn).
    impls = [(e or {}).get("impl") if isinstance(e, dict) else None for e in model["extra"]]
    backends = set(long["backend"])
    model["impl"] = [i if i is None or i in backends else i.split("_", 1)[0] for i in impls]
    model = model.dropna(subset=["impl"]).drop_duplicates(["layer", "impl"], keep="last")
    model = model[["layer", "impl", "time_ms", "dram_bytes", "l2_bytes"]].rename(columns={
        "impl": "backend", "time_ms": "pred_model_ms", "dram_bytes": "pred_dram_bytes",
        "l2_bytes": "pred_l2_bytes"})
    points = points.merge(model, on=["layer", "backend"], how="left")
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


# -- memory --------------------------------------------------------------------------------------

# How plan and profile runs name their memory numbers (jaxcnn.planner; profile's memory_analysis).
PLAN_HINT = "run `jaxcnn plan MODEL --db DB` to record memory plans"


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
                     "(what jaxcnn.planner calls a compiled program's peak)",
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
    of its plans packs, and whether it has our plan (pack_2d) and XLA's own to compare."""
    plans = store.plans()
    if plans.empty:
        return pd.DataFrame({"run_id": pd.Series(dtype="int64"), "algorithms": pd.Series(dtype="object"),
                             "buffers": pd.Series(dtype="int64"), "ours_vs_xla": pd.Series(dtype="bool")})
    rows = plans.groupby("run_id", as_index=False).agg(algorithms=("algorithm", ",".join),
                                                        buffers=("n_buffers", "max"))
    rows["run_id"] = rows["run_id"].astype("int64")
    roles = [{algorithm_role(a) for a in names.split(",")} for names in rows["algorithms"]]
    rows["ours_vs_xla"] = [{"ours", "XLA"} <= r for r in roles]
    return rows


def default_plan_run_id(planned: pd.DataFrame, plans: pd.DataFrame, model: str | None = None) -> int | None:
    """The plan the Memory page starts from: a run with our plan and XLA's (of `model` when it has
    one), the one packing the most buffers (a real model, not LeNet), the latest among equals."""
    if planned.empty:
        return None
    compared = plans.loc[plans["ours_vs_xla"], ["run_id", "buffers"]].rename(columns={"run_id": "id"})
    candidates = planned.merge(compared, on="id")
    if candidates.empty:
        return int(planned["id"].max())
    if model is not None and (candidates["model"] == model).any():
        candidates = candidates[candidates["model"] == model]
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
                     "(jaxcnn.planner.records.record_donation) into the store")
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


# -- sparsity ------------------------------------------------------------------------------------

SPARSE_PATTERN = re.compile(r"sparse", re.IGNORECASE)


def sparsity_table(store: Store, run_id: int) -> pd.DataFrame:
    """Per-layer activation sparsity (zero fraction of the layer's input and output)."""
    rows = store.sparsity(int(run_id))
    if rows.empty:
        raise NoData(f"run {run_id} has no sparsity measurements: run `jaxcnn profile MODEL --db DB` "
                     "(without --no-sparsity)")
    layers = layer_table(store, run_id)[["idx", "layer", "op", "input_shapes", "output_shape"]]
    out_zero = [(e or {}).get("output_zero_fraction") if isinstance(e, dict) else None for e in rows["extra"]]
    table = pd.DataFrame({"layer": rows["layer"], "input_zero_pct": 100 * rows["zero_fraction"].astype("float64"),
                          "output_zero_pct": 100 * pd.Series(out_zero, dtype="float64").to_numpy()})
    return layers.merge(table, on="layer", how="inner").sort_values("idx", ignore_index=True)


def dense_sparse_decisions(store: Store, run_id: int) -> pd.DataFrame:
    """Per layer: the best dense and best sparse time (backends or variants named *sparse*), the
    faster one as the decision, and the input zero fraction it was measured at."""
    long, _metric = layer_times(store, run_id)
    kind = [("sparse" if SPARSE_PATTERN.search(f"{b} {v}") else "dense") for b, v in zip(long["backend"], long["variant"])]
    long = long.assign(kind=kind)
    if not (long["kind"] == "sparse").any():
        raise NoData(f"run {run_id} has no sparse-kernel measurements yet: the dense/sparse decision appears "
                     "once a run times sparse variants (a backend or variant whose name contains `sparse`)")
    best = long.groupby(["idx", "layer", "kind"], as_index=False)["time_ms"].min()
    wide = best.pivot_table(index=["idx", "layer"], columns="kind", values="time_ms").reset_index()
    wide = wide.rename(columns={"dense": "dense_ms", "sparse": "sparse_ms"}).dropna(subset=["dense_ms", "sparse_ms"])
    wide["sparse_over_dense"] = wide["sparse_ms"] / wide["dense_ms"]
    wide["decision"] = (wide["sparse_ms"] < wide["dense_ms"]).map({True: "sparse", False: "dense"})
    sparsity = sparsity_table(store, run_id)[["layer", "input_zero_pct"]]
    return wide.merge(sparsity, on="layer", how="left").sort_values("idx", ignore_index=True)


def crossover_zero_pct(decisions: pd.DataFrame) -> float | None:
    """The input zero % where sparse starts to win: the ratio sparse/dense fitted linearly in the
    zero % (least squares over the measured layers) and solved for 1. None if it never crosses
    inside [0, 100] or there are fewer than two distinct zero fractions."""
    points = decisions.dropna(subset=["input_zero_pct", "sparse_over_dense"])
    if points["input_zero_pct"].nunique() < 2:
        return None
    x, y = points["input_zero_pct"].to_numpy(float), points["sparse_over_dense"].to_numpy(float)
    xm, ym = x.mean(), y.mean()
    slope = ((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum()
    if slope == 0:
        return None
    crossing = xm + (1.0 - ym) / slope
    return float(crossing) if 0.0 <= crossing <= 100.0 else None
