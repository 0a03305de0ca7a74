"""Checks of a jaxcnn function on a batch-sharded activation, for the scripts that run on 8 forced
host devices (host_devices.run_on_8_host_devices puts tests/helpers/ on their PYTHONPATH): the
compiled program never gathers the batch, each device computes its own shard, and the value,
gradients and shard_map equal the single-device ones.

fn takes the activation first and replicated parameters after it: fn(x, *params)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from fp32_reassociation import assert_reassociated_close, at_magnitudes

# Largest difference allowed where both sides compute the same sums in the same order but XLA
# may fuse them differently per shard.
CLOSE = dict(rtol=1e-6, atol=1e-6)


def data_mesh(axis_type=AxisType.Auto):
    """The 8 host devices as one mesh axis, "data"."""
    assert jax.device_count() == 8, jax.devices()
    return jax.make_mesh((8,), ("data",), axis_types=(axis_type,))


def shard_batch(x, mesh):
    """x split over "data" along its first (batch) axis."""
    return jax.device_put(x, NamedSharding(mesh, P("data")))


def assert_no_gather(hlo: str, *context) -> None:
    """The compiled program moves no activation between devices."""
    assert "all-gather" not in hlo and "all-to-all" not in hlo, (*context, hlo)


def assert_equal(got, want, exact: bool, name: str = "") -> None:
    if exact:
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        np.testing.assert_allclose(got, want, **CLOSE, err_msg=name)


def check_forward(fn, x, xs, *params, local: str, exact=False, name="") -> None:
    """jit(fn) on the sharded xs: batch-local (no gather; `local`, one device's shard type such
    as "f32[2,5,4,8]", in the program), its result sharded over the batch and equal to fn on
    one device (bit for bit when exact)."""
    fwd = jax.jit(fn)
    hlo = fwd.lower(xs, *params).compile().as_text()
    assert_no_gather(hlo, name)
    assert local in hlo, (name, "each device must run its own 2-image shard")
    y = fwd(xs, *params)
    assert y.sharding.spec[0] == "data", (name, y.sharding)
    assert_equal(y, fn(x, *params), exact, name)


def check_grads(fn, argnums, x, xs, *params, n_terms: int, name="") -> None:
    """The gradients of sum(fn ** 2) under jit on the sharded xs equal the single-device ones up
    to the reordering of sums of n_terms terms (per-device partial sums, then an all-reduce)."""
    grad = jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=argnums)
    for got, want, magnitude in zip(jax.jit(grad)(xs, *params), grad(x, *params),
                                    at_magnitudes(grad, x, *params)):
        assert_reassociated_close(got, want, magnitude, n_terms, err_msg=name)


def check_shard_map(fn, x, xs, *params, exact=False) -> None:
    """fn under jax.shard_map over xs's mesh (each device its batch shard, the parameters
    replicated) equals fn on one device."""
    in_specs = (P("data"),) + (P(),) * len(params)
    sm = jax.jit(jax.shard_map(fn, mesh=xs.sharding.mesh, in_specs=in_specs, out_specs=P("data")))
    assert_equal(sm(xs, *params), fn(x, *params), exact)
