"""vmap over an op's activation: the batching rule folds the mapped axis into the primitive's own
batch (one bind, not one per slice) and every slice equals the op on that slice alone."""

import jax
import jax.numpy as jnp
import numpy as np


def check_folds_into_batch(op, x, in_axis: int, *, primitive: str, folded: str, exact=False,
                           rtol=1e-6, atol=1e-6) -> None:
    """vmap(op) over three slices (x, x / 2, -x) stacked on in_axis: `primitive` (its name in
    the jaxpr) appears once, with the folded operand type `folded` (e.g. "f32[6,5,4,8]"), and
    each result slice equals op(slice) (bit for bit when exact)."""
    xs = jnp.stack([x, 0.5 * x, -x], axis=in_axis)
    f = jax.vmap(op, in_axes=in_axis)
    jaxpr = str(jax.make_jaxpr(f)(xs))
    assert jaxpr.count(primitive) == 1 and folded in jaxpr, jaxpr
    got = f(xs)
    for i in range(3):
        want = op(jnp.take(xs, i, axis=in_axis))
        if exact:
            np.testing.assert_array_equal(got[i], want)
        else:
            np.testing.assert_allclose(got[i], want, rtol=rtol, atol=atol)
