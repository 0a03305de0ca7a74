"""The profile store: round trips, validation, portability, concurrency, damaged and foreign files."""

import json
import multiprocessing
import os
import sqlite3
import sys

import pytest

pd = pytest.importorskip("pandas")

from jaxcnn.store import APPLICATION_ID, SCHEMA_VERSION, TABLES, Store, StoreError, _schema, read_export  # noqa: E402

ENV = {
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "gpu_count": 1,
    "driver": "550.54",
    "cuda_version": "12.4",
    "jax_version": "0.6.2",
    "jaxlib_version": "0.6.2",
    "jaxcnn_version": "0.1.0",
    "python": "3.11.7",
    "platform": "Linux-x86_64",
    "hostname": "gpu-box",
    "extra": {"clocks": "locked"},
}

LAYERS = [
    {"idx": 0, "name": "conv1", "op": "conv2d", "input_shapes": [[8, 224, 224, 3]], "weight_shape": [7, 7, 3, 64],
     "output_shape": [8, 112, 112, 64], "params": {"stride": 2, "padding": "SAME", "groups": 1}, "flops": 10**9,
     "bytes": 4_000_000},
    {"idx": 1, "name": "relu1", "op": "relu", "input_shapes": [[8, 112, 112, 64]], "output_shape": [8, 112, 112, 64]},
    {"idx": 2, "name": "conv2", "op": "conv2d", "input_shapes": [[8, 112, 112, 64]], "weight_shape": [3, 3, 64, 64],
     "params": {"stride": 1, "activation": "relu"}, "flops": 2 * 10**9},
]


def timing(layer_id, backend, median, **more):
    return {"layer_id": layer_id, "backend": backend, "metric": "device_time_ms", "median": median, "unit": "ms",
            **more}


def populate(store, model="resnet18", environment=ENV, scale=1.0):
    """A run with a row in every table; returns (run_id, layer ids)."""
    run = store.add_run("profile", model=model, backend="jaxcnn", batch=8, dtype="bfloat16", device="gpu",
                        note="test", git_commit="abc123", environment=environment, extra={"warmup": 3})
    conv1, relu1, conv2 = store.add_layers(run, LAYERS)
    store.add_measurements(run, [
        timing(conv1, "xla", 1.0 * scale, p10=0.9 * scale, p90=1.2 * scale, min=0.8 * scale, max=1.5 * scale, n=50,
               variant="cudnn",
               extra={"kernels": ["sm90_xmma_fprop"]}),
        timing(conv1, "jaxcnn", 0.5 * scale, n=50, variant="nhwc_tiled"),
        timing(conv2, "xla", 2.0 * scale),
        timing(conv2, "jaxcnn", 1.0 * scale),
        {"backend": "jaxcnn", "metric": "wall_time_ms", "median": 7.5, "unit": "ms"},  # whole model
    ])
    store.add_predictions(run, [
        {"layer_id": conv1, "model": "roofline", "time_ms": 0.4, "dram_bytes": 4_000_000},
        {"layer_id": conv2, "model": "delta", "tiling": {"tm": 128, "tn": 64}, "l1_bytes": 10, "l2_bytes": 20,
         "dram_bytes": 30, "time_ms": 0.9, "extra": {"waves": 2}},
    ])
    store.add_counters(run, [{"layer_id": conv2, "source": "ncu", "backend": "jaxcnn", "l1_bytes": 11,
                              "l2_bytes": 21, "dram_bytes": 31, "extra": {"kernel": "conv_tiled"}}])
    store.add_plan(run, "tflite_greedy", 300, 200, [
        {"name": "act0", "size_bytes": 100, "start_step": 0, "end_step": 1, "offset_bytes": 0},
        {"name": "act1", "size_bytes": 200, "start_step": 1, "end_step": 2, "offset_bytes": 100},
    ], seconds=0.01)
    store.add_plan(run, "naive", 300, 200, [
        {"name": "act0", "size_bytes": 100, "start_step": 0, "end_step": 1, "offset_bytes": 0},
        {"name": "act1", "size_bytes": 200, "start_step": 1, "end_step": 2, "offset_bytes": 100},
    ])
    store.add_sparsity(run, [{"layer_id": relu1, "zero_fraction": 0.55, "sample_count": 16,
                              "extra": {"tensor": "out"}}])
    return run, (conv1, relu1, conv2)


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "profiles.sqlite") as s:
        yield s


def table_counts(path):
    with sqlite3.connect(path) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


# -- round trips -------------------------------------------------------------------------------


def test_round_trip_of_every_table(store):
    run, (conv1, relu1, conv2) = populate(store)

    runs = store.runs()
    assert len(runs) == 1
    r = runs.iloc[0]
    def fields(row, *names):
        return tuple(row[name] for name in names)

    assert fields(r, "id", "kind", "model", "backend", "batch", "dtype", "device") == (
        run, "profile", "resnet18", "jaxcnn", 8, "bfloat16", "gpu")
    assert fields(r, "note", "git_commit", "extra") == ("test", "abc123", {"warmup": 3})
    assert fields(r, "gpu_name", "gpu_count", "hostname", "environment_extra") == (
        ENV["gpu_name"], 1, "gpu-box", {"clocks": "locked"})
    assert str(r["created_at"].tz) == "UTC"

    layers = store.layers(run)
    assert list(layers.id) == [conv1, relu1, conv2]
    assert list(layers["name"]) == ["conv1", "relu1", "conv2"]
    assert layers.input_shapes[0] == [[8, 224, 224, 3]]
    assert layers.weight_shape[0] == [7, 7, 3, 64] and layers.weight_shape[1] is None
    assert layers.params[0] == {"stride": 2, "padding": "SAME", "groups": 1}
    assert layers.params[1] == {}  # schema default
    assert layers.flops[0] == 10**9 and layers.flops.isna()[1]

    m = store.measurements(run)
    assert len(m) == 5 and m.layer_id.isna().sum() == 1
    first = m[(m.layer == "conv1") & (m.backend == "xla")].iloc[0]
    assert fields(first, "median", "p10", "p90", "min", "max", "n") == (1.0, 0.9, 1.2, 0.8, 1.5, 50)
    assert fields(first, "variant", "extra", "layer_idx") == ("cudnn", {"kernels": ["sm90_xmma_fprop"]}, 0)
    assert len(store.measurements(run, metric="wall_time_ms")) == 1
    assert len(store.measurements()) == 5

    p = store.predictions(run)
    assert list(p.model) == ["roofline", "delta"]
    assert p.tiling[1] == {"tm": 128, "tn": 64} and p.layer[1] == "conv2"
    assert (p.l1_bytes[1], p.l2_bytes[1], p.dram_bytes[1], p.time_ms[1]) == (10, 20, 30, 0.9)

    c = store.counters(run)
    assert (c.source[0], c.layer[0], c.dram_bytes[0], c.extra[0]) == ("ncu", "conv2", 31, {"kernel": "conv_tiled"})

    plans = store.plans(run)
    assert list(plans.algorithm) == ["tflite_greedy", "naive"]
    assert list(plans.n_buffers) == [2, 2] and plans.arena_bytes[0] == 300 and plans.lower_bound_bytes[0] == 200
    assert plans.seconds[0] == 0.01 and pd.isna(plans.seconds[1])

    b = store.buffers(run, algorithm="tflite_greedy")
    assert list(b["name"]) == ["act0", "act1"] and list(b.offset_bytes) == [0, 100]
    assert list(b.start_step) == [0, 1] and list(b.end_step) == [1, 2]
    assert len(store.buffers(run)) == 4

    s = store.sparsity(run)
    assert (s.layer[0], s.zero_fraction[0], s.sample_count[0], s.extra[0]) == ("relu1", 0.55, 16, {"tensor": "out"})


def test_readers_of_an_empty_store_have_columns(store):
    assert "model" in store.runs().columns and store.runs().empty
    assert {"median", "layer"} <= set(store.measurements().columns)
    assert {"ratio"} <= set(store.compare(*[store.add_run("bench") for _ in range(2)]).columns)


def test_numpy_values_are_accepted(store):
    np = pytest.importorskip("numpy")
    run = store.add_run("bench", batch=np.int64(4))
    (layer,) = store.add_layers(run, [{"idx": np.int32(0), "name": "c", "op": "conv2d",
                                       "input_shapes": [np.array([1, 2])], "flops": np.int64(5)}])
    store.add_measurements(run, [timing(layer, "xla", np.float32(0.25))])
    assert store.layers(run).input_shapes[0] == [[1, 2]]
    run_id_from_frame = store.runs().id[0]  # a NumPy integer
    assert len(store.layers(run_id_from_frame)) == 1 and len(store.measurements(run_id_from_frame)) == 1
    assert store.measurements(run)["median"][0] == 0.25


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row, message",
    [
        ({"backend": "xla", "metric": "device_time_ms"}, "missing required keys ['median']"),
        ({"backend": "xla", "metric": "t", "median": 1.0, "mediam": 2}, "unknown keys ['mediam']"),
        ({"backend": "xla", "metric": "t", "median": "fast"}, "'median' must be a finite number"),
        ({"backend": "xla", "metric": "t", "median": float("nan")}, "finite"),
        ({"backend": "xla", "metric": "t", "median": 1.0, "n": 2.5}, "'n' must be an integer"),
        ({"backend": "xla", "metric": "t", "median": 1.0, "n": True}, "got a bool"),
        ({"backend": "xla", "metric": "t", "median": 1.0, "p10": 2.0}, "quantiles_ordered"),
        ({"backend": "xla", "metric": "t", "median": 1.0, "n": 0}, "CHECK constraint failed"),
        ({"backend": "xla", "metric": "t", "median": 1.0, "extra": {1, 2}}, "not JSON-serializable"),
        ("not a dict", "expected a dict"),
    ],
)
def test_bad_rows_raise_clear_value_errors(store, row, message):
    run = store.add_run("bench")
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        store.add_measurements(run, [row])


def test_multi_row_insert_is_atomic(store, tmp_path):
    run = store.add_run("bench")
    good = {"idx": 0, "name": "a", "op": "conv2d"}
    with pytest.raises(ValueError, match="layers row 2"):
        store.add_layers(run, [good, {"idx": 1, "name": "b", "op": "relu"}, {"idx": 2, "name": "a", "op": "relu"}])
    assert store.layers(run).empty
    with pytest.raises(ValueError, match="offset_bytes 250 \\+ size_bytes 100 exceeds arena_bytes 300"):
        store.add_plan(run, "naive", 300, None, [{"name": "x", "size_bytes": 100, "start_step": 0, "end_step": 0,
                                                  "offset_bytes": 250}])
    assert store.plans(run).empty


def test_transaction_is_all_or_nothing(store, tmp_path):
    with pytest.raises(RuntimeError, match="midway"):
        with store.transaction():
            run = store.add_run("profile")
            store.add_layers(run, LAYERS)
            assert len(store.layers(run)) == 3  # the transaction sees its own rows
            raise RuntimeError("midway")
    assert store.runs().empty and table_counts(tmp_path / "profiles.sqlite")["layers"] == 0

    with store.transaction():
        run = store.add_run("profile")
        with store.transaction():  # nested: joins the outer one
            (conv1, *_) = store.add_layers(run, LAYERS)
        with pytest.raises(ValueError, match="missing required keys"):  # one failed call undoes only itself
            store.add_measurements(run, [timing(conv1, "xla", 1.0), {"backend": "xla"}])
        store.add_measurements(run, [timing(conv1, "jaxcnn", 0.5)])
    assert list(store.measurements(run).backend) == ["jaxcnn"] and len(store.layers(run)) == 3


def test_a_transaction_is_invisible_to_other_readers_until_it_ends(store, tmp_path):
    with Store(tmp_path / "profiles.sqlite", read_only=True) as reader:
        with store.transaction():
            run = store.add_run("profile")
            store.add_layers(run, LAYERS)
            assert reader.runs().empty and reader.layers().empty
        assert len(reader.runs()) == 1 and len(reader.layers()) == 3


def test_references_are_checked(store):
    run_a, (conv1, _, _) = populate(store)
    run_b = store.add_run("bench")
    with pytest.raises(ValueError, match="no run with id 999"):
        store.add_layers(999, [])
    with pytest.raises(ValueError, match=f"layer ids \\[{conv1}\\] are not layers of run {run_b}"):
        store.add_measurements(run_b, [timing(conv1, "xla", 1.0)])
    with pytest.raises(ValueError, match="already has a 'naive' plan"):
        store.add_plan(run_a, "naive", 1)
    with pytest.raises(ValueError, match="device"):
        store.add_run("bench", device="tpu")
    with pytest.raises(ValueError, match="timezone-aware"):
        store.add_run("bench", created_at="2025-01-01T00:00:00")
    with pytest.raises(ValueError, match="unknown keys \\['gpu'\\]"):
        store.add_run("bench", environment={"gpu": "H100"})


# -- environments, compare, delete ----------------------------------------------------------------


def test_environments_are_deduplicated(store):
    reordered = dict(reversed(list(ENV.items())))
    run_a = store.add_run("bench", environment=ENV)
    run_b = store.add_run("bench", environment={**reordered, "extra": {"clocks": "locked"}})
    run_c = store.add_run("bench", environment={**ENV, "driver": "560.1"})
    run_d = store.add_run("bench", environment={"hostname": "laptop"})
    run_e = store.add_run("bench", environment={"hostname": "laptop", "gpu_name": None})  # None == absent
    env_of = store.runs().set_index("id").environment_id
    assert env_of[run_a] == env_of[run_b]
    assert env_of[run_d] == env_of[run_e]
    assert len({env_of[run_a], env_of[run_c], env_of[run_d]}) == 3
    assert len(store.environments()) == 3


def test_compare_joins_layers_by_name_and_backend(store):
    run_a, _ = populate(store)
    run_b, (conv1_b, _, _) = populate(store, scale=2.0)
    store.add_measurements(run_b, [timing(conv1_b, "jaxcnn", 0.75), timing(conv1_b, "triton", 0.6)])  # re-measured
    cmp = store.compare(run_a, run_b)
    assert list(cmp.columns) == ["layer", "idx", "op", "backend", "median_a", "median_b", "ratio", "variant_a",
                                 "variant_b", "unit"]
    got = {(row.layer, row.backend): (row.median_a, row.median_b, row.ratio) for row in cmp.itertuples()}
    assert got[("conv1", "xla")] == (1.0, 2.0, 2.0)
    assert got[("conv1", "jaxcnn")] == (0.5, 0.75, 1.5)  # the latest measurement of run b counts
    assert got[("conv2", "xla")] == (2.0, 4.0, 2.0)
    assert pd.isna(got[("conv1", "triton")][0]) and got[("conv1", "triton")][1] == 0.6  # only in run b
    assert len(cmp) == 5 and list(cmp.idx) == [0, 0, 0, 2, 2]
    with pytest.raises(ValueError, match="no run with id 42"):
        store.compare(run_a, 42)


def test_delete_run_cascades(store):
    run_a, _ = populate(store)
    run_b, _ = populate(store, environment={"hostname": "other"})
    before = table_counts(store.path)
    store.delete_run(run_a)
    after = table_counts(store.path)
    assert after["runs"] == 1 and after["environments"] == 1  # run_a's environment is unused now
    for table in set(TABLES) - {"runs", "environments"}:
        assert after[table] == before[table] // 2, table
    assert list(store.runs().id) == [run_b]
    with pytest.raises(ValueError, match="no run"):
        store.delete_run(run_a)


# -- export / import -------------------------------------------------------------------------------


def content(store, path):
    """All runs of `store` as exported JSON: the content without database ids."""
    store.export_json(path)
    return json.loads(path.read_text())


def test_json_export_import_round_trip(tmp_path):
    dump = tmp_path / "results.json"
    with Store(tmp_path / "a.sqlite") as a:
        populate(a)
        populate(a, model="vgg", environment={"hostname": "cpu-box"}, scale=3.0)
        a.add_run("plan", created_at="2025-01-02T03:04:05.5+02:00")  # a run with nothing under it
        original = content(a, dump)
        original_frames = {name: getattr(a, name)() for name in ("runs", "layers", "measurements", "buffers")}
    with Store(tmp_path / "b.sqlite") as b:
        b.add_run("bench")  # ids in b start elsewhere
        b.delete_run(b.runs().id[0])
        ids = b.import_json(dump)
        assert len(ids) == 3
        assert content(b, tmp_path / "again.json") == original
        assert b.import_json(dump) == ids  # importing again adds nothing
        assert len(b.runs()) == 3
        for name, df in original_frames.items():
            drop = [c for c in df.columns if c == "id" or c.endswith("_id")]
            pd.testing.assert_frame_equal(getattr(b, name)().drop(columns=drop), df.drop(columns=drop))
        assert b.runs().created_at[0] == pd.Timestamp("2025-01-02T01:04:05.5", tz="UTC")


def test_json_export_of_selected_runs(tmp_path, store):
    populate(store)
    run_b, _ = populate(store, model="vgg")
    store.export_json(tmp_path / "one.json", run_ids=[run_b])
    with Store(tmp_path / "fresh.sqlite") as fresh:
        fresh.import_json(tmp_path / "one.json")
        assert list(fresh.runs().model) == ["vgg"]


def test_import_rejects_bad_files_without_writing(tmp_path, store):
    not_json = tmp_path / "x.json"
    not_json.write_text("{")
    with pytest.raises(ValueError, match="invalid JSON"):
        store.import_json(not_json)
    not_export = tmp_path / "y.json"
    not_export.write_text('{"runs": []}')
    with pytest.raises(ValueError, match="not a jaxcnn profile export"):
        store.import_json(not_export)
    populate(store)
    dump = tmp_path / "dump.json"
    document = content(store, dump)
    document["runs"][0]["uid"] = "new"
    document["runs"][0]["measurements"][0]["layer"] = "no_such_layer"
    dump.write_text(json.dumps(document))
    with pytest.raises(ValueError, match="no layer named 'no_such_layer'"):
        store.import_json(dump)
    assert len(store.runs()) == 1


def test_json_export_records_the_schema_version(tmp_path, store):
    populate(store)
    dump = tmp_path / "dump.json"
    document = content(store, dump)
    assert document["schema_version"] == SCHEMA_VERSION
    export = read_export(dump)
    assert export.schema_version == SCHEMA_VERSION and len(export.runs) == 1
    # Exports from before the key existed come from version-1 stores.
    del document["schema_version"]
    dump.write_text(json.dumps(document))
    assert read_export(dump).schema_version == 1
    # An export of a newer schema is refused, naming both versions, and nothing is written.
    document["schema_version"] = SCHEMA_VERSION + 1
    document["runs"][0]["uid"] = "from-the-future"
    dump.write_text(json.dumps(document))
    with Store(tmp_path / "other.sqlite") as other:
        with pytest.raises(ValueError, match=f"schema version {SCHEMA_VERSION + 1}, newer than this jaxcnn's"):
            other.import_json(dump)
        assert other.runs().empty
    document["schema_version"] = "2"
    dump.write_text(json.dumps(document))
    with pytest.raises(ValueError, match="schema_version.*must be a positive integer"):
        read_export(dump)


def test_csv_export_writes_every_table(tmp_path, store):
    populate(store)
    paths = store.export(tmp_path / "csv")
    assert sorted(p.name for p in paths) == sorted(f"{t}.csv" for t in ("meta", *TABLES))
    counts = table_counts(store.path)
    for table in TABLES:
        assert len(pd.read_csv(tmp_path / "csv" / f"{table}.csv")) == counts[table]
    layers = pd.read_csv(tmp_path / "csv" / "layers.csv")
    assert json.loads(layers.params[0]) == LAYERS[0]["params"]
    with pytest.raises(ValueError, match="format"):
        store.export(tmp_path, format="xlsx")


def test_parquet_export(tmp_path, store):
    pytest.importorskip("pyarrow")
    populate(store)
    store.export(tmp_path / "pq", format="parquet")
    assert len(pd.read_parquet(tmp_path / "pq" / "measurements.parquet")) == 5


def test_parquet_export_without_pyarrow_says_what_to_install(tmp_path, store, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow` fail
    with pytest.raises(ImportError, match="pip install pyarrow"):
        store.export(tmp_path / "pq", format="parquet")
    assert not (tmp_path / "pq").exists()


# -- concurrency -----------------------------------------------------------------------------------


def write_runs(path, worker, n_runs, start_together):
    start_together.wait()
    with Store(path) as store:
        for i in range(n_runs):
            run = store.add_run("bench", model=f"worker{worker}", note=str(i), environment={"hostname": "shared"})
            layer_ids = store.add_layers(run, LAYERS)
            store.add_measurements(run, [timing(layer_id, "xla", 1.0) for layer_id in layer_ids])


def test_two_processes_write_at_once(tmp_path):
    path = tmp_path / "shared.sqlite"  # both processes create it: the schema setup races too
    n_runs = 50
    context = multiprocessing.get_context("spawn")  # never fork a process that has JAX threads running
    start_together = context.Barrier(2)
    workers = [context.Process(target=write_runs, args=(path, w, n_runs, start_together)) for w in range(2)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(timeout=60)
    assert [p.exitcode for p in workers] == [0, 0]
    with Store(path) as store:
        runs = store.runs()
        assert len(runs) == 2 * n_runs
        assert runs.groupby("model").note.apply(lambda notes: sorted(notes, key=int)).map(len).to_dict() == {
            "worker0": n_runs, "worker1": n_runs}
        assert runs.environment_id.nunique() == 1
        layers = store.layers()
        assert (layers.groupby("run_id")["name"].apply(list) == [[l["name"] for l in LAYERS]] * (2 * n_runs)).all()
        m = store.measurements()
        assert len(m) == 2 * n_runs * len(LAYERS)
        assert (m.merge(layers, left_on="layer_id", right_on="id").run_id_x == m.run_id.values).all()


def test_a_store_can_be_shared_across_threads(store):
    import threading

    errors = []

    def add():
        try:
            store.add_layers(store.add_run("bench"), LAYERS)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(store.layers()) == 4 * len(LAYERS)


# -- files: new, empty, corrupt, foreign, default path ---------------------------------------------


def test_new_and_empty_files_are_initialized(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    for path in (tmp_path / "new.sqlite", empty):
        with Store(path) as store:
            assert store.runs().empty
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            meta = dict(conn.execute("SELECT key, value FROM meta"))
        assert meta == {"application": "jaxcnn-profile-store", "schema_version": str(SCHEMA_VERSION)}


def test_random_bytes_raise_store_error(tmp_path):
    path = tmp_path / "random.sqlite"
    path.write_bytes(os.urandom(8192))
    with pytest.raises(StoreError, match=f"{path} is not a jaxcnn profile store"):
        Store(path)


def test_corrupt_sqlite_pages_raise_store_error(tmp_path):
    path = tmp_path / "corrupt.sqlite"
    with Store(path) as store:
        populate(store)
    data = bytearray(path.read_bytes())
    data[100:] = os.urandom(len(data) - 100)  # keep the header, scramble every page
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=str(path)):
        Store(path)


def test_truncated_file_raises_store_error(tmp_path):
    path = tmp_path / "truncated.sqlite"
    with Store(path) as store:
        populate(store)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(StoreError, match=f"{path} is truncated"):
        Store(path)
    path.write_bytes(data[:50])
    with pytest.raises(StoreError, match=f"{path} is not a jaxcnn profile store"):
        Store(path)


def test_foreign_sqlite_files_raise_store_error(tmp_path):
    other_app = tmp_path / "other.sqlite"
    with sqlite3.connect(other_app) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    with pytest.raises(StoreError, match=f"{other_app} is not a jaxcnn profile store.*customers"):
        Store(other_app)

    other_id = tmp_path / "other_id.sqlite"
    with sqlite3.connect(other_id) as conn:
        conn.execute("PRAGMA application_id = 1234")
    with pytest.raises(StoreError, match="not a jaxcnn profile store .*application_id 0x000004d2"):
        Store(other_id)

    no_meta = tmp_path / "no_meta.sqlite"
    with sqlite3.connect(no_meta) as conn:
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("CREATE TABLE runs (id INTEGER)")
    with pytest.raises(StoreError, match="no jaxcnn meta table"):
        Store(no_meta)

    for path in (other_app, other_id):  # left as they were
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_default_path_and_env_var(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JAXCNN_DB", raising=False)
    with Store() as store:
        assert store.path == tmp_path / "jaxcnn_profiles.sqlite"
    assert (tmp_path / "jaxcnn_profiles.sqlite").exists()
    monkeypatch.setenv("JAXCNN_DB", str(tmp_path / "from_env.sqlite"))
    with Store() as store:
        store.add_run("bench")
    with Store(tmp_path / "from_env.sqlite") as store:
        assert len(store.runs()) == 1
    with Store(tmp_path / "explicit.sqlite") as store:  # an explicit path beats the variable
        assert store.path.name == "explicit.sqlite"


def test_closed_store_raises(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="is closed"):
        store.runs()


# -- schema versions --------------------------------------------------------------------------------


def test_store_from_version_0_is_migrated(tmp_path):
    """A file holding only the bootstrap (version 0) gets every migration, v1 included."""
    path = tmp_path / "v0.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    _schema.run_script(conn, _schema.BOOTSTRAP)
    conn.close()
    with Store(path) as store:
        populate(store)
        assert len(store.runs()) == 1


def test_pending_migrations_run_in_order_and_keep_data(tmp_path, monkeypatch):
    path = tmp_path / "old.sqlite"
    with Store(path) as store:
        populate(store)
    applied = []

    def to_v2(conn):
        applied.append(2)
        conn.execute("ALTER TABLE runs ADD COLUMN tags JSON TEXT")

    def to_v3(conn):
        applied.append(3)
        conn.execute("UPDATE runs SET tags = '[\"migrated\"]'")

    monkeypatch.setattr(_schema, "MIGRATIONS", [*_schema.MIGRATIONS, to_v2, to_v3])
    with Store(path) as store:
        assert applied == [2, 3]
        runs = store.runs()
        assert runs.tags[0] == ["migrated"] and runs.model[0] == "resnet18"
        assert len(store.measurements()) == 5
    with Store(path):
        assert applied == [2, 3]  # nothing left to do
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("3",)


def test_failed_migration_changes_nothing(tmp_path, monkeypatch):
    path = tmp_path / "old.sqlite"
    with Store(path) as store:
        populate(store)

    def broken_v2(conn):
        conn.execute("CREATE TABLE half_done (x INTEGER)")
        conn.execute("SELECT no_such_column FROM runs")

    monkeypatch.setattr(_schema, "MIGRATIONS", [*_schema.MIGRATIONS, broken_v2])
    with pytest.raises(StoreError, match="migrating the schema to version 2 failed"):
        Store(path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'half_done'").fetchone() is None


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "future.sqlite"
    Store(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 99, newer than this jaxcnn supports"):
        Store(path)
