"""jaxcnn.layouts on a GPU: autotune_conv measures every candidate that runs and XLA's conv,
picks the fastest and writes the cache; a measured chain plan runs (pytest -m gpu)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcnn.layouts as L
from jaxcnn.models import get_model

pytestmark = pytest.mark.gpu

LAYERS = [
    # (x NHWC, w HWIO, dtype, conv kwargs)
    ((8, 56, 56, 64), (3, 3, 64, 128), "bfloat16", dict(padding="SAME", activation="relu")),
    ((32, 112, 112, 3), (3, 3, 3, 32), "float32", dict(stride=2, padding=1)),       # stem, C=3
    ((32, 56, 56, 96), (3, 3, 1, 96), "bfloat16", dict(groups=96, padding=1)),       # depthwise
]


@pytest.mark.parametrize("x_shape,w_shape,dtype,kw", LAYERS)
def test_autotune_conv_measures_and_caches(tmp_path, x_shape, w_shape, dtype, kw):
    cache = L.AutotuneCache(tmp_path / "autotune.json")
    choice = L.autotune_conv(x_shape, w_shape, dtype, cache=cache, iters=10, warmup=2, measure=True, **kw)
    assert choice.source == "measured" and not choice.cached
    assert choice.device == jax.devices()[0].device_kind
    ran = [c for c in choice.candidates if c.ok]
    assert ran, choice.explain()
    for c in choice.candidates:
        # Every candidate either has a device time or the reason it cannot run.
        assert (c.ok and c.time_ms > 0 and c.source == "measured" and c.kernels) or (
            not c.ok and "cannot run" in c.error), c
    assert choice.time_ms == min(c.time_ms for c in ran)
    assert choice.xla_ms is not None and choice.xla_ms > 0 and choice.xla_ratio > 0
    assert set(choice.transforms) == {"NCHW", "CHWN"}
    assert all(t["in_ms"] > 0 and t["out_ms"] > 0 for t in choice.transforms.values())
    if w_shape[2] == 1:
        assert any(c.algorithm == "depthwise" for c in ran)
    text = choice.explain()
    assert "measured" in text and "winner" in text and "XLA" in text

    data = json.loads(cache.path.read_text())
    ops = [json.loads(k)["op"] for k in data["entries"]]
    assert ops.count("conv2d") == 1 and ops.count("to_layout") == 4
    again = L.autotune_conv(x_shape, w_shape, dtype, cache=cache, iters=10, warmup=2, measure=True, **kw)
    assert again.cached and again.time_ms == choice.time_ms


def test_measured_plan_runs_and_matches_xla(tmp_path):
    cache = tmp_path / "autotune.json"
    plan = L.plan_model_layouts("squeezenet1_1", batch=4, dtype="float32", costs="measured",
                                cache=cache, iters=5, warmup=1)
    assert plan.source == "measured" and plan.total_ms <= plan.all_nhwc_ms + 1e-9
    spec = get_model("squeezenet1_1")
    params = spec.init(0, jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(0), spec.input_shape(4), jnp.float32)
    got = jax.jit(lambda p, x: L.apply_plan(plan, p, x))(params, x)
    with jax.default_matmul_precision("highest"):
        want = jax.jit(lambda p, x: spec.apply(p, x, backend="xla"))(params, x)
    # TF32 tensor cores where the plan picked them: loose tolerance on the logits.
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=3e-2, atol=3e-2)
