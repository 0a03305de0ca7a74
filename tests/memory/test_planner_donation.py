"""Donation planning: what plan_donation / jaxcnn.jit donate, that XLA aliases all of it (the
CPU backend of jax 0.10 implements donation: alias_size_in_bytes, deleted inputs), and that jax's
"Some donated buffers were not usable" warning never fires."""

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxcnn
from jaxcnn.models import get_model
from jaxcnn.memory import measure_donation, plan_donation
from jaxcnn.memory.footprint import memory_stats
from jaxcnn.memory.training import adam, sgd_momentum, train_step, training_args

NOT_USABLE = "Some donated buffers were not usable"


@pytest.mark.parametrize("optimizer", [sgd_momentum(), adam()], ids=lambda o: o.name)
def test_training_step_donates_params_and_optimizer_state(optimizer):
    step = train_step("lenet5", optimizer)
    args = training_args("lenet5", 4, "float32", optimizer)
    plan = plan_donation(step, *args)
    assert plan.donate_argnums == (0, 1)
    kept = {d.label: d.reason for d in plan.decisions if not d.donated}
    assert set(kept) == {"arg 2 (images)", "arg 3 (labels)"}
    assert all("does not reappear" in reason for reason in kept.values())
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(args[:2]))
    assert plan.donated_bytes == state_bytes

    savings = measure_donation(step, *args)
    assert savings.before["alias_size_in_bytes"] == 0
    assert savings.alias_bytes == state_bytes  # every donated byte is aliased
    assert savings.peak_after < savings.peak_before
    assert "donate arg 0 (params)" in savings.explain()


def test_donating_jit_runs_deletes_donated_buffers_and_matches_jax_jit():
    optimizer = adam()
    spec = get_model("lenet5")
    step = train_step(spec, optimizer)
    params = spec.init(0)
    state = optimizer.init(params)
    images = jax.random.normal(jax.random.PRNGKey(1), (4, 32, 32, 1))
    labels = jnp.arange(4, dtype=jnp.int32)
    expected = jax.jit(step)(params, state, images, labels)

    copies = jax.tree.map(jnp.copy, (params, state))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=NOT_USABLE)
        got = jaxcnn.jit(step)(*copies, images, labels)
    assert all(x.is_deleted() for x in jax.tree.leaves(copies))
    assert not images.is_deleted() and not labels.is_deleted()
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_jit_plans_once_per_signature_and_lowers_with_aliases():
    calls = []

    def update(state, x):
        calls.append(1)
        return jax.tree.map(lambda s: s + x.sum(), state), x.mean()

    fn = jaxcnn.jit(update)
    state = {"a": jnp.zeros((8, 8)), "b": jnp.zeros((3,))}
    x = jnp.ones((5,))
    assert fn.plan(state, x).donate_argnums == (0,)
    stats = memory_stats(fn.lower(state, x).compile())
    assert stats["alias_size_in_bytes"] == (64 + 3) * 4
    traced = len(calls)
    state = fn(state, x)[0]
    state = fn(state, x)[0]
    assert len(calls) == traced  # planned and traced once for this signature
    np.testing.assert_allclose(np.asarray(state["b"]), 10.0)


def test_only_declared_consumable_arguments_are_donated():
    def f(a, b):
        return a * 2, b * 2

    a, b = jax.ShapeDtypeStruct((4,), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.float32)
    assert plan_donation(f, a, b).donate_argnums == (0, 1)
    plan = plan_donation(f, a, b, consumable=["b"])
    assert plan.donate_argnums == (1,)
    assert "not declared consumable" in plan.decisions[0].reason
    assert plan_donation(f, a, b, consumable=()).donate_argnums == ()


def test_consumable_matches_leaf_by_leaf_across_structures():
    # The output is a flat tuple, the argument a dict: no structural match, but declared
    # consumable its leaves pair with outputs.
    def f(state):
        return state["w"] + 1, state["v"] * 2

    state = {"w": jax.ShapeDtypeStruct((3, 3), jnp.float32), "v": jax.ShapeDtypeStruct((2,), jnp.int32)}
    assert plan_donation(f, state).donate_argnums == ()
    assert plan_donation(f, state, consumable=0).donate_argnums == (0,)


def test_conflict_keeps_the_larger_argument():
    # Outputs f32[10] and f32[5]: A = f32[10] and B = (f32[10], f32[5]) cannot both go.
    def f(a, b):
        return a + b[0], b[1] * 2

    a = jax.ShapeDtypeStruct((10,), jnp.float32)
    b = (jax.ShapeDtypeStruct((10,), jnp.float32), jax.ShapeDtypeStruct((5,), jnp.float32))
    plan = plan_donation(f, a, b, consumable=(0, 1))
    assert plan.donate_argnums == (1,)
    assert "taken by larger donated arguments" in plan.decisions[0].reason


def test_unused_scalar_and_short_arguments_are_kept_with_reasons():
    def f(used, unused, scale, big):
        return used * scale, jnp.zeros((2,)) + sum(b.sum() for b in big), jnp.zeros((4,))

    used = jnp.ones((2,))
    unused = jnp.ones((4,))
    big = (jnp.ones((2,)), jnp.ones((2,)), jnp.ones((2,)))
    plan = plan_donation(f, used, unused, 3.0, big, consumable=(0, 1, 2, 3))
    reasons = {d.argnum: d.reason for d in plan.decisions}
    assert plan.donate_argnums == (0,)
    assert "never reads it" in reasons[1]
    assert "float leaf" in reasons[2]
    assert "3 leaves float32[2] but only 2 outputs" in reasons[3]


def test_static_and_keyword_arguments():
    def f(x, n, *, state):
        return jax.tree.map(lambda s: s * n, state), x.sum()

    x = jnp.ones((3,))
    state = {"w": jnp.ones((4, 4))}
    plan = plan_donation(f, x, 2, static_argnums=1, state=state)
    assert plan.donate_argnums == () and plan.donate_argnames == ("state",)
    fn = jaxcnn.jit(f, static_argnums=1)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=NOT_USABLE)
        out, total = fn(x, 3, state=state)
    assert state["w"].is_deleted()
    np.testing.assert_allclose(np.asarray(out["w"]), 3.0)
    assert float(total) == 3.0


def test_same_buffer_twice_runs_without_donation():
    fn = jaxcnn.jit(lambda a, b: (a + b, a - b))
    a = jnp.arange(3.0)
    assert fn.plan(a, a).donate_argnums == (0, 1)
    total, diff = fn(a, a)  # XLA would refuse to donate one buffer twice
    assert not a.is_deleted()
    np.testing.assert_allclose(np.asarray(total), [0.0, 2.0, 4.0])
    np.testing.assert_allclose(np.asarray(diff), 0.0)


def test_decorator_form_and_donate_none():
    @jaxcnn.jit(consumable=(0,))
    def inc(x):
        return x + 1

    x = jnp.zeros((2,))
    assert float(inc(x)[0]) == 1.0 and x.is_deleted()
    plain = jaxcnn.jit(lambda x: x + 1, donate="none")
    y = jnp.zeros((2,))
    plain(y)
    assert not y.is_deleted()


def test_bad_arguments():
    with pytest.raises(ValueError, match="donate"):
        jaxcnn.jit(lambda x: x, donate="all")
    with pytest.raises(TypeError, match="donate_argnums"):
        jaxcnn.jit(lambda x: x, donate_argnums=0)
    with pytest.raises(TypeError, match="consumable"):
        jaxcnn.jit(lambda x: x, consumable=1.5)
    with pytest.raises(ValueError, match="consumable"):
        plan_donation(lambda x: x, jnp.ones(2), consumable=3)
    with pytest.raises(ValueError, match="consumable"):
        plan_donation(lambda x: x, jnp.ones(2), consumable="y")
    with pytest.raises(TypeError, match="fn"):
        plan_donation(3, jnp.ones(2))


SHAPES = [(2,), (3,), (2, 2)]
DTYPES = [jnp.float32, jnp.int32]


def _leaf_spec():
    return st.tuples(st.sampled_from(SHAPES), st.sampled_from(DTYPES))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arg_specs=st.lists(st.lists(_leaf_spec(), min_size=1, max_size=3), min_size=1, max_size=4),
    out_specs=st.lists(_leaf_spec(), min_size=1, max_size=5),
    unused=st.sets(st.integers(0, 3), max_size=2),
)
def test_random_functions_never_warn_and_alias_the_best_set(arg_specs, out_specs, unused):
    def f(*args):
        total = sum((jnp.sum(leaf).astype(jnp.float32) for i, arg in enumerate(args) if i not in unused
                     for leaf in arg), jnp.float32(0))
        return [jnp.full(shape, total).astype(dtype) for shape, dtype in out_specs]

    args = [tuple(jnp.ones(shape, dtype) for shape, dtype in arg) for arg in arg_specs]
    consumable = tuple(range(len(args)))
    plan = plan_donation(f, *args, consumable=consumable)

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=NOT_USABLE)
        compiled = jax.jit(f, donate_argnums=plan.donate_argnums).lower(*args).compile()
        jaxcnn.jit(f, consumable=consumable)(*args)
    assert memory_stats(compiled).get("alias_size_in_bytes", 0) == plan.donated_bytes
    for i in plan.donate_argnums:
        assert all(leaf.is_deleted() for leaf in args[i])

    # Brute force: the most bytes any warning-free set of used arguments could alias.
    capacity = {}
    for spec in out_specs:
        key = (spec[0], jnp.dtype(spec[1]))
        capacity[key] = capacity.get(key, 0) + 1
    sizes = [sum(int(np.prod(s)) * 4 for s, _ in arg) for arg in arg_specs]
    usable = [i for i in range(len(args)) if i not in unused]
    best = 0
    for r in range(len(usable) + 1):
        for subset in itertools.combinations(usable, r):
            counts = {}
            for i in subset:
                for s, d in arg_specs[i]:
                    counts[(s, jnp.dtype(d))] = counts.get((s, jnp.dtype(d)), 0) + 1
            if all(n <= capacity.get(k, 0) for k, n in counts.items()):
                best = max(best, sum(sizes[i] for i in subset))
    assert plan.donated_bytes == best


def test_donation_results_go_to_the_store(tmp_path):
    from jaxcnn.memory.records import record_donation
    from jaxcnn.store import Store

    optimizer = sgd_momentum()
    savings = measure_donation(train_step("lenet5", optimizer), *training_args("lenet5", 2, "float32", optimizer))
    with Store(tmp_path / "s.sqlite") as store:
        run_id = record_donation(store, savings, model="lenet5", batch=2, dtype="float32")
        rows = store.measurements(run_id)
        run = store.runs().iloc[0]
    by = {(r.metric, r.variant): r.median for r in rows.itertuples()}
    assert by[("alias_bytes", "donated")] == savings.alias_bytes > 0
    assert by[("alias_bytes", "undonated")] == 0
    assert by[("peak_bytes", "undonated")] - by[("peak_bytes", "donated")] == by[("saved_bytes", "donated")]
    assert run["note"] == "donation" and run["extra"]["donate_argnums"] == [0, 1]
