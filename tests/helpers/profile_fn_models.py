"""Small functions built the way `jaxcnn profile --fn MODULE:CALLABLE` wants them: a callable
returning (fn, example_args), taking batch= (and dtype=) keywords, and some that break the contract
(tests/profile/test_profiler_cli.py). A Flax CNN is in profile_fn_flax.py (Flax is an optional extra)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def lax_nchw_cnn(batch: int = 2):
    """Two raw lax convolutions on NCHW activations with OIHW weights (no framework)."""
    w1 = jax.random.normal(jax.random.key(2), (8, 3, 3, 3)) * 0.2
    w2 = jax.random.normal(jax.random.key(3), (4, 8, 1, 1)) * 0.2
    x = jax.random.normal(jax.random.key(4), (batch, 3, 12, 12))

    def forward(weights, x):
        first, second = weights
        dims = ("NCHW", "OIHW", "NCHW")
        y = jax.nn.relu(lax.conv_general_dilated(x, first, (1, 1), "SAME", dimension_numbers=dims))
        return lax.conv_general_dilated(y, second, (1, 1), "VALID", dimension_numbers=dims)

    return forward, ((w1, w2), x)


def no_conv():
    """A function without a conv site."""
    return (lambda x: jnp.tanh(x) * 2), (jnp.ones((4, 4)),)


def not_a_pair(batch: int = 1):
    return jnp.ones((batch, 3))
