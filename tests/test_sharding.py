"""Batch sharding over 8 forced host devices: no all-gather, results equal single-device."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import jaxcnn

    assert jax.device_count() == 8, jax.devices()
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    kx, kw, kb = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(kx, (16, 11, 9, 6))
    w = jax.random.normal(kw, (3, 3, 3, 4)) * 0.2
    b = jax.random.normal(kb, (4,))
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    conv = lambda x, w, b: jaxcnn.conv2d(x, w, b, stride=2, groups=2, activation="relu")

    fwd = jax.jit(conv)
    hlo = fwd.lower(xs, w, b).compile().as_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo, hlo
    assert "f32[2,6,5,4]" in hlo, "each device must convolve its own 2-image shard"
    y = fwd(xs, w, b)
    assert y.sharding.spec[0] == "data", y.sharding
    np.testing.assert_allclose(y, conv(x, w, b), rtol=1e-6, atol=1e-6)

    # The backward runs XLA's convolutions: XLA keeps the plain conv's grads batch-local
    # (only dw/db are all-reduced) but all-gathers for grouped strided transposed convs.
    w1 = jax.random.normal(kw, (3, 3, 6, 4)) * 0.2
    plain_loss = lambda x, w, b: jnp.sum(jaxcnn.conv2d(x, w, b, activation="relu") ** 2)
    plain_grad = jax.jit(jax.grad(plain_loss, argnums=(0, 1, 2)))
    ghlo = plain_grad.lower(xs, w1, b).compile().as_text()
    assert "all-gather" not in ghlo, ghlo
    for got, want in zip(plain_grad(xs, w1, b), jax.grad(plain_loss, argnums=(0, 1, 2))(x, w1, b)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    loss = lambda x, w, b: jnp.sum(conv(x, w, b) ** 2)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    for got, want in zip(grad(xs, w, b), jax.grad(loss, argnums=(0, 1, 2))(x, w, b)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)

    sm = jax.jit(jax.shard_map(conv, mesh=mesh, in_specs=(P("data"), P(), P()), out_specs=P("data")))
    np.testing.assert_allclose(sm(xs, w, b), conv(x, w, b), rtol=1e-6, atol=1e-6)
    print("SHARDING OK")
    """
)


def test_batch_sharded_conv_has_no_all_gather():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "SHARDING OK" in proc.stdout
