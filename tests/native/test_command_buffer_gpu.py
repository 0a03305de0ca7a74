"""GPU: the handlers are registered command-buffer compatible, so XLA records a program's
jaxcnn kernels into one CUDA graph (from the second call on) and re-records it when buffer
addresses change. A chain of every kernel family runs on fresh inputs, call after call;
each stage is checked against XLA in float32 applied to the previous stage's output, so an
error does not hide behind the next layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxcnn
from jaxcnn._native import library

pytestmark = pytest.mark.gpu

DN = ("NHWC", "HWIO", "NHWC")
TOL = dict(rtol=4e-2, atol=4e-2)  # bf16 outputs of O(1) values


def conv_relu_f32(x, w, b):
    y = lax.conv_general_dilated(x.astype(jnp.float32), w.astype(jnp.float32), (1, 1), "SAME",
                                 dimension_numbers=DN)
    return jnp.maximum(y + b.astype(jnp.float32), 0)


def fire_f32(x, wsq, we1, we3, bsq, be1, be3):
    s = conv_relu_f32(x, wsq, bsq).astype(x.dtype)  # the kernels keep s in x's dtype
    return jnp.concatenate([conv_relu_f32(s, we1, be1), conv_relu_f32(s, we3, be3)], axis=-1)


def params(seed):
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 16))

    def he(shape):
        fan_in = shape[0] * shape[1] * shape[2]
        return (jax.random.normal(next(keys), shape) * np.sqrt(2.0 / fan_in)).astype(jnp.bfloat16)

    def bias(n):
        return (0.1 * jax.random.normal(next(keys), (n,))).astype(jnp.bfloat16)

    fire = lambda c, s, e: (he((1, 1, c, s)), he((1, 1, s, e)), he((3, 3, s, e)),  # noqa: E731
                            bias(s), bias(e), bias(e))
    return {"conv": (he((3, 3, 64, 128)), bias(128)), "fire_a": fire(128, 16, 64),
            "fire_b": fire(128, 32, 128), "sparse": (he((3, 3, 256, 64)), bias(64))}


def chain(p, x):
    """conv (CUTLASS wgmma) -> max pool -> fire (two-phase) -> fire (wgmma convs) ->
    sparse conv -> softmax: every stage's output is returned."""
    c = jaxcnn.conv2d(x, *p["conv"], activation="relu", algorithm="tensor_core")
    pooled = jaxcnn.max_pool2d(c, 3, 2)
    fa = jaxcnn.fire(pooled, *p["fire_a"][:3], *p["fire_a"][3:], algorithm="two_phase")
    fb = jaxcnn.fire(fa, *p["fire_b"][:3], *p["fire_b"][3:], algorithm="wgmma")
    sp = jaxcnn.sparse_conv2d(fb, *p["sparse"], activation="relu")
    probs = jaxcnn.softmax(sp.reshape(sp.shape[0], -1))
    return c, pooled, fa, fb, sp, probs


def test_registered_with_the_command_buffer_trait():
    assert library.library_state().registered, library.library_state().reason
    assert library.registration_traits() == library.xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE


def test_chain_replayed_on_fresh_inputs_matches_xla():
    p = params(0)
    run = jax.jit(chain)
    for call, seed in enumerate((1, 2, 3, 4, 5)):
        # A new input buffer each call: the recorded graph must follow the new addresses.
        x = jax.random.normal(jax.random.PRNGKey(seed), (2, 27, 27, 64)).astype(jnp.bfloat16)
        c, pooled, fa, fb, sp, probs = run(p, x)
        stages = {
            "conv": (c, conv_relu_f32(x, *p["conv"])),
            "max_pool": (pooled, lax.reduce_window(c.astype(jnp.float32), -jnp.inf, lax.max,
                                                   (1, 3, 3, 1), (1, 2, 2, 1), "VALID")),
            "fire two_phase": (fa, fire_f32(pooled, *p["fire_a"])),
            "fire wgmma": (fb, fire_f32(fa, *p["fire_b"])),
            "sparse conv": (sp, conv_relu_f32(fb, *p["sparse"])),
            "softmax": (probs, jax.nn.softmax(sp.reshape(2, -1).astype(jnp.float32))),
        }
        for name, (got, want) in stages.items():
            got = np.asarray(got, np.float32)
            assert np.isfinite(got).all(), f"call {call}: {name} has NaN/inf"
            tol = dict(rtol=4e-2, atol=1e-6) if name == "softmax" else TOL  # tiny probabilities
            np.testing.assert_allclose(got, np.asarray(want), **tol,
                                       err_msg=f"call {call}: {name}")
        assert float(jnp.abs(fb).max()) > 0, "fire output all zero: the check would be vacuous"
