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
