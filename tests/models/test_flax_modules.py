"""jaxcnn.flax: drop-in linen / nnx layers on jaxcnn kernels give Flax's own layers' results
with the same parameter trees; unsupported arguments raise errors naming them; `import jaxcnn`
does not import flax."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("flax")
import flax.linen as nn  # noqa: E402
from flax import nnx  # noqa: E402

import jaxcnn.flax as jf  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)


def rand(seed, shape):
    return jax.random.normal(jax.random.PRNGKey(seed), shape)


def shapes(tree):
    return jax.tree.map(jnp.shape, tree)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.sampled_from([(1, 1), (3, 3), (2, 3)]), strides=st.sampled_from([1, 2, (2, 1)]),
       padding=st.sampled_from(["SAME", "VALID", 1, (1, 2), ((0, 1), (2, 0))]), dilation=st.sampled_from([1, 2]),
       groups=st.sampled_from([1, 2]), use_bias=st.booleans(), batch=st.sampled_from([(), (2,), (2, 3)]),
       seed=st.integers(0, 2**16))
@pytest.mark.slow
def test_linen_conv_matches_flax(k, strides, padding, dilation, groups, use_bias, batch, seed):
    x = rand(seed, (*batch, 9, 8, 4))
    kw = dict(features=6, kernel_size=k, strides=strides, padding=padding, kernel_dilation=dilation,
              feature_group_count=groups, use_bias=use_bias)
    ref, ours = nn.Conv(**kw), jf.Conv(**kw)
    params = ref.init(jax.random.PRNGKey(seed + 1), x)
    params = jax.tree.map(lambda p: p + 0.3, params)  # a nonzero bias
    assert shapes(ours.init(jax.random.PRNGKey(0), x)) == shapes(params)
    np.testing.assert_allclose(ours.apply(params, x), ref.apply(params, x), **TOL)  # a flax checkpoint loads
    relu = jf.Conv(**kw, activation="relu")
    np.testing.assert_allclose(relu.apply(params, x), nn.relu(ref.apply(params, x)), **TOL)


def test_linen_conv_bf16_and_grad():
    x = rand(1, (2, 8, 8, 8)).astype(jnp.bfloat16)
    ref = nn.Conv(16, (3, 3), dtype=jnp.bfloat16)
    ours = jf.Conv(16, (3, 3), dtype=jnp.bfloat16)
    params = ref.init(jax.random.PRNGKey(2), x)
    got, want = ours.apply(params, x), ref.apply(params, x)
    assert got.dtype == want.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=5e-2, atol=5e-2)
    x32 = x.astype(jnp.float32)
    loss = lambda m: lambda p, x: jnp.sum(jnp.sin(nn.Conv(16, (3, 3)).apply(p, x) if m is None else m.apply(p, x)))
    p32 = jax.tree.map(lambda a: a.astype(jnp.float32), params)
    got = jax.grad(loss(jf.Conv(16, (3, 3))), argnums=(0, 1))(p32, x32)
    want = jax.grad(loss(None), argnums=(0, 1))(p32, x32)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window, strides, padding", [((2, 2), None, "VALID"), ((3, 3), (2, 2), "SAME"),
                                                      ((3, 2), (1, 2), ((1, 1), (0, 1)))])
def test_pools_match_flax(window, strides, padding):
    x = rand(3, (2, 9, 8, 5))
    np.testing.assert_allclose(jf.max_pool(x, window, strides, padding), nn.max_pool(x, window, strides, padding))
    for include in (True, False):
        np.testing.assert_allclose(jf.avg_pool(x, window, strides, padding, count_include_pad=include),
                                   nn.avg_pool(x, window, strides, padding, count_include_pad=include), **TOL)
    np.testing.assert_allclose(jf.max_pool(x[0], window, strides, padding), nn.max_pool(x[0], window, strides, padding))
    assert jf.nnx.max_pool is jf.max_pool and jf.nnx.avg_pool is jf.avg_pool


def test_linen_fire_matches_three_flax_convs():
    class FlaxFire(nn.Module):
        @nn.compact
        def __call__(self, x):
            s = nn.relu(nn.Conv(4, (1, 1), name="squeeze")(x))
            return jnp.concatenate([nn.relu(nn.Conv(6, (1, 1), name="expand1x1")(s)),
                                    nn.relu(nn.Conv(5, (3, 3), name="expand3x3")(s))], axis=-1)

    x = rand(4, (2, 7, 7, 8))
    params = jax.tree.map(lambda p: p + 0.1, FlaxFire().init(jax.random.PRNGKey(5), x))
    want = FlaxFire().apply(params, x)
    for fused in (False, True):
        ours = jf.Fire(4, 6, 5, fused=fused)
        assert shapes(ours.init(jax.random.PRNGKey(0), x)) == shapes(params)
        np.testing.assert_allclose(ours.apply(params, x), want, **TOL)


def test_nnx_conv_and_fire_match_flax_nnx():
    x = rand(6, (2, 9, 9, 8))
    kw = dict(strides=2, padding=((1, 0), (0, 1)), kernel_dilation=(1, 2), feature_group_count=2)
    ref = nnx.Conv(8, 6, (3, 3), **kw, rngs=nnx.Rngs(0))
    ours = jf.nnx.Conv(8, 6, (3, 3), **kw, rngs=nnx.Rngs(1))
    assert shapes(nnx.state(ours, nnx.Param)) == shapes(nnx.state(ref, nnx.Param))
    nnx.update(ours, nnx.state(ref, nnx.Param))  # an nnx state loads
    ours.bias[...] = ref.bias[...] = jnp.linspace(-1, 1, 6)
    np.testing.assert_allclose(ours(x), ref(x), **TOL)
    np.testing.assert_allclose(nnx.jit(lambda m, x: m(x))(ours, x), ref(x), **TOL)

    fire = jf.nnx.Fire(8, 4, 6, 5, rngs=nnx.Rngs(2))
    convs = {name: getattr(fire, name) for name in ("squeeze", "expand1x1", "expand3x3")}
    s = nnx.relu(x @ convs["squeeze"].kernel[...][0, 0] + convs["squeeze"].bias[...])
    e1 = nnx.relu(s @ convs["expand1x1"].kernel[...][0, 0] + convs["expand1x1"].bias[...])
    e3 = nnx.relu(jax.lax.conv_general_dilated(s, convs["expand3x3"].kernel[...], (1, 1), "SAME",
                                               dimension_numbers=("NHWC", "HWIO", "NHWC")) + convs["expand3x3"].bias[...])
    np.testing.assert_allclose(fire(x), jnp.concatenate([e1, e3], -1), **TOL)


def test_unsupported_arguments_are_named():
    x = rand(7, (1, 6, 6, 4))
    cases = [
        (dict(features=4, kernel_size=(3, 3), input_dilation=2), "input_dilation"),
        (dict(features=4, kernel_size=(3, 3), mask=jnp.ones((3, 3, 4, 4))), "mask"),
        (dict(features=4, kernel_size=(3, 3), padding="CIRCULAR"), "padding"),
        (dict(features=4, kernel_size=3), "kernel_size"),
        (dict(features=4, kernel_size=(3, 3, 3)), "kernel_size"),
        (dict(features=4, kernel_size=(3, 3), feature_group_count=3), "feature_group_count"),
        (dict(features=4, kernel_size=(3, 3), conv_general_dilated=jax.lax.conv_general_dilated), "conv_general_dilated"),
    ]
    for kwargs, name in cases:
        with pytest.raises(ValueError, match=name):
            jf.Conv(**kwargs).init(jax.random.PRNGKey(0), x)
    with pytest.raises(ValueError, match="preferred_element_type"):
        jf.nnx.Conv(4, 4, (3, 3), preferred_element_type=jnp.float32, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="input_dilation"):
        jf.nnx.Conv(4, 4, (3, 3), input_dilation=(2, 1), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="window_shape"):
        jf.max_pool(x, 2)
    with pytest.raises(ValueError, match="padding"):
        jf.avg_pool(x, (2, 2), padding="CAUSAL")
    with pytest.raises(TypeError, match="count_include_pad"):
        jf.avg_pool(x, (2, 2), count_include_pad="yes")
    with pytest.raises(ValueError, match="squeeze"):
        jf.Fire(0, 4, 4).init(jax.random.PRNGKey(0), x)


def test_import_jaxcnn_does_not_import_flax():
    code = ("import sys, jaxcnn; jaxcnn.conv2d; jaxcnn.optimize; import jaxcnn.optimize.patterns; "
            "assert 'flax' not in sys.modules and 'equinox' not in sys.modules, sorted(m for m in sys.modules if 'flax' in m)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
