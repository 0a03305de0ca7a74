"""The multiply-add FLOPs of a traced program, counted from its jaxpr: every conv and matmul
(2 FLOPs per multiply-add), in call bodies too. The roofline's compute floor where XLA's cost
analysis reports none (it returns no "flops" for GPU programs in recent jax); elementwise work
is left out, as it is memory-bound next to the convs."""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
from jax.extend import core


def _sub_jaxprs(eqn) -> list:
    out = []
    for value in eqn.params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, core.ClosedJaxpr):
                out.append(v.jaxpr)
            elif isinstance(v, core.Jaxpr):
                out.append(v)
    return out


def _eqn_flops(eqn) -> int:
    name = eqn.primitive.name
    if name == "conv_general_dilated":
        lhs, rhs = (v.aval.shape for v in eqn.invars)
        rhs_spec = eqn.params["dimension_numbers"].rhs_spec  # (out, in, spatial...)
        per_output = rhs[rhs_spec[1]] * math.prod(rhs[a] for a in rhs_spec[2:])
        return 2 * math.prod(eqn.outvars[0].aval.shape) * per_output
    if name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        return 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[a] for a in lhs_contract)
    return 0


def jaxpr_flops(jaxpr) -> int:
    """FLOPs of the convs and matmuls of `jaxpr` (a Jaxpr or ClosedJaxpr) and its call bodies."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0
    for eqn in jaxpr.eqns:
        total += _eqn_flops(eqn)
        for sub in _sub_jaxprs(eqn):
            total += jaxpr_flops(sub)
    return total


def function_flops(fn: Callable, *args: Any) -> int:
    """FLOPs of fn(*args) as jaxpr_flops counts them."""
    return jaxpr_flops(jax.make_jaxpr(fn)(*args))
