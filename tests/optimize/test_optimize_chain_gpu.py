"""GPU suite for optimize's expand -> depthwise chains (`pytest -m gpu`): the fused kernel runs
in the optimized program (one custom call per chain, forced with fuse="all") and the program
computes what XLA computes for the same blocks, for ReLU6 and SiLU, with Keras' stride-2 pad."""

import jax
import numpy as np
import pytest

import jaxcnn
from test_optimize_chain import TARGET, setup, two_blocks

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("act", [jax.nn.relu6, jax.nn.silu])
def test_fused_chains_match_xla(act):
    params, x = setup()
    fn = lambda p, x: two_blocks(p, x, act)  # noqa: E731
    opt = jaxcnn.optimize(fn, fuse="all")
    compiled = jax.jit(opt).lower(params, x).compile().as_text()
    assert compiled.count(f'custom_call_target="{TARGET}"') == 2
    want = np.asarray(jax.jit(fn)(params, x), np.float32)
    got = np.asarray(jax.jit(opt)(params, x), np.float32)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=0.05 * np.max(np.abs(want)))
