"""The conv epilogue every conv kernel family applies after its fp32 accumulation:

    y = activation(acc + bias[k] + residual[n, p, q, k])        (fp32, one rounding to x.dtype)

bias and residual are optional. The activation names, their codes (shared with
cuda_ops/common/epilogue.cuh's `Activation`, checked by tests/ops/test_epilogue_codes.py) and their
reference math live here, so the reference lowering, the gradients, the rewriter's pattern
matcher and the FFI attributes all read one table.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxcnn._native.codes import ACTIVATION_CODES  # name -> the kernels' `activation` attribute

ACTIVATIONS = tuple(ACTIVATION_CODES)
# leaky_relu's negative slope when none is given (jax.nn.leaky_relu's default).
DEFAULT_LEAKY_ALPHA = 0.01

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def check_activation(activation, alpha) -> float:
    """Validates `activation` / `alpha` (a conv's keyword arguments) and returns alpha as a float
    (0.0 where the activation takes none)."""
    if activation not in ACTIVATION_CODES:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if alpha is None:
        return DEFAULT_LEAKY_ALPHA if activation == "leaky_relu" else 0.0
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"alpha must be a float, got {alpha!r}")
    if activation != "leaky_relu":
        raise ValueError(f"alpha is leaky_relu's slope; activation={activation!r} takes none")
    if not math.isfinite(alpha):
        raise ValueError(f"alpha must be finite, got {alpha!r}")
    return float(alpha)


def apply_activation(y, activation, alpha: float = 0.0):
    """The activation in y's dtype, with jax.nn's definitions: NaN propagates as jnp.maximum, and
    ReLU-like kinks take jax.nn's one-sided gradient (relu: 0 at 0; relu6: 0 at 0 and 6)."""
    if activation is None:
        return y
    if activation == "relu":
        return jax.nn.relu(y)
    if activation == "relu6":
        return jax.nn.relu6(y)
    if activation == "silu":
        return y * jax.nn.sigmoid(y)
    if activation == "hard_swish":
        return y * (jax.nn.relu6(y + 3) / 6)
    if activation == "gelu_tanh":
        return 0.5 * y * (1 + jnp.tanh(_SQRT_2_OVER_PI * (y + 0.044715 * (y * y * y))))
    if activation == "gelu_erf":
        return 0.5 * y * (1 + jax.lax.erf(y * (1 / math.sqrt(2.0))))
    if activation == "sigmoid":
        return jax.nn.sigmoid(y)
    if activation == "leaky_relu":
        return jnp.where(y >= 0, y, alpha * y)
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def activation_grad(pre, g, activation, alpha: float = 0.0):
    """g times d activation(pre) / d pre, in fp32, from the pre-activation value `pre`."""
    if activation is None:
        return g.astype(jnp.float32)
    _, vjp = jax.vjp(lambda v: apply_activation(v, activation, alpha), pre.astype(jnp.float32))
    return vjp(g.astype(jnp.float32))[0]


def epilogue_reference(acc, bias, residual, activation, alpha: float, channel_axis: int):
    """The epilogue on an fp32 accumulator `acc` (bias [K] along channel_axis, residual of acc's
    shape, both optional), in fp32."""
    y = acc
    if bias is not None:
        y = y + jnp.expand_dims(bias.astype(jnp.float32), tuple(range(channel_axis + 1 - acc.ndim, 0)))
    if residual is not None:
        y = y + residual.astype(jnp.float32)
    return apply_activation(y, activation, alpha)
