"""Row dicts in, DataFrames out: validation and typing driven by the schema itself.

What a table accepts is read from the database (PRAGMA table_info), so the SQL in _schema.py is
the one place that says which keys exist, which are required and what type each takes.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Declared SQL type -> the kind of Python value the column takes.
_KIND_OF_DECLARED_TYPE = {"INTEGER": "int", "REAL": "float", "TEXT": "str", "JSON TEXT": "json"}


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "int", "float", "str" or "json"
    required: bool  # NOT NULL without a default: the row must give a non-None value


def table_columns(conn: sqlite3.Connection, table: str) -> dict[str, Column]:
    columns = {}
    for _cid, name, declared, notnull, default, primary_key in conn.execute(f"PRAGMA table_info({table})"):
        kind = _KIND_OF_DECLARED_TYPE[declared.upper()]
        required = bool(notnull) and default is None and not primary_key
        columns[name] = Column(name, kind, required)
    return columns


def row_values(what: str, columns: Mapping[str, Column], row: Any) -> dict[str, Any]:
    """`row` checked against `columns` and converted to SQLite values; ValueError naming `what`."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{what}: expected a dict, got {type(row).__name__}")
    unknown = sorted(set(row) - set(columns))
    if unknown:
        raise ValueError(f"{what}: unknown keys {unknown}; allowed keys: {sorted(columns)}")
    missing = sorted(c.name for c in columns.values() if c.required and row.get(c.name) is None)
    if missing:
        raise ValueError(f"{what}: missing required keys {missing}")
    return {name: sql_value(f"{what}: {name!r}", columns[name].kind, value) for name, value in row.items()}


def sql_value(what: str, kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "json":
        return to_json(what, value)
    if isinstance(value, bool):  # bool is an int subclass; True as a batch size is a bug
        raise ValueError(f"{what} must be {_KIND_NAMES[kind]}, got a bool")
    if kind == "int":
        try:
            return operator.index(value)  # int and NumPy integers, not floats
        except TypeError:
            raise ValueError(f"{what} must be an integer, got {value!r}") from None
    if kind == "float":
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            # SQLite would store NaN as NULL, silently.
            raise ValueError(f"{what} must be a finite number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {value!r}")
    return value


_KIND_NAMES = {"int": "an integer", "float": "a finite number", "str": "a string"}


def to_json(what: str, value: Any) -> str:
    """Canonical JSON (sorted keys), so equal content gives equal text."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False, default=_json_default)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serializable: {exc}") from None


def _json_default(value: Any) -> Any:
    """NumPy/JAX scalars and arrays (shapes, counts) as plain JSON."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def from_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def column_kinds(conn: sqlite3.Connection, tables: Iterable[str]) -> dict[str, str]:
    """Column name -> kind over all tables (a name means the same thing in every table)."""
    kinds: dict[str, str] = {}
    for table in tables:
        for column in table_columns(conn, table).values():
            assert kinds.setdefault(column.name, column.kind) == column.kind, column.name
    return kinds


def frame(cursor: sqlite3.Cursor, kinds: Mapping[str, str]):
    """The cursor's rows as a DataFrame: nullable Int64 for integers, decoded JSON (None where
    NULL), UTC datetimes for created_at.

    Built from the cursor rather than pandas.read_sql so SQLite errors stay sqlite3 errors.
    """
    pd = import_pandas()
    names = [d[0] for d in cursor.description]
    rows = cursor.fetchall()
    columns = list(zip(*rows)) if rows else [()] * len(names)
    return pd.DataFrame({name: _series(pd, name, kinds.get(name), values) for name, values in zip(names, columns)})


def _series(pd, name: str, kind: str | None, values: tuple):
    if name == "created_at":
        return pd.to_datetime(pd.Series(values, dtype=object), utc=True, format="ISO8601")
    if kind == "int":
        return pd.Series(values, dtype="Int64")
    if kind == "float":
        return pd.Series(values, dtype="float64")
    if kind == "json":
        return pd.Series([from_json(v) for v in values], dtype=object)
    return pd.Series(values, dtype=None if values else object)


def import_pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError("reading a jaxcnn profile store needs pandas: pip install 'jaxcnn[dashboard]'") from None
    return pandas
