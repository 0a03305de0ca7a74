"""The profile store: a SQLite file that profiler runs write into and the dashboard reads."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jaxcnn.store import _db, _portable, _rows, _schema
from jaxcnn.store._db import StoreError
from jaxcnn.store._schema import TABLES

# Columns the Store fills in itself, never taken from row dicts.
_MANAGED = {
    "environments": {"id", "content_hash"},
    "runs": {"id", "uid", "created_at", "environment_id"},
    "buffers": {"id", "plan_id"},
}
_MANAGED_DEFAULT = {"id", "run_id"}

COMPARE_COLUMNS = ("layer", "idx", "op", "backend", "median_a", "median_b", "ratio", "variant_a", "variant_b", "unit")

# Columns that readers add by joins, with their kinds.
_JOINED_KINDS = {"layer": "str", "layer_idx": "int", "environment_extra": "json", "n_buffers": "int"}


class Store:
    """A jaxcnn profile store.

    ``Store(path=None)`` opens (creating or migrating) the SQLite file at `path`, else at
    ``$JAXCNN_DB``, else ``jaxcnn_profiles.sqlite`` in the current directory. Use it as a context
    manager or call close(). Several processes may write to one file at once; within a process a
    Store may be shared across threads. Open a new Store in each process (never share one
    across fork).

    ``read_only=True`` opens an existing store read-only and never creates, migrates or writes
    it (what readers should use); ``read_only=False`` insists on write access; the default opens a
    file without write permission read-only and anything else read-write. The file is checked
    (identity, schema version, tables) here, so a bad store fails before any work is done.

    Writers take plain dicts whose keys are the table's columns (see _schema.py; unknown or missing
    required keys raise ValueError) and insert all rows of one call in one transaction;
    ``with store.transaction():`` makes several calls one all-or-nothing transaction. Readers
    return pandas DataFrames with JSON columns decoded and integer columns as nullable Int64.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, read_only: bool | None = None,
                 partial: bool = False):
        self.path: Path = _db.resolve_path(path)
        self._lock = threading.RLock()
        self._in_transaction = False  # inside transaction(): writer calls become savepoints
        if partial and read_only is not True:
            raise ValueError("partial=True opens a store read-only: pass read_only=True with it")
        conn, self.read_only = _db.open_connection(self.path, read_only, partial)
        self._conn: sqlite3.Connection | None = conn
        self._columns = {t: _rows.table_columns(self._conn, t) for t in TABLES}
        self._kinds = {**_rows.column_kinds(self._conn, TABLES), **_JOINED_KINDS}

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r}{', read_only=True' if self.read_only else ''})"

    @contextmanager
    def transaction(self) -> Iterator[Store]:
        """Make every writer call in the block one transaction: all of it lands, or none of it
        (an exception, a crash or a kill midway). Other threads' calls wait for the block;
        other processes see nothing of it until it ends. Nested blocks join the outer one.

            with store.transaction():
                run = store.add_run("profile", ...)
                store.add_measurements(run, rows)
        """
        with self._connection() as conn:
            if self._in_transaction:
                yield self
                return
            self._check_writable()
            with _db.write_transaction(conn):
                self._in_transaction = True
                try:
                    yield self
                finally:
                    self._in_transaction = False

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock, with SQLite errors turned into ValueError/StoreError."""
        with self._lock:
            if self._conn is None:
                raise StoreError(f"profile store {self.path} is closed")
            try:
                yield self._conn
            except sqlite3.IntegrityError as exc:
                raise ValueError(f"{self.path}: {exc}") from exc
            except sqlite3.Error as exc:
                raise StoreError(f"profile store {self.path}: {exc}") from exc

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One writer call, all or nothing: its own transaction, or a savepoint inside transaction()."""
        with self._connection() as conn:
            self._check_writable()
            if not self._in_transaction:
                with _db.write_transaction(conn):
                    yield conn
                return
            conn.execute("SAVEPOINT writer_call")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK TO writer_call")
                    conn.execute("RELEASE writer_call")
                raise
            conn.execute("RELEASE writer_call")

    def _check_writable(self) -> None:
        if self.read_only:
            raise StoreError(f"profile store {self.path} is open read-only: cannot write to it")

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._connection() as conn, _db.read_transaction(conn):
            yield conn

    # -- writers --------------------------------------------------------------------------------

    def add_run(
        self,
        kind: str,
        *,
        model: str | None = None,
        backend: str | None = None,
        batch: int | None = None,
        dtype: str | None = None,
        device: str | None = None,
        note: str | None = None,
        git_commit: str | None = None,
        environment: Mapping[str, Any] | None = None,
        extra: Any = None,
        created_at: datetime | str | None = None,
    ) -> int:
        """Record a run and return its id.

        `environment`: dict with keys gpu_name, gpu_count, driver, cuda_version, jax_version,
        jaxlib_version, jaxcnn_version, python, platform, hostname, extra (all optional); runs
        with equal environments share one row. `created_at`: timezone-aware, default now.
        """
        fields = dict(
            kind=kind, model=model, backend=backend, batch=batch, dtype=dtype, device=device,
            note=note, git_commit=git_commit, extra=extra,
        )
        with self._writing() as conn:
            return self._insert_run(conn, fields, environment, created_at, uid=None)

    def add_layers(self, run_id: int, rows: Iterable[Mapping[str, Any]]) -> list[int]:
        """Layers of a run, in any order. Keys: idx, name, op (required; idx and name unique in the
        run), input_shapes, weight_shape, output_shape, params (JSON), flops, bytes."""
        with self._writing() as conn:
            return self._insert_rows(conn, "layers", rows, run_id=self._require_run(conn, run_id))

    def add_measurements(self, run_id: int, rows: Iterable[Mapping[str, Any]]) -> list[int]:
        """Keys: backend, metric, median (required), layer_id (None: whole model), p10, p90, min,
        max, n, unit, variant, extra (JSON). Quantiles must be ordered."""
        with self._writing() as conn:
            return self._insert_rows(conn, "measurements", rows, run_id=self._require_run(conn, run_id))

    def add_predictions(self, run_id: int, rows: Iterable[Mapping[str, Any]]) -> list[int]:
        """Keys: model (required), layer_id, tiling (JSON), l1_bytes, l2_bytes, dram_bytes,
        time_ms, extra (JSON)."""
        with self._writing() as conn:
            return self._insert_rows(conn, "predictions", rows, run_id=self._require_run(conn, run_id))

    def add_counters(self, run_id: int, rows: Iterable[Mapping[str, Any]]) -> list[int]:
        """Measured counters. Keys: source (required, e.g. 'ncu'), layer_id, backend, variant,
        l1_bytes, l2_bytes, dram_bytes, extra (JSON)."""
        with self._writing() as conn:
            return self._insert_rows(conn, "counters", rows, run_id=self._require_run(conn, run_id))

    def add_sparsity(self, run_id: int, rows: Iterable[Mapping[str, Any]]) -> list[int]:
        """Keys: layer_id, zero_fraction (required, in [0, 1]), sample_count, extra (JSON)."""
        with self._writing() as conn:
            return self._insert_rows(conn, "sparsity", rows, run_id=self._require_run(conn, run_id))

    def add_plan(
        self,
        run_id: int,
        algorithm: str,
        arena_bytes: int,
        lower_bound_bytes: int | None = None,
        buffers: Iterable[Mapping[str, Any]] = (),
        *,
        seconds: float | None = None,
        extra: Any = None,
    ) -> int:
        """A memory plan of the run (one per algorithm) and its buffers; returns the plan id.

        Buffer keys: name, size_bytes, start_step, end_step (required; inclusive program-order
        lifetime), offset_bytes, extra (JSON). offset_bytes + size_bytes must fit in the arena.
        """
        plan = dict(algorithm=algorithm, arena_bytes=arena_bytes, lower_bound_bytes=lower_bound_bytes,
                    seconds=seconds, extra=extra)
        with self._writing() as conn:
            return self._insert_plan(conn, self._require_run(conn, run_id), plan, buffers)

    def delete_run(self, run_id: int) -> None:
        """Delete a run with everything recorded under it, and environments no run uses any more."""
        with self._writing() as conn:
            conn.execute("DELETE FROM runs WHERE id = ?", (self._require_run(conn, run_id),))
            conn.execute(
                "DELETE FROM environments WHERE id NOT IN "
                "(SELECT environment_id FROM runs WHERE environment_id IS NOT NULL)"
            )

    # -- readers --------------------------------------------------------------------------------

    def runs(self):
        """All runs, oldest first, with their environment's columns (its extra as environment_extra)."""
        env_columns = [c for c in self._columns["environments"] if c not in ("id", "content_hash", "extra")]
        sql = (
            f"SELECT r.*, {', '.join('e.' + c for c in env_columns)}, e.extra AS environment_extra "
            "FROM runs r LEFT JOIN environments e ON e.id = r.environment_id ORDER BY r.created_at, r.id"
        )
        return self._frame(sql)

    def environments(self):
        return self._frame("SELECT * FROM environments ORDER BY id")

    def layers(self, run_id: int | None = None):
        """Layers of one run (None: all runs) in program order."""
        where, params = _where(run_id=run_id)
        return self._frame(f"SELECT * FROM layers {where} ORDER BY run_id, idx", params)

    def measurements(self, run_id: int | None = None, metric: str | None = None):
        """Measurements with the layer's name and idx (layer, layer_idx; NA for whole-model rows)."""
        return self._per_layer("measurements", run_id, metric=metric)

    def predictions(self, run_id: int | None = None):
        return self._per_layer("predictions", run_id)

    def counters(self, run_id: int | None = None):
        return self._per_layer("counters", run_id)

    def sparsity(self, run_id: int | None = None):
        return self._per_layer("sparsity", run_id)

    def plans(self, run_id: int | None = None):
        """Plans with their buffer count (n_buffers)."""
        where, params = _where(**{"p.run_id": run_id})
        sql = (
            "SELECT p.*, count(b.id) AS n_buffers FROM plans p LEFT JOIN buffers b ON b.plan_id = p.id "
            f"{where} GROUP BY p.id ORDER BY p.run_id, p.id"
        )
        return self._frame(sql, params)

    def buffers(self, run_id: int | None = None, algorithm: str | None = None):
        """Buffers with their plan's run_id and algorithm, by start_step."""
        where, params = _where(**{"p.run_id": run_id, "p.algorithm": algorithm})
        sql = (
            "SELECT b.*, p.run_id, p.algorithm FROM buffers b JOIN plans p ON p.id = b.plan_id "
            f"{where} ORDER BY p.run_id, p.algorithm, b.start_step, b.id"
        )
        return self._frame(sql, params)

    def compare(self, run_a: int, run_b: int, metric: str = "device_time_ms"):
        """Per-layer `metric` of two runs joined on (layer name, backend); ratio = b / a.

        An outer join: a layer or backend measured in only one run gets NA on the other side.
        Where a run measured a (layer, backend) several times, its latest row counts.
        Columns: COMPARE_COLUMNS.
        """
        sides = [self._layer_metric(run_id, metric) for run_id in (run_a, run_b)]
        both = sides[0].merge(sides[1], on=["layer", "backend"], how="outer", suffixes=("_a", "_b"))
        for column in ("idx", "op", "unit"):  # the same in both runs, unless one side is missing
            both[column] = both[f"{column}_a"].combine_first(both[f"{column}_b"])
        both["ratio"] = both["median_b"] / both["median_a"]
        both = both.sort_values(["idx", "layer", "backend"], ignore_index=True)
        return both[list(COMPARE_COLUMNS)]

    # -- export / import ------------------------------------------------------------------------

    def export(self, directory: str | os.PathLike, format: str = "csv") -> list[Path]:
        """Write each table (raw, JSON as text) to `directory`/<table>.csv or .parquet."""
        with self._reading() as conn:
            return _portable.export_tables(conn, ("meta", *TABLES), self._kinds, Path(directory), format)

    def export_json(self, path: str | os.PathLike, run_ids: Iterable[int] | None = None) -> Path:
        """Write runs (default: all) with everything under them to a portable JSON file."""
        with self._reading() as conn:
            ids = self._all_run_ids(conn) if run_ids is None else [self._require_run(conn, r) for r in run_ids]
            runs = [_portable.run_document(conn, run_id, self._columns) for run_id in ids]
            schema_version = _portable.store_schema_version(conn)
        return _portable.write_export(Path(path), runs, schema_version)

    def import_json(self, path: str | os.PathLike) -> list[int]:
        """Load a file written by export_json, all or nothing; returns the run ids, in file order.

        Runs already in this store (same uid, e.g. a second import of the same file) are not
        duplicated: their existing ids are returned.
        """
        export = _portable.read_export(path)
        latest = len(_schema.MIGRATIONS)
        if export.schema_version > latest:
            raise ValueError(f"{path} was exported from a store of schema version {export.schema_version}, newer "
                             f"than this jaxcnn's ({latest}); upgrade jaxcnn to import it")
        runs = export.runs
        with self._writing() as conn:
            return [self._import_run(conn, run, f"{path}: run {i}") for i, run in enumerate(runs)]

    # -- internals ------------------------------------------------------------------------------

    def _writable(self, table: str) -> dict[str, _rows.Column]:
        managed = _MANAGED.get(table, _MANAGED_DEFAULT)
        return {name: c for name, c in self._columns[table].items() if name not in managed}

    def _require_run(self, conn: sqlite3.Connection, run_id: Any) -> int:
        run_id = _rows.sql_value("run_id", "int", run_id)
        if conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
            raise ValueError(f"{self.path}: no run with id {run_id}")
        return run_id

    def _all_run_ids(self, conn: sqlite3.Connection) -> list[int]:
        return [row[0] for row in conn.execute("SELECT id FROM runs ORDER BY created_at, id")]

    def _insert_run(self, conn, fields: dict, environment, created_at, uid: str | None) -> int:
        values = _rows.row_values("run", self._writable("runs"), fields)
        values["created_at"] = _utc_iso(created_at)
        values["uid"] = uid or uuid.uuid4().hex
        values["environment_id"] = self._environment_id(conn, environment)
        return _insert(conn, "runs", values)

    def _environment_id(self, conn: sqlite3.Connection, environment: Mapping[str, Any] | None) -> int | None:
        if environment is None:
            return None
        columns = self._writable("environments")
        values = _rows.row_values("environment", columns, environment)
        canonical = _rows.to_json("environment", {name: values.get(name) for name in columns})
        content_hash = hashlib.sha256(canonical.encode()).hexdigest()
        found = conn.execute("SELECT id FROM environments WHERE content_hash = ?", (content_hash,)).fetchone()
        return found[0] if found else _insert(conn, "environments", {**values, "content_hash": content_hash})

    def _insert_rows(self, conn, table: str, rows: Iterable[Mapping[str, Any]], **fixed: Any) -> list[int]:
        return self._insert_validated(conn, table, self._validated(table, rows), **fixed)

    def _validated(self, table: str, rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Every row checked before any is inserted."""
        if isinstance(rows, Mapping):
            raise ValueError(f"{table}: expected a list of row dicts, got a single dict")
        columns = self._writable(table)
        return [_rows.row_values(f"{table} row {i}", columns, row) for i, row in enumerate(rows)]

    def _insert_validated(self, conn, table: str, all_values: list[dict[str, Any]], **fixed: Any) -> list[int]:
        """Insert rows checked by _validated; the caller's transaction makes it all or nothing."""
        if "run_id" in fixed and "layer_id" in self._columns[table]:
            self._check_layer_ids(conn, table, fixed["run_id"], all_values)
        ids = []
        for i, values in enumerate(all_values):
            try:
                ids.append(_insert(conn, table, {**fixed, **values}))
            except sqlite3.IntegrityError as exc:
                raise ValueError(f"{self.path}: {table} row {i}: {exc}") from exc
        return ids

    def _check_layer_ids(self, conn, table: str, run_id: int, all_values: list[dict]) -> None:
        wanted = {v["layer_id"] for v in all_values if v.get("layer_id") is not None}
        known = {row[0] for row in conn.execute("SELECT id FROM layers WHERE run_id = ?", (run_id,))}
        if wanted - known:
            raise ValueError(f"{table}: layer ids {sorted(wanted - known)} are not layers of run {run_id}")

    def _insert_plan(self, conn, run_id: int, plan: dict, buffers: Iterable[Mapping[str, Any]]) -> int:
        values = _rows.row_values("plan", self._writable("plans"), plan)
        buffer_values = self._validated("buffers", buffers)
        _check_buffers_fit(buffer_values, values["arena_bytes"])
        exists = conn.execute("SELECT 1 FROM plans WHERE run_id = ? AND algorithm = ?", (run_id, values["algorithm"]))
        if exists.fetchone():
            raise ValueError(f"{self.path}: run {run_id} already has a {values['algorithm']!r} plan")
        plan_id = _insert(conn, "plans", {**values, "run_id": run_id})
        self._insert_validated(conn, "buffers", buffer_values, plan_id=plan_id)
        return plan_id

    def _import_run(self, conn: sqlite3.Connection, run: Mapping[str, Any], what: str) -> int:
        parts = _portable.split_run_document(run, what)
        existing = conn.execute("SELECT id FROM runs WHERE uid = ?", (parts.uid,)).fetchone()
        if existing:
            return existing[0]
        run_id = self._insert_run(conn, parts.fields, parts.environment, parts.created_at, parts.uid)
        layer_ids = self._insert_rows(conn, "layers", parts.layers, run_id=run_id)
        layer_id_of = {layer["name"]: layer_id for layer, layer_id in zip(parts.layers, layer_ids)}
        for table, rows in parts.per_layer.items():
            rows = [_portable.with_layer_id(row, layer_id_of, f"{what}: {table}") for row in rows]
            self._insert_rows(conn, table, rows, run_id=run_id)
        for plan, buffers in parts.plans:
            self._insert_plan(conn, run_id, plan, buffers)
        return run_id

    def _per_layer(self, table: str, run_id: int | None, **filters: Any):
        where, params = _where(**{"t.run_id": run_id, **{f"t.{k}": v for k, v in filters.items()}})
        sql = (
            f"SELECT t.*, l.name AS layer, l.idx AS layer_idx FROM {table} t "
            f"LEFT JOIN layers l ON l.id = t.layer_id {where} ORDER BY t.run_id, l.idx, t.id"
        )
        return self._frame(sql, params)

    def _layer_metric(self, run_id: int, metric: str):
        with self._reading() as conn:
            run_id = self._require_run(conn, run_id)
        sql = (
            "SELECT l.name AS layer, l.idx, l.op, m.backend, m.median, m.unit, m.variant "
            "FROM measurements m JOIN layers l ON l.id = m.layer_id "
            "WHERE m.run_id = ? AND m.metric = ? ORDER BY m.id"
        )
        return self._frame(sql, (run_id, metric)).drop_duplicates(["layer", "backend"], keep="last")

    def _frame(self, sql: str, params: tuple = ()):
        with self._connection() as conn:
            return _rows.frame(conn.execute(sql, params), self._kinds)


def _insert(conn: sqlite3.Connection, table: str, values: Mapping[str, Any]) -> int:
    names = ", ".join(values)
    marks = ", ".join("?" * len(values))
    return conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", tuple(values.values())).lastrowid


def _where(**conditions: Any) -> tuple[str, tuple]:
    """'WHERE a = ? AND b = ?' over the conditions that are not None.

    Non-string values are ids: made plain ints, because sqlite3 binds a NumPy integer (what a
    DataFrame cell holds) as a BLOB that equals no id.
    """
    given = {
        column: value if isinstance(value, str) else _rows.sql_value(column, "int", value)
        for column, value in conditions.items()
        if value is not None
    }
    if not given:
        return "", ()
    return "WHERE " + " AND ".join(f"{column} = ?" for column in given), tuple(given.values())


def _check_buffers_fit(buffers: list[dict[str, Any]], arena_bytes: int) -> None:
    for i, buffer in enumerate(buffers):
        offset, size = buffer.get("offset_bytes"), buffer["size_bytes"]
        if offset is not None and offset + size > arena_bytes:
            raise ValueError(
                f"buffers row {i}: offset_bytes {offset} + size_bytes {size} exceeds arena_bytes {arena_bytes}"
            )


def _utc_iso(moment: datetime | str | None) -> str:
    """UTC ISO-8601 with microseconds, so stored timestamps sort correctly as text."""
    if moment is None:
        moment = datetime.now(timezone.utc)
    elif isinstance(moment, str):
        try:
            moment = datetime.fromisoformat(moment.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"created_at {moment!r} is not an ISO-8601 timestamp") from None
    if not isinstance(moment, datetime) or moment.tzinfo is None:
        raise ValueError(f"created_at must be a timezone-aware datetime or ISO string, got {moment!r}")
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")
