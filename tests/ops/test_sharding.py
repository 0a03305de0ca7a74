"""Batch sharding over 8 forced host devices: every jaxcnn primitive (and jaxcnn.optimize'd
Flax/Equinox models) keeps its batch shard local under jit + NamedSharding (no all-gather in
the compiled HLO), runs under jax.shard_map, and equals the single-device result."""

import textwrap

import pytest

from host_devices import run_on_8_host_devices

SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    import jaxcnn
    from batch_sharding import check_forward, check_grads, check_shard_map, data_mesh, shard_batch

    kx, kw, kb = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(kx, (16, 11, 9, 6))
    w = jax.random.normal(kw, (3, 3, 3, 4)) * 0.2
    b = jax.random.normal(kb, (4,))
    xs = shard_batch(x, data_mesh())
    # algorithm="jaxcnn": the primitive's own sharding rule (auto may pick XLA's conv here).
    conv = lambda x, w, b: jaxcnn.conv2d(x, w, b, stride=2, groups=2, activation="relu", algorithm="jaxcnn")
    check_forward(conv, x, xs, w, b, local="f32[2,6,5,4]")

    # The backward runs XLA's convolutions: XLA keeps the plain conv's grads batch-local
    # (only dw/db are all-reduced) but all-gathers for grouped strided transposed convs.
    w1 = jax.random.normal(kw, (3, 3, 6, 4)) * 0.2
    plain = lambda x, w, b: jaxcnn.conv2d(x, w, b, activation="relu", algorithm="jaxcnn")
    plain_grad = jax.grad(lambda x, w, b: jnp.sum(plain(x, w, b) ** 2), argnums=(0, 1, 2))
    ghlo = jax.jit(plain_grad).lower(xs, w1, b).compile().as_text()
    assert "all-gather" not in ghlo, ghlo
    # dw sums over the batch's 16*11*9 outputs (per device, then all-reduced) after the
    # forward's 3*3*6 terms; the strided grouped conv: 16*6*5 outputs after 3*3*3.
    check_grads(plain, (0, 1, 2), x, xs, w1, b, n_terms=16 * 11 * 9 + 3 * 3 * 6)
    check_grads(conv, (0, 1, 2), x, xs, w, b, n_terms=16 * 6 * 5 + 3 * 3 * 3)
    check_shard_map(conv, x, xs, w, b)
    print("SHARDING OK")
    """
)


@pytest.mark.slow
def test_batch_sharded_conv_has_no_all_gather():
    assert "SHARDING OK" in run_on_8_host_devices(SCRIPT, timeout=600)


# Every primitive, one row each: (name, function of one batch-sharded activation, its shape, the
# batch axis of input and output). A new primitive is one more row; rows whose function jaxcnn
# does not have (yet) are skipped by name.
PRIMITIVES_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import jaxcnn
    from batch_sharding import assert_no_gather, data_mesh

    mesh = data_mesh()
    # Under Explicit axes the batch sharding is part of the type: the result's must say it.
    explicit = data_mesh(AxisType.Explicit)
    key = iter(jax.random.split(jax.random.PRNGKey(0), 16))
    w3 = jax.random.normal(next(key), (3, 3, 6, 4)) * 0.2
    bias = jax.random.normal(next(key), (4,))
    sq = jax.random.normal(next(key), (1, 1, 6, 3)) * 0.3
    e1 = jax.random.normal(next(key), (1, 1, 3, 4)) * 0.3
    e3 = jax.random.normal(next(key), (3, 3, 3, 5)) * 0.3
    NHWC, NCHW, CHWN = (16, 7, 5, 6), (16, 6, 7, 5), (6, 7, 5, 16)
    inc = [jax.random.normal(next(key), shape) * 0.3 for shape in
           ((1, 1, 6, 2), (1, 1, 6, 3), (3, 3, 3, 4), (1, 1, 6, 2), (5, 5, 2, 3), (1, 1, 6, 2))]
    c1 = jax.random.normal(next(key), (1, 1, 4, 5)) * 0.3
    dw = jax.random.normal(next(key), (3, 3, 1, 3)) * 0.3

    ROWS = [
        # name, jaxcnn function it needs, fn, input shape, batch axis (input, output)
        ("conv2d NHWC", "conv2d", lambda x: jaxcnn.conv2d(x, w3, bias, stride=2, activation="relu", algorithm="jaxcnn"), NHWC, 0),
        ("conv2d NCHW", "conv2d", lambda x: jaxcnn.conv2d(x, w3, bias, padding="VALID", layout="NCHW", algorithm="jaxcnn"), NCHW, 0),
        ("conv2d CHWN", "conv2d", lambda x: jaxcnn.conv2d(x, w3, None, dilation=2, layout="CHWN", algorithm="jaxcnn"), CHWN, 3),
        ("max_pool2d NHWC", "max_pool2d", lambda x: jaxcnn.max_pool2d(x, 3, 2, padding=1), NHWC, 0),
        ("avg_pool2d NCHW", "avg_pool2d", lambda x: jaxcnn.avg_pool2d(x, 2, layout="NCHW"), NCHW, 0),
        ("avg_pool2d CHWN", "avg_pool2d", lambda x: jaxcnn.avg_pool2d(x, 3, 1, padding="SAME", layout="CHWN",
                                                                      count_include_pad=False), CHWN, 3),
        ("softmax", "softmax", lambda x: jaxcnn.softmax(x), (16, 5, 33), 0),
        ("log_softmax axis 1", "log_softmax", lambda x: jaxcnn.log_softmax(x, axis=1), (16, 5, 33), 0),
        ("to_layout NHWC->NCHW", "to_layout", lambda x: jaxcnn.to_layout(x, "NHWC", "NCHW"), NHWC, 0),
        ("to_layout NHWC->CHWN", "to_layout", lambda x: jaxcnn.to_layout(x, "NHWC", "CHWN"), NHWC, (0, 3)),
        ("to_layout CHWN->NCHW", "to_layout", lambda x: jaxcnn.to_layout(x, "CHWN", "NCHW"), CHWN, (3, 0)),
        ("fire", "fire", lambda x: jaxcnn.fire(x, sq, e1, e3), NHWC, 0),
        ("conv1x1_conv3x3", "conv1x1_conv3x3", lambda x: jaxcnn.conv1x1_conv3x3(x, sq, e3), NHWC, 0),
        ("conv2d_pool 3x3/2", "conv2d_pool", lambda x: jaxcnn.conv2d_pool(x, w3, bias, pool_window=3, pool_stride=2), NHWC, 0),
        ("sparse_conv2d", "sparse_conv2d", lambda x: jaxcnn.sparse_conv2d(jax.nn.relu(x), w3, bias), NHWC, 0),
        ("sparse_conv2d_pool", "sparse_conv2d_pool", lambda x: jaxcnn.sparse_conv2d_pool(x, w3, bias), NHWC, 0),
        ("inception", "inception", lambda x: jaxcnn.inception(x, *inc), NHWC, 0),
        ("conv3x3_conv1x1", "conv3x3_conv1x1", lambda x: jaxcnn.conv3x3_conv1x1(x, w3, c1, bias, algorithm="fused"),
         NHWC, 0),
        ("conv1x1_depthwise /2", "conv1x1_depthwise",
         lambda x: jaxcnn.conv1x1_depthwise(x, sq, dw, stride=2, activations=("relu6", None)), NHWC, 0),
    ]

    checked = []
    for i, (name, needs, fn, shape, axes) in enumerate(ROWS):
        if not hasattr(jaxcnn, needs):
            print("SKIP (jaxcnn has no %s): %s" % (needs, name))
            continue
        in_axis, out_axis = axes if isinstance(axes, tuple) else (axes, axes)
        x = jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(1), i), shape)
        spec = lambda rank, axis: P(*[("data" if i == axis else None) for i in range(rank)])
        xs = jax.device_put(x, NamedSharding(mesh, spec(x.ndim, in_axis)))
        want = jax.jit(fn)(x)
        fwd = jax.jit(fn)
        assert_no_gather(fwd.lower(xs).compile().as_text(), name)
        y = fwd(xs)
        assert y.sharding.spec[out_axis] == "data", (name, y.sharding)
        local = list(want.shape)
        local[out_axis] //= 8
        assert y.addressable_shards[0].data.shape == tuple(local), (name, y.addressable_shards[0].data.shape)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5, err_msg=name)
        typed = jax.eval_shape(fn, jax.device_put(x, NamedSharding(explicit, spec(x.ndim, in_axis))))
        assert typed.sharding.spec[out_axis] == "data", (name, "Explicit mesh", typed.sharding)
        sm = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(spec(x.ndim, in_axis),),
                                   out_specs=spec(want.ndim, out_axis)))
        np.testing.assert_allclose(sm(xs), want, rtol=1e-5, atol=1e-5, err_msg=name + " (shard_map)")
        checked.append(name)
    print("CHECKED", len(checked), checked)
    print("PRIMITIVES OK")
    """
)


@pytest.mark.slow
def test_every_primitive_shards_over_the_batch():
    out = run_on_8_host_devices(PRIMITIVES_SCRIPT)
    assert "PRIMITIVES OK" in out
    checked = int(out.split("CHECKED ")[1].split()[0])
    assert checked >= 19, out  # every row above: a missing function would be skipped


# Data-parallel inference of Flax-written SqueezeNet 1.1 and VGG-19 through jaxcnn.optimize.
MODELS_SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import jaxcnn
    from batch_sharding import assert_no_gather, data_mesh
    from benchmarks import thirdparty_models as tm

    # Explicit axes (jax.make_mesh's default) type each value with its sharding; VGG's
    # pool -> flatten -> dense needs the pool's result typed batch-sharded there.
    # fuse="all": Equinox's NCHW fire groups (and their one weight relayout), GoogLeNet's
    # inception blocks.
    for name, kw, axis_type, fuse in (("linen_squeezenet1_1", dict(hw=48, num_classes=16), AxisType.Auto, "none"),
                                      ("linen_vgg19", dict(hw=32, num_classes=16, hidden=32), AxisType.Auto, "none"),
                                      ("linen_vgg19", dict(hw=32, num_classes=16, hidden=32), AxisType.Explicit, "none"),
                                      ("equinox_squeezenet1_1", dict(hw=48, num_classes=16), AxisType.Auto, "none"),
                                      ("equinox_squeezenet1_1", dict(hw=48, num_classes=16), AxisType.Auto, "all"),
                                      ("linen_googlenet_head", dict(hw=64, num_classes=16), AxisType.Auto, "all")):
        mesh = data_mesh(axis_type)
        m = tm.build(name, batch=16, **kw)
        opt = jaxcnn.optimize(m.apply, policy="all", fuse=fuse)
        assert len(opt.rewrites(m.params, m.x)) > (10 if fuse == "none" else 4)
        xs = jax.device_put(m.x, NamedSharding(mesh, P("data")))
        params = jax.device_put(m.params, NamedSharding(mesh, P()))
        fwd = jax.jit(opt)
        assert_no_gather(fwd.lower(params, xs).compile().as_text(), name)
        y = fwd(params, xs)
        assert y.sharding.spec[0] == "data", (name, y.sharding)
        np.testing.assert_allclose(y, jax.jit(m.apply)(m.params, m.x), rtol=2e-4, atol=2e-5, err_msg=name)
        print("OK", name, axis_type, fuse)
    print("MODELS OK")
    """
)


@pytest.mark.slow
def test_optimized_flax_models_data_parallel():
    pytest.importorskip("flax")
    pytest.importorskip("equinox")
    out = run_on_8_host_devices(MODELS_SCRIPT, timeout=1500)
    assert "MODELS OK" in out
