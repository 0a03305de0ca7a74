"""The rewritten program's weight prologue: every rewritten conv whose epilogue folds into its
weights (inference BatchNorm, a scaled bias) takes its folded weights and bias from one
jaxcnn.fold_weights at the start of the program.

Folded site by site, each conv costs one or two XLA kernels per call for the fold (plus XLA's
own transpose of the weights to its cuDNN layout): at N=1 a ResNet's convs spend about as long
in those small kernels as in the convolutions. The prologue folds, casts and lays out every
weight at once, in the layout its conv reads: OHWI for XLA's 16-bit NHWC convs (cuDNN's KRSC,
so XLA transposes nothing), OIHW for NCHW ones, HWIO for jaxcnn's kernels.

A site takes part when its weight and per-channel vectors derive from the program's inputs
alone (parameters, not activations): the equations computing them move ahead of the fold. A
fused group whose convs all fold (an expand -> depthwise chain with BatchNorm after both)
takes part the same way: its match names the conv matches it fuses (`fold_parts`) and how to
build it from their folded HWIO weights and biases (`prefolded_build`).
A site's candidates that would run on the prologue's weights are measured that way
(`prologue_candidate`): the conv on weights folded beforehand, plus the site's share of the one
fold (its fold alone, less the same fold of a constant one-element-per-channel weight: the launch
and the factor computations, which the program pays once for all sites). Timed
with a fold of their own, small convs lose to XLA by that fold's launch at batch 1. A site
whose weights turn out not to come from parameters folds on its own; the whole-program check
measures the program with its prologue either way.

Weights the function closes over (constants of its jaxpr, e.g. a Keras model called inside
jax.jit, whose variables trace as constants) fold once, when the program is traced: the folds
and the equations before them whose inputs are all concrete run eagerly
(jax.ensure_compile_time_eval), so the compiled program holds the folded weights as constants
and runs no fold at all. Such a site's candidates are measured on folded weights with no share
of a fold (`prologue_candidate(..., constant=True)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.extend.core import Literal, Var

from jaxcnn.ops.conv2d.api import conv2d
from jaxcnn.ops.conv2d.config import HANDLER_ALGORITHM, make_config
from jaxcnn.ops.conv2d.reference import xla_conv2d
from jaxcnn.ops.weights.fold import fold_weights
from jaxcnn.optimize.epilogue_patterns import Epilogue, fold_affine
from jaxcnn.tuning.decision import Candidate

HWIO = (0, 1, 2, 3)
# HWIO -> the weight layout XLA's conv reads without a transpose, by activation layout (16-bit
# convs: XLA runs fp32 ones in a layout of its own choosing, so they get HWIO and XLA's transpose).
# Grouped (depthwise) convs keep HWIO, the layout the frameworks trace them in: XLA autotunes a
# depthwise conv read in OHWI several times as long (docs/results.md, "First call"), which every
# first call and every later process's compile would pay.
XLA_WEIGHT_LAYOUT = {"NHWC": ("OHWI", (3, 0, 1, 2)), "NCHW": ("OIHW", (3, 2, 0, 1))}


@dataclass
class FoldSite:
    """What the prologue needs of a conv match whose epilogue folds into its weights."""

    epilogue: Epilogue
    w: Var  # the weight operand, in the user's axis order
    to_hwio: tuple[int, ...]  # the weight's axes in HWIO order
    w_hwio_shape: tuple[int, ...]
    dtype: Any  # x's dtype: the folded weights' and bias's
    out_dtype: Any
    conv_kwargs: dict

    @property
    def k(self) -> int:
        return self.w_hwio_shape[3]

    def target(self, algorithm: str) -> tuple[str, tuple[int, ...]]:
        """(weight spec, its axes in HWIO order) the algorithm's conv reads."""
        if algorithm == "xla" and jnp.dtype(self.dtype).itemsize == 2 and self.conv_kwargs["groups"] == 1:
            return XLA_WEIGHT_LAYOUT.get(self.conv_kwargs["layout"], ("HWIO", HWIO))
        return "HWIO", HWIO

    def build(self, algorithm: str, weight_spec: str) -> Callable:
        """(x, folded weight in weight_spec, bias, [residual]) -> the match's output."""
        kwargs, out_dtype = self.conv_kwargs, self.out_dtype

        def run(x, w, bias, *residual):
            r = residual[0] if residual else None
            if algorithm == "xla":
                cfg = make_config(x.shape, self.w_hwio_shape, algorithm="xla", **kwargs)
                y = xla_conv2d(x, w, bias, cfg, residual=r, weight_spec=weight_spec)
            else:
                algo = HANDLER_ALGORITHM if algorithm == "auto" else algorithm
                y = conv2d(x, w, bias, residual=r, algorithm=algo, **kwargs)
            return y.astype(out_dtype)

        return run


def _fold_job(fold: FoldSite, perm: tuple, vector_values: dict) -> tuple:
    """One site's fold_weights entries: (scale, scale axis, permutation of the user's weight, dtype,
    shift) for its weight laid out in `perm` (axes in HWIO order)."""
    scale, shift = fold_affine(fold.epilogue.steps, vector_values, fold.k)
    return scale, fold.to_hwio[3], tuple(fold.to_hwio[p] for p in perm), fold.dtype, shift


def _fold_one(fold: FoldSite, perm: tuple, w, vector_values: dict) -> list:
    """fold_weights on one site: [its weight in `perm` (axes in HWIO order), its bias]."""
    scale, axis, w_perm, dtype, shift = _fold_job(fold, perm, vector_values)
    return fold_weights([w], [scale], [axis], [w_perm], [dtype], vectors=[shift], vector_dtypes=[dtype])


def prologue_candidate(name: str, fold: FoldSite, algorithm: str, constant: bool = False) -> Candidate:
    """The decision-owner candidate of a conv site run as the prologue runs it: on inputs
    (x, w, *vectors, [residual]) (the match's in_vars), the conv with `algorithm` on the weight
    and bias folded beforehand in its layout, plus this site's share of the one fold; with
    `constant` (weights and vectors the program's constants: folded once, at trace time) no share."""
    spec, perm = fold.target(algorithm)
    n_vectors = len(fold.epilogue.vectors)

    def split(vals):
        x, w, rest = vals[0], vals[1], vals[2:]
        return x, w, dict(zip(fold.epilogue.vectors, rest[:n_vectors])), tuple(rest[n_vectors:])

    def prepare(*vals):
        x, w, vectors, residual = split(vals)
        return (x, *_fold_one(fold, perm, w, vectors), *residual)

    def shared(*vals):
        _, w, vectors, _ = split(vals)
        return _fold_one(fold, perm, w, vectors)

    def floor(*vals):
        _, w, vectors, _ = split(vals)
        shape = [1, 1, 1, 1]
        shape[fold.to_hwio[3]] = fold.k
        return _fold_one(fold, perm, jnp.ones(shape, w.dtype), vectors)

    # The site's candidates reading the same weight layout share one fold (prepared_as).
    if constant:
        return Candidate(name, fold.build(algorithm, spec), prepare=prepare, prepared_as=spec)
    return Candidate(name, fold.build(algorithm, spec), prepare=prepare, shared=shared, shared_floor=floor,
                     prepared_as=spec)


def _concrete(value) -> bool:
    return not isinstance(value, jax.core.Tracer)


def derives_from_constants(uses, roots) -> bool:
    """Whether every value of `roots` is computed, without effects, from the jaxpr's constants
    and literals alone (no input): then it is concrete when the program is traced."""
    constants = {id(v) for v in uses.jaxpr.constvars}
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        v = stack.pop()
        if isinstance(v, Literal) or id(v) in constants or id(v) in seen:
            continue
        seen.add(id(v))
        index = uses.producer.get(v)
        if index is None or uses.jaxpr.eqns[index].effects:
            return False
        stack.extend(u for u in uses.jaxpr.eqns[index].invars if isinstance(u, Var))
    return True


class _Folded:
    """An environment key: a site's folded weight or bias, put there by the prologue."""

    __slots__ = ("what",)

    def __init__(self, what: str):
        self.what = what  # "w" or "b"

    def __repr__(self) -> str:
        return f"<folded {self.what}>"


@dataclass
class WeightPrologue:
    """The plan's prologue: early equations, then one fold of every taking-part conv."""

    early: list[int] = field(default_factory=list)  # equation indices, in program order
    # one per folded conv: (its FoldSite, its target axes in HWIO order, weight key, bias key)
    folds: list[tuple[FoldSite, tuple, Any, Any]] = field(default_factory=list)
    # per match (by its last equation index): (in_vars, build) replacing the match's own
    replaced: dict[int, tuple[tuple, Callable]] = field(default_factory=dict)
    constant: int = 0  # folds whose weight and vectors are the program's constants (folded when traced)

    def fold(self, fold: FoldSite, perm: tuple) -> tuple:
        """Adds a conv's fold; its (weight, bias) environment keys."""
        keys = (_Folded("w"), _Folded("b"))
        self.folds.append((fold, perm, *keys))
        return keys

    def run(self, env: dict, bind_eqn: Callable, eqns) -> None:
        """The early equations, then the folds. Where all of an equation's or a fold's inputs
        are concrete (the program's constants), it runs now, eagerly, and its results enter the
        traced program as constants; the rest folds in one fold_weights of the program."""
        for i in self.early:
            if all(_concrete(v.val if isinstance(v, Literal) else env[v]) for v in eqns[i].invars):
                with jax.ensure_compile_time_eval():
                    bind_eqn(eqns[i], env)
            else:
                bind_eqn(eqns[i], env)
        constant, traced = [], []
        for entry in self.folds:
            fold = entry[0]
            inputs = [env[fold.w], *(env[v] for v in fold.epilogue.vectors)]
            (constant if all(map(_concrete, inputs)) else traced).append(entry)
        if constant:
            with jax.ensure_compile_time_eval():
                self._fold(env, constant)
        if traced:
            self._fold(env, traced)

    @staticmethod
    def _fold(env: dict, folds: list) -> None:
        """One fold_weights of `folds`, its outputs put in env under their keys."""
        ws, scales, axes, perms, dtypes, shifts, w_keys, b_keys = [], [], [], [], [], [], [], []
        for fold, perm, w_key, b_key in folds:
            scale, axis, w_perm, dtype, shift = _fold_job(fold, perm, {v: env[v] for v in fold.epilogue.vectors})
            ws.append(env[fold.w])
            scales.append(scale)
            axes.append(axis)
            perms.append(w_perm)
            dtypes.append(dtype)
            shifts.append(shift)
            w_keys.append(w_key)
            b_keys.append(b_key)
        outs = fold_weights(ws, scales, axes, perms, dtypes, vectors=shifts, vector_dtypes=dtypes)
        env.update(zip([*w_keys, *b_keys], outs))


def _param_slice(plan, roots, inputs: set[int], blocked: set[int]) -> set[int] | None:
    """The equations computing `roots` from the plan's inputs, or None where a root depends on
    anything else (an activation, an effect, a rewritten equation)."""
    producer = plan.found.uses.producer
    need: set[int] = set()
    stack = list(roots)
    while stack:
        v = stack.pop()
        if isinstance(v, Literal) or id(v) in inputs:
            continue
        index = producer.get(v)
        if index is None or index in blocked:
            return None
        if index in need:
            continue
        eqn = plan.jaxpr.eqns[index]
        if eqn.effects:
            return None
        need.add(index)
        stack.extend(u for u in eqn.invars if isinstance(u, Var))
    return need


def plan_weight_prologue(plan) -> WeightPrologue | None:
    """The prologue of plan's conv matches that fold (None when none takes part)."""
    if plan.found is None:
        return None
    inputs = {id(v) for v in (*plan.jaxpr.invars, *plan.jaxpr.constvars)}
    blocked = set(plan.skipped) | set(plan.matches) | set(plan.calls)
    prologue = WeightPrologue()
    early: set[int] = set()
    for last, m in sorted(plan.matches.items()):
        if m.algorithm in (None, "sparse"):
            continue
        parts = [m] if m.op == "conv2d" else list(m.fold_parts)
        folds = [p.fold for p in parts]
        if not folds or None in folds or (m.op != "conv2d" and m.prefolded_build is None):
            continue
        needs = [_param_slice(plan, [f.w, *f.epilogue.vectors], inputs, blocked) for f in folds]
        if None in needs:
            continue
        early = early.union(*needs)
        prologue.constant += sum(derives_from_constants(plan.found.uses, [f.w, *f.epilogue.vectors]) for f in folds)
        if m.op == "conv2d":
            (fold,) = folds
            spec, perm = fold.target(m.algorithm)
            residual = (fold.epilogue.residual,) if fold.epilogue.residual is not None else ()
            prologue.replaced[last] = ((m.in_vars[0], *prologue.fold(fold, perm), *residual),
                                       fold.build(m.algorithm, spec))
        else:  # a fused group: its kernel reads HWIO weights
            keys = [k for f in folds for k in prologue.fold(f, HWIO)]
            prologue.replaced[last] = ((m.in_vars[0], *keys), m.prefolded_build)
    if not prologue.folds:
        return None
    prologue.early = sorted(early)
    return prologue
