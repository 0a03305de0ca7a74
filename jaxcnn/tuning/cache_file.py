"""Cache files that survive any bytes in them.

A cache only saves work, so a file that cannot be used (unreadable, not UTF-8, not JSON, JSON of
the wrong shape, entries missing keys or holding values of the wrong type) must never stop the
program: it is reported once, as a CacheFileWarning naming the file and what is wrong, then read
as holding nothing (or without the bad entries), and the next store rewrites it whole.

    data = read_json(path, "autotune cache", fields({"entries": dict_of(anything)}))
    write_text_atomic(path, json.dumps(data))

Writes go to a temporary file in the target's directory that replaces the target with
os.replace, so a reader sees the old file or the new one, never half of one.

Shapes of JSON values are described by checks: functions from a value to None (it fits) or a
short text saying what is wrong and where (`number`, `text`, `flag`, `equal_to`, `optional`,
`list_of`, `dict_of`, `fields`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

Check = Callable[[Any], "str | None"]

REWRITE = "ignoring it; the next store rewrites it"


class CacheFileWarning(UserWarning):
    """A cache file, or some entries of it, could not be used and were ignored."""


# --------------------------------------------------------------------------- reporting

_reported: set[tuple[str, str, bytes | None]] = set()
_reported_lock = threading.Lock()


def report(path: str | os.PathLike, what: str, problem: str, action: str = REWRITE) -> None:
    """Warns that `what` at `path` cannot be used because of `problem`, and what happens now."""
    warnings.warn(f"{what} {path} is corrupt ({problem}); {action}", CacheFileWarning, stacklevel=3)


def report_once(path: str | os.PathLike, what: str, problem: str, content: bytes | None = None,
                action: str = REWRITE) -> None:
    """`report`, once per file, problem and file content: a cache read on every lookup warns
    about a bad file once, and again only when the file changed and is still bad."""
    digest = hashlib.sha256(content).digest() if content is not None else None
    key = (os.path.abspath(path), problem, digest)
    with _reported_lock:
        if key in _reported:
            return
        _reported.add(key)
    report(path, what, problem, action)


# --------------------------------------------------------------------------- reading and writing


def parse_json(content: bytes | str, check: Check) -> tuple[Any, str | None]:
    """(value, None) when `content` is (UTF-8) JSON that passes `check`, else (None, what is wrong)."""
    if isinstance(content, bytes):
        try:
            content = content.decode("utf-8")
        except UnicodeDecodeError as err:
            return None, f"not UTF-8 text: byte {content[err.start]:#04x} at offset {err.start}"
    try:
        value = json.loads(content)
    except json.JSONDecodeError as err:
        return None, f"not JSON: {err.msg} at line {err.lineno} column {err.colno}"
    except (ValueError, RecursionError) as err:  # e.g. an integer of 5000 digits, [[[[... nested too deep
        return None, f"not JSON this reader accepts: {type(err).__name__}: {str(err)[:80]}"
    problem = check(value)
    return (None, problem) if problem else (value, None)


def read_json(path: str | os.PathLike, what: str, check: Check) -> Any:
    """The JSON value in `path` when it passes `check`. None when the file does not exist, or
    cannot be used (reported once: see `report_once`)."""
    try:
        content = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        report_once(path, what, f"cannot read it: {err.strerror or err}")
        return None
    value, problem = parse_json(content, check)
    if problem:
        report_once(path, what, problem, content)
        return None
    return value


def valid_entries(entries: Mapping[str, Any],
                  entry_problem: Callable[[str, Any], str | None]) -> tuple[dict[str, Any], list[str]]:
    """(the entries that pass `entry_problem(key, record)`, one "key: problem" per other entry)."""
    kept, problems = {}, []
    for key, record in entries.items():
        problem = entry_problem(key, record)
        if problem:
            problems.append(f"{_short(key, 120)}: {problem}")
        else:
            kept[key] = record
    return kept, problems


@contextlib.contextmanager
def replacing(path: str | os.PathLike, sidecars: Sequence[str] = ()) -> Iterator[Path]:
    """A new temporary path next to `path` (the file exists, empty); when the block ends without
    an error it replaces `path` (os.replace, atomic). Whatever is left of it afterwards is
    removed, with its `sidecars` (suffixes, e.g. SQLite's "-wal", "-shm")."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        for leftover in (tmp, *(tmp + s for s in sidecars)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes `text` (UTF-8) to `path` through a synced temporary file and os.replace."""
    with replacing(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


# --------------------------------------------------------------------------- checks


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _got(value: Any) -> str:
    return f"got {type(value).__name__} {_short(value)}"


def anything(value: Any) -> str | None:
    return None


def number(value: Any) -> str | None:
    """A finite int or float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a number, {_got(value)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"expected a finite number, {_got(value)}"
    return None


def text(value: Any) -> str | None:
    return None if isinstance(value, str) else f"expected a string, {_got(value)}"


def flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"expected true or false, {_got(value)}"


def equal_to(expected: Any) -> Check:
    """Exactly `expected`, of its type (true is not 1)."""
    def check(value: Any) -> str | None:
        if type(value) is type(expected) and value == expected:
            return None
        return f"expected {expected!r}, {_got(value)}"

    return check


def optional(check: Check) -> Check:
    """`check`, or null."""
    return lambda value: None if value is None else check(value)


def list_of(item: Check, *, nonempty: bool = False) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, list):
            return f"expected a list, {_got(value)}"
        if nonempty and not value:
            return "expected a non-empty list"
        for i, element in enumerate(value):
            if problem := item(element):
                return f"[{i}]: {problem}"
        return None

    return check


def dict_of(item: Check) -> Check:
    """An object whose every value passes `item`."""
    def check(value: Any) -> str | None:
        if not isinstance(value, dict):
            return f"expected an object, {_got(value)}"
        for key, element in value.items():
            if problem := item(element):
                return f"[{_short(key)}]: {problem}"
        return None

    return check


def fields(required: Mapping[str, Check], optional_fields: Mapping[str, Check] | None = None) -> Check:
    """An object with every `required` key, and the `optional_fields` where present, passing
    their checks; other keys are allowed (records written by a newer version)."""
    optional_fields = optional_fields or {}

    def check(value: Any) -> str | None:
        if not isinstance(value, dict):
            return f"expected an object, {_got(value)}"
        for key, field_check in required.items():
            if key not in value:
                return f"missing {key!r}"
            if problem := field_check(value[key]):
                return f"{key}: {problem}"
        for key, field_check in optional_fields.items():
            if key in value and (problem := field_check(value[key])):
                return f"{key}: {problem}"
        return None

    return check
