"""Fusion in a plain JAX function: fire-shaped, inception-shaped and conv->max-pool groups in
the jaxpr that jaxcnn.optimize rewrites, decided like the zoo's groups and replaced by one
`jaxcnn.fire` / `jaxcnn.inception` / `jaxcnn.conv2d_pool` each; then the expand -> depthwise
chains among the convs left (chain_groups.py, decided by the decision owner).

    fast = jaxcnn.optimize(model_fn, fuse="auto")   # or optimize_fused(model_fn, kinds=...)
    y = jax.jit(fast)(params, x)
    print(fast.explain(params, x))                   # the group decisions, then every rewrite

A fire group is what jaxcnn.optimize matches as three conv2d sites of one layout, NHWC or NCHW
(stride 1, ReLU; rewritten by the policy or left to XLA by it): a 1x1 "squeeze" whose output
only two convs read, a 1x1 and a 3x3 (padding 1) "expand", whose outputs only one channel
concatenate reads, in that order. Searched in call bodies too (jit, custom_jvp/vjp). Weights in
any order go to HWIO: those of the top-level jaxpr's inputs in one jaxcnn.relayout_weights for
all groups, the others as optimize transposes them.

An inception group is GoogLeNet's block: 1x1, 1x1 -> 3x3, 1x1 -> 5x5 and 3x3/1 max pool -> 1x1
branches of one input, every conv + ReLU, concatenated along channels in that order.

A conv->pool group is a conv2d site (ReLU, groups 1) whose output only a max pool of the same
layout reads: one conv2d_pool, the pre-pool activation never written to memory.

All may reach their readers through layout-only views: size-1 axes added and removed (Equinox
under vmap wraps every conv so) and, for the pool, the transposes Equinox pools through. NCHW
groups run the NHWC kernel between two transposes; between consecutive groups those transposes
cancel, so an NCHW model runs channels-last from its first group to its last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax

from jaxcnn.tuning.fusion_plan import GroupDecision, decide_groups
from jaxcnn.ops.conv2d_pool.api import conv2d_pool
from jaxcnn.ops.fire.api import fire
from jaxcnn.ops.inception.api import inception
from jaxcnn.ops.weights.relayout import relayout_weights
from jaxcnn.optimize.chain_groups import FUSED as CHAIN_FUSED
from jaxcnn.optimize.chain_groups import ChainSite, chain_sites, decide_chains, replace_chain
from jaxcnn.optimize.group_common import (
    FUSED_LAYOUTS,
    INCEPTION_CONVS,
    JaxprGroup,
    as_nhwc_op,
    call_bodies,
    nhwc_shape,
    view_base,
    view_chain,
    view_source,
)
from jaxcnn.optimize.patterns import Match, Site, Uses, _accepts, _inner_jaxpr, match_pool
from jaxcnn.optimize.rewrite import Optimized, RewritePlan, build_plan, declined_convs
from jaxcnn.tuning.decision import BASELINE, Decision
from jaxcnn.tuning.text_table import fmt_ms, text_table

GROUPS = ("auto", "all", "none")
USER_KINDS = ("fire", "inception", "conv_pool", "conv1x1_depthwise")


@dataclass
class _FireSite:
    plan: RewritePlan
    concat: int
    x: Any  # what the fused call reads: the squeeze's input, or the value it is a view of
    sq: Match
    e1: Match
    e3: Match
    group: JaxprGroup


def _conv_ok(m: Match, kernel: int) -> bool:
    s = m.site
    pad = kernel // 2
    return (s.layout in FUSED_LAYOUTS and s.w_shape[:2] == (kernel, kernel) and s.kwargs["activation"] == "relu"
            and tuple(s.kwargs["stride"]) == (1, 1) and tuple(s.kwargs["dilation"]) == (1, 1)
            and s.kwargs["groups"] == 1 and tuple(map(tuple, s.kwargs["padding"])) == ((pad, pad),) * 2)


def _max_pools(uses: Uses) -> list[Match]:
    """Every max pool of the jaxpr as optimize matches it (layout-only steps absorbed)."""
    pools = (match_pool(uses, j) for j, e in enumerate(uses.jaxpr.eqns) if e.primitive.name == "reduce_window_max")
    return [p for p in pools if p is not None and p.op == "max_pool2d"]


def _open_calls(plan: RewritePlan) -> None:
    """Gives every call body a (possibly empty) child plan, so that groups of convs the policy
    left to XLA are found in call bodies too (build_plan keeps only bodies with a rewrite)."""
    for i, eqn in enumerate(plan.jaxpr.eqns):
        if i in plan.matches or i in plan.skipped:
            continue
        body = _inner_jaxpr(eqn)
        if body is not None:
            child = plan.calls.setdefault(i, RewritePlan(body))
            if child.found is None and plan.found is not None:
                child.found = plan.found.calls.get(i)  # its sites, as decided
            _open_calls(child)


def _prune_calls(plan: RewritePlan) -> None:
    """Drops the child plans that hold no rewrite again (undoes _open_calls where nothing fused):
    a body in plan.calls is inlined, which only a rewrite inside should cause."""
    for i, child in list(plan.calls.items()):
        _prune_calls(child)
        if not child.matches and not child.calls:
            del plan.calls[i]


def _fire_sites(plan: RewritePlan, path: str = "") -> list[_FireSite]:
    jaxpr = plan.jaxpr
    uses = Uses(jaxpr)
    convs = {m.out_var: m for m in [*plan.matches.values(), *declined_convs(plan, uses)]
             if m.op == "conv2d" and m.plain}
    found = []
    for i, eqn in enumerate(jaxpr.eqns):
        if i in plan.skipped or i in plan.matches or eqn.primitive.name != "concatenate" or len(eqn.invars) != 2:
            continue
        e1, e3 = (convs.get(v) for v in eqn.invars)
        if e1 is None or e3 is None:
            continue
        # The expands read the squeeze's output, each maybe through its own unit reshapes.
        views = [view_source(uses, m.in_vars[0], convs) for m in (e1, e3)]
        if None in views or views[0][0] is not views[1][0]:
            continue
        sq = convs[views[0][0]]
        layout = sq.site.layout
        if not (_conv_ok(sq, 1) and _conv_ok(e1, 1) and _conv_ok(e3, 3)) or eqn.params.get("dimension") != layout.index("C"):
            continue
        if len({sq.site.dtype, e1.site.dtype, e3.site.dtype}) != 1 or len({sq.site.layout, e1.site.layout, e3.site.layout}) != 1:
            continue
        # The squeeze feeds the two expands only, the expands the concatenate only.
        first_readers = [chain[-1] if chain else m.eqn_indices[0] for m, (_, chain) in zip((e1, e3), views)]
        if sq.out_var in uses.outputs or sorted(uses.readers.get(sq.out_var, [])) != sorted(first_readers):
            continue
        if any(m.out_var in uses.outputs or uses.readers.get(m.out_var, []) != [i] for m in (e1, e3)):
            continue
        x, x_view = view_base(uses, sq.in_vars[0])
        indices = tuple(sorted({*x_view, *sq.eqn_indices, *e1.eqn_indices, *e3.eqn_indices, *views[0][1],
                                *views[1][1], i}))
        group = JaxprGroup("fire", path, nhwc_shape(sq.site.x_shape, layout), nhwc_shape(eqn.outvars[0].aval.shape, layout),
                           sq.site.dtype, (tuple(sq.site.w_shape), tuple(e1.site.w_shape),
                                           tuple(e3.site.w_shape)), indices, dict(layout=layout))
        found.append(_FireSite(plan, i, x, sq, e1, e3, group))
    for child, child_path in call_bodies(plan, path):
        found.extend(_fire_sites(child, child_path))
    return found


@dataclass
class _InceptionSite:
    plan: RewritePlan
    concat: int
    x: Any
    convs: tuple[Match, ...]  # in INCEPTION_CONVS order
    pool: Match
    group: JaxprGroup


def _inception_sites(plan: RewritePlan, path: str = "") -> list[_InceptionSite]:
    """GoogLeNet blocks: a channel concatenate of [1x1(x), KxK(1x1(x)), KxK(1x1(x)),
    1x1(maxpool3x3/1(x))], every conv + ReLU, stride 1, "same" padding, the branch convs 3x3
    and 5x5 (the zoo block the fusion plan measures), each intermediate read by its branch alone.
    x itself may have other readers."""
    jaxpr = plan.jaxpr
    uses = Uses(jaxpr)
    convs = {m.out_var: m for m in [*plan.matches.values(), *declined_convs(plan, uses)]
             if m.op == "conv2d" and m.plain}
    pools = {p.out_var: p for p in _max_pools(uses)}
    found = []
    for i, eqn in enumerate(jaxpr.eqns):
        if i in plan.skipped or i in plan.matches or eqn.primitive.name != "concatenate" or len(eqn.invars) != 4:
            continue
        c1, b3, b5, pp = (convs.get(v) for v in eqn.invars)
        if None in (c1, b3, b5, pp):
            continue
        layout = c1.site.layout
        if layout not in FUSED_LAYOUTS or eqn.params.get("dimension") != layout.index("C"):
            continue
        reduces = [view_source(uses, m.in_vars[0], convs) for m in (b3, b5)]
        if None in reduces:
            continue
        r3, r5 = (convs[src] for src, _ in reduces)
        pool_view = view_source(uses, pp.in_vars[0], pools)
        if pool_view is None:
            continue
        pool, pp_view = pools[pool_view[0]], pool_view[1]
        if pool.site.layout != layout:
            continue
        pk = pool.site.kwargs
        if (tuple(pk["window"]) != (3, 3) or tuple(pk["stride"]) != (1, 1)
                or tuple(map(tuple, pk["padding"])) != ((1, 1), (1, 1))):
            continue
        members = (c1, r3, b3, r5, b5, pp)
        if not (all(_conv_ok(m, 1) for m in (c1, r3, r5, pp)) and _conv_ok(b3, 3) and _conv_ok(b5, 5)):
            continue
        if len({m.site.dtype for m in members}) != 1 or len({m.site.layout for m in members}) != 1:
            continue
        if len({m.site.kwargs["precision"] for m in members}) != 1:
            continue
        x, _ = view_base(uses, c1.in_vars[0], exclusive=False)  # x may have other readers
        views = [view_chain(uses, m.in_vars[0], x) for m in (c1, r3, r5)] + [view_chain(uses, pool.in_vars[0], x)]
        if None in views:
            continue
        # Inside the block every value has one reader: its next step (x may have others).
        inner = [(c1.out_var, i), (b3.out_var, i), (b5.out_var, i), (pp.out_var, i)]
        if any(uses.sole_reader(v) != r for v, r in inner):
            continue
        if any(m.out_var in uses.outputs or len(uses.readers.get(m.out_var, [])) != 1 for m in (r3, r5)):
            continue
        if pool.out_var in uses.outputs or len(uses.readers.get(pool.out_var, [])) != 1:
            continue
        indices = tuple(sorted({*(j for m in members for j in m.eqn_indices), *pool.eqn_indices,
                                *(j for v in views for j in v), *pp_view, *reduces[0][1], *reduces[1][1], i}))
        planned = plan.matches.get(max(pool.eqn_indices))  # the pool's equations are free, or
        same = planned is not None and planned.eqn_indices == pool.eqn_indices  # the policy's pool match
        if not same and any(j in plan.matches or j in plan.skipped for j in pool.eqn_indices):
            continue
        group = JaxprGroup("inception", path, nhwc_shape(x.aval.shape, layout), nhwc_shape(eqn.outvars[0].aval.shape, layout),
                           c1.site.dtype, tuple(tuple(m.site.w_shape) for m in members), indices, dict(layout=layout))
        found.append(_InceptionSite(plan, i, x, members, pool, group))
    for child, child_path in call_bodies(plan, path):
        found.extend(_inception_sites(child, child_path))
    return found


def _replace_inception(site: _InceptionSite, weights: "_WeightRelayouts") -> None:
    """Puts one jaxcnn.inception match in place of the six convs, the pool and the concatenate."""
    plan = site.plan
    for m in (*site.convs, site.pool):
        planned = plan.matches.get(max(m.eqn_indices))
        if planned is not None and planned.eqn_indices == m.eqn_indices:
            plan.matches.pop(max(m.eqn_indices))
        plan.skipped.difference_update(m.eqn_indices)
    operands = [weights.operand(plan, m) for m in site.convs]
    has_bias = [len(m.in_vars) == 3 for m in site.convs]
    precision = site.convs[0].site.kwargs["precision"]

    def build(x, *vals):
        it = iter(vals)
        ws, bs = [], []
        for m, (_, w_is_hwio), bias in zip(site.convs, operands, has_bias):
            w = next(it)
            ws.append(w if w_is_hwio else m.weight_hwio(w))
            bs.append(next(it).reshape(-1) if bias else None)
        return inception(x, *ws, *bs, precision=precision)

    in_vars = (site.x,) + tuple(v for m, (w, _) in zip(site.convs, operands) for v in (w, *m.in_vars[2:]))
    g = site.group
    out = plan.jaxpr.eqns[site.concat].outvars[0]
    match = Match("inception", g.eqn_indices, out, in_vars,
                  Site("inception", g.attrs["layout"], tuple(site.x.aval.shape), g.dtype, None, all(has_bias),
                       dict(zip(INCEPTION_CONVS, (w[3] for w in g.weight_shapes)))),
                  ("6 x conv_general_dilated+bias+relu", "reduce_window_max", "concatenate"),
                  build=as_nhwc_op(g.attrs["layout"], build), algorithm="auto")
    plan.matches[max(g.eqn_indices)] = match
    plan.skipped.update(j for j in g.eqn_indices if j != max(g.eqn_indices))


@dataclass
class _ConvPoolSite:
    plan: RewritePlan
    x: Any  # as _FireSite.x
    conv: Match
    pool: Match
    group: JaxprGroup


def _conv_pool_build(conv: Match, pool_kw, w_is_hwio: bool = False):
    conv_kw = conv.site.kwargs

    def build(x, w, *rest):
        if conv.plain:
            w_hwio, b = (w if w_is_hwio else conv.weight_hwio(w)), (rest[0].reshape(-1) if rest else None)
        else:  # e.g. BatchNorm folded into the weights and bias (the conv's match builds them)
            _, w_hwio, b, _ = conv.operands(x, w, *rest)
        return conv2d_pool(x, w_hwio, b, stride=conv_kw["stride"],
                           padding=conv_kw["padding"], dilation=conv_kw["dilation"],
                           pool_window=pool_kw["window"], pool_stride=pool_kw["stride"],
                           pool_padding=pool_kw["padding"], precision=conv_kw["precision"])
    return as_nhwc_op(conv.site.layout, build)


def _conv_pool_sites(plan: RewritePlan, path: str = "") -> list[_ConvPoolSite]:
    uses = Uses(plan.jaxpr)
    pools = {p.in_vars[0]: p for p in _max_pools(uses)}
    found = []
    for m in [*plan.matches.values(), *declined_convs(plan, uses)]:
        s = m.site
        if (m.op != "conv2d" or s.residual or s.layout not in FUSED_LAYOUTS or s.kwargs["activation"] != "relu"
                or s.kwargs["groups"] != 1 or m.out_var in uses.outputs):
            continue
        pool = pools.get(m.out_var)  # read by the pool alone (straight or through its layout steps)
        if pool is None or pool.site.layout != s.layout or uses.sole_reader(m.out_var) not in pool.eqn_indices:
            continue
        # The pool's equations are free, or the policy matched this very pool.
        planned = plan.matches.get(max(pool.eqn_indices))
        same = planned is not None and planned.eqn_indices == pool.eqn_indices
        if not same and any(i in plan.matches or i in plan.skipped for i in pool.eqn_indices):
            continue
        build = _conv_pool_build(m, pool.site.kwargs)
        avals = [v.aval for v in m.in_vars]
        if not _accepts(build, pool.out_var.aval, *avals):
            continue  # a pool conv2d_pool does not take (e.g. padding as wide as the window)
        x, x_view = view_base(uses, m.in_vars[0])
        group = JaxprGroup("conv_pool", path, nhwc_shape(s.x_shape, s.layout), nhwc_shape(pool.out_var.aval.shape, s.layout),
                           s.dtype, (tuple(s.w_shape),), tuple(sorted({*x_view, *m.eqn_indices, *pool.eqn_indices})),
                           dict(conv=dict(s.kwargs), pool=dict(pool.site.kwargs),
                                conv_out=nhwc_shape(m.out_var.aval.shape, s.layout), layout=s.layout))
        found.append(_ConvPoolSite(plan, x, m, pool, group))
    for child, child_path in call_bodies(plan, path):
        found.extend(_conv_pool_sites(child, child_path))
    return found


def _replace_conv_pool(site: _ConvPoolSite, weights: "_WeightRelayouts") -> None:
    """Puts one conv2d_pool match in place of the conv match (and the pool's, if planned)."""
    plan, conv, pool = site.plan, site.conv, site.pool
    plan.matches.pop(max(conv.eqn_indices), None)  # absent when the policy left it to XLA
    plan.skipped.difference_update(conv.eqn_indices)
    planned = plan.matches.get(max(pool.eqn_indices))
    if planned is not None and planned.eqn_indices == pool.eqn_indices:
        plan.matches.pop(max(pool.eqn_indices))
        plan.skipped.difference_update(pool.eqn_indices)
    g = site.group
    kwargs = {k: v for k, v in conv.site.kwargs.items() if k not in ("activation", "groups", "layout")}
    kwargs.update(pool_window=pool.site.kwargs["window"], pool_stride=pool.site.kwargs["stride"],
                  pool_padding=pool.site.kwargs["padding"])
    # A folded epilogue's build transposes the user's weights itself: no hoisted relayout.
    w, w_is_hwio = weights.operand(plan, conv) if conv.plain else (conv.in_vars[1], False)
    build = _conv_pool_build(conv, pool.site.kwargs, w_is_hwio)
    match = Match("conv2d_pool", g.eqn_indices, pool.out_var, (site.x, w, *conv.in_vars[2:]),
                  Site("conv2d_pool", conv.site.layout, conv.site.x_shape, g.dtype, g.weight_shapes[0],
                       conv.site.bias, kwargs),
                  conv.replaced + pool.replaced, build=build, algorithm="auto")
    plan.matches[max(g.eqn_indices)] = match
    plan.skipped.update(j for j in g.eqn_indices if j != max(g.eqn_indices))


def find_jaxpr_groups(fn: Callable, *args, **kwargs) -> list[JaxprGroup]:
    """Fire-shaped and conv->max-pool groups in `fn`'s jaxpr on these arguments (see the module
    docstring), whichever convs optimize's default policy would leave to XLA."""
    closed = jax.make_jaxpr(lambda a, k: fn(*a, **k))(args, kwargs)
    plan = build_plan(closed.jaxpr, "all")
    return [site.group for site in _fire_sites(plan) + _inception_sites(plan) + _conv_pool_sites(plan)
            + chain_sites(plan)]


def _replace(site: _FireSite, weights: "_WeightRelayouts") -> None:
    """Puts one fire match in place of the three conv matches and the concatenate."""
    plan = site.plan
    parts = (site.sq, site.e1, site.e3)
    for m in parts:
        plan.matches.pop(max(m.eqn_indices), None)  # absent when the policy left it to XLA
        plan.skipped.difference_update(m.eqn_indices)
    # Read x once, then (w[, b]) of each conv: the expands' input is the squeeze, inside.
    counts = [len(m.in_vars) - 1 for m in parts]
    operands = [weights.operand(plan, m) for m in parts]  # (w or its HWIO stand-in, is HWIO)

    def build(x, *vals):
        it = iter(vals)
        ws, bs = [], []
        for m, count, (_, w_is_hwio) in zip(parts, counts, operands):
            w, *b = [next(it) for _ in range(count)]
            ws.append(w if w_is_hwio else m.weight_hwio(w))  # the user's weight order to HWIO
            bs.append(b[0].reshape(-1) if b else None)  # Equinox biases are (K, 1, 1)
        return fire(x, *ws, *bs)

    build = as_nhwc_op(site.sq.site.layout, build)
    indices = site.group.eqn_indices
    out = plan.jaxpr.eqns[site.concat].outvars[0]
    in_vars = (site.x,) + tuple(v for m, (w, _) in zip(parts, operands) for v in (w, *m.in_vars[2:]))
    g = site.group
    match = Match("fire", indices, out, in_vars,
                  Site("fire", site.sq.site.layout, site.sq.site.x_shape, g.dtype, None, all(len(m.in_vars) == 3 for m in parts),
                       dict(squeeze=g.weight_shapes[0][3], expand1x1=g.weight_shapes[1][3],
                            expand3x3=g.weight_shapes[2][3])),
                  ("conv_general_dilated(squeeze)+bias+relu", "expand 1x1", "expand 3x3", "concatenate"),
                  build=build, algorithm="auto")
    plan.matches[max(indices)] = match
    plan.skipped.update(j for j in indices if j != max(indices))


class _HoistedWeight:
    """Stands for a weight relaid out to HWIO by the plan's prologue (a key of its environment)."""

    __slots__ = ("var", "perm")

    def __init__(self, var, perm):
        self.var, self.perm = var, perm


class _WeightRelayouts:
    """The weights that the fused groups of the top-level jaxpr read in another axis order
    (OIHW in an NCHW model), relaid out to HWIO by one relayout_weights in the plan's prologue
    rather than by one transpose kernel per weight on every call."""

    def __init__(self, plan: RewritePlan):
        self.plan = plan
        self.inputs = {id(v) for v in (*plan.jaxpr.invars, *plan.jaxpr.constvars)}
        self.hoisted: dict[tuple, _HoistedWeight] = {}

    def operand(self, plan: RewritePlan, conv: Match):
        """(what the fused call reads for `conv`'s weight, whether that is HWIO already)."""
        w, perm = conv.in_vars[1], conv.w_to_hwio
        if plan is not self.plan or perm in (None, (0, 1, 2, 3)) or id(w) not in self.inputs:
            return w, False  # a call body's weight (bound later) or HWIO already
        return self.hoisted.setdefault((id(w), perm), _HoistedWeight(w, perm)), True

    def install(self) -> None:
        if not self.hoisted:
            return
        hoisted = list(self.hoisted.values())

        def relayout(env):
            env.update(zip(hoisted, relayout_weights([env[h.var] for h in hoisted], [h.perm for h in hoisted])))
        self.plan.prologue.append(relayout)


class FusedOptimized(Optimized):
    """jaxcnn.optimize's rewrites plus one jaxcnn.fire per chosen fire-shaped group and one
    jaxcnn.conv2d_pool per chosen conv->max-pool group."""

    def __init__(self, fn, example_args, policy, groups, decide_kwargs, kinds=USER_KINDS, sparse="none"):
        if not (callable(groups) or groups in GROUPS):
            raise ValueError(f"groups must be one of {GROUPS} or a callable(JaxprGroup) -> bool, got {groups!r}")
        if isinstance(kinds, str) or not set(kinds) <= set(USER_KINDS):
            raise ValueError(f"kinds must be a sequence of {USER_KINDS}, got {kinds!r}")
        self.kinds = tuple(kinds)
        if policy == "xla":
            raise ValueError("policy='xla' rewrites nothing, so there is nothing to fuse: use fn itself")
        self.groups = groups
        self.decide_kwargs = decide_kwargs
        self._decisions: dict[int, list] = {}
        super().__init__(fn, example_args, policy, sparse)

    def _traced(self, args, kwargs):
        traced = super()._traced(args, kwargs)
        if id(traced) not in self._decisions:
            _open_calls(traced.plan)
            sites = ((_fire_sites(traced.plan) if "fire" in self.kinds else [])
                     + (_inception_sites(traced.plan) if "inception" in self.kinds else [])
                     + (_conv_pool_sites(traced.plan) if "conv_pool" in self.kinds else []))
            chosen: list = []
            if self.groups == "auto" and sites:
                decisions, *_ = decide_groups([s.group.to_group() for s in sites], **self.decide_kwargs)
                chosen = [(s, d.choice == "fused", d) for s, d in zip(sites, decisions)]
            else:
                for s in sites:
                    take = (self.groups == "all") if isinstance(self.groups, str) else bool(self.groups(s.group))
                    chosen.append((s, take, None))
            weights = _WeightRelayouts(traced.plan)
            for s, take, _ in chosen:
                if take:
                    replace = {_ConvPoolSite: _replace_conv_pool, _InceptionSite: _replace_inception}.get(type(s), _replace)
                    replace(s, weights)
            weights.install()
            if "conv1x1_depthwise" in self.kinds:  # among the convs the groups above left
                chosen.extend(self._chains(traced.plan))
            _prune_calls(traced.plan)
            traced.plan.forget_folds()
            self._decisions[id(traced)] = [(s.group, take, d) for s, take, d in chosen]
        return traced

    def _chains(self, plan: RewritePlan) -> list[tuple[ChainSite, bool, Decision | None]]:
        """The expand -> depthwise chains, decided by the decision owner under groups="auto"
        (else by `groups`), the chosen ones replaced by one conv1x1_depthwise each."""
        sites = chain_sites(plan)
        if self.groups == "auto":
            decide_chains(sites)
        chosen = []
        for s in sites:
            if self.groups == "auto":
                take = s.decision.choice == CHAIN_FUSED
            else:
                take = (self.groups == "all") if isinstance(self.groups, str) else bool(self.groups(s.group))
            if take:
                replace_chain(s)
            chosen.append((s, take, s.decision))
        return chosen

    def decisions(self, *args, **kwargs) -> list[tuple[JaxprGroup, bool, GroupDecision | None]]:
        """(group, fused?, the fusion plan's decision or None) per group found."""
        traced = self._traced(*self._args(args, kwargs))
        return self._decisions[id(traced)]

    def explain(self, *args, **kwargs) -> str:
        rows = []
        for g, take, d in self.decisions(*args, **kwargs):
            if isinstance(d, Decision):  # the decision owner's (chains)
                why = f"{d.source}: {d.reason}"
                times = (fmt_ms(d.times_ms.get(CHAIN_FUSED)), fmt_ms(d.times_ms.get(BASELINE)))
            else:
                why = d.reason if d is not None else f"groups={self.groups!r}"
                times = (fmt_ms(d.time("fused")), fmt_ms(d.time("xla"))) if d is not None else ("-", "-")
            rows.append([g.name, g.describe(), *times, "fused" if take else "as optimize", why])
        head = (text_table(["group", "what", "fused ms", "XLA ms", "choice", "why"], rows) if rows
                else "no fusable group")
        return head + "\n" + super().explain(*args, **kwargs)


def optimize_fused(fn: Callable, *, example_args=None, policy="auto", groups: Any = "auto",
                   costs: str = "auto", cache: Any = None, iters: int = 20, warmup: int = 3,
                   kinds=USER_KINDS, sparse="none") -> FusedOptimized:
    """`jaxcnn.optimize(fn, policy=policy)` plus fused fire modules, inception blocks,
    conv->max-pool pairs and expand -> depthwise chains.

    groups: "auto" (each group decided like a zoo model's: measured where the CUDA kernels run,
      else the cost model; `costs`, `cache`, `iters`, `warmup` as plan_fusion's), "all", "none",
      or a callable(JaxprGroup) -> bool.
    kinds: the group kinds to look for, among USER_KINDS ("fire", "inception", "conv_pool",
      "conv1x1_depthwise"). Groups include
      convs the policy leaves to XLA (policy="auto" leaves most dense convs there): fused or
      not is the group decision's.
    sparse: as jaxcnn.optimize's.
    Returns a callable with .explain(*args) (decisions, then every rewrite), .decisions(*args)
    and .rewrites(*args); it works under jit, grad and vmap like jaxcnn.optimize's.
    """
    return FusedOptimized(fn, example_args, policy, groups,
                          dict(costs=costs, cache=cache, iters=iters, warmup=warmup), kinds, sparse)
