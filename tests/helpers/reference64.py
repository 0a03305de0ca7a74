"""An independent float64 oracle for conv2d (lax on upcast inputs, string padding kept as is)."""

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax


def conv2d_f64(x, w, bias=None, *, stride=1, padding="SAME", dilation=1, groups=1, activation=None):
    """numpy float64 result of the same convolution, computed by XLA on the CPU."""
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    if isinstance(padding, int):
        padding = ((padding, padding), (padding, padding))
    elif not isinstance(padding, str) and isinstance(padding[0], int):
        padding = ((padding[0], padding[0]), (padding[1], padding[1]))
    with jax.enable_x64(True):
        cpu = jax.devices("cpu")[0]
        x64 = jax.device_put(np.asarray(x, np.float64), cpu)
        w64 = jax.device_put(np.asarray(w, np.float64), cpu)
        y = lax.conv_general_dilated(
            x64, w64, pair(stride), padding, rhs_dilation=pair(dilation),
            dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups,
            precision=lax.Precision.HIGHEST,
        )
        if bias is not None:
            y = y + jnp.asarray(np.asarray(bias, np.float64))
        if activation == "relu":
            y = jnp.maximum(y, 0.0)
        return np.asarray(y)


def rel_err(out, ref) -> float:
    """max |out - ref| / max |ref|; NaN anywhere in out gives inf so it never passes."""
    out = np.asarray(out, np.float64)
    if not np.all(np.isfinite(out)) and np.all(np.isfinite(ref)):
        return float("inf")
    scale = max(float(np.max(np.abs(ref))), 1e-30)
    return float(np.max(np.abs(out - ref))) / scale


TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}
# fp32 at precision "default" (TF32 tensor cores keep 10 mantissa bits: rel err ~1e-3 on
# unit-scale data).
TF32_TOLERANCE = 5e-3
# The same bounds as assert_allclose's rtol and atol, for outputs of O(1) values.
ALLCLOSE_TOL = {dtype: dict(rtol=tol, atol=tol) for dtype, tol in TOLERANCE.items()}
