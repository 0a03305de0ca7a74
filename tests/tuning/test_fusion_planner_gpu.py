"""GPU suite for jaxcnn.fusion (`pytest -m gpu`): the planner measures fused vs unfused on the
device (real profiler device times, cached per GPU), and the planned SqueezeNet/GoogLeNet/
MobileNetV2 run end to end on the CUDA kernels and match XLA's model."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcnn import fusion, layouts as L
from jaxcnn.models import get_model

# The block kinds these tests are about (conv_pool groups have their own tests).
BLOCKS = ("fire", "inception")

pytestmark = pytest.mark.gpu

# Logits vs XLA's model relative to their scale (bf16 activations through the whole net).
TOL = {"float32": 2e-2, "bfloat16": 1e-1}


def forced_fused(plan):
    """The plan with every group fused, whatever was measured."""
    return dataclasses.replace(plan, decisions=tuple(
        dataclasses.replace(d, choice="fused", reason="forced") for d in plan.decisions))


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.parametrize("model,batch", [("squeezenet1_1", 1), ("squeezenet1_0", 4)])
def test_measured_plan_runs_and_matches_xla(model, batch, tmp_path):
    cache = L.AutotuneCache(tmp_path / "autotune.json")
    plan = fusion.plan_fusion(model, batch, "bfloat16", costs="measured", cache=cache, iters=5, warmup=1, kinds=BLOCKS)
    assert plan.source == "measured" and plan.device == jax.devices()[0].device_kind
    for d in plan.decisions:
        assert d.source == "measured" and d.choice in fusion.CANDIDATES
        assert all(c.source == "measured" and c.ok for c in d.candidates), d.candidates
        best = min(c.time_ms for c in d.candidates)
        assert d.time(d.choice) == best
    assert "measured" in plan.explain() and "fire9" in plan.explain()
    keys = [json.loads(k) for k in cache.load()]
    assert sum(k["op"] == "fusion_group" for k in keys) == len({json.dumps(d.group.cache_fields(), sort_keys=True)
                                                                 for d in plan.decisions})
    again = fusion.plan_fusion(model, batch, "bfloat16", costs="measured", cache=cache, kinds=BLOCKS)
    assert all("(cache)" in d.reason for d in again.decisions)

    spec = get_model(model)
    params = spec.init(0, jnp.bfloat16)
    x = jax.random.normal(jax.random.PRNGKey(1), spec.input_shape(batch)).astype(jnp.bfloat16)
    want = jax.jit(lambda p, x: spec.apply(p, x, backend="xla"))(params, x)
    fused_all = forced_fused(plan)
    for p in (plan, fused_all):
        fn = jax.jit(p.apply)
        hlo = fn.lower(params, x).compile().as_text()
        assert hlo.count('custom_call_target="jaxcnn_fire_fwd"') == len(p.fused_groups)
        assert rel(jnp.asarray(fn(params, x), jnp.float32), jnp.asarray(want, jnp.float32)) <= TOL["bfloat16"]


def test_googlenet_inception_groups_measured_and_applied(tmp_path):
    plan = fusion.plan_fusion("googlenet", 2, "bfloat16", costs="measured",
                              cache=tmp_path / "c.json", iters=5, warmup=1, kinds=BLOCKS)
    assert len(plan.decisions) == 9 and all(d.source == "measured" for d in plan.decisions)
    spec = get_model("googlenet")
    params = spec.init(0, jnp.bfloat16)
    x = jax.random.normal(jax.random.PRNGKey(2), spec.input_shape(2)).astype(jnp.bfloat16)
    forced = forced_fused(plan)
    got = jax.jit(forced.apply)(params, x)
    want = jax.jit(lambda p, x: spec.apply(p, x, backend="xla"))(params, x)
    assert rel(jnp.asarray(got, jnp.float32), jnp.asarray(want, jnp.float32)) <= TOL["bfloat16"]


def test_mobilenetv2_expand_depthwise_measured_and_applied(tmp_path):
    plan = fusion.plan_fusion("mobilenetv2", 2, "bfloat16", costs="measured", cache=tmp_path / "c.json",
                              iters=5, warmup=1, kinds=("expand_depthwise",))
    assert len(plan.decisions) == 16 and all(d.source == "measured" for d in plan.decisions)
    spec = get_model("mobilenetv2")
    params = spec.init(0, jnp.bfloat16)
    x = jax.random.normal(jax.random.PRNGKey(2), spec.input_shape(2)).astype(jnp.bfloat16)
    fn = jax.jit(forced_fused(plan).apply)
    hlo = fn.lower(params, x).compile().as_text()
    assert hlo.count('custom_call_target="jaxcnn_conv1x1_depthwise_fwd"') == 16
    want = jax.jit(lambda p, x: spec.apply(p, x, backend="xla"))(params, x)
    assert rel(jnp.asarray(fn(params, x), jnp.float32), jnp.asarray(want, jnp.float32)) <= TOL["bfloat16"]


def test_group_candidates_time_real_kernels():
    (g, *_), _ = fusion.find_groups("squeezenet1_1", 64, "bfloat16", kinds=BLOCKS)
    params, x = fusion.group_params(g)
    hlo = {v: jax.jit(fusion.group_fn(g, v)).lower(params, x).compile().as_text() for v in fusion.CANDIDATES}
    target = 'custom_call_target="{}"'.format
    assert hlo["fused"].count(target("jaxcnn_fire_fwd")) == 1 and target("jaxcnn_conv2d_fwd") not in hlo["fused"]
    assert hlo["jaxcnn"].count(target("jaxcnn_conv2d_fwd")) == 3 and target("jaxcnn_fire_fwd") not in hlo["jaxcnn"]
    assert 'custom_call_target="jaxcnn_' not in hlo["xla"]
