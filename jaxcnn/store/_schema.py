"""The store's SQL schema: one SQL string per version and the ordered migrations between them.

Conventions the rest of the package relies on (it reads the schema back with PRAGMA table_info):
  * declared type INTEGER, REAL or TEXT says what Python type a column takes;
  * declared type ``JSON TEXT`` marks a column holding JSON (TEXT affinity: a bare ``JSON`` type
    would get NUMERIC affinity and turn the text '3' into the integer 3);
  * NOT NULL without a DEFAULT makes a key required in the row dicts.

Adding a version: write ``SCHEMA_V2`` as the SQL that turns a v1 database into a v2 one, append
its function to ``MIGRATIONS`` and never edit an earlier entry: stores in the wild are at every
version, and each is brought forward by running the entries after its own version in order.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

# PRAGMA application_id of every jaxcnn store: "JCNN" in ASCII, so `file` and sqlite3 tools can
# tell the file apart from other SQLite databases.
APPLICATION_ID = 0x4A434E4E

# The tables of the current schema that hold data (meta aside); a store lacking one is damaged.
TABLES = ("environments", "runs", "layers", "measurements", "predictions", "counters", "plans", "buffers", "sparsity")

# Also kept in the meta table, so the identity survives tools that rewrite the header.
APPLICATION_MARKER = "jaxcnn-profile-store"

# Version 0: an identified but otherwise empty store; every migration starts from here.
BOOTSTRAP = f"""
PRAGMA application_id = {APPLICATION_ID};
CREATE TABLE meta (
    key    TEXT PRIMARY KEY,
    value  TEXT NOT NULL
) WITHOUT ROWID;
INSERT INTO meta (key, value) VALUES ('application', '{APPLICATION_MARKER}'), ('schema_version', '0');
"""

SCHEMA_V1 = """
-- Machines the runs came from; identical content is stored once (content_hash is the dedup key,
-- because UNIQUE over nullable columns would not catch duplicates holding NULLs).
CREATE TABLE environments (
    id              INTEGER PRIMARY KEY,
    content_hash    TEXT NOT NULL UNIQUE,
    gpu_name        TEXT,
    gpu_count       INTEGER CHECK (gpu_count >= 0),
    driver          TEXT,
    cuda_version    TEXT,
    jax_version     TEXT,
    jaxlib_version  TEXT,
    jaxcnn_version  TEXT,
    python          TEXT,
    platform        TEXT,
    hostname        TEXT,
    extra           JSON TEXT
);

CREATE TABLE runs (
    id              INTEGER PRIMARY KEY,
    uid             TEXT NOT NULL UNIQUE,       -- random; kept by export/import so re-imports are no-ops
    created_at      TEXT NOT NULL,              -- UTC ISO-8601 with microseconds: sorts as text
    kind            TEXT NOT NULL CHECK (kind <> ''),   -- 'profile', 'bench', 'plan', ...
    model           TEXT,
    backend         TEXT,
    batch           INTEGER CHECK (batch > 0),
    dtype           TEXT,
    device          TEXT CHECK (device IN ('cpu', 'gpu')),
    note            TEXT,
    git_commit      TEXT,
    environment_id  INTEGER REFERENCES environments (id),
    extra           JSON TEXT
);
CREATE INDEX runs_by_created_at ON runs (created_at);
CREATE INDEX runs_by_environment ON runs (environment_id);

CREATE TABLE layers (
    id              INTEGER PRIMARY KEY,
    run_id          INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    idx             INTEGER NOT NULL CHECK (idx >= 0),      -- program order
    name            TEXT NOT NULL,
    op              TEXT NOT NULL,
    input_shapes    JSON TEXT NOT NULL DEFAULT '[]',        -- list of shapes
    weight_shape    JSON TEXT,
    output_shape    JSON TEXT,
    params          JSON TEXT NOT NULL DEFAULT '{}',        -- stride, padding, groups, activation, ...
    flops           INTEGER CHECK (flops >= 0),
    bytes           INTEGER CHECK (bytes >= 0),
    UNIQUE (run_id, idx),
    UNIQUE (run_id, name),      -- compare() joins runs on layer names
    UNIQUE (id, run_id)         -- target of the (layer_id, run_id) foreign keys: a row can only
                                -- point at a layer of its own run
);

-- layer_id NULL: the whole model.
CREATE TABLE measurements (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    layer_id    INTEGER,
    backend     TEXT NOT NULL,          -- 'xla', 'jaxcnn' or a variant's name
    metric      TEXT NOT NULL,          -- 'device_time_ms', 'wall_time_ms', 'peak_bytes', ...
    median      REAL NOT NULL,
    p10         REAL,
    p90         REAL,
    min         REAL,
    max         REAL,
    n           INTEGER CHECK (n > 0),
    unit        TEXT,
    variant     TEXT,                   -- kernel / layout chosen
    extra       JSON TEXT,              -- kernel names, ...
    FOREIGN KEY (layer_id, run_id) REFERENCES layers (id, run_id) ON DELETE CASCADE,
    CONSTRAINT quantiles_ordered CHECK (
        min <= p10 AND p10 <= median AND median <= p90 AND p90 <= max
        AND min <= median AND median <= max
    )
);
CREATE INDEX measurements_by_run ON measurements (run_id, metric);
CREATE INDEX measurements_by_layer ON measurements (layer_id);

-- Performance-model predictions (layer_id NULL: the whole model).
CREATE TABLE predictions (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    layer_id    INTEGER,
    model       TEXT NOT NULL,          -- 'delta', 'roofline', ...
    tiling      JSON TEXT,
    l1_bytes    INTEGER CHECK (l1_bytes >= 0),
    l2_bytes    INTEGER CHECK (l2_bytes >= 0),
    dram_bytes  INTEGER CHECK (dram_bytes >= 0),
    time_ms     REAL CHECK (time_ms >= 0),
    extra       JSON TEXT,
    FOREIGN KEY (layer_id, run_id) REFERENCES layers (id, run_id) ON DELETE CASCADE
);
CREATE INDEX predictions_by_run ON predictions (run_id);
CREATE INDEX predictions_by_layer ON predictions (layer_id);

-- Measured hardware counters, to hold against the predictions.
CREATE TABLE counters (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    layer_id    INTEGER,
    source      TEXT NOT NULL,          -- 'ncu', ...
    backend     TEXT,
    variant     TEXT,
    l1_bytes    INTEGER CHECK (l1_bytes >= 0),
    l2_bytes    INTEGER CHECK (l2_bytes >= 0),
    dram_bytes  INTEGER CHECK (dram_bytes >= 0),
    extra       JSON TEXT,              -- kernel name, other counters, ...
    FOREIGN KEY (layer_id, run_id) REFERENCES layers (id, run_id) ON DELETE CASCADE
);
CREATE INDEX counters_by_run ON counters (run_id);
CREATE INDEX counters_by_layer ON counters (layer_id);

-- One memory plan per (run, algorithm); its buffers below.
CREATE TABLE plans (
    id                  INTEGER PRIMARY KEY,
    run_id              INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    algorithm           TEXT NOT NULL,  -- 'naive', 'tflite_greedy', 'xla_best_fit', 'jaxcnn_2d', 'xla', ...
    arena_bytes         INTEGER NOT NULL CHECK (arena_bytes >= 0),
    lower_bound_bytes   INTEGER CHECK (lower_bound_bytes >= 0),
    seconds             REAL CHECK (seconds >= 0),      -- planner run time
    extra               JSON TEXT,
    UNIQUE (run_id, algorithm)
);

-- Lifetime [start_step, end_step] is inclusive, in program order (layer idx).
CREATE TABLE buffers (
    id              INTEGER PRIMARY KEY,
    plan_id         INTEGER NOT NULL REFERENCES plans (id) ON DELETE CASCADE,
    name            TEXT NOT NULL,
    size_bytes      INTEGER NOT NULL CHECK (size_bytes >= 0),
    start_step      INTEGER NOT NULL CHECK (start_step >= 0),
    end_step        INTEGER NOT NULL CHECK (end_step >= start_step),
    offset_bytes    INTEGER CHECK (offset_bytes >= 0),      -- NULL: the planner gave no offset
    extra           JSON TEXT,
    UNIQUE (plan_id, name)
);

CREATE TABLE sparsity (
    id              INTEGER PRIMARY KEY,
    run_id          INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    layer_id        INTEGER NOT NULL,
    zero_fraction   REAL NOT NULL CHECK (zero_fraction BETWEEN 0 AND 1),
    sample_count    INTEGER CHECK (sample_count > 0),
    extra           JSON TEXT,
    FOREIGN KEY (layer_id, run_id) REFERENCES layers (id, run_id) ON DELETE CASCADE
);
CREATE INDEX sparsity_by_run ON sparsity (run_id);
CREATE INDEX sparsity_by_layer ON sparsity (layer_id);
"""


def run_script(conn: sqlite3.Connection, sql: str) -> None:
    """Execute `sql` statement by statement inside the caller's transaction.

    sqlite3's executescript() would COMMIT first and so break the all-or-nothing migration.
    """
    statement = ""
    for line in sql.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            conn.execute(statement)
            statement = ""
    if statement.strip():
        raise ValueError(f"incomplete SQL statement at the end of a script: {statement!r}")


def migrate_to_v1(conn: sqlite3.Connection) -> None:
    run_script(conn, SCHEMA_V1)


# MIGRATIONS[i] turns a version-i store into a version-(i + 1) store.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [migrate_to_v1]

# The version a new or migrated store has; exports (JSON) record the version they were written at.
SCHEMA_VERSION = len(MIGRATIONS)
