"""Small readers of jaxpr equations shared by the pattern matchers (patterns.py and
epilogue_patterns.py)."""

from __future__ import annotations

import numpy as np
from jax.extend.core import Literal

# Call-like primitives whose body is a jaxpr evaluated once on the call's operands.
CALL_PRIMITIVES = ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call")


def call_body(eqn):
    """The body of a call-like equation as its params hold it (a ClosedJaxpr or a Jaxpr), or None."""
    if eqn.primitive.name not in CALL_PRIMITIVES:
        return None
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        body = eqn.params.get(key)
        if body is not None:
            return body
    return None


def literal_value(v) -> float | None:
    """The value of a one-element literal operand, else None."""
    if isinstance(v, Literal):
        arr = np.asarray(v.val)
        if arr.size == 1:
            return float(arr.reshape(()))
    return None


def bind(eqn, invals) -> list:
    """Runs one traced equation on `invals` (its primitive with its own parameters, under its
    context); its outputs as a list."""
    with eqn.ctx.manager:
        outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
    return list(outs) if eqn.primitive.multiple_results else [outs]


def run_equations(eqns, in_vars, vals, out_var):
    """The value of `out_var` after running `eqns` (in order) on `in_vars` bound to `vals`."""
    env = dict(zip(in_vars, vals))
    for eqn in eqns:
        outs = bind(eqn, [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars])
        env.update(zip(eqn.outvars, outs))
    return env[out_var]
