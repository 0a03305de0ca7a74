"""Stores the dashboard tests read: the shipped H200 data, real packing plans, a max-batch curve and
donation from real compiles, a real CPU profile, and broken files. Shared by test_dashboard_*.py."""

from __future__ import annotations

import atexit
import shutil
import sqlite3
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxcnn.dashboard import data
from jaxcnn.models import get_model
from jaxcnn.memory import compiled_buffers, jaxpr_buffers
from jaxcnn.memory.packing import plan_all
from jaxcnn.store import Store

PLAN_MODEL = "squeezenet1_1"
CURVE_MODEL = "lenet5"
CURVE_BATCHES = (1, 2, 4, 8)


_BUILT: dict[str, Path] = {}


def shipped_with_plans(cache: Path) -> Path:
    """The shipped data plus real packing plans and a max-batch curve; built once per test
    process (the page and browser tests only read it)."""
    if "shipped_with_plans" not in _BUILT:
        directory = tempfile.mkdtemp(prefix="jaxcnn_dashboard_")
        atexit.register(shutil.rmtree, directory, True)
        path = shipped_copy(Path(directory), cache)
        with Store(path) as store:
            add_packing_plans(store)
            add_batch_curve(store)
        _BUILT["shipped_with_plans"] = path
    return _BUILT["shipped_with_plans"]


def shipped_copy(directory: Path, cache: Path) -> Path:
    """A writable copy of the store built from dashboard/shipped/."""
    target = directory / "shipped_copy.sqlite"
    shutil.copyfile(data.shipped_store(cache=cache), target)
    return target


def add_packing_plans(store: Store, model: str = PLAN_MODEL, batch: int = 1) -> int:
    """A kind='plan' run with every packing algorithm's plan of the model's jaxpr buffers, and
    XLA's own (its compiled ENTRY buffers, arena = temp size; XLA gives no offsets)."""
    spec = get_model(model)
    params = spec.abstract_params("bfloat16")
    x = jax.ShapeDtypeStruct(spec.input_shape(batch), "bfloat16")
    forward = lambda p, x: spec.apply(p, x, backend="xla")  # noqa: E731
    buffers = jaxpr_buffers(forward, params, x)
    plans, bound = plan_all(buffers)
    run = store.add_run("plan", model=model, backend="xla", batch=batch, dtype="bfloat16", device="cpu",
                        note="dashboard test: jaxpr buffers")
    for name, plan in plans.items():
        store.add_plan(run, name, plan.arena_bytes, bound, [
            dict(name=b.name, size_bytes=b.size_bytes, start_step=b.start, end_step=b.end,
                 offset_bytes=plan.offsets[b.name]) for b in buffers])
    hlo, stats = compiled_buffers(forward, params, x)
    store.add_plan(run, "xla", stats["temp_size_in_bytes"], None, [
        dict(name=b.name, size_bytes=b.size_bytes, start_step=b.start, end_step=b.end) for b in hlo])
    return run


def _sgd_step(spec):
    def loss(params, x):
        return jnp.mean(spec.apply(params, x, backend="xla").astype(jnp.float32) ** 2)

    def step(params, x):
        grads = jax.grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

    return step


def add_batch_curve(store: Store, model: str = CURVE_MODEL) -> int:
    """A kind='plan' run with XLA's peak bytes of the model's SGD step at several batches and the
    aliased bytes when the params are donated (measured by compiling on this machine)."""
    spec = get_model(model)
    params = spec.abstract_params("float32")
    step = _sgd_step(spec)
    run = store.add_run("plan", model=model, backend="xla", batch=max(CURVE_BATCHES), dtype="float32", device="cpu",
                        note="dashboard test: max-batch curve")
    rows = []
    for batch in CURVE_BATCHES:
        x = jax.ShapeDtypeStruct(spec.input_shape(batch), "float32")
        stats = jax.jit(step).lower(params, x).compile().memory_analysis()
        peak = stats.temp_size_in_bytes + stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
        rows.append(dict(backend="xla", metric="peak_bytes", median=float(peak), unit="bytes", variant="not donated",
                         extra={"batch": batch}))
    x = jax.ShapeDtypeStruct(spec.input_shape(1), "float32")
    donated = jax.jit(step, donate_argnums=0).lower(params, x).compile().memory_analysis()
    rows.append(dict(backend="xla", metric="alias_bytes", median=float(donated.alias_size_in_bytes), unit="bytes",
                     variant="params donated", extra={"batch": 1}))
    store.add_measurements(run, rows)
    return run


def cpu_profile(path: Path, model: str = CURVE_MODEL) -> Path:
    """A real CPU profile (host wall times, no GPU data) of a small zoo model."""
    from jaxcnn.profile.profiler import profile_model

    profile_model(model, batch=1, dtype="float32", iters=2, warmup=1, store=str(path))
    return path


def profiles_only(path: Path) -> Path:
    """A store holding only the shipped H200 zoo profiles (no plans, donation or max-batch runs)."""
    export = next(f for f in data.shipped_files() if f.name.endswith("-zoo.json"))
    with Store(path) as store:
        store.import_json(export)
    return path


def empty_store(path: Path) -> Path:
    Store(path).close()
    return path


def corrupt_file(path: Path) -> Path:
    path.write_bytes(b"this is not a database\n" * 64)
    return path


def missing_tables(source: Path, target: Path) -> Path:
    """A jaxcnn store whose measurement, prediction, plan and sparsity tables were dropped."""
    shutil.copyfile(source, target)
    with sqlite3.connect(target) as conn:
        conn.execute("PRAGMA foreign_keys = OFF")
        for table in ("buffers", "plans", "sparsity", "counters", "predictions", "measurements"):
            conn.execute(f"DROP TABLE {table}")
    return target


def foreign_sqlite(path: Path) -> Path:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    return path
