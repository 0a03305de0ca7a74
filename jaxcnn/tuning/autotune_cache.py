"""The autotune cache: measured results on disk as JSON, keyed by GPU device_kind, op, shapes,
dtype and parameters. The layout choice (conv, pool and transform timings), the fusion planner
(fusion groups), the decision owner (sites) and the sparse crossover table keep their records
in it.

File: $JAXCNN_AUTOTUNE_CACHE, else ~/.cache/jaxcnn/autotune.json. Writes merge under a file
lock and replace the file atomically; an unreadable file or entry is ignored with one warning
(jaxcnn.tuning.cache_file) and left out of the next write.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from jaxcnn.tuning import cache_file

try:
    import fcntl
except ImportError:  # not POSIX: the atomic replace still keeps the file whole
    fcntl = None

CACHE_ENV = "JAXCNN_AUTOTUNE_CACHE"
CACHE_VERSION = 1


def default_cache_path() -> Path:
    """$JAXCNN_AUTOTUNE_CACHE, else ~/.cache/jaxcnn/autotune.json."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "jaxcnn" / "autotune.json"


class AutotuneCache:
    """Measured results on disk as JSON: {"version": 1, "entries": {key: record}}.

    `put` re-reads the file under an exclusive lock, merges and replaces it atomically
    (temporary file + os.replace), so concurrent writers never lose each other's entries and
    readers never see a half-written file. A file that is not cache JSON (any bytes), and every
    entry that `entry_problem(key, record)` finds malformed, is ignored with one warning
    (jaxcnn.tuning.cache_file) and left out of the next write.
    """

    _thread_lock = threading.Lock()

    def __init__(self, path: str | os.PathLike | None = None, *, what: str = "autotune cache",
                 entry_problem: Callable[[str, Any], str | None] | None = None):
        self.path = Path(path).expanduser() if path is not None else default_cache_path()
        self.what = what  # how warnings name the file
        self.entry_problem = entry_problem or autotune_entry_problem

    @staticmethod
    def key(**fields: Any) -> str:
        """A stable string key from JSON-able fields (sorted)."""
        return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=list)

    def load(self) -> dict[str, Any]:
        """The well-formed entries; {} when the file is missing or unusable (warned once)."""
        data = cache_file.read_json(self.path, self.what, _cache_file_problem)
        if data is None:
            return {}
        entries, problems = cache_file.valid_entries(data["entries"], self.entry_problem)
        if problems:
            cache_file.report_once(
                self.path, self.what, f"{len(problems)} malformed entr{'y' if len(problems) == 1 else 'ies'}"
                f" ignored, first {problems[0]}", json.dumps(data, sort_keys=True).encode(),
                action="the next store rewrites it without them")
        return entries

    def get(self, key: str) -> dict[str, Any] | None:
        return self.load().get(key)

    def put(self, key: str, record: dict[str, Any]) -> None:
        self.put_many({key: record})

    def put_many(self, records: Mapping[str, dict[str, Any]]) -> None:
        if not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked():
            entries = self.load()  # an unusable file or entry is reported (once) and dropped here
            entries.update(records)
            payload = json.dumps({"version": CACHE_VERSION, "entries": entries}, indent=1, sort_keys=True)
            cache_file.write_text_atomic(self.path, payload)

    @contextlib.contextmanager
    def _locked(self):
        """Exclusive lock on a side file (flock where available) plus an in-process lock."""
        with self._thread_lock:
            lock_path = self.path.with_name(self.path.name + ".lock")
            with open(lock_path, "a") as handle:
                if fcntl is None:
                    yield
                    return
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# What the cache's readers rely on: the file and each kind of record (the "op" of its key).
_cache_file_problem = cache_file.fields({"version": cache_file.equal_to(CACHE_VERSION),
                                         "entries": cache_file.dict_of(cache_file.anything)})
_OPTIONAL_MS = cache_file.optional(cache_file.number)
_TIMING = dict(time_ms=_OPTIONAL_MS, source=cache_file.text, note=cache_file.text, error=cache_file.text,
               kernels=cache_file.list_of(cache_file.text), measured=cache_file.flag)
_CANDIDATES = cache_file.list_of(cache_file.fields(dict(layout=cache_file.text, algorithm=cache_file.text),
                                                   _TIMING))
_RECORD_CHECKS = {
    "to_layout": cache_file.fields({}, _TIMING),
    "conv2d": cache_file.fields(dict(candidates=_CANDIDATES), dict(
        xla=cache_file.optional(cache_file.fields({}, _TIMING)),
        transforms=cache_file.dict_of(cache_file.fields({}, dict(in_ms=_OPTIONAL_MS, out_ms=_OPTIONAL_MS))),
        created=cache_file.text)),
    "maxpool": cache_file.fields(dict(candidates=_CANDIDATES), dict(created=cache_file.text)),
    "avgpool": cache_file.fields(dict(candidates=_CANDIDATES), dict(created=cache_file.text)),
    "fusion_group": cache_file.fields(dict(candidates=cache_file.dict_of(cache_file.fields({}, _TIMING))),
                                      dict(created=cache_file.text)),
}


def autotune_entry_problem(key: str, record: Any) -> str | None:
    """What is wrong with one autotune cache entry (None: usable). Records are JSON objects;
    those of a known op (from the key, see AutotuneCache.key) have the fields their readers use."""
    if not isinstance(record, dict):
        return f"expected an object, got {type(record).__name__}"
    try:
        fields = json.loads(key)
    except (ValueError, RecursionError):
        return None  # not a key AutotuneCache.key makes: no reader here looks it up
    op = fields.get("op") if isinstance(fields, dict) else None
    check = _RECORD_CHECKS.get(op) if isinstance(op, str) else None
    return check(record) if check else None


def as_cache(cache: Any) -> AutotuneCache | None:
    """cache=None: the default file; False: no cache; a path or an AutotuneCache."""
    if cache is False:
        return None
    if cache is None:
        return AutotuneCache()
    if isinstance(cache, AutotuneCache):
        return cache
    if isinstance(cache, (str, os.PathLike)):
        return AutotuneCache(cache)
    raise TypeError(f"cache must be None, False, a path or an AutotuneCache, got {cache!r}")


def created_now() -> str:
    """The "created" field of a new record: UTC now, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
