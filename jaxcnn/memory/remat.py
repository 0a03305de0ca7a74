"""Rematerialization advice: which activations of a zoo model's training step to recompute
(jax.checkpoint policies) so the step fits a memory budget, at the fewest recomputed FLOPs.

Candidate policies (`candidate_policies`), from cheapest to most recompute:
  none                no checkpointing (the plain step);
  layers_save_convs   each layer in jax.checkpoint(dots_saveable): conv/dense results are kept,
                      their bias + activation epilogues are recomputed;
  blocks              each block (fire, inception, bottleneck, inverted residual) in
                      jax.checkpoint(nothing_saveable): only block inputs are kept, the block
                      body is recomputed in its backward (models with blocks only);
  layers              each layer in jax.checkpoint(nothing_saveable): layer inputs are kept,
                      every layer is recomputed once in its backward;
  every_K             the whole forward in jax.checkpoint(save_only_these_names(...)) keeping
                      the outputs of every K-th layer (named with checkpoint_name);
  nothing             the whole forward in jax.checkpoint(nothing_saveable).

For each, `remat_advice` reports
  recompute_flops     the analytic estimate from the layer table (flops of the layers the policy
                      recomputes; epilogues count one op per output element);
  residual_bytes      the bytes the forward pass saves for the backward (the leaves of jax.vjp's
                      pullback, params included);
  predicted           plain footprint + (live-bytes bound of the step's jaxpr under the policy -
                      that bound without it): program order is where jax puts the recompute;
  predicted_residuals plain footprint - (residual_bytes without the policy - with it): the
                      footprint if the recompute needed no more memory than it frees (a
                      scheduler that recomputes each value right before its use);
  measured            the footprint of the compiled step (planner.footprint.footprint_bytes).
It picks the candidate with the fewest recompute_flops whose *measured* footprint fits.

Measured and predicted differ where the compiler changes the program: XLA's CPU pipeline
expands jax's optimization barriers before a late CSE pass, which merges the recomputation
back into the forward pass, so on CPU most policies measure like `none`; the GPU pipeline
removes the barriers only after scheduling, so the recompute stays.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import jax
from jax.ad_checkpoint import checkpoint_name

from jaxcnn.models.backends import get_ops
from jaxcnn.models.layers import LayerInfo, Net
from jaxcnn.memory import training
from jaxcnn.memory.batch import compile_stats, parse_bytes
from jaxcnn.memory.donation import jit as donating_jit
from jaxcnn.memory.lifetimes import jaxpr_buffers, live_bytes_lower_bound

SCOPES = ("none", "layers", "blocks", "model")
EVERY_K = (2, 4)
# Ops whose layer output is the end of a bias + activation epilogue.
_EPILOGUE_OPS = ("conv2d", "dense")


@dataclass(frozen=True)
class RematPolicy:
    """Where jax.checkpoint goes (scope) and what it may save (policy; save_names for 'model')."""

    name: str
    scope: str
    policy: Callable | None
    description: str
    save_names: tuple[str, ...] = ()

    def recompute_flops(self, layers: list[LayerInfo]) -> int:
        """Analytic FLOPs recomputed in the backward pass (module doc)."""
        if self.scope == "none":
            return 0
        if self.name == "layers_save_convs":
            return sum(math.prod(l.output_shape) if l.op in _EPILOGUE_OPS else l.flops for l in layers)
        if self.scope == "layers":
            return sum(l.flops for l in layers)
        if self.scope == "blocks":
            return sum(l.flops for l in layers if l.block is not None)
        saved = set(self.save_names)
        # A saved output still needs its layer's pre-activation for the activation's derivative.
        return sum(l.flops for l in layers if l.name not in saved or l.activation is not None)


class _NamedNet(Net):
    """Net whose layer outputs carry checkpoint_name(layer name) and whose blocks may run in
    jax.checkpoint."""

    def __init__(self, ops, params, block_policy=None):
        super().__init__(ops, params)
        self._block_policy = block_policy

    def _run(self, name, op, inputs, weights=(), **attributes):
        return checkpoint_name(super()._run(name, op, inputs, weights, **attributes), name)

    def block(self, kind, name, body, x, **kwargs):
        if self._block_policy is None:
            return super().block(kind, name, body, x, **kwargs)
        run = lambda x_: Net.block(self, kind, name, body, x_, **kwargs)  # noqa: E731
        return jax.checkpoint(run, policy=self._block_policy)(x)


def _checkpointed_ops(ops: dict[str, Callable], policy: Callable) -> dict[str, Callable]:
    """The op table with every op (its arrays; attributes static) in its own jax.checkpoint."""
    def wrap(fn):
        def op(*arrays, **attributes):
            return jax.checkpoint(functools.partial(fn, **attributes), policy=policy)(*arrays)
        return op
    return {name: wrap(fn) for name, fn in ops.items()}


def remat_forward(model, policy: RematPolicy, *, backend: str = "xla") -> Callable:
    """forward(params, images) -> logits with `policy` applied."""
    spec = training._spec(model)
    ops = get_ops(backend)
    if policy.scope == "layers":
        ops = _checkpointed_ops(ops, policy.policy)

    def forward(params, images):
        net = _NamedNet(ops, params, policy.policy if policy.scope == "blocks" else None)
        if policy.scope != "model":
            return spec.body(net, images)
        return jax.checkpoint(lambda p, x: spec.body(_NamedNet(ops, p), x), policy=policy.policy)(params, images)

    return forward


def candidate_policies(model, batch: int = 1) -> list[RematPolicy]:
    """The candidates of the module doc for this model (blocks only where it has blocks)."""
    spec = training._spec(model)
    layers = spec.layers(batch)
    cp = jax.checkpoint_policies
    out = [
        RematPolicy("none", "none", None, "no checkpointing"),
        RematPolicy("layers_save_convs", "layers", cp.dots_saveable,
                    "per-layer checkpoint saving conv/dense results: recompute epilogues"),
    ]
    if any(l.block is not None for l in layers):
        out.append(RematPolicy("blocks", "blocks", cp.nothing_saveable,
                               "per-block checkpoint: keep block inputs, recompute block bodies"))
    out.append(RematPolicy("layers", "layers", cp.nothing_saveable,
                           "per-layer checkpoint: keep layer inputs, recompute every layer"))
    names = [l.name for l in layers]
    for k in EVERY_K:
        if k < len(names):
            saved = tuple(names[k - 1::k])
            out.append(RematPolicy(f"every_{k}", "model", cp.save_only_these_names(*saved),
                                   f"whole-forward checkpoint keeping every {k}th layer output", saved))
    out.append(RematPolicy("nothing", "model", cp.nothing_saveable,
                           "whole-forward checkpoint keeping nothing: recompute the forward"))
    return out


@dataclass(frozen=True)
class RematRow:
    policy: str
    description: str
    recompute_flops: int
    residual_bytes: int
    predicted: int  # footprint bytes, program-order model
    predicted_residuals: int  # footprint bytes, residual model
    measured: int | None  # None: not compiled
    fits: bool | None


@dataclass(frozen=True)
class RematAdvice:
    model: str
    batch: int
    budget_bytes: int
    rows: tuple[RematRow, ...]
    chosen: str | None  # None: no candidate fits

    def row(self, policy: str) -> RematRow:
        return next(r for r in self.rows if r.policy == policy)

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(model=self.model, batch=self.batch, budget_bytes=self.budget_bytes,
                     chosen=r.policy == self.chosen, **r.__dict__) for r in self.rows]

    def explain(self) -> str:
        mib = lambda n: "-" if n is None else f"{n / 2**20:.2f}"  # noqa: E731
        lines = [f"{self.model} batch {self.batch}: budget {self.budget_bytes / 2**20:.2f} MiB -> "
                 + (f"use '{self.chosen}'" if self.chosen else "no candidate policy fits"),
                 f"  {'policy':18s} {'recompute GFLOP':>15s} {'residual MiB':>12s} {'predicted MiB':>13s} "
                 f"{'pred. resid. MiB':>16s} {'measured MiB':>12s}  fits"]
        for r in self.rows:
            fits = "-" if r.fits is None else "yes" if r.fits else "no"
            lines.append(f"  {r.policy:18s} {r.recompute_flops / 1e9:15.3f} {mib(r.residual_bytes):>12s} "
                         f"{mib(r.predicted):>13s} {mib(r.predicted_residuals):>16s} {mib(r.measured):>12s}  {fits}"
                         + ("  <- chosen" if r.policy == self.chosen else ""))
        return "\n".join(lines)


def _residual_bytes(forward: Callable, params, images) -> int:
    pullback = jax.eval_shape(lambda p, x: jax.vjp(forward, p, x)[1], params, images)
    return sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree.leaves(pullback))


def remat_advice(model, budget_bytes: int | str, *, batch: int, dtype="float32", optimizer="sgd_momentum",
                 backend: str = "xla", policies: list[RematPolicy] | None = None,
                 measure_all: bool = False) -> RematAdvice:
    """Cheapest candidate policy (fewest recompute_flops) whose measured footprint fits.

    The training step donates params and optimizer state (jaxcnn.jit). With measure_all=False
    compiling stops at the first fitting candidate (the rest have measured=None)."""
    spec = training._spec(model)
    budget = parse_bytes(budget_bytes)
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    policies = candidate_policies(spec, batch) if policies is None else list(policies)
    if not policies:
        raise ValueError("policies is empty")
    layers = spec.layers(batch, dtype)
    args = training.training_args(spec, batch, dtype, optimizer)
    params, images = args[0], args[2]

    def step_for(policy):
        return training.train_step(spec, optimizer, forward=remat_forward(spec, policy, backend=backend))

    def bound(policy) -> int:
        return live_bytes_lower_bound(jaxpr_buffers(step_for(policy), *args))

    plain = RematPolicy("none", "none", None, "no checkpointing")
    plain_measured = compile_stats(lambda b: (donating_jit(step_for(plain)), args), batch)["footprint_bytes"]
    plain_bound = bound(plain)
    plain_residuals = _residual_bytes(remat_forward(spec, plain, backend=backend), params, images)

    order = sorted(policies, key=lambda p: p.recompute_flops(layers))
    rows, chosen = [], None
    for policy in order:
        predicted = plain_measured + bound(policy) - plain_bound
        measured = None
        if measure_all or chosen is None:
            measured = (plain_measured if policy.scope == "none" else
                        compile_stats(lambda b: (donating_jit(step_for(policy)), args), batch)["footprint_bytes"])
            if chosen is None and measured <= budget:
                chosen = policy.name
        residuals = _residual_bytes(remat_forward(spec, policy, backend=backend), params, images)
        rows.append(RematRow(
            policy=policy.name, description=policy.description, recompute_flops=policy.recompute_flops(layers),
            residual_bytes=residuals, predicted=predicted,
            predicted_residuals=plain_measured - (plain_residuals - residuals),
            measured=measured, fits=None if measured is None else measured <= budget,
        ))
    return RematAdvice(spec.name, batch, budget, tuple(rows), chosen)
