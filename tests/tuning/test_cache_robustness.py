"""Caches survive any bytes in their files: the autotune cache (jaxcnn.tuning), the sparse
crossover cache (jaxcnn.tuning.sparse_dispatch) and the dashboard's cached copy of the shipped data.

Unusable content is reported once (a CacheFileWarning naming the file and what is wrong), read
as "no entry", and the next store rewrites a valid file. CPU only: the autotune reader runs as on
a GPU named "Fake GPU" (its measuring is never reached: every test reads or stores records)."""

from __future__ import annotations

import contextlib
import json
import math
import random
import sqlite3
import warnings

import pytest

import jaxcnn.layouts as L
from jaxcnn.tuning import sparse_dispatch as sd
from jaxcnn.dashboard import data
from jaxcnn.store import Store
from jaxcnn.tuning import autotune_cache, cache_file, layer_autotune
from jaxcnn.tuning import measure as measuring
from jaxcnn.tuning.cache_file import CacheFileWarning

DEVICE = "Fake GPU"


@contextlib.contextmanager
def cache_warnings():
    """The CacheFileWarnings raised inside the block (every one: no deduplication by Python)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got: list[str] = []
        yield got
    got += [str(w.message) for w in caught if issubclass(w.category, CacheFileWarning)]


def assert_one_warning(got: list[str], path, fragment: str) -> None:
    assert len(got) == 1, got
    assert str(path) in got[0] and fragment in got[0], got[0]


# --------------------------------------------------------------------------- corrupt files

def _corrupt_files(valid: bytes) -> list[tuple[str, bytes, str]]:
    """(case, file content, what the warning says) for a cache whose valid file is `valid`."""
    return [
        ("random bytes", random.Random(0).randbytes(512), "not UTF-8"),
        ("UTF-16 byte order mark", b"\xff\xfe", "not UTF-8 text: byte 0xff at offset 0"),
        ("UTF-16 text", json.dumps({"version": 1, "entries": {}}).encode("utf-16"), "not UTF-8"),
        ("Latin-1 text", '{"version": 1, "entries": {"caf\xe9": {}}}'.encode("latin-1"), "not UTF-8"),
        ("empty", b"", "not JSON"),
        ("truncated", valid[: len(valid) // 2], "not JSON"),
        ("one byte short", valid[:-2], "not JSON"),
        ("nested too deep", b"[" * 100_000 + b"]" * 100_000, "not JSON this reader accepts"),
        ("5000-digit number", b"9" * 5000, "not JSON this reader accepts"),
        ("a list", b"[]", "expected an object, got list"),
        ("null", b"null", "expected an object, got NoneType"),
        ("a number", b"1.5", "expected an object, got float"),
        ("NaN", b"NaN", "expected an object, got float"),
        ("no entries", b'{"version": 1}', "missing 'entries'"),
        ("entries a list", b'{"version": 1, "entries": []}', "entries: expected an object"),
        ("no version", b'{"entries": {}}', "missing 'version'"),
        ("version as text", b'{"version": "1", "entries": {}}', "version: expected 1"),
        ("version true", b'{"version": true, "entries": {}}', "version: expected 1"),
        ("future version", b'{"version": 99, "entries": {}}', "version: expected 1"),
    ]


# --------------------------------------------------------------------------- autotune cache

X_SHAPE, W_SHAPE, DTYPE = (1, 8, 8, 8), (3, 3, 8, 16), "float32"
LAYER = L.conv_layer(X_SHAPE, W_SHAPE, DTYPE)
CONV_KEY = layer_autotune.conv_key(DEVICE, LAYER)
TRANSFORM_KEY = layer_autotune.transform_key(DEVICE, X_SHAPE, DTYPE, "NHWC", "NCHW")
TRANSFORM_RECORD = dict(time_ms=0.25, measured=True, note="device time", kernels=["k"],
                        created="2026-01-01T00:00:00+00:00", iters=2)


def _conv_record() -> dict:
    """A well-formed record of LAYER in which (NCHW, direct) is fastest."""
    cands = layer_autotune.default_conv_candidates(LAYER)
    return dict(op="conv2d", device=DEVICE, created="2026-01-01T00:00:00+00:00", iters=2,
                candidates=[dict(layout=lay, algorithm=alg, time_ms=0.5 if (lay, alg) == ("NCHW", "direct")
                                 else 1.0 + i, source="measured", note="", kernels=["k"])
                            for i, (lay, alg) in enumerate(cands)],
                xla=dict(time_ms=2.0, measured=True, note="", kernels=[]),
                transforms={lay: dict(in_ms=0.1, out_ms=0.1) for lay in ("NCHW", "CHWN")})


def _autotune_file(entries: dict) -> bytes:
    return json.dumps({"version": autotune_cache.CACHE_VERSION, "entries": entries}, indent=1).encode()


@pytest.fixture
def fake_gpu(monkeypatch):
    """The cached-choice reader as on a GPU (it returns None off the GPU, cache or not)."""
    monkeypatch.setattr(measuring, "should_measure", lambda measure: True)
    monkeypatch.setattr(measuring, "device_kind", lambda: DEVICE)


def _cached_choice(path):
    return layer_autotune.cached_conv_choice(X_SHAPE, W_SHAPE, DTYPE, cache=path)


def _assert_valid_autotune_file(path, want_keys) -> None:
    stored = json.loads(path.read_bytes().decode("utf-8"))
    assert stored["version"] == autotune_cache.CACHE_VERSION and set(stored["entries"]) == set(want_keys)
    assert not list(path.parent.glob("*.tmp"))


AUTOTUNE_FILES = _corrupt_files(_autotune_file({CONV_KEY: _conv_record(), TRANSFORM_KEY: TRANSFORM_RECORD}))


@pytest.mark.parametrize("content,message", [c[1:] for c in AUTOTUNE_FILES],
                         ids=[c[0] for c in AUTOTUNE_FILES])
def test_autotune_cache_survives_a_corrupt_file(tmp_path, fake_gpu, content, message):
    path = tmp_path / "autotune.json"
    path.write_bytes(content)
    with cache_warnings() as got:
        assert _cached_choice(path) is None
        assert _cached_choice(path) is None  # read again: not reported again
        assert L.AutotuneCache(path).load() == {}
    assert_one_warning(got, path, "autotune cache")
    assert message in got[0] and "the next store rewrites it" in got[0]

    with cache_warnings() as got:
        L.AutotuneCache(path).put(CONV_KEY, _conv_record())
        choice = _cached_choice(path)
    assert got == []
    _assert_valid_autotune_file(path, {CONV_KEY})
    assert choice.cached and (choice.layout, choice.algorithm, choice.time_ms) == ("NCHW", "direct", 0.5)


def _with_candidate(field, value):
    def change(record):
        record["candidates"][0][field] = value
        return record
    return change


def _with(**changes):
    def change(record):
        record.update(changes)
        return record
    return change


def _without(field):
    def change(record):
        del record[field]
        return record
    return change


def _candidate_without(field):
    def change(record):
        del record["candidates"][0][field]
        return record
    return change


CONV_ENTRIES = [
    ("a list", lambda r: [r], "expected an object, got list"),
    ("a string", lambda r: "conv2d", "expected an object, got str"),
    ("no candidates", _without("candidates"), "missing 'candidates'"),
    ("candidates an object", _with(candidates={}), "candidates: expected a list, got dict"),
    ("candidates null", _with(candidates=None), "candidates: expected a list, got NoneType"),
    ("candidate a number", _with(candidates=[1]), "candidates: [0]: expected an object"),
    ("candidate without layout", _candidate_without("layout"), "candidates: [0]: missing 'layout'"),
    ("candidate without algorithm", _candidate_without("algorithm"), "missing 'algorithm'"),
    ("layout a number", _with_candidate("layout", 3), "layout: expected a string"),
    ("time as text", _with_candidate("time_ms", "fast"), "time_ms: expected a number, got str"),
    ("time true", _with_candidate("time_ms", True), "time_ms: expected a number, got bool"),
    ("time a list", _with_candidate("time_ms", [1.0]), "time_ms: expected a number, got list"),
    ("time NaN", _with_candidate("time_ms", math.nan), "time_ms: expected a finite number"),
    ("time infinite", _with_candidate("time_ms", math.inf), "time_ms: expected a finite number"),
    ("source a number", _with_candidate("source", 1), "source: expected a string"),
    ("kernels a string", _with_candidate("kernels", "k"), "kernels: expected a list"),
    ("kernels numbers", _with_candidate("kernels", [1]), "kernels: [0]: expected a string"),
    ("xla a string", _with(xla="fast"), "xla: expected an object"),
    ("xla time text", _with(xla={"time_ms": "2"}), "xla: time_ms: expected a number"),
    ("xla measured text", _with(xla={"time_ms": 2.0, "measured": "yes"}), "measured: expected true"),
    ("transforms a list", _with(transforms=[]), "transforms: expected an object"),
    ("transform a number", _with(transforms={"NCHW": 1}), "transforms: ['NCHW']: expected an object"),
    ("transform time text", _with(transforms={"NCHW": {"in_ms": "x"}}), "in_ms: expected a number"),
    ("created a number", _with(created=5), "created: expected a string"),
]


@pytest.mark.parametrize("change,message", [c[1:] for c in CONV_ENTRIES], ids=[c[0] for c in CONV_ENTRIES])
def test_autotune_cache_ignores_a_malformed_conv_entry(tmp_path, fake_gpu, change, message):
    path = tmp_path / "autotune.json"
    path.write_bytes(_autotune_file({CONV_KEY: change(_conv_record()), TRANSFORM_KEY: TRANSFORM_RECORD}))
    with cache_warnings() as got:
        assert _cached_choice(path) is None
        assert _cached_choice(path) is None
        assert L.AutotuneCache(path).get(TRANSFORM_KEY) == TRANSFORM_RECORD  # the good entry stays
    assert_one_warning(got, path, "1 malformed entry ignored")
    assert message in got[0] and '"device":"Fake GPU"' in got[0]  # names the entry

    other = layer_autotune.transform_key(DEVICE, X_SHAPE, DTYPE, "NHWC", "CHWN")
    with cache_warnings() as got:
        L.AutotuneCache(path).put(other, TRANSFORM_RECORD)  # rewrites the file without the bad entry
    assert got == []
    _assert_valid_autotune_file(path, {TRANSFORM_KEY, other})
    L.AutotuneCache(path).put(CONV_KEY, _conv_record())
    assert _cached_choice(path).algorithm == "direct"


TRANSFORM_ENTRIES = [
    ("time as text", {"time_ms": "0.25"}, "time_ms: expected a number"),
    ("time an object", {"time_ms": {}}, "time_ms: expected a number"),
    ("a number", 0.25, "expected an object, got float"),
    ("null", None, "expected an object, got NoneType"),
]


@pytest.mark.parametrize("record,message", [c[1:] for c in TRANSFORM_ENTRIES],
                         ids=[c[0] for c in TRANSFORM_ENTRIES])
def test_autotune_cache_ignores_a_malformed_transform_entry(tmp_path, record, message):
    path = tmp_path / "autotune.json"
    path.write_bytes(_autotune_file({TRANSFORM_KEY: record}))
    with cache_warnings() as got:
        assert L.AutotuneCache(path).get(TRANSFORM_KEY) is None
        assert L.AutotuneCache(path).get(TRANSFORM_KEY) is None
    assert_one_warning(got, path, message)


def test_autotune_cache_reports_each_new_corruption(tmp_path):
    """Once per file content: a file that changes and is still unusable is reported again."""
    path = tmp_path / "autotune.json"
    cache = L.AutotuneCache(path)
    with cache_warnings() as got:
        for content in (b"\xff", b"\xff", b"{", b"{", b"[]"):
            path.write_bytes(content)
            assert cache.load() == {}
    assert len(got) == 3
    for message, problem in zip(got, ("not UTF-8 text", "not JSON", "expected an object")):
        assert problem in message


def test_autotune_cache_unreadable_path_is_reported_not_raised(tmp_path):
    path = tmp_path / "autotune.json"
    path.mkdir()  # a directory where the file should be
    with cache_warnings() as got:
        assert L.AutotuneCache(path).load() == {}
        assert L.AutotuneCache(path).get(CONV_KEY) is None
    assert_one_warning(got, path, "cannot read it")


def test_autotune_cache_write_is_atomic(tmp_path, monkeypatch):
    """A write that fails before os.replace leaves the old file whole and no temporary file."""
    path = tmp_path / "autotune.json"
    L.AutotuneCache(path).put(TRANSFORM_KEY, TRANSFORM_RECORD)
    before = path.read_bytes()

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(cache_file.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        L.AutotuneCache(path).put(CONV_KEY, _conv_record())
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "autotune.json", "autotune.json.lock"]


# --------------------------------------------------------------------------- sparse crossover cache

SPARSE_X, SPARSE_W = (1, 56, 56, 64), (3, 3, 64, 64)


def _crossover() -> sd.Crossover:
    """Sparse time linear in density, 2.0 ms dense to 0.2 ms all zeros; dense 1.0 ms."""
    grid = (0.0, 0.5, 0.9, 1.0)
    sparse_ms = tuple(0.2 + 1.8 * (1 - s) for s in grid)
    key = sd.layer_key(SPARSE_X, SPARSE_W, DTYPE, stride=(1, 1), padding=((1, 1), (1, 1)))
    return sd.Crossover(DEVICE, key, grid, sparse_ms, 1.0, "xla", {"jaxcnn": 1.1, "xla": 1.0},
                        sd.find_crossover(grid, sparse_ms, 1.0))


def _crossover_file(record: dict) -> bytes:
    return _autotune_file({sd.CrossoverTable._entry_key(DEVICE, _crossover().key): record})


def _choose(path):
    return sd.choose(SPARSE_X, SPARSE_W, DTYPE, 0.9, table=sd.CrossoverTable(path), device=DEVICE)


def _assert_crossover_ignored(path, fragment: str, message: str) -> None:
    """The crossover table at path is read as empty (the dense path, twice alike) with one
    warning naming the file, fragment and message, and a store then rewrites it whole."""
    with cache_warnings() as got:
        decision = _choose(path)
        assert _choose(path) == decision and sd.CrossoverTable(path).entries() == []
    assert not decision.sparse and "no crossover measured" in decision.reason
    assert_one_warning(got, path, fragment)
    assert message in got[0]
    _assert_rewritten_by_a_store(path)


def _assert_rewritten_by_a_store(path) -> None:
    with cache_warnings() as got:
        sd.CrossoverTable(path).put(_crossover())
        decision = _choose(path)
        entries = sd.CrossoverTable(path).entries()
    assert got == [] and decision.sparse and entries == [_crossover()]
    json.loads(path.read_bytes().decode("utf-8"))


SPARSE_FILES = _corrupt_files(_crossover_file(_crossover().to_record()))


@pytest.mark.parametrize("content,message", [c[1:] for c in SPARSE_FILES], ids=[c[0] for c in SPARSE_FILES])
def test_crossover_cache_survives_a_corrupt_file(tmp_path, content, message):
    path = tmp_path / "cross.json"
    path.write_bytes(content)
    _assert_crossover_ignored(path, "sparse crossover cache", message)


CROSSOVER_ENTRIES = [
    ("a list", lambda r: list(r.values()), "expected an object, got list"),
    ("null", lambda r: None, "expected an object, got NoneType"),
    ("no sparse_ms", _without("sparse_ms"), "missing 'sparse_ms'"),
    ("no sparsities", _without("sparsities"), "missing 'sparsities'"),
    ("no dense_ms", _without("dense_ms"), "missing 'dense_ms'"),
    ("no device", _without("device"), "missing 'device'"),
    ("no key", _without("key"), "missing 'key'"),
    ("no dense_path", _without("dense_path"), "missing 'dense_path'"),
    ("sparse_ms text", _with(sparse_ms="fast"), "sparse_ms: expected a list"),
    ("sparse_ms of text", _with(sparse_ms=["1", "2", "3", "4"]), "sparse_ms: [0]: expected a number"),
    ("sparse_ms NaN", _with(sparse_ms=[2.0, math.nan, 0.4, 0.2]), "sparse_ms: [1]: expected a finite"),
    ("sparsities empty", _with(sparsities=[], sparse_ms=[]), "sparsities: expected a non-empty list"),
    ("lengths differ", _with(sparse_ms=[2.0, 1.1]), "4 sparsities but 2 sparse_ms"),
    ("sparsities unsorted", _with(sparsities=[0.0, 0.9, 0.5, 1.0]), "not in increasing order"),
    ("dense_ms null", _with(dense_ms=None), "dense_ms: expected a number, got NoneType"),
    ("dense_ms true", _with(dense_ms=True), "dense_ms: expected a number, got bool"),
    ("dense_ms text", _with(dense_ms="1.0"), "dense_ms: expected a number, got str"),
    ("dense_path a number", _with(dense_path=1), "dense_path: expected a string"),
    ("candidates a list", _with(dense_candidates_ms=[1.0]), "dense_candidates_ms: expected an object"),
    ("candidate text", _with(dense_candidates_ms={"xla": "1"}), "dense_candidates_ms: ['xla']"),
    ("crossover text", _with(crossover="55%"), "crossover: expected a number"),
    ("another device", _with(device="Other GPU"), "differ from the entry's"),
    ("another layer", _with(key=sd.layer_key((1, 8, 8, 64), SPARSE_W, DTYPE)), "differ from the entry's"),
]


@pytest.mark.parametrize("change,message", [c[1:] for c in CROSSOVER_ENTRIES],
                         ids=[c[0] for c in CROSSOVER_ENTRIES])
def test_crossover_cache_ignores_a_malformed_entry(tmp_path, change, message):
    path = tmp_path / "cross.json"
    path.write_bytes(_crossover_file(change(_crossover().to_record())))
    _assert_crossover_ignored(path, "1 malformed entry ignored", message)


@pytest.mark.parametrize("layer_key,message", [
    ("not a key", "key: not JSON"),
    ("[1, 2]", "key: expected an object, got list"),
    ('{"x": [1, 8, 8, 64]}', "key: missing 'w'"),
    ('{"x": "1x8", "w": [], "stride": [], "padding": [], "dtype": "float32", "precision": "default"}',
     "key: x: expected a list"),
])
def test_crossover_cache_ignores_a_record_with_a_malformed_layer_key(tmp_path, layer_key, message):
    """The record's own key (its layer, which record_crossover reads) must be a layer key."""
    path = tmp_path / "cross.json"
    record = dict(_crossover().to_record(), key=layer_key)
    path.write_bytes(_autotune_file({sd.CrossoverTable._entry_key(DEVICE, layer_key): record}))
    with cache_warnings() as got:
        assert sd.CrossoverTable(path).get(DEVICE, layer_key) is None
        assert sd.CrossoverTable(path).entries() == []
    assert_one_warning(got, path, message)


# --------------------------------------------------------------------------- dashboard's shipped copy


@pytest.fixture(scope="module")
def shipped_dir(tmp_path_factory):
    """A small shipped-data directory: one export of three runs."""
    root = tmp_path_factory.mktemp("shipped_source")
    with Store(root / "source.sqlite") as store:
        for batch in (1, 2, 4):
            store.add_run("profile", model="lenet5", device="cpu", batch=batch, dtype="float32",
                          note="robustness test " * 100)
        (root / "shipped").mkdir()
        store.export_json(root / "shipped" / "runs.json")
    return root / "shipped"


def _foreign_sqlite(tmp_path) -> bytes:
    path = tmp_path / "foreign.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
        conn.commit()
    return path.read_bytes()


def _store_without_runs(tmp_path) -> bytes:
    path = tmp_path / "empty_store.sqlite"
    with Store(path):
        pass
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.read_bytes()


SHIPPED_COPIES = [
    ("random bytes", lambda valid, tmp: random.Random(0).randbytes(4096), "file is not a database"),
    ("UTF-16 byte order mark", lambda valid, tmp: b"\xff\xfe", "file is not a database"),
    ("empty", lambda valid, tmp: b"", "no such table: runs"),
    ("truncated", lambda valid, tmp: valid[: len(valid) // 2], "malformed"),
    ("a page zeroed", lambda valid, tmp: valid[:4096] + bytes(4096) + valid[8192:], "malformed"),
    ("SQLite header only", lambda valid, tmp: valid[:100], "corrupt ("),
    ("a foreign SQLite file", lambda valid, tmp: _foreign_sqlite(tmp), "no such table: runs"),
    ("a store without runs", lambda valid, tmp: _store_without_runs(tmp), "it holds no runs"),
    ("JSON", lambda valid, tmp: b'{"runs": []}', "file is not a database"),
]


@pytest.mark.parametrize("corrupt,message", [c[1:] for c in SHIPPED_COPIES], ids=[c[0] for c in SHIPPED_COPIES])
def test_corrupt_shipped_copy_is_reported_and_rebuilt(tmp_path, shipped_dir, corrupt, message):
    cache = tmp_path / "cache"
    target = data.shipped_store(shipped_dir, cache)
    valid = target.read_bytes()
    assert len(valid) >= 3 * 4096  # the page-zeroing case needs a file of several pages
    target.write_bytes(corrupt(valid, tmp_path))
    (cache / f"{target.name}-wal").write_bytes(b"stale write-ahead log of the corrupt copy")

    with cache_warnings() as got:
        assert data.shipped_store(shipped_dir, cache) == target
    assert_one_warning(got, target, f"rebuilding it from {shipped_dir}")
    assert message in got[0]
    assert sorted(p.name for p in cache.iterdir()) == [target.name]  # no temporary or stale files
    with contextlib.closing(sqlite3.connect(f"file:{target}?mode=ro", uri=True)) as conn:
        assert conn.execute("SELECT batch FROM runs ORDER BY id").fetchall() == [(1,), (2,), (4,)]

    mtime = target.stat().st_mtime_ns
    with cache_warnings() as got:
        source = data.choose_source(tmp_path / "none.sqlite", shipped_dir=shipped_dir, cache=cache)
    assert got == [] and source.shipped and source.path == target and target.stat().st_mtime_ns == mtime
