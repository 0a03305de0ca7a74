"""The store under failure: profile writers killed with SIGKILL at random points, writers in
several processes at once, read-only and missing files, damaged schemas, and the CLI's one-line
errors with their exit statuses.

Run as a script, this file is the writer process the kill and concurrency tests start:
    python test_store_reliability.py profiles DB SEED     record synthetic profiles until killed
    python test_store_reliability.py runs DB WORKER N     write N runs
Each says "ready" on stdout, then starts writing when a line arrives on stdin.
"""

import hashlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxcnn.store import TABLES, Store, StoreError

REPO = Path(__file__).resolve().parents[2]

# The synthetic profile the killed writers record: enough rows that one profile takes a while
# to write, so random kills land inside the transaction as well as between profiles.
PROFILE_LAYERS = 120
PROFILE_BACKENDS = ("xla", "jaxcnn")
# Rows one synthetic profile adds: a timing per layer and backend, end-to-end and wall time per
# backend; a sparsity row per layer.
PROFILE_MEASUREMENTS = PROFILE_LAYERS * len(PROFILE_BACKENDS) + 2 * len(PROFILE_BACKENDS)
PROFILE_SPARSITY = PROFILE_LAYERS

KILL_SEEDS = range(12)
CONCURRENT_WRITERS = 8
RUNS_PER_WRITER = 15
RUN_LAYERS = 4  # layers per run in the concurrency test; a measurement and a sparsity row each


def synthetic_profile(label: str):
    """A ModelProfile with PROFILE_LAYERS made-up layers and timings (no model is run)."""
    from jaxcnn.models.layers import LayerInfo
    from jaxcnn.profile.device_time import TimingStats, stats_fields
    from jaxcnn.profile.model_profile import LayerProfile, ModelProfile

    def timing(base_ms):
        return TimingStats(**stats_fields([base_ms, 1.1 * base_ms, 1.3 * base_ms]))

    layers = []
    for index in range(PROFILE_LAYERS):
        info = LayerInfo(name=f"conv{index}", op="conv2d", dtype="float32", input_shapes=((1, 8, 8, 4),),
                         output_shape=(1, 8, 8, 4), weight_shape=(3, 3, 4, 4), stride=(1, 1),
                         padding=((1, 1), (1, 1)), flops=2 * 9 * 16 * 64, bytes=4 * 700)
        times = {backend: timing(0.01 * (index + 1) * (k + 1)) for k, backend in enumerate(PROFILE_BACKENDS)}
        layers.append(LayerProfile(info, times, input_zero_fraction=0.25, output_zero_fraction=0.5))
    whole = {backend: timing(1.0) for backend in PROFILE_BACKENDS}
    return ModelProfile("synthetic", 1, "float32", PROFILE_BACKENDS, False, layers, whole, dict(whole), {},
                        {"hostname": "writer"}, note=label)


def record_synthetic_profiles(db: str, seed: str) -> None:
    """Record profiles into `db` until killed, saying on stdout when each one is committed."""
    from jaxcnn.profile.record import record_profile

    profile = synthetic_profile("")  # built once: the loop's time goes to recording
    with Store(db, read_only=False) as store:
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(10**6):
            profile.note = f"{seed}-{i}"
            record_profile(profile, store, predict=False)
            print(f"committed {profile.note}", flush=True)


def write_runs(db: str, worker: str, n_runs: str) -> None:
    """Write `n_runs` runs (run, layers, measurements, sparsity: one transaction each)."""
    with Store(db) as store:
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(int(n_runs)):
            with store.transaction():
                run = store.add_run("bench", model=f"worker{worker}", note=str(i), environment={"hostname": "shared"})
                layer_ids = store.add_layers(run, [{"idx": k, "name": f"l{k}", "op": "conv2d"}
                                                   for k in range(RUN_LAYERS)])
                store.add_measurements(run, [{"layer_id": layer, "backend": "xla", "metric": "wall_time_ms",
                                              "median": 1.0} for layer in layer_ids])
                store.add_sparsity(run, [{"layer_id": layer, "zero_fraction": 0.5} for layer in layer_ids])


def start_writer(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def wait_ready(writer: subprocess.Popen) -> None:
    line = writer.stdout.readline()
    if line.strip() != "ready":
        writer.kill()
        raise AssertionError(f"writer did not start: {line!r} {writer.stderr.read()}")


def say_go(writer: subprocess.Popen) -> None:
    writer.stdin.write("go\n")
    writer.stdin.flush()


def finish(writer: subprocess.Popen) -> tuple[str, str]:
    """The rest of the writer's stdout and its stderr, once it has ended. Read through the same
    buffered files wait_ready used: communicate() would skip lines they had already buffered."""
    out = writer.stdout.read()
    err = writer.stderr.read()
    writer.wait(timeout=60)
    writer.stdin.close()
    return out, err


def rows_per_run(path) -> dict[int, tuple[int, int, int]]:
    """Run id -> (layers, measurements, sparsity rows) it holds."""
    counts = ", ".join(f"(SELECT count(*) FROM {t} WHERE run_id = r.id)" for t in ("layers", "measurements", "sparsity"))
    with sqlite3.connect(path) as conn:
        return {row[0]: tuple(row[1:]) for row in conn.execute(f"SELECT r.id, {counts} FROM runs r")}


def table_counts(path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def integrity(path) -> tuple[str, list]:
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0], conn.execute("PRAGMA foreign_key_check").fetchall()


def run_contents(store: Store, run_id: int) -> dict:
    """Everything recorded under a run, to tell whether it changed."""
    return {"layers": store.layers(run_id).to_dict("list"), "measurements": store.measurements(run_id).to_dict("list"),
            "sparsity": store.sparsity(run_id).to_dict("list")}


# -- kills -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def killed_writers(tmp_path_factory):
    """Seed -> (store, profiles the writer reported committed, exit status, contents of the runs
    recorded before it started). One writer per seed, each on its own store with two earlier
    runs, all started together (their start-up overlaps) and each killed with SIGKILL after a
    delay drawn from its seed."""
    from jaxcnn.profile.record import record_profile

    stores, earlier, writers = {}, {}, {}
    for seed in KILL_SEEDS:
        stores[seed] = tmp_path_factory.mktemp(f"kill{seed}") / "killed.sqlite"
        with Store(stores[seed]) as store:
            runs = [record_profile(synthetic_profile(f"earlier-{k}"), store, predict=False) for k in range(2)]
            earlier[seed] = {run: run_contents(store, run) for run in runs}
        writers[seed] = start_writer("profiles", str(stores[seed]), f"seed{seed}")
    for writer in writers.values():
        wait_ready(writer)
    for writer in writers.values():
        say_go(writer)
    # Some profiles' worth of time after the start: each kill lands anywhere in its writer's
    # first profiles, inside or between their transactions.
    started = time.monotonic()
    delays = {seed: random.Random(seed).uniform(0.0, 1.0) for seed in KILL_SEEDS}
    for seed in sorted(KILL_SEEDS, key=delays.get):
        time.sleep(max(0.0, started + delays[seed] - time.monotonic()))
        writers[seed].send_signal(signal.SIGKILL)
    outcome = {}
    for seed, writer in writers.items():
        out, _ = finish(writer)
        committed = [line.split()[1] for line in out.splitlines() if line.startswith("committed")]
        outcome[seed] = (stores[seed], committed, writer.returncode, earlier[seed])
    return outcome


@pytest.mark.parametrize("seed", KILL_SEEDS)
def test_profile_writer_killed_at_a_random_point_leaves_no_partial_run(killed_writers, seed):
    from jaxcnn.profile.record import record_profile

    db, committed, returncode, earlier_contents = killed_writers[seed]
    assert returncode == -signal.SIGKILL

    assert integrity(db) == ("ok", [])
    with Store(db, read_only=True) as store:
        runs = store.runs()
        notes = list(runs.note)
        # Every profile the writer saw committed is there; at most one more (killed between its
        # commit and its report); nothing of the profile the kill interrupted.
        assert notes[:2] == ["earlier-0", "earlier-1"]
        assert notes[2:2 + len(committed)] == committed and len(notes) - 2 - len(committed) in (0, 1)
        assert {run: run_contents(store, run) for run in earlier_contents} == earlier_contents
    complete = (PROFILE_LAYERS, PROFILE_MEASUREMENTS, PROFILE_SPARSITY)
    assert rows_per_run(db) == {run_id: complete for run_id in runs.id}
    with Store(db) as store:  # and the store takes new profiles after the crash
        record_profile(synthetic_profile("after"), store, predict=False)
        assert list(store.runs().note)[-1] == "after"


def test_failure_midway_through_a_profile_records_nothing(tmp_path, monkeypatch):
    """An error after the run and its layers are written (here: the sparsity rows) rolls back
    the whole profile."""
    from jaxcnn.profile.record import record_profile

    db = tmp_path / "failed.sqlite"
    with Store(db) as store:
        record_profile(synthetic_profile("good"), store, predict=False)
        before = table_counts(db)

        def broken_sparsity(self, run_id, rows):
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(Store, "add_sparsity", broken_sparsity)
        with pytest.raises(RuntimeError, match="disk on fire"):
            record_profile(synthetic_profile("bad"), store, predict=False)
        assert list(store.runs().note) == ["good"]
    assert table_counts(db) == before


# -- concurrent writers --------------------------------------------------------------------------------


def test_concurrent_writers_all_rows_land(tmp_path):
    db = tmp_path / "shared.sqlite"  # the writers create it together: the schema setup races too
    writers = [start_writer("runs", str(db), str(w), str(RUNS_PER_WRITER)) for w in range(CONCURRENT_WRITERS)]
    for writer in writers:
        wait_ready(writer)
    for writer in writers:
        say_go(writer)
    results = [finish(writer) for writer in writers]
    assert [w.returncode for w in writers] == [0] * CONCURRENT_WRITERS, [err for _, err in results]

    assert integrity(db) == ("ok", [])
    n_runs = CONCURRENT_WRITERS * RUNS_PER_WRITER
    assert table_counts(db) == {"environments": 1, "runs": n_runs, "layers": n_runs * RUN_LAYERS,
                                "measurements": n_runs * RUN_LAYERS, "sparsity": n_runs * RUN_LAYERS,
                                "predictions": 0, "counters": 0, "plans": 0, "buffers": 0}
    with Store(db, read_only=True) as store:
        runs = store.runs()
        per_worker = runs.groupby("model").note.apply(lambda notes: sorted(int(n) for n in notes))
        assert per_worker.to_dict() == {f"worker{w}": list(range(RUNS_PER_WRITER)) for w in range(CONCURRENT_WRITERS)}
        layers = store.layers()
        assert (layers.groupby("run_id").size() == RUN_LAYERS).all()


# -- read-only, missing and damaged stores ----------------------------------------------------------------


@pytest.fixture
def filled_store(tmp_path):
    """A store with a profile run (per-layer times) and a plan run (no measurements)."""
    path = tmp_path / "filled.sqlite"
    with Store(path) as store:
        profile = store.add_run("profile", model="lenet5", device="cpu")
        layers = store.add_layers(profile, [{"idx": 0, "name": "conv1", "op": "conv2d"},
                                            {"idx": 1, "name": "pool1", "op": "maxpool"}])
        store.add_measurements(profile, [{"layer_id": layer, "backend": "xla", "metric": "wall_time_ms",
                                          "median": 1.0 + k} for k, layer in enumerate(layers)])
        plan = store.add_run("plan", model="lenet5")
        store.add_plan(plan, "naive", 100, 50)
    return path


def file_digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_read_only_store_is_readable_and_refuses_writes(filled_store):
    digest = file_digest(filled_store)
    with Store(filled_store, read_only=True) as store:
        assert store.read_only and list(store.runs().kind) == ["profile", "plan"]
        assert len(store.compare(1, 1, metric="wall_time_ms")) == 2
        with pytest.raises(StoreError, match=f"{filled_store} is open read-only"):
            store.add_run("bench")
        with pytest.raises(StoreError, match="open read-only"), store.transaction():
            pass
    assert file_digest(filled_store) == digest


def test_store_without_write_permission_opens_read_only(filled_store, monkeypatch):
    from jaxcnn.store import _db

    monkeypatch.setattr(_db, "is_writable", lambda path: False)
    with Store(filled_store) as store:
        assert store.read_only and len(store.runs()) == 2
    with pytest.raises(StoreError, match=f"profile store {filled_store} is read-only \\(no write permission\\)"):
        Store(filled_store, read_only=False)


def test_read_only_store_in_a_read_only_directory_is_read_as_immutable(filled_store, monkeypatch):
    """Where a reader may not create the -shm index beside a closed WAL store, it reads the file
    as immutable and leaves the directory as it was."""
    from jaxcnn.store import _db

    monkeypatch.setattr(_db, "_wal_index_uncreatable", lambda path: True)
    before = sorted(filled_store.parent.iterdir())
    with Store(filled_store, read_only=True) as store:
        assert list(store.runs().kind) == ["profile", "plan"]
    assert sorted(filled_store.parent.iterdir()) == before


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes files whatever their mode")
def test_chmod_read_only_file_is_readable(filled_store):
    filled_store.chmod(0o444)
    with Store(filled_store) as store:
        assert store.read_only and len(store.runs()) == 2


@pytest.mark.parametrize("read_only", [True, None, False])
def test_missing_store_is_created_only_by_writers(tmp_path, read_only):
    path = tmp_path / "missing.sqlite"
    if read_only:
        with pytest.raises(StoreError, match=f"profile store {path} does not exist"):
            Store(path, read_only=True)
        assert list(tmp_path.iterdir()) == []
    else:
        with Store(path, read_only=read_only) as store:
            assert not store.read_only
        assert path.exists()


def test_store_in_a_missing_directory_is_a_clear_error(tmp_path):
    path = tmp_path / "no" / "such" / "dir" / "s.sqlite"
    with pytest.raises(StoreError, match=f"cannot create profile store {path}: directory .* does not exist"):
        Store(path)
    with pytest.raises(StoreError, match="is a directory"):
        Store(tmp_path)


@pytest.mark.parametrize("table", ["measurements", "layers", "runs", "sparsity"])
def test_dropped_table_is_named_on_open(filled_store, table):
    with sqlite3.connect(filled_store) as conn:
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute(f"DROP TABLE {table}")
    for read_only in (True, None):
        with pytest.raises(StoreError, match=f"profile store {filled_store} is damaged: table {table} missing"):
            Store(filled_store, read_only=read_only)


def test_empty_file_opened_read_only_says_so(tmp_path):
    path = tmp_path / "empty.sqlite"
    path.touch()
    with pytest.raises(StoreError, match="is empty"):
        Store(path, read_only=True)
    assert path.stat().st_size == 0


# -- CLI errors: one line, exit 1 (2 for usage), traceback only with --debug ---------------------------------


def run_cli(capsys, *argv):
    from jaxcnn import cli

    status = cli.main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_one_line_error(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["profile", "lenet5", "--iters", "0"], "--iters: must be >= 1, got 0"),
        (["profile", "lenet5", "--warmup", "-1"], "--warmup: must be >= 0, got -1"),
        (["profile", "lenet5", "--batch", "0"], "--batch: must be >= 1, got 0"),
        (["profile", "lenet5", "--iters", "many"], "--iters: expected an integer, got 'many'"),
        (["profile", "lenet5", "--backend", "cudnn"], "unknown backend 'cudnn'"),
        (["layers", "vgg99"], "unknown model 'vgg99'"),
        (["layers", "lenet5", "--dtype", "int8"], "unknown dtype 'int8'"),
        (["compare", "1"], "the following arguments are required: run_b"),
        (["compare", "one", "2"], "argument run_a"),
        (["layouts", "lenet5", "--iters", "0"], "--iters: must be >= 1"),
        (["maxbatch", "lenet5", "--budget", "lots"], "--budget"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2_in_one_line(capsys, argv, fragment):
    status, out, err = run_cli(capsys, *argv)
    assert status == 2 and out == ""
    assert_one_line_error(err, fragment)


def test_compare_errors_exit_1_in_one_line(capsys, filled_store, tmp_path):
    db = str(filled_store)
    status, _, err = run_cli(capsys, "compare", "1", "99", "--db", db)
    assert status == 1
    assert_one_line_error(err, db, "no run with id 99")

    status, out, err = run_cli(capsys, "compare", "1", "2", "--db", db)  # a profile run and a plan run
    assert status == 1 and "nan" not in out.lower()
    assert_one_line_error(err, db, "run 2 ('plan') has no per-layer", "cannot be compared with run 1 ('profile')")

    missing = tmp_path / "missing.sqlite"
    status, _, err = run_cli(capsys, "compare", "1", "2", "--db", str(missing))
    assert status == 1 and not missing.exists()
    assert_one_line_error(err, str(missing), "does not exist")

    status, out, err = run_cli(capsys, "compare", "1", "1", "--db", db)  # device time falls back to wall time
    assert status == 0 and "conv1" in out and "pool1" in out


def test_damaged_stores_are_one_line_errors(capsys, filled_store, tmp_path):
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database" * 100)
    status, _, err = run_cli(capsys, "compare", "1", "2", "--db", str(garbage))
    assert status == 1
    assert_one_line_error(err, str(garbage), "not a jaxcnn profile store")

    with sqlite3.connect(filled_store) as conn:
        conn.execute("DROP TABLE measurements")
    status, _, err = run_cli(capsys, "compare", "1", "2", "--db", str(filled_store))
    assert status == 1
    assert_one_line_error(err, str(filled_store), "table measurements missing")


def test_profile_checks_the_store_before_profiling(capsys, filled_store, monkeypatch):
    """A bad store fails the profile command at once: the profiling itself never starts."""
    from jaxcnn.profile import profiler
    from jaxcnn.store import _db

    def must_not_run(*args, **kwargs):
        raise AssertionError("profiled before the store was checked")

    monkeypatch.setattr(profiler, "_profile", must_not_run)
    with sqlite3.connect(filled_store) as conn:
        conn.execute("DROP TABLE sparsity")
    status, _, err = run_cli(capsys, "profile", "lenet5", "--quiet", "--db", str(filled_store))
    assert status == 1
    assert_one_line_error(err, str(filled_store), "table sparsity missing")

    monkeypatch.setattr(_db, "is_writable", lambda path: False)
    status, _, err = run_cli(capsys, "profile", "lenet5", "--quiet", "--db", str(filled_store))
    assert status == 1
    assert_one_line_error(err, str(filled_store), "read-only")


def test_debug_shows_the_traceback(capsys, tmp_path):
    missing = str(tmp_path / "missing.sqlite")
    for argv in (["--debug", "compare", "1", "2", "--db", missing], ["compare", "1", "2", "--db", missing, "--debug"]):
        status, _, err = run_cli(capsys, *argv)
        assert status == 1 and "Traceback" in err and "StoreError" in err
        assert err.strip().splitlines()[-1].endswith("does not exist")


def test_cli_process_exit_status_and_stderr(tmp_path):
    """The installed entry point, as a shell sees it: status 1 and one line on stderr."""
    missing = tmp_path / "missing.sqlite"
    result = subprocess.run([sys.executable, "-m", "jaxcnn.cli", "compare", "1", "2", "--db", str(missing)],
                            capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert result.returncode == 1 and result.stdout == ""
    assert_one_line_error(result.stderr, str(missing))
    assert not missing.exists()


if __name__ == "__main__":
    writers = {"profiles": record_synthetic_profiles, "runs": write_runs}
    writers[sys.argv[1]](*sys.argv[2:])
