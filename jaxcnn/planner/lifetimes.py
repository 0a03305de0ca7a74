"""Buffer lifetimes from a jaxpr: each intermediate value is a rectangle of
[first step, last step] x size, steps being equation order in the flattened program."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import numpy as np
from jax.extend import core as jex_core

# Equation params that hold a sub-program to inline (pjit, custom_jvp/vjp, closed_call, remat).
SUB_JAXPR_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


@dataclass(frozen=True)
class Buffer:
    name: str
    size_bytes: int
    start: int  # step that defines it
    end: int  # last step that reads it (inclusive)


def _aval_bytes(aval) -> int:
    shape = getattr(aval, "shape", None)
    if shape is None:
        return 0
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def _sub_jaxpr(eqn):
    for key in SUB_JAXPR_PARAMS:
        sub = eqn.params.get(key)
        if sub is not None:
            return getattr(sub, "jaxpr", sub)
    return None


def jaxpr_buffers(fn: Callable, *args) -> list[Buffer]:
    """Intermediates of fn(*args) with program-order lifetimes; calls are inlined, inputs and
    outputs excluded (they live for the whole call)."""
    closed = jax.make_jaxpr(fn)(*args)
    first: dict[int, tuple[str, int, int]] = {}
    last: dict[int, int] = {}
    step = 0

    def walk(jaxpr, alias: dict):
        nonlocal step
        for eqn in jaxpr.eqns:
            ins = [alias.get(id(v), id(v)) for v in eqn.invars if not isinstance(v, jex_core.Literal)]
            sub = _sub_jaxpr(eqn)
            if sub is not None:
                inner = {id(iv): outer for iv, outer in zip(sub.invars, ins)}
                walk(sub, inner)
                for ov, inner_out in zip(eqn.outvars, sub.outvars):
                    alias[id(ov)] = inner.get(id(inner_out), id(inner_out))
                continue
            for v in ins:
                last[v] = step
            for v in eqn.outvars:
                first[id(v)] = (f"{eqn.primitive.name}_{step}", _aval_bytes(v.aval), step)
            step += 1

    top: dict = {}
    walk(closed.jaxpr, top)
    outputs = {top.get(id(v), id(v)) for v in closed.jaxpr.outvars}
    return [
        Buffer(name, size, start, last.get(key, start))
        for key, (name, size, start) in first.items()
        if key not in outputs and size > 0
    ]


def live_bytes_lower_bound(buffers: list[Buffer]) -> int:
    """max over steps of the bytes alive at that step: no packing can use less."""
    if not buffers:
        return 0
    steps = max(b.end for b in buffers) + 2
    delta = np.zeros(steps, dtype=np.int64)
    for b in buffers:
        delta[b.start] += b.size_bytes
        delta[b.end + 1] -= b.size_bytes
    return int(np.cumsum(delta).max())
