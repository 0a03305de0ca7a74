"""Opening a store file: identify it, create or migrate its schema, set it up for concurrent use."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jaxcnn.store import _schema

DEFAULT_FILENAME = "jaxcnn_profiles.sqlite"
PATH_ENV_VAR = "JAXCNN_DB"

# Long enough to wait out any other process's (short) write transaction.
BUSY_TIMEOUT_S = 30.0

_SQLITE_MAGIC = b"SQLite format 3\x00"
_HEADER_BYTES = 100


class StoreError(Exception):
    """The file cannot be used as a jaxcnn profile store (corrupt, foreign, too new, closed...)."""


def resolve_path(path: str | os.PathLike | None) -> Path:
    """`path`, else $JAXCNN_DB, else jaxcnn_profiles.sqlite in the current directory."""
    if path is None:
        path = os.environ.get(PATH_ENV_VAR) or Path.cwd() / DEFAULT_FILENAME
    return Path(path).expanduser()


def open_connection(path: Path, read_only: bool | None = None,
                    partial: bool = False) -> tuple[sqlite3.Connection, bool]:
    """A connection to the store at `path` and whether it is read-only.

    read_only=None: read-write, creating the file (and the schema) if it is missing, unless the
    file exists without write permission for this process: then read-only.
    read_only=True: read-only (SQLite mode=ro): never creates, migrates or writes anything.
    read_only=False: read-write; a file without write permission is a StoreError up front.
    A writable store has its schema created or migrated to the current version; every store has
    its schema checked (identity, version, tables) before this returns. partial=True (read-only
    only) lets a reader that reports missing tables per query, such as the dashboard's pages,
    open a store some tables of which were dropped.
    """
    read_only = _access_mode(path, read_only)
    check_file_header(path)
    # mode=ro makes SQLite refuse any write and never create the file; the URI keeps any
    # character of the path literal (as_uri percent-encodes '?' and '#').
    uri = f"{path.resolve().as_uri()}?mode={'ro' if read_only else 'rwc'}"
    if read_only and _wal_index_uncreatable(path):
        uri += "&immutable=1"
    try:
        # isolation_level=None: no implicit transactions; writers use write_transaction().
        # check_same_thread=False: a Store may be shared across threads (its methods hold a lock).
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open profile store {path}: {exc}") from exc
    try:
        conn.execute("PRAGMA foreign_keys = ON")  # per connection, off by default in SQLite
        if read_only:
            check_readable_schema(conn, path)
        else:
            ensure_schema(conn, path)
            enable_wal(conn)
        if not (partial and read_only):
            check_tables(conn, path)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(f"cannot open profile store {path}: {_explain(exc)}") from exc
    except BaseException:
        conn.close()
        raise
    return conn, read_only


def _access_mode(path: Path, read_only: bool | None) -> bool:
    """Whether to open `path` read-only, after the checks that need no SQLite: StoreError when
    a reader finds no file, or a writer cannot write the file or create it."""
    if path.is_dir():
        raise StoreError(f"profile store {path} is a directory, not a file")
    if not path.exists():
        if read_only:
            raise StoreError(f"profile store {path} does not exist")
        directory = path.parent
        if not directory.is_dir():
            raise StoreError(f"cannot create profile store {path}: directory {directory} does not exist")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise StoreError(f"cannot create profile store {path}: directory {directory} is not writable")
        return False
    if read_only is None:
        return not is_writable(path)
    if not read_only and not is_writable(path):
        raise StoreError(f"profile store {path} is read-only (no write permission): cannot write to it")
    return read_only


def _wal_index_uncreatable(path: Path) -> bool:
    """Whether a reader of this WAL store could not create its -shm index (a directory this
    process may not write) while no writer has the file open (no -wal or -shm beside it).
    SQLite then reads the file only when told it is immutable, which holds for as long as no
    writer opens it."""
    no_sidecars = not any(Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-shm"))
    return no_sidecars and not os.access(path.parent, os.W_OK | os.X_OK)


def is_writable(path: Path) -> bool:
    """Whether this process may write the store file (and so open it read-write)."""
    return os.access(path, os.W_OK)


def _explain(exc: sqlite3.DatabaseError) -> str:
    """SQLite's message, with the likely cause where the message alone misleads."""
    message = str(exc)
    if "readonly" in message or "read-only" in message:
        return f"{message} (no write permission for the file or its directory?)"
    if "unable to open" in message:
        return f"{message} (missing directory or no permission?)"
    return f"{message} (corrupt file?)"


def check_file_header(path: Path) -> None:
    """Reject a non-SQLite or truncated file before SQLite gets to touch it."""
    # Header, then sidecars, then size: another process may be writing the file meanwhile, and
    # in this order a header announcing pages not yet written is seen with its journal beside
    # it, or with the size read after the write.
    try:
        with open(path, "rb") as f:
            header = f.read(_HEADER_BYTES)
        if not header:
            return  # SQLite treats an empty file as a new database
        # With a -wal or -journal file beside it the file may legitimately lag its header.
        has_sidecar = any(Path(f"{path}{suffix}").exists() for suffix in ("-wal", "-journal"))
        size = path.stat().st_size
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"cannot open profile store {path}: {exc}") from exc
    if len(header) < _HEADER_BYTES or not header.startswith(_SQLITE_MAGIC):
        raise StoreError(
            f"{path} is not a jaxcnn profile store: not a SQLite database (corrupt or another kind of file)"
        )
    expected = _size_from_header(header)
    if expected is not None and size < expected and not has_sidecar:
        raise StoreError(f"profile store {path} is truncated: {size} bytes, its header says {expected} (corrupt file)")


def _size_from_header(header: bytes) -> int | None:
    """Database size in bytes recorded in the header, None when the header does not vouch for it."""
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    page_count = int.from_bytes(header[28:32], "big")
    change_counter, valid_for = header[24:28], header[92:96]
    if page_count == 0 or change_counter != valid_for:
        return None
    return page_size * page_count


def ensure_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Create the schema in a new file, or run the pending migrations of an older one."""
    latest = len(_schema.MIGRATIONS)
    # One snapshot: read piecemeal, another process's schema setup committing in between would
    # look like a foreign database (its application_id before, its tables after).
    with read_transaction(conn):
        if read_schema_version(conn, path) == latest:
            return
    with write_transaction(conn):
        # Read again under the write lock: another process may have done the work meanwhile.
        version = read_schema_version(conn, path)
        if version is None:
            _schema.run_script(conn, _schema.BOOTSTRAP)
            version = 0
        for target in range(version + 1, latest + 1):
            _migrate(conn, path, target)


def check_readable_schema(conn: sqlite3.Connection, path: Path) -> None:
    """What ensure_schema checks, for a store that may not be written: nothing to create or migrate."""
    with read_transaction(conn):
        version = read_schema_version(conn, path)
    latest = len(_schema.MIGRATIONS)
    if version is None:
        raise StoreError(f"profile store {path} is empty (no jaxcnn tables): nothing to read")
    if version < latest:
        raise StoreError(
            f"profile store {path} has schema version {version}, older than this jaxcnn's ({latest}), "
            "and is opened read-only: open it writable once to migrate it"
        )


def check_tables(conn: sqlite3.Connection, path: Path) -> None:
    """Every table the store uses is there: a dropped one is named, not met later as a table
    without columns."""
    present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    missing = [table for table in _schema.TABLES if table not in present]
    if missing:
        raise StoreError(
            f"profile store {path} is damaged: table{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)} missing (dropped by hand?)"
        )


def _migrate(conn: sqlite3.Connection, path: Path, target: int) -> None:
    try:
        _schema.MIGRATIONS[target - 1](conn)
    except Exception as exc:
        raise StoreError(f"{path}: migrating the schema to version {target} failed: {exc}") from exc
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(target),))


def read_schema_version(conn: sqlite3.Connection, path: Path) -> int | None:
    """The store's schema version; None for a blank database; StoreError for anything else."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    tables = sorted(row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    if app_id == 0 and not tables:
        return None
    if app_id != _schema.APPLICATION_ID:
        listed = ", ".join(tables[:8]) + (", ..." if len(tables) > 8 else "")
        raise StoreError(
            f"{path} is not a jaxcnn profile store (a SQLite database with application_id "
            f"{app_id:#010x} and tables: {listed or 'none'})"
        )
    meta = dict(conn.execute("SELECT key, value FROM meta")) if "meta" in tables else {}
    if meta.get("application") != _schema.APPLICATION_MARKER:
        raise StoreError(f"{path} is not a jaxcnn profile store (jaxcnn application_id but no jaxcnn meta table)")
    version = meta.get("schema_version", "")
    if not version.isdigit():
        raise StoreError(f"profile store {path} is damaged: bad schema_version {version!r} in its meta table")
    version = int(version)
    latest = len(_schema.MIGRATIONS)
    if version > latest:
        raise StoreError(
            f"profile store {path} has schema version {version}, newer than this jaxcnn supports "
            f"({latest}); upgrade jaxcnn to open it"
        )
    return version


def enable_wal(conn: sqlite3.Connection) -> None:
    """WAL lets readers run beside a writer; the mode is stored in the file, so set it once."""
    if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        conn.execute("PRAGMA journal_mode = WAL")
    # In WAL mode NORMAL cannot corrupt the file; a power cut may only lose the last commits.
    conn.execute("PRAGMA synchronous = NORMAL")


@contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """All-or-nothing write. IMMEDIATE takes the write lock up front (waiting up to the busy
    timeout): a deferred transaction that later upgrades to a writer fails at once with
    'database is locked' when another process wrote in between."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite may already have rolled back (e.g. disk full)
            conn.execute("ROLLBACK")
        raise


@contextmanager
def read_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One consistent snapshot across several SELECTs (WAL readers never block writers);
    inside a write transaction, that transaction is the snapshot."""
    if conn.in_transaction:
        yield conn
        return
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
