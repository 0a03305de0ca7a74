"""The fp32 tolerance between two evaluations of the same sums in different orders: a batch-sharded
program (per-device partial sums, then an all-reduce) against the single-device one.

Any order of a sum of n terms is within gamma_n * sum|terms| of the exact sum (gamma_n =
n*u / (1 - n*u), u = 2**-24 the fp32 unit roundoff), so two orders differ by at most
2 * gamma_n * sum|terms|. Through a chain of sums (conv, then a gradient that sums over the
batch) the lengths add: an input's rounding is carried by the next sum's |coefficients|, so n is
the total length of the longest chain. sum|terms| is bounded by the same function evaluated on
the absolute values of every operand (|conv(x, w)| <= conv(|x|, |w|); ReLU, bias add, average
and max pooling keep |f(a)| <= f(|a|)). The tolerance takes that magnitude's maximum over the
tensor, not per element: under |operands| a max-pool's backward may route a cotangent to another
window position, so only the tensor-wide maximum bounds every element.

The scripts that run on 8 forced host devices import this module (tests/helpers/ on PYTHONPATH)."""

import jax.numpy as jnp
import numpy as np

FP32_UNIT_ROUNDOFF = 2.0**-24


def at_magnitudes(fn, *operands):
    """fn at the absolute values of its operands: an upper bound of sum|terms| of each sum fn
    evaluates (fn a gradient too: jax.grad(loss, argnums) at |operands|)."""
    return fn(*[jnp.abs(a) for a in operands])


def reassociation_atol(magnitude, n_terms: int) -> float:
    """Largest difference of two fp32 evaluations of sums of n_terms terms in different orders,
    for sums whose sum|terms| is at most max(|magnitude|)."""
    if n_terms * FP32_UNIT_ROUNDOFF >= 1:
        raise ValueError(f"n_terms={n_terms} is too long for an fp32 error bound")
    gamma = n_terms * FP32_UNIT_ROUNDOFF / (1 - n_terms * FP32_UNIT_ROUNDOFF)
    return 2 * gamma * float(np.max(np.abs(np.asarray(magnitude, np.float64))))


def assert_reassociated_close(got, want, magnitude, n_terms: int, err_msg: str = "") -> None:
    """got == want up to the reordering of sums of n_terms terms bounded by magnitude."""
    atol = reassociation_atol(magnitude, n_terms)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=atol,
                               err_msg=f"{err_msg} (reassociation bound, n_terms={n_terms})")
