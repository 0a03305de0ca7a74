"""Buffer lifetimes from a jaxpr: each intermediate value is a rectangle of
[first step, last step] x size, steps being equation order in the flattened program.

Calls (pjit, closed_call, custom_jvp_call, custom_vjp_call, remat/checkpoint, shard_map...) are
inlined: their equations take their own steps, their parameters and results are the caller's
values. Control flow keeps one copy of each body intermediate, since XLA reuses it on every
iteration or runs one branch only:

- scan: the loop state (final carry) and the stacked outputs `ys` are buffers sized from the
  outer avals, defined when the loop starts and alive until it ends (the loop writes them on
  every iteration); the body's intermediates are laid out once, over the body's steps; consts
  and `xs` are read until the loop ends (the body reads a slice of `xs` in place);
- while: like scan with the cond computation first, then the body, both once;
- cond: one branch runs, so each branch's intermediates may share bytes with the others':
  branches are laid out one after the other in time (branch 0 first, as in `branches`), while
  the operands and the outputs (defined when the cond starts) stay alive across all of them. The
  live-bytes bound is then the max over branches, not the sum (laying the branches over the
  same steps would reserve the sum).
"""

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


def _open(jaxpr):
    """The Jaxpr of a Jaxpr or ClosedJaxpr (whose consts are not intermediates)."""
    return getattr(jaxpr, "jaxpr", jaxpr)


def _sub_jaxpr(eqn):
    for key in SUB_JAXPR_PARAMS:
        sub = eqn.params.get(key)
        if sub is not None:
            return _open(sub)
    return None


class _Walker:
    """Flattens a jaxpr into steps; `records[key] = [name, size, start, end]` per intermediate.
    Variables map to buffer keys through `env` dicts; None stands for a literal, a const or a
    program input (not an intermediate: never recorded)."""

    def __init__(self):
        self.step = 0
        self.records: dict[int, list] = {}
        self.names: set[str] = set()

    def read(self, key, step: int) -> None:
        if key is not None:
            rec = self.records[key]
            rec[3] = max(rec[3], step)

    def define(self, name: str, aval, step: int) -> int:
        key = len(self.records)
        if name in self.names:  # a nested loop's first equation may share prim and step
            name = f"{name}.{key}"
        self.names.add(name)
        self.records[key] = [name, _aval_bytes(aval), step, step]
        return key

    def define_outs(self, eqn, step: int) -> list[int]:
        prim = eqn.primitive.name
        outs = eqn.outvars
        names = [f"{prim}_{step}"] if len(outs) == 1 else [f"{prim}_{step}#{i}" for i in range(len(outs))]
        return [self.define(n, v.aval, step) for n, v in zip(names, outs)]

    def walk(self, jaxpr, env: dict) -> None:
        def key_of(v):
            return None if isinstance(v, jex_core.Literal) else env.get(v)

        for eqn in jaxpr.eqns:
            ins = [key_of(v) for v in eqn.invars]
            prim = eqn.primitive.name
            if prim == "scan":
                outs = self.scan(eqn, ins)
            elif prim == "while":
                outs = self.while_loop(eqn, ins)
            elif prim == "cond":
                outs = self.cond(eqn, ins)
            elif (sub := _sub_jaxpr(eqn)) is not None:
                inner = dict(zip(sub.invars, ins))
                self.walk(sub, inner)
                outs = [None if isinstance(v, jex_core.Literal) else inner.get(v) for v in sub.outvars]
            else:
                for k in ins:
                    self.read(k, self.step)
                outs = self.define_outs(eqn, self.step)
                self.step += 1
            env.update(zip(eqn.outvars, outs))

    def _body(self, jaxpr, env: dict) -> list:
        """Walk a control-flow body; the keys its results are read from."""
        jaxpr = _open(jaxpr)
        self.walk(jaxpr, env)
        return [None if isinstance(v, jex_core.Literal) else env.get(v) for v in jaxpr.outvars]

    def _close_loop(self, start: int, reads: list, outs: list, results: list) -> None:
        # The loop runs steps [start, end]: the state, the outputs and everything the body reads
        # from outside stay alive to its end; the body's results are copied into the state last.
        end = max(self.step - 1, start)
        self.step = end + 1
        for k in reads + outs + results:
            self.read(k, end)

    def scan(self, eqn, ins: list) -> list:
        n_consts, n_carry = eqn.params["num_consts"], eqn.params["num_carry"]
        start = self.step
        consts, init, xs = ins[:n_consts], ins[n_consts:n_consts + n_carry], ins[n_consts + n_carry:]
        for k in init:
            self.read(k, start)  # copied into the loop state when the loop starts
        outs = self.define_outs(eqn, start)
        body = _open(eqn.params["jaxpr"])
        # Body inputs: consts and xs slices read the outer buffers, the carry is the loop state.
        env = dict(zip(body.invars, consts + outs[:n_carry] + xs))
        results = self._body(body, env)
        self._close_loop(start, consts + xs, outs, results)
        return outs

    def while_loop(self, eqn, ins: list) -> list:
        n_cond, n_body = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
        start = self.step
        cond_consts, body_consts, init = ins[:n_cond], ins[n_cond:n_cond + n_body], ins[n_cond + n_body:]
        for k in init:
            self.read(k, start)
        outs = self.define_outs(eqn, start)
        cond, body = _open(eqn.params["cond_jaxpr"]), _open(eqn.params["body_jaxpr"])
        predicate = self._body(cond, dict(zip(cond.invars, cond_consts + outs)))
        results = self._body(body, dict(zip(body.invars, body_consts + outs)))
        self._close_loop(start, cond_consts + body_consts, outs, predicate + results)
        return outs

    def cond(self, eqn, ins: list) -> list:
        start = self.step
        outs = self.define_outs(eqn, start)
        for branch in eqn.params["branches"]:
            branch = _open(branch)
            results = self._body(branch, dict(zip(branch.invars, ins[1:])))
            # A branch's results are copied into the cond's outputs at the end of its own steps,
            # so they do not overlap the next branch's buffers.
            for k in results:
                self.read(k, max(self.step - 1, start))
        # Operands and outputs stay alive across every branch's steps.
        self._close_loop(start, ins, outs, [])
        return outs


def jaxpr_buffers(fn: Callable, *args) -> list[Buffer]:
    """Intermediates of fn(*args) with program-order lifetimes (module docstring: calls, scan,
    while, cond); inputs and outputs are excluded (they live for the whole call)."""
    closed = jax.make_jaxpr(fn)(*args)
    walker = _Walker()
    top: dict = {}
    walker.walk(closed.jaxpr, top)
    outputs = {top.get(v) for v in closed.jaxpr.outvars if not isinstance(v, jex_core.Literal)}
    return [
        Buffer(name, size, start, end)
        for key, (name, size, start, end) in walker.records.items()
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
