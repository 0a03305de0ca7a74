"""Getting data out of (and into) a store file: per-table CSV/Parquet and a portable JSON dump.

The JSON dump is how measured GPU results travel: committed to the repository and imported into
a store on machines without a GPU. It holds no database ids; rows point at layers by name, and
each run keeps the uid it was created with, so importing a file twice adds nothing the second time.
It records the schema version of the store it was written from ("schema_version"), so data
shipped with the repository can be checked against the store's current schema; files written
before that key existed come from version-1 stores (the only version there was).
"""

from __future__ import annotations

import importlib
import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxcnn.store import _rows
from jaxcnn.store._schema import APPLICATION_MARKER

JSON_FORMAT_VERSION = 1
# The schema version of exports written before they recorded one.
UNRECORDED_SCHEMA_VERSION = 1

# Tables whose rows may point at a layer; in the JSON they carry the layer's name as "layer".
PER_LAYER_TABLES = ("measurements", "predictions", "counters", "sparsity")

EXPORT_FORMATS = ("csv", "parquet")


# -- per-table export ------------------------------------------------------------------------------


def export_tables(conn, tables, kinds: Mapping[str, str], directory: Path, format: str) -> list[Path]:
    if format not in EXPORT_FORMATS:
        raise ValueError(f"export format must be one of {EXPORT_FORMATS}, got {format!r}")
    if format == "parquet":
        _require_pyarrow()
    directory.mkdir(parents=True, exist_ok=True)
    # Raw table contents: JSON stays text, timestamps stay ISO strings.
    raw_kinds = {name: kind for name, kind in kinds.items() if kind in ("int", "float")}
    written = []
    for table in tables:
        df = _rows.frame(conn.execute(f"SELECT * FROM {table} ORDER BY 1"), raw_kinds)
        path = directory / f"{table}.{format}"
        if format == "csv":
            df.to_csv(path, index=False)
        else:
            df.to_parquet(path, index=False, engine="pyarrow")
        written.append(path)
    return written


def _require_pyarrow() -> None:
    try:
        importlib.import_module("pyarrow")
    except ImportError:
        raise ImportError("exporting to parquet needs pyarrow: pip install pyarrow (or use format='csv')") from None


# -- JSON dump -------------------------------------------------------------------------------------


def run_document(conn: sqlite3.Connection, run_id: int, columns: Mapping[str, Mapping[str, _rows.Column]]) -> dict:
    """One run and everything under it, as plain JSON-ready data without database ids."""
    def select(table: str, sql: str, *params: Any, drop: tuple[str, ...] = ("id", "run_id")) -> list[dict]:
        return _select_dicts(conn, sql, params, columns[table], drop)

    run = select("runs", "SELECT * FROM runs WHERE id = ?", run_id, drop=("id", "environment_id"))[0]
    run["environment"] = _environment_document(conn, run_id, columns["environments"])
    run["layers"] = select("layers", "SELECT * FROM layers WHERE run_id = ? ORDER BY idx", run_id)
    layer_name = {row[0]: row[1] for row in conn.execute("SELECT id, name FROM layers WHERE run_id = ?", (run_id,))}
    for table in PER_LAYER_TABLES:
        rows = _select_dicts(conn, f"SELECT * FROM {table} WHERE run_id = ? ORDER BY id", (run_id,), columns[table],
                             drop=("id", "run_id"))
        run[table] = [_with_layer_name(row, layer_name) for row in rows]
    run["plans"] = select("plans", "SELECT * FROM plans WHERE run_id = ? ORDER BY id", run_id)
    plan_ids = [row[0] for row in conn.execute("SELECT id FROM plans WHERE run_id = ? ORDER BY id", (run_id,))]
    for plan, plan_id in zip(run["plans"], plan_ids):
        plan["buffers"] = select("buffers", "SELECT * FROM buffers WHERE plan_id = ? ORDER BY id", plan_id,
                                 drop=("id", "plan_id"))
    return run


def _environment_document(conn, run_id: int, columns: Mapping[str, _rows.Column]) -> dict | None:
    sql = "SELECT e.* FROM environments e JOIN runs r ON r.environment_id = e.id WHERE r.id = ?"
    found = _select_dicts(conn, sql, (run_id,), columns, drop=("id", "content_hash"))
    return found[0] if found else None


def _select_dicts(conn, sql: str, params: tuple, columns: Mapping[str, _rows.Column], drop: tuple) -> list[dict]:
    """Rows as dicts with JSON decoded; NULLs and the `drop` columns left out (absent means None)."""
    cursor = conn.execute(sql, params)
    names = [d[0] for d in cursor.description]
    rows = []
    for values in cursor:
        row = {}
        for name, value in zip(names, values):
            if name in drop or value is None:
                continue
            row[name] = _rows.from_json(value) if columns[name].kind == "json" else value
        rows.append(row)
    return rows


def _with_layer_name(row: dict, layer_name: Mapping[int, str]) -> dict:
    layer_id = row.pop("layer_id", None)
    return row if layer_id is None else {"layer": layer_name[layer_id], **row}


def with_layer_id(row: Any, layer_id_of: Mapping[str, int], what: str) -> Any:
    """The JSON row with its layer name swapped for the id of that layer in the importing store."""
    if not isinstance(row, Mapping):
        return row  # row validation reports it
    if "layer_id" in row:
        raise ValueError(f"{what}: rows refer to layers by name ('layer'), not by 'layer_id'")
    row = dict(row)
    name = row.pop("layer", None)
    if name is not None:
        if name not in layer_id_of:
            raise ValueError(f"{what}: no layer named {name!r} in this run")
        row["layer_id"] = layer_id_of[name]
    return row


def store_schema_version(conn: sqlite3.Connection) -> int:
    """The schema version in the store's meta table (the store was checked when it was opened)."""
    return int(conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0])


def write_export(path: str | Path, runs: list[dict], schema_version: int) -> Path:
    """Write `runs` (run documents, as read_export returns them) as an export file at `path`,
    atomically: the file is whole or not there."""
    path = Path(path)
    document = {"format": APPLICATION_MARKER, "format_version": JSON_FORMAT_VERSION,
                "schema_version": schema_version, "runs": runs}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(_layout(document) + "\n", encoding="utf-8")
    temporary.replace(path)  # never leave a half-written file where a good one was
    return path


def _layout(value: Any, depth: int = 0) -> str:
    """Indented JSON with one table row per line: readable, and diffs well when committed."""
    if not _holds_rows(value):
        return json.dumps(value, ensure_ascii=False)
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(value, list):
        items = [inner + _layout(item, depth + 1) for item in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    items = [f"{inner}{json.dumps(key)}: {_layout(item, depth + 1)}" for key, item in value.items()]
    return "{\n" + ",\n".join(items) + f"\n{pad}}}"


def _holds_rows(value: Any) -> bool:
    """A non-empty list of dicts, or a dict with such a list among its values."""
    if isinstance(value, list):
        return bool(value) and all(isinstance(item, dict) for item in value)
    return isinstance(value, dict) and any(isinstance(item, list) and _holds_rows(item) for item in value.values())


@dataclass(frozen=True)
class Export:
    """A JSON export, checked: the schema version of the store it was written from, and its runs
    (plain dicts as export_json wrote them)."""

    path: Path
    schema_version: int
    runs: list


def read_export(path: str | Path) -> Export:
    """The export at `path` after checking it is one this jaxcnn reads (ValueError otherwise)."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a jaxcnn profile export: invalid JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != APPLICATION_MARKER:
        raise ValueError(f"{path} is not a jaxcnn profile export (no \"format\": \"{APPLICATION_MARKER}\")")
    version = document.get("format_version")
    if not isinstance(version, int) or version > JSON_FORMAT_VERSION:
        raise ValueError(
            f"{path} has export format version {version!r}; this jaxcnn reads up to {JSON_FORMAT_VERSION}, upgrade it"
        )
    schema = document.get("schema_version", UNRECORDED_SCHEMA_VERSION)
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        raise ValueError(f"{path}: \"schema_version\" must be a positive integer, got {schema!r}")
    runs = document.get("runs")
    if not isinstance(runs, list):
        raise ValueError(f"{path}: \"runs\" must be a list")
    return Export(path, schema, runs)


@dataclass
class RunParts:
    uid: str
    created_at: str
    fields: dict  # the other runs-table columns
    environment: dict | None
    layers: list
    per_layer: dict[str, list]  # table -> rows naming their layer as "layer"
    plans: list[tuple[dict, list]]  # (plan columns, its buffers)


def split_run_document(run: Any, what: str) -> RunParts:
    """A run object of the JSON file cut into what each table takes (rows are checked later)."""
    if not isinstance(run, Mapping):
        raise ValueError(f"{what}: expected an object, got {type(run).__name__}")
    fields = dict(run)
    uid, created_at = fields.pop("uid", None), fields.pop("created_at", None)
    if not isinstance(uid, str) or not uid or not isinstance(created_at, str):
        raise ValueError(f"{what}: needs a 'uid' and a 'created_at' string")
    nested = {key: fields.pop(key, []) for key in ("layers", *PER_LAYER_TABLES, "plans")}
    for key, rows in nested.items():
        if not isinstance(rows, list):
            raise ValueError(f"{what}: {key!r} must be a list")
    return RunParts(
        uid=uid,
        created_at=created_at,
        fields=fields,
        environment=fields.pop("environment", None),
        layers=nested["layers"],
        per_layer={table: nested[table] for table in PER_LAYER_TABLES},
        plans=[_split_plan(plan, f"{what}: plan {i}") for i, plan in enumerate(nested["plans"])],
    )


def _split_plan(plan: Any, what: str) -> tuple[dict, list]:
    if not isinstance(plan, Mapping):
        raise ValueError(f"{what}: expected an object, got {type(plan).__name__}")
    plan = dict(plan)
    buffers = plan.pop("buffers", [])
    if not isinstance(buffers, list):
        raise ValueError(f"{what}: 'buffers' must be a list")
    return plan, buffers
