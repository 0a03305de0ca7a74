"""A conv match (a conv with its epilogue) as a site for the decision owner (jaxcnn.tuning):
its candidates, cache key and rule.

Candidates:
  "xla"          the matched equations exactly as traced (the baseline: no rewrite);
  "xla_folded"   XLA's conv with the epilogue's affine steps folded into weights and bias, then
                 bias, residual and activation as XLA fuses them (only where there is
                 something to fold);
  "jaxcnn:<alg>" jaxcnn.conv2d with the whole epilogue in the kernel, `alg` as conv2d takes it
                 ("auto" lets the library pick the family; the Hopper wgmma and stem kernels
                 are tried by name where their plan takes the shape).
Where the epilogue folds (BatchNorm), the two replacements are measured as the program's weight
prologue runs them (weight_prologue.prologue_candidate): on weights folded beforehand, plus the
site's share of the program's one fold; with no share where the weights and vectors are the
program's constants (folded once, when the program is traced).
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
from jaxcnn.optimize.jaxpr_reading import run_equations
from jaxcnn.optimize.patterns import Match, Uses
from jaxcnn.optimize.policy import unpooled_plan
from jaxcnn.optimize.weight_prologue import derives_from_constants, prologue_candidate
from jaxcnn.tuning.decision import BASELINE, Candidate, Site, fingerprint

FOLDED = "xla_folded"
OURS = "jaxcnn:"


def subgraph_fn(uses: Uses, match: Match) -> Callable:
    """The match's equations as traced, as a function of match.in_vars."""
    eqns = [uses.jaxpr.eqns[i] for i in sorted(match.eqn_indices)]
    return lambda *vals: run_equations(eqns, match.in_vars, vals, match.out_var)


def formulation(names, in_vars) -> str:
    """A site's formulation in its cache key: the primitives it replaces and its inputs' shapes
    and dtypes, hashed (a site traced differently is measured again)."""
    return fingerprint(" ".join(names) + " | " + " ".join(
        f"{tuple(v.aval.shape)}:{jnp.dtype(v.aval.dtype).name}" for v in in_vars))


def kernel_algorithms(match: Match) -> list[str]:
    """conv2d algorithms worth measuring for this site besides "auto"."""
    extra = []
    for algorithm in ("wgmma", "stem"):
        if unpooled_plan(match.site, algorithm):
            extra.append(algorithm)
    return ["auto", *extra]


def conv_site(uses: Uses, match: Match, rule: Callable[[], tuple[str, str]]) -> Site:
    """The decision-owner Site for a conv match."""
    s = match.site
    names = [BASELINE] + ([FOLDED] if not match.plain else []) + [OURS + a for a in kernel_algorithms(match)]
    constant = _weights_constant(uses, match)
    candidates = [_candidate(uses, match, name, constant) for name in names]
    fields = dict(kind="conv_epilogue", x=list(s.x_shape), w=list(s.w_shape), dtype=s.dtype, layout=s.layout,
                  kwargs={k: v for k, v in s.kwargs.items()}, residual=s.residual, folded=s.folded,
                  formulation=formulation(match.replaced, match.in_vars), candidates=[c.name for c in candidates],
                  weights="constant" if constant else "prologue" if match.fold is not None else "own")
    return Site(fields, candidates, [v.aval for v in match.in_vars], rule)


def site_candidate(uses: Uses, match: Match, name: str) -> Candidate:
    """Candidate `name` of a conv match ("xla", "xla_folded" or "jaxcnn:<alg>" for any conv2d
    algorithm, also one conv_site does not measure), built as conv_site builds its candidates."""
    return _candidate(uses, match, name, _weights_constant(uses, match))


def _weights_constant(uses: Uses, match: Match) -> bool:
    """The match folds weights and vectors that are all the program's constants (folded once)."""
    return match.fold is not None and derives_from_constants(uses, [match.fold.w, *match.fold.epilogue.vectors])


def _candidate(uses: Uses, match: Match, name: str, constant: bool) -> Candidate:
    algorithm = algorithm_for(name)
    if algorithm is None:
        return Candidate(BASELINE, subgraph_fn(uses, match))
    if match.fold is not None:
        return prologue_candidate(name, match.fold, algorithm, constant)
    return Candidate(name, match.make_build(algorithm))


def algorithm_for(choice: str) -> str | None:
    """conv2d's algorithm for a decision's choice; None keeps the traced equations."""
    if choice == BASELINE:
        return None
    if choice == FOLDED:
        return "xla"
    if choice.startswith(OURS):
        return choice[len(OURS):]
    raise ValueError(f"unknown conv site choice {choice!r}")
