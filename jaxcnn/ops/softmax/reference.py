"""Pure-lax reference of softmax: the CPU lowering, the fallback, the tests' oracle and the
backward pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def softmax_reference(x, *, log: bool):
    """jax.nn.(log_)softmax over the last axis in fp32, rounded once to x's dtype."""
    xf = x.astype(jnp.float32)
    y = jax.nn.log_softmax(xf, axis=-1) if log else jax.nn.softmax(xf, axis=-1)
    return y.astype(x.dtype)
