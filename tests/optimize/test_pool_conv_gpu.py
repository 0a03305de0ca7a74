"""On a GPU, policy="auto" measures an InceptionV3 pool branch (3x3 average pool, count without
the padding, then a 1x1 conv with BatchNorm and ReLU) in both orders and keeps the faster; the
program gives the float64 reference's values. Run: pytest -m gpu tests/optimize/test_pool_conv_gpu.py"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcnn
from jaxcnn.optimize.pool_conv import COMMUTED, POOL_CONV
from jaxcnn.tuning.decision import BASELINE
from reference64 import rel_err
from pool_branch import block, keras_avg

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("shape, k", [((16, 17, 17, 768), 192), ((16, 35, 35, 288), 64), ((8, 8, 8, 2048), 192)])
def test_pool_branch_is_measured_and_matches_the_reference(shape, k, monkeypatch, tmp_path):
    monkeypatch.setenv("JAXCNN_MEASURE", "1")
    monkeypatch.setenv("JAXCNN_AUTOTUNE_CACHE", str(tmp_path / "autotune.json"))
    rng = np.random.default_rng(sum(shape) + k)
    c = shape[-1]
    x = jnp.asarray(rng.normal(size=shape), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(1, 1, c, k)) / np.sqrt(c), jnp.bfloat16)
    vecs = [jnp.asarray(rng.uniform(0.5, 1.5, k), jnp.float32) for _ in range(4)]
    fn = block(keras_avg)
    opt = jaxcnn.optimize(fn)
    (r,) = [r for r in opt.rewrites(x, w, *vecs) if r.op == POOL_CONV] or [None]
    text = opt.explain(x, w, *vecs)
    assert "reduce_window_sum + div + conv_general_dilated" in text and "(measured:" in text
    if r is not None:  # commuted: measured faster than the traced order beyond MIN_GAIN
        times = {name: float(t) for name, t in
                 (part.strip("*").rsplit(" ", 2)[:2] for part in r.why.split("[")[1].rstrip("]").split(", "))}
        assert times[COMMUTED] < times[BASELINE]
    out = opt.rewritten(x, w, *vecs)(x, w, *vecs)
    with jax.default_device(jax.devices("cpu")[0]):  # the float32 traced order on the CPU
        want = np.asarray(jax.jit(fn)(*(jnp.asarray(np.asarray(a, np.float32)) for a in (x, w, *vecs))), np.float64)
    got = np.asarray(jax.block_until_ready(out), np.float64)
    assert np.all(np.isfinite(got))
    # bf16: the conv's output and the pool's are each rounded once (2^-8), the BatchNorm scale <= 2
    assert rel_err(got, want) < 4 * 2.0 ** -8
