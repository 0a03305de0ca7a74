"""Zoo planning report (jaxcnn.memory.report), the `jaxcnn plan` command and scripts/plan_zoo.py,
on LeNet-5 (fast to compile on CPU)."""

import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcnn.cli import main as cli_main
from jaxcnn.models import get_model
from jaxcnn.memory.packing import ALGORITHMS, lower_bound
from jaxcnn.memory.report import (
    example_args,
    plan_buffers,
    plan_model,
    store_plan,
    summary,
    to_record,
    training_step,
)
from jaxcnn.store import Store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lenet_train_plan():
    return plan_model("lenet5", 2, train=True)


def test_training_step_is_sgd_on_cross_entropy():
    spec = get_model("lenet5")
    params = spec.init(0)
    x = jax.random.normal(jax.random.PRNGKey(1), spec.input_shape(4))
    labels = jnp.array([0, 3, 7, 9], jnp.int32)
    step = jax.jit(training_step(spec, learning_rate=0.05))
    new_params, loss = step(params, x, labels)
    logits = jax.jit(spec.apply)(params, x)
    expected = -np.mean(np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)),
                                           np.asarray(labels)[:, None], axis=1))
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert jax.tree.structure(new_params) == jax.tree.structure(params)
    grads = jax.jit(jax.grad(lambda p: -jnp.mean(jnp.take_along_axis(
        jax.nn.log_softmax(spec.apply(p, x)), labels[:, None], axis=1))))(params)
    for new, old, g in zip(jax.tree.leaves(new_params), jax.tree.leaves(params), jax.tree.leaves(grads)):
        np.testing.assert_allclose(new, old - 0.05 * g, rtol=1e-5, atol=1e-6)
    # A small step down the gradient lowers the loss on the same batch.
    assert step(new_params, x, labels)[1] < loss


def test_example_args_shapes_and_validation():
    spec = get_model("lenet5")
    params, x, labels = example_args(spec, 3, "float32", train=True)
    assert x.shape == (3, 32, 32, 1) and labels.shape == (3,) and labels.dtype == jnp.int32
    assert len(example_args(spec, 3)) == 2
    with pytest.raises(ValueError, match="batch"):
        example_args(spec, 0)


def test_plan_model_both_sources(lenet_train_plan):
    plan = lenet_train_plan
    assert plan.mode == "training" and set(plan.sources) == {"jaxpr", "hlo"}
    for source, sp in plan.sources.items():
        assert set(sp.plans) == set(ALGORITHMS)
        for p in sp.plans.values():
            p.validate(sp.buffers)
            assert p.arena_bytes >= sp.aligned_bound >= sp.bound == lower_bound(sp.buffers)
        goals = sp.goals()
        assert goals["bound"] and goals["peers"], (source, goals)
    hlo = plan.sources["hlo"]
    xla = plan.xla
    assert hlo.xla_bytes == xla["temp_size_in_bytes"] + xla["output_size_in_bytes"]
    # Temps + outputs from definition: no assignment can beat the bound, XLA's included.
    assert hlo.bound <= hlo.xla_bytes
    # XLA's own assignment (dumped) covers exactly its temp + live-out allocations.
    if hlo.xla_arena is not None:
        assert hlo.xla_arena == hlo.xla_bytes
        assert hlo.xla_offsets and set(hlo.xla_offsets) <= {b.name for b in hlo.buffers}
    assert plan.sources["jaxpr"].xla_bytes == xla["temp_size_in_bytes"]


def test_summary_and_record(lenet_train_plan):
    text = summary(lenet_train_plan, "hlo")
    for name in ALGORITHMS:
        assert f"| {name} |" in text
    assert "XLA temp + output" in text and "goals:" in text
    rows = to_record(lenet_train_plan)
    assert [r["source"] for r in rows] == ["jaxpr", "hlo"]
    json.dumps(rows)  # JSON-ready
    assert all(r["pack_2d"] <= min(r["greedy_by_size"], r["best_fit_decreasing"]) for r in rows)


def test_store_plan_round_trip(lenet_train_plan, tmp_path):
    with Store(tmp_path / "plans.sqlite") as store:
        runs = store_plan(store, lenet_train_plan)
        assert set(runs) == {"jaxpr", "hlo"}
        table = store.runs()
        assert set(table["kind"]) == {"plan"}
        for source, run_id in runs.items():
            sp = lenet_train_plan.sources[source]
            plans = store.plans(run_id).set_index("algorithm")
            assert set(plans.index) == set(ALGORITHMS) | {"xla"}
            assert plans.loc["pack_2d", "arena_bytes"] == sp.ours.arena_bytes
            assert plans.loc["xla", "arena_bytes"] >= sp.xla_bytes
            assert (plans["n_buffers"] == len(sp.buffers)).all()
            ours = store.buffers(run_id, algorithm="pack_2d")
            assert ours["offset_bytes"].notna().all()
        xla_buffers = store.buffers(runs["hlo"], algorithm="xla")
        assert xla_buffers["offset_bytes"].notna().any()


def test_plan_buffers_rejects_unknown_algorithm():
    with pytest.raises(ValueError, match="algorithms"):
        plan_buffers([], algorithms=["nope"])
    with pytest.raises(ValueError, match="sources"):
        plan_model("lenet5", 1, sources=("bytecode",))


def test_cli_plan(capsys, tmp_path):
    db = tmp_path / "cli.sqlite"
    assert cli_main(["plan", "lenet5", "--batch", "2", "--dtype", "fp32", "--source", "jaxpr",
                     "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "source=jaxpr" in out and "| pack_2d |" in out and "XLA temp" in out
    assert "recorded in" in out
    with Store(db) as store:
        assert len(store.runs()) == 1
    assert cli_main(["plan", "not_a_model"]) == 2


def test_plan_zoo_script(tmp_path):
    spec = importlib.util.spec_from_file_location("plan_zoo", ROOT / "scripts" / "plan_zoo.py")
    plan_zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plan_zoo)
    rc = plan_zoo.main(["--out", str(tmp_path), "--label", "t", "--models", "lenet5",
                        "--batches", "1", "--modes", "inference", "--db", str(tmp_path / "z.sqlite")])
    assert rc == 0
    data = json.loads((tmp_path / "t-planner_zoo.json").read_text())
    assert [r["source"] for r in data["rows"]] == ["jaxpr", "hlo"] and not data["failures"]
    md = (tmp_path / "t-planner_zoo.md").read_text()
    assert "| lenet5 | inference | 1 |" in md
    with Store(tmp_path / "z.sqlite") as store:
        assert len(store.runs()) == 2
