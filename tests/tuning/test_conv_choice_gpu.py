"""conv2d(algorithm="auto") on the GPU: the decision owner measures XLA's conv and each jaxcnn
family that takes the conv, keeps XLA unless a family beats it, and auto's result (from the
cached decision) matches float64 (run with `pytest -m gpu`)."""

import jax
import jax.numpy as jnp
import pytest

import jaxcnn
from jaxcnn.ops.conv2d.config import make_config
from jaxcnn.tuning import conv_choice as C
from jaxcnn.tuning import decision as D
from arrays import random_operands
from reference64 import TF32_TOLERANCE, TOLERANCE, conv2d_f64, rel_err

pytestmark = pytest.mark.gpu

# Shapes of issue 33's table (where "auto" once ran a kernel many times slower than XLA) and
# one of each family.
CASES = [
    ((2, 9, 31, 300), (5, 5, 300, 17), dict(padding=2, dilation=2), "bfloat16", None),
    ((8, 56, 56, 3), (7, 7, 3, 64), dict(stride=2, padding=3), "float32", None),
    ((8, 28, 28, 16), (5, 5, 16, 32), dict(padding=2), "float32", "highest"),
    ((8, 28, 28, 96), (3, 3, 96, 128), dict(activation="relu"), "bfloat16", None),
    ((4, 30, 30, 64), (3, 3, 1, 64), dict(groups=64, activation="relu"), "bfloat16", None),
    ((2, 17, 15, 24), (3, 3, 6, 20), dict(groups=4, stride=2), "float16", None),
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "autotune.json"
    monkeypatch.setenv("JAXCNN_AUTOTUNE_CACHE", str(path))
    return path


@pytest.mark.parametrize("x_shape, w_shape, kw, dtype, precision", CASES)
def test_auto_never_keeps_a_slower_kernel(cache, x_shape, w_shape, kw, dtype, precision):
    x, w, b = random_operands(31, x_shape, w_shape, dtype)
    cfg = make_config(x_shape, w_shape, precision=precision, **kw)
    d = C.decide_conv(x, w, b, None, cfg, measure=True)
    assert d.source == "measured", d.explain()
    base = d.times_ms[D.BASELINE]
    assert base is not None and base > 0, d.explain()
    if d.choice != D.BASELINE:
        assert d.times_ms[d.choice] < base * (1 - D.MIN_GAIN), d.explain()
    ran = {n for n, t in d.times_ms.items() if t is not None}
    assert ran - {D.BASELINE}, f"no jaxcnn family ran: {d.explain()}"

    out = jax.jit(lambda *a: jaxcnn.conv2d(*a, precision=precision, **kw))(x, w, b)
    assert C.decide_conv(x, w, b, None, cfg).source == "cached"
    tol = TF32_TOLERANCE if (dtype == "float32" and precision is None) else TOLERANCE[dtype]
    err = rel_err(out, conv2d_f64(x, w, b, **kw))
    assert bool(jnp.all(jnp.isfinite(out))) and err <= tol, f"rel err {err:.2e} > {tol:.0e}; {d.explain()}"
