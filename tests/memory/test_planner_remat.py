"""Rematerialization advice: the policies compute the same step, save fewer residuals, and the
advice picks the cheapest candidate whose compiled (CPU) footprint fits the budget."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcnn.models import get_model
from jaxcnn.memory import candidate_policies, remat_advice
from jaxcnn.memory.remat import RematPolicy, _residual_bytes, remat_forward


def test_candidates_follow_the_model_structure():
    lenet = [p.name for p in candidate_policies("lenet5")]
    assert lenet == ["none", "layers_save_convs", "layers", "every_2", "every_4", "nothing"]
    squeeze = [p.name for p in candidate_policies("squeezenet1_1")]
    assert "blocks" in squeeze
    every_2 = next(p for p in candidate_policies("lenet5") if p.name == "every_2")
    assert every_2.save_names == ("pool1", "pool2", "fc2")


@pytest.mark.slow
@pytest.mark.parametrize("model,policies", [("lenet5", None), ("squeezenet1_1", ("blocks", "every_4"))])
def test_policies_compute_the_same_logits_and_gradients(model, policies):
    spec = get_model(model)
    # SqueezeNet on 64x64 images keeps the test quick; the layers are the same.
    spec_small = spec if model == "lenet5" else dataclasses.replace(spec, image_size=64)
    params = spec_small.init(0)
    images = jax.random.normal(jax.random.PRNGKey(1), spec_small.input_shape(2))

    def loss(forward):
        return lambda p: jnp.sum(jnp.sin(forward(p, images)))

    plain = remat_forward(spec_small, RematPolicy("none", "none", None, ""))
    ref_value, ref_grads = jax.jit(jax.value_and_grad(loss(plain)))(params)
    for policy in candidate_policies(spec_small):
        if policies is not None and policy.name not in policies:
            continue
        value, grads = jax.jit(jax.value_and_grad(loss(remat_forward(spec_small, policy))))(params)
        np.testing.assert_allclose(value, ref_value, rtol=1e-5, err_msg=policy.name)
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=policy.name)


def test_policies_save_fewer_residuals():
    spec = get_model("squeezenet1_1")
    params = spec.abstract_params()
    images = jax.ShapeDtypeStruct(spec.input_shape(2), jnp.float32)
    residuals = {p.name: _residual_bytes(remat_forward(spec, p), params, images)
                 for p in candidate_policies(spec)}
    for name in ("blocks", "layers", "every_2", "every_4", "nothing"):
        assert residuals[name] < residuals["none"], name
    assert residuals["nothing"] <= min(residuals.values())
    assert residuals["every_4"] < residuals["every_2"]


def test_recompute_flops_order():
    layers = get_model("squeezenet1_1").layers(1)
    flops = {p.name: p.recompute_flops(layers) for p in candidate_policies("squeezenet1_1")}
    assert flops["none"] == 0
    assert 0 < flops["layers_save_convs"] < flops["blocks"] < flops["layers"]
    assert flops["layers"] == sum(l.flops for l in layers)


@pytest.mark.slow
def test_advice_picks_the_cheapest_fitting_policy():
    plain = remat_advice("lenet5", "1GiB", batch=64)
    assert plain.chosen == "none"
    assert [r.measured is not None for r in plain.rows] == [True] + [False] * (len(plain.rows) - 1)
    full = plain.row("none").measured

    # A budget just under the plain footprint: something recomputes, or nothing fits.
    advice = remat_advice("lenet5", full - 1, batch=64, measure_all=True)
    measured = {r.policy: r.measured for r in advice.rows}
    assert all(m is not None for m in measured.values())
    fitting = [r for r in advice.rows if r.measured <= advice.budget_bytes]
    assert fitting, advice.explain()  # on CPU, per-layer checkpoints of LeNet save memory
    cheapest = min(fitting, key=lambda r: r.recompute_flops)
    assert advice.chosen == fitting[0].policy
    assert advice.row(advice.chosen).recompute_flops == cheapest.recompute_flops
    assert advice.row("none").fits is False
    assert "<- chosen" in advice.explain()

    hopeless = remat_advice("lenet5", 1000, batch=64)
    assert hopeless.chosen is None and all(r.fits is False for r in hopeless.rows)


def test_bad_arguments():
    with pytest.raises(ValueError, match="batch"):
        remat_advice("lenet5", "1GiB", batch=0)
    with pytest.raises(ValueError, match="policies"):
        remat_advice("lenet5", "1GiB", batch=1, policies=[])
    with pytest.raises(ValueError, match="unknown model"):
        remat_advice("lenet6", "1GiB", batch=1)


def test_remat_results_go_to_the_store(tmp_path):
    from jaxcnn.memory.records import record_remat
    from jaxcnn.memory.remat import RematAdvice, RematRow
    from jaxcnn.store import Store

    rows = (RematRow("none", "no checkpointing", 0, 300, 1000, 1000, 1000, False),
            RematRow("layers", "per-layer", 50, 100, 900, 800, 850, True),
            RematRow("nothing", "whole", 60, 10, 1000, 700, None, None))
    advice = RematAdvice("lenet5", 8, 900, rows, "layers")
    with Store(tmp_path / "s.sqlite") as store:
        run_id = record_remat(store, advice, dtype="float32")
        got = store.measurements(run_id)
        run = store.runs().iloc[0]
    by = {(r.metric, r.variant): r.median for r in got.itertuples()}
    assert by[("peak_bytes", "layers")] == 850 and ("peak_bytes", "nothing") not in by
    assert by[("predicted_peak_bytes", "nothing")] == 1000
    assert by[("predicted_residual_peak_bytes", "layers")] == 800
    assert by[("recompute_flops", "layers")] == 50
    assert run["extra"]["chosen"] == "layers" and run["batch"] == 8
