"""Pooling and softmax sharded over the batch axis of 8 forced host devices: every layout
keeps its batch shard local (no all-gather), results equal the unsharded ones."""

import textwrap

import pytest

from host_devices import run_on_8_host_devices

SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import jaxcnn
    from batch_sharding import assert_no_gather, data_mesh

    mesh = data_mesh()
    x_nhwc = jax.random.normal(jax.random.PRNGKey(0), (16, 11, 9, 6))
    perms = {"NHWC": (0, 1, 2, 3), "NCHW": (0, 3, 1, 2), "CHWN": (3, 1, 2, 0)}
    for layout, perm in perms.items():
        x = jnp.transpose(x_nhwc, perm)
        n_axis = layout.index("N")
        spec = P(*[("data" if i == n_axis else None) for i in range(4)])
        xs = jax.device_put(x, NamedSharding(mesh, spec))
        for pool in (
            lambda x: jaxcnn.max_pool2d(x, 3, 2, padding=1, layout=layout),
            lambda x: jaxcnn.avg_pool2d(x, (2, 3), (2, 1), padding="SAME", layout=layout,
                                        count_include_pad=False),
        ):
            fwd = jax.jit(pool)
            hlo = fwd.lower(xs).compile().as_text()
            assert_no_gather(hlo, layout)
            local = list(jax.eval_shape(pool, x).shape)
            local[n_axis] //= 8
            assert "[" + ",".join(map(str, local)) + "]" in hlo, (layout, local, hlo)
            y = fwd(xs)
            assert y.sharding.spec[n_axis] == "data", (layout, y.sharding)
            np.testing.assert_allclose(y, pool(x), rtol=1e-6, atol=1e-6)
            loss = lambda x: jnp.sum(pool(x) ** 2)
            np.testing.assert_allclose(jax.jit(jax.grad(loss))(xs), jax.grad(loss)(x),
                                       rtol=1e-5, atol=1e-6)
        sm = jax.jit(jax.shard_map(
            lambda x: jaxcnn.max_pool2d(x, 2, layout=layout), mesh=mesh,
            in_specs=(spec,), out_specs=spec))
        np.testing.assert_array_equal(sm(xs), jaxcnn.max_pool2d(x, 2, layout=layout))
    print("POOL OK")

    z = jax.random.normal(jax.random.PRNGKey(1), (16, 5, 33))
    zs = jax.device_put(z, NamedSharding(mesh, P("data")))
    for fn in (jaxcnn.softmax, jaxcnn.log_softmax):
        f = jax.jit(fn)
        hlo = f.lower(zs).compile().as_text()
        assert_no_gather(hlo)
        assert "f32[2,5,33]" in hlo, hlo
        y = f(zs)
        assert y.sharding.spec[0] == "data", y.sharding
        np.testing.assert_allclose(y, fn(z), rtol=1e-6, atol=1e-6)
        g = jax.jit(jax.grad(lambda z: jnp.sum(fn(z) * z)))
        np.testing.assert_allclose(g(zs), jax.grad(lambda z: jnp.sum(fn(z) * z))(z), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(jax.jit(lambda z: fn(z, axis=1))(zs), fn(z, axis=1), rtol=1e-6, atol=1e-6)
    v = jax.random.normal(jax.random.PRNGKey(2), (64,))
    np.testing.assert_allclose(jax.jit(jaxcnn.softmax)(jax.device_put(v, NamedSharding(mesh, P("data")))),
                               jaxcnn.softmax(v), rtol=1e-6, atol=1e-7)
    print("SOFTMAX OK")
    """
)


@pytest.mark.slow
def test_batch_sharded_pool_and_softmax_have_no_all_gather():
    out = run_on_8_host_devices(SCRIPT, timeout=900)
    assert "POOL OK" in out and "SOFTMAX OK" in out
