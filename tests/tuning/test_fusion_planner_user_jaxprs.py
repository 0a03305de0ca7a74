"""jaxcnn.fusion's groups in a user's own function on the CPU: fire modules found in a user jaxpr
(also inside a nested jit, not where the squeeze output escapes), optimize_fused replacing them
(HWIO and OIHW weights, gradients), the planner deciding which to fuse, and jaxcnn.optimize's
fuse= under policy="auto". The zoo models' groups: test_fusion_planner.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcnn


def user_fire(x, p, *, oihw=False):
    def conv(x, w, b, pad):
        spec = ("NHWC", "OIHW", "NHWC") if oihw else ("NHWC", "HWIO", "NHWC")
        w = jnp.transpose(w, (3, 2, 0, 1)) if oihw else w
        y = jax.lax.conv_general_dilated(x, w, (1, 1), pad, dimension_numbers=spec)
        return jax.nn.relu(y + b)
    s = conv(x, p["sq"], p["bsq"], "VALID")
    return jnp.concatenate([conv(s, p["e1"], p["b1"], "VALID"), conv(s, p["e3"], p["b3"], ((1, 1), (1, 1)))], -1)


def user_params(c=16, s=8, e=12):
    k = jax.random.split(jax.random.PRNGKey(0), 7)
    he = lambda key, shape: jax.random.normal(key, shape) * np.sqrt(2.0 / np.prod(shape[:3]))  # noqa: E731
    return {"sq": he(k[0], (1, 1, c, s)), "bsq": 0.1 * jax.random.normal(k[3], (s,)),
            "e1": he(k[1], (1, 1, s, e)), "b1": 0.1 * jax.random.normal(k[4], (e,)),
            "e3": he(k[2], (3, 3, s, e)), "b3": 0.1 * jax.random.normal(k[5], (e,))}


def two_fires(x, p):
    return user_fire(jax.nn.relu(user_fire(x, p)[..., :16]), p)


def test_fire_groups_in_a_user_jaxpr():
    p, x = user_params(), jax.random.normal(jax.random.PRNGKey(3), (2, 9, 9, 16))
    found = jaxcnn.optimize.find_jaxpr_groups(two_fires, x, p)
    assert len(found) == 2 and all(g.kind == "fire" for g in found)
    assert found[0].x_shape == (2, 9, 9, 16) and found[0].y_shape == (2, 9, 9, 24)
    assert found[0].weight_shapes == ((1, 1, 16, 8), (1, 1, 8, 12), (3, 3, 8, 12))
    assert "fire: x 2x9x9x16 float32" in found[0].describe()
    nested = jaxcnn.optimize.find_jaxpr_groups(jax.jit(user_fire), x, p)
    assert len(nested) == 1 and nested[0].path.startswith("jit")
    assert jaxcnn.optimize.find_jaxpr_groups(lambda x: jnp.concatenate([x, x], -1), x) == []

    def squeeze_read_twice(x, p):  # the squeeze output escapes: no fire module
        s = jax.nn.relu(jax.lax.conv_general_dilated(x, p["sq"], (1, 1), "VALID",
                                                     dimension_numbers=("NHWC", "HWIO", "NHWC")) + p["bsq"])
        return user_fire(x, p), s
    assert len(jaxcnn.optimize.find_jaxpr_groups(squeeze_read_twice, x, p)) == 1  # only user_fire's own
    group = found[0].to_group()
    assert group.kind == "fire" and group.short_members().endswith("squeeze1x1,expand1x1,expand3x3,concat")


@pytest.mark.parametrize("oihw", [False, True])
def test_optimize_fused_replaces_user_fire_modules(oihw):
    p, x = user_params(), jax.random.normal(jax.random.PRNGKey(4), (2, 9, 7, 16))
    fn = lambda x, p: two_fires(x, p) if not oihw else user_fire(x, p, oihw=True)  # noqa: E731
    fast = jaxcnn.optimize.optimize_fused(fn, groups="all")
    np.testing.assert_allclose(jax.jit(fast)(x, p), fn(x, p), rtol=1e-5, atol=1e-5)
    jaxpr = str(jax.make_jaxpr(fast)(x, p))
    assert jaxpr.count("jaxcnn_fire") == (1 if oihw else 2) and "conv_general_dilated" not in jaxpr
    text = fast.explain(x, p)
    assert "fused" in text and "jaxcnn.fire(" in text and "groups='all'" in text
    g = jax.grad(lambda x: jnp.sum(fast(x, p) ** 2))(x)
    np.testing.assert_allclose(g, jax.grad(lambda x: jnp.sum(fn(x, p) ** 2))(x), rtol=1e-4, atol=1e-4)


def test_optimize_fused_decides_with_the_planner():
    p, x = user_params(), jax.random.normal(jax.random.PRNGKey(5), (1, 9, 9, 16))
    fast = jaxcnn.optimize.optimize_fused(two_fires, costs="model")
    decisions = fast.decisions(x, p)
    assert len(decisions) == 2 and all(d.source == "model" for _, _, d in decisions)
    assert [take for _, take, _ in decisions] == [d.choice == "fused" for _, _, d in decisions]
    assert "model: fused" in fast.explain(x, p)
    none = jaxcnn.optimize.optimize_fused(two_fires, groups="none", policy="all")
    assert "jaxcnn_fire" not in str(jax.make_jaxpr(none)(x, p))
    assert str(jax.make_jaxpr(none)(x, p)).count("jaxcnn_conv2d") == 6
    # policy="auto" leaves these dense convs to XLA: unfused they stay lax.
    auto_none = str(jax.make_jaxpr(jaxcnn.optimize.optimize_fused(two_fires, groups="none"))(x, p))
    assert "jaxcnn_" not in auto_none and auto_none.count("conv_general_dilated") == 6
    picky = jaxcnn.optimize.optimize_fused(two_fires, groups=lambda g: g.eqn_indices[0] == 0)
    assert str(jax.make_jaxpr(picky)(x, p)).count("jaxcnn_fire") == 1
    with pytest.raises(ValueError, match="groups must be one of"):
        jaxcnn.optimize.optimize_fused(two_fires, groups="some")
    with pytest.raises(ValueError, match="nothing to fuse"):
        jaxcnn.optimize.optimize_fused(two_fires, policy="xla")


@pytest.mark.parametrize("jit", [False, True])
def test_fuse_under_auto_policy_takes_fires_of_convs_left_to_xla(jit):
    """policy="auto" leaves dense bf16 convs to XLA (no measured win), yet fuse= still offers
    their fire modules (also inside a jit body, which holds no other rewrite) to the planner;
    a group not fused stays XLA's."""
    p, x = user_params(), jax.random.normal(jax.random.PRNGKey(6), (2, 9, 9, 16))
    p, x = jax.tree.map(lambda a: a.astype(jnp.bfloat16), p), x.astype(jnp.bfloat16)
    fn = jax.jit(two_fires) if jit else two_fires
    assert jaxcnn.optimize(fn, fuse="none").rewrites(x, p) == []
    fast = jaxcnn.optimize(fn, fuse="all")
    assert [r.op for r in fast.rewrites(x, p)] == ["fire", "fire"]
    assert all(r.path.startswith("jit") == jit for r in fast.rewrites(x, p))
    jaxpr = str(jax.make_jaxpr(fast)(x, p))
    assert jaxpr.count("jaxcnn_fire") == 2 and "conv_general_dilated" not in jaxpr
    np.testing.assert_allclose(np.asarray(jax.jit(fast)(x, p), np.float32), np.asarray(fn(x, p), np.float32),
                               rtol=5e-2, atol=5e-2)
    one = jaxcnn.optimize.optimize_fused(fn, groups=lambda g: g.eqn_indices[0] == 0)
    jaxpr = str(jax.make_jaxpr(one)(x, p))
    assert jaxpr.count("jaxcnn_fire") == 1 and jaxpr.count("conv_general_dilated") == 3
    assert "jaxcnn_conv2d" not in jaxpr
    decided = jaxcnn.optimize(fn, fuse="auto")  # off GPU: the cost model decides each group
    assert len(decided.decisions(x, p)) == 2
    assert str(jax.make_jaxpr(decided)(x, p)).count("jaxcnn_fire") == sum(t for _, t, _ in decided.decisions(x, p))
