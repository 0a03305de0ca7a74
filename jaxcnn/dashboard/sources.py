"""Where the dashboard's data comes from, and where each number it shows comes from.

Which store (``choose_source``): the DB the user names, or, when it does not exist or holds no
runs, the shipped store exports (dashboard/shipped/*.json, measured on a GPU at a recorded
commit: ``shipped_provenance``) imported once into a cached SQLite file.

Which source each number has (``column_sources``): measured (timed or read from XLA's compile
on the machine of a run of this store), shipped (the same, from the shipped data), model
(jaxcnn.costmodel's predictions and roofline floors) or computed (counted from shapes or
buffer lifetimes: FLOPs, compulsory bytes, packing arenas).

Also the pieces every reader of the dashboard shares: NoData, read-only SQL on a store
(``_readonly``, ``_sql``), the MiB unit and the cell helpers ``_present`` / ``_text``.
Nothing here imports Streamlit or jax.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from jaxcnn.store import DEFAULT_FILENAME, PATH_ENV_VAR, Store, StoreError, read_export
from jaxcnn.tuning import cache_file

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "dashboard" / "shipped"
CACHE_ENV_VAR = "JAXCNN_DASHBOARD_CACHE"
MIB = 2**20  # bytes in a MiB: the unit of every *_mib column
SHORT_COMMIT = 7  # hex digits of a commit shown

# Where a number shown comes from.
MEASURED = "measured"
SHIPPED = "shipped"
MODEL = "model"
COMPUTED = "computed"
SOURCE_MEANINGS = {
    MEASURED: "timed, or read from XLA's compiled program, on the machine of a run in this store",
    SHIPPED: "measured on the GPU of the shipped data (dashboard/shipped/), at its recorded commit",
    MODEL: "predicted by jaxcnn.costmodel (traffic/time model, roofline floor)",
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
    """The GPUs, dates and commits of the shipped exports in one line, e.g. 'NVIDIA H200, made
    2026-11-21 to 2026-11-29, commits 37d5348-dirty, cc1624b (3 of 75 runs record no commit)'
    (-dirty: made from a tree with uncommitted changes)."""
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


# -- cells ---------------------------------------------------------------------------------------


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and value is not pd.NA


def _text(value: Any) -> str:
    return str(value) if _present(value) and str(value) else ""
