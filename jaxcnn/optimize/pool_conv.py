"""An average pool read only by a 1x1 conv runs after the conv instead: conv1x1(pool(x)) =
pool(conv1x1(x)).

The pool is a reduce_window_sum over the spatial axes, then any number of float converts and
multiplications or divisions by a value that does not depend on x and has one entry per pixel
at most (no channel axis): lax's sum / window size (Flax, Equinox), or the per-pixel count of
an average that leaves the padding out (Keras). Such a pool is linear and treats every channel
alike; a 1x1 conv (stride 1, no padding, one group) mixes the channels of each pixel alone. So
the two commute, and the pool can run on the conv's K output channels instead of its C input
channels. InceptionV3's pool branches average 192-2048 channels to feed 1x1 convs of 32-192:
XLA keeps the traced order, and its reduce_window fusions are slow on the wide side.

The match covers the pool's equations and the conv; what reads the conv (its BatchNorm, its
activation) stays as traced, after the pool, where XLA fuses it into the pool. Under
policy="auto" the decision owner (jaxcnn.tuning.decision) measures both orders on this GPU and
commutes only where that is faster; elsewhere policy.commute_pays decides by the channel counts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Literal, Var

from jaxcnn.optimize.conv_sites import formulation, subgraph_fn
from jaxcnn.optimize.jaxpr_reading import bind
from jaxcnn.optimize.patterns import Match, Site, Uses, match_pool, spec_layout
from jaxcnn.optimize.policy import commute_pays
from jaxcnn.tuning.decision import BASELINE, Candidate
from jaxcnn.tuning.decision import Site as DecisionSite

POOL_CONV = "pool_conv"  # the match's op
COMMUTED = "commuted"  # the decision's candidate: the conv first, then the pool
# Equations a pool's chain may hold between its sum and the conv: the scaling (the operand that
# is not the chain: a window size, a per-pixel count) and dtype changes between floats.
SCALING = ("mul", "div")
# How far back the scaling operand's producers are followed to prove it does not read x.
DEPENDENCY_LIMIT = 64


def match_pool_conv(uses: Uses, index: int) -> Match | None:
    """The pool whose sum is equation `index`, with the 1x1 conv that alone reads it, as a
    commutable pair; None where the pattern or its conditions (module docstring) do not hold."""
    eqns = uses.jaxpr.eqns
    head = eqns[index]
    x = head.invars[0]
    if not isinstance(x, Var) or x.aval.ndim != 4:
        return None
    chain = [(head, 0)]  # (equation, position of the pooled value among its operands)
    defined = uses.defining(x)
    if defined is not None and _is_float_convert(defined[1]) and uses.sole_reader(x) == index:
        chain.insert(0, (defined[1], 0))  # a 16-bit model's pool summing in float32
        x = defined[1].invars[0]
        if not isinstance(x, Var) or x.aval.ndim != 4:
            return None
    others = []  # the scaling operands (Vars) the match reads besides x and w
    var = head.outvars[0]
    while True:
        reader = uses.sole_reader(var)
        if reader is None:
            return None
        eqn = eqns[reader]
        name = eqn.primitive.name
        if name == "conv_general_dilated" and eqn.invars[0] is var:
            conv_index, conv = reader, eqn
            break
        if _is_float_convert(eqn):
            chain.append((eqn, 0))
        elif name in SCALING and var in eqn.invars and (name == "mul" or eqn.invars[0] is var):
            pos = list(eqn.invars).index(var)
            other = eqn.invars[1 - pos]
            if other is var:
                return None
            chain.append((eqn, pos))
            if isinstance(other, Var):
                others.append(other)
        else:
            return None
        var = eqn.outvars[0]
    w = conv.invars[1]
    geometry = _geometry(head, conv, w)
    if geometry is None or not _per_pixel(others, geometry["feature"], uses, x):
        return None
    if x.aval.dtype != conv.invars[0].aval.dtype:
        return None  # the conv would read x in another dtype than its weights
    indices = tuple(sorted([conv_index, *(uses.producer[e.outvars[0]] for e, _ in chain)]))
    if not uses.internal(indices, conv.outvars[0]):
        return None
    in_vars = (x, *dict.fromkeys(others), w)
    commuted = _commuted(chain, conv, in_vars)
    try:
        out = jax.eval_shape(commuted, *(v.aval for v in in_vars))
    except (TypeError, ValueError):
        return None
    target = conv.outvars[0].aval
    if out.shape != target.shape or out.dtype != target.dtype:
        return None
    c, k = geometry["c"], geometry["k"]
    site = Site(POOL_CONV, geometry["layout"], tuple(x.aval.shape), jnp.dtype(x.aval.dtype).name,
                w_shape=(1, 1, c, k), kwargs=dict(window=geometry["window"], stride=geometry["stride"],
                                                  padding=geometry["padding"]))
    replaced = tuple(eqns[i].primitive.name for i in indices)
    return Match(POOL_CONV, indices, conv.outvars[0], in_vars, site, replaced,
                 make_build=lambda algorithm: commuted)


def match_sum_pool(uses: Uses, index: int) -> Match | None:
    """A reduce_window_sum: the pool with its 1x1 conv where they commute, else the pool alone."""
    return match_pool_conv(uses, index) or match_pool(uses, index)


def _is_float_convert(eqn) -> bool:
    return (eqn.primitive.name == "convert_element_type" and jnp.issubdtype(eqn.invars[0].aval.dtype, jnp.floating)
            and jnp.issubdtype(eqn.outvars[0].aval.dtype, jnp.floating))


def _geometry(head, conv, w) -> dict | None:
    """The pool's spatial window, strides and padding and the conv's channels, where the conv is
    a 1x1 of stride 1 without padding or groups and the sum pools spatial axes only."""
    p, dn = conv.params, conv.params["dimension_numbers"]
    lhs, rhs = dn.lhs_spec, dn.rhs_spec
    if any(w.aval.shape[a] != 1 for a in rhs[2:]) or tuple(p["window_strides"]) != (1, 1):
        return None
    if any(tuple(pad) != (0, 0) for pad in p["padding"]) or tuple(p["lhs_dilation"]) != (1, 1):
        return None
    if p["feature_group_count"] != 1 or p["batch_group_count"] != 1:
        return None
    q = head.params
    if any(d != 1 for d in (*q["base_dilation"], *q["window_dilation"])):
        return None
    win, strides, pads = q["window_dimensions"], q["window_strides"], q["padding"]
    if any(win[a] != 1 or strides[a] != 1 or tuple(pads[a]) != (0, 0) for a in lhs[:2]):
        return None  # it sums across images or channels
    spatial = lhs[2:]
    return dict(feature=lhs[1], layout=spec_layout(lhs), c=w.aval.shape[rhs[1]], k=w.aval.shape[rhs[0]],
                window=tuple(win[a] for a in spatial), stride=tuple(strides[a] for a in spatial),
                padding=tuple(tuple(pads[a]) for a in spatial))


def _per_pixel(others, feature: int, uses: Uses, x) -> bool:
    """Every scaling operand has no channel axis (a scalar, or size 1 along `feature`) and is
    computed without x."""
    for v in others:
        if v.aval.ndim not in (0, 4) or (v.aval.ndim == 4 and v.aval.shape[feature] != 1):
            return False
        if _reads(uses, v, x):
            return False
    return True


def _reads(uses: Uses, var, target) -> bool:
    """Whether `var` is computed from `target` (True also where that is too far to tell)."""
    stack, seen = [var], set()
    while stack:
        v = stack.pop()
        if v is target:
            return True
        if not isinstance(v, Var) or v in seen:
            continue
        seen.add(v)
        if len(seen) > DEPENDENCY_LIMIT:
            return True
        defined = uses.defining(v)
        if defined is not None:
            stack.extend(defined[1].invars)
    return False


def _commuted(chain, conv, in_vars):
    """(x, *scaling operands, w) -> the conv on x, then the pool's equations on its output."""
    def run(*vals):
        env = dict(zip(in_vars, vals))
        x, w = vals[0], vals[-1]
        (value,) = bind(conv, [x, w])
        for eqn, pos in chain:
            operands = [v.val if isinstance(v, Literal) else env.get(v) for v in eqn.invars]
            operands[pos] = value
            (value,) = bind(eqn, operands)
        return value
    return run


def pool_conv_candidate(uses: Uses, match: Match, name: str) -> Candidate:
    """Candidate `name` of a pool_conv match: "xla" (its equations as traced) or "commuted"."""
    if name == BASELINE:
        return Candidate(BASELINE, subgraph_fn(uses, match))
    if name == COMMUTED:
        return Candidate(COMMUTED, match.make_build(COMMUTED))
    raise ValueError(f"a pool_conv site's candidates are {BASELINE!r} and {COMMUTED!r}, got {name!r}")


def pool_conv_site(uses: Uses, match: Match) -> DecisionSite:
    """The decision-owner Site of a pool_conv match: the traced order against the commuted one;
    where nothing is measured, commute_rule."""
    s = match.site
    candidates = [pool_conv_candidate(uses, match, name) for name in (BASELINE, COMMUTED)]
    fields = dict(kind=POOL_CONV, x=list(s.x_shape), w=list(s.w_shape), dtype=s.dtype, layout=s.layout,
                  kwargs=dict(s.kwargs), formulation=formulation(match.replaced, match.in_vars),
                  candidates=[c.name for c in candidates])
    return DecisionSite(fields, candidates, [v.aval for v in match.in_vars], lambda: commute_rule(s))


def commute_rule(site: Site) -> tuple[str, str]:
    """policy.commute_pays as a decision: (choice, reason)."""
    if not commute_pays(site):
        return BASELINE, "the pool would not shrink after the conv (K >= C or a strided pool)"
    return COMMUTED, f"the pool averages K={site.w_shape[3]} channels after the conv, not C={site.w_shape[2]}"


def pool_conv_algorithm(choice: str) -> str | None:
    """A pool_conv match's algorithm for a decision's choice; None keeps the traced order."""
    return COMMUTED if choice == COMMUTED else None
