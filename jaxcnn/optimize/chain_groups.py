"""The expand -> depthwise chain in a plain JAX function (MobileNetV2 / EfficientNet /
MobileNetV3 inverted residual blocks): a 1x1 conv site whose output only a 3x3 depthwise conv
site reads (maybe through a zero `pad`, as Keras' ZeroPadding2D before a stride-2 "valid"
depthwise), each with its epilogue as optimize matches it (BatchNorm folded, bias, activation),
replaced by one `jaxcnn.conv1x1_depthwise`: the expanded activation (6x the block's input in
MobileNetV2) never reaches memory.

Each chain is one site of the decision owner (jaxcnn.tuning.decision): XLA's own subgraph as
traced against the fused kernel, measured on this GPU on first use and cached; the fused kernel
is kept only if it beats the baseline, and also the two convs as optimize decided them alone.
Where nothing can be measured the rule takes the fused kernel wherever it runs (the chain
benchmark, scripts/bench_chain.py, measured it faster than XLA's layers on every MobileNetV2
shape).
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxcnn.ops.chain.config import ACTIVATIONS as CHAIN_ACTIVATIONS
from jaxcnn.ops.chain.config import (
    CONV1X1_DEPTHWISE_MAX_IN,
    MAX_DEPTHWISE_PAD,
    conv1x1_depthwise_fused,
)
from jaxcnn.ops.chain.conv1x1_depthwise import conv1x1_depthwise
from jaxcnn.optimize.conv_sites import formulation, subgraph_fn
from jaxcnn.optimize.group_common import (
    FUSED_LAYOUTS,
    JaxprGroup,
    as_nhwc_op,
    call_bodies,
    nhwc_shape,
    view_source,
)
from jaxcnn.optimize.patterns import Match, Site, Uses
from jaxcnn.optimize.rewrite import RewritePlan, declined_convs
from jaxcnn.tuning.decision import BASELINE, Candidate, Decision, decide_all
from jaxcnn.tuning.decision import Site as DecisionSite

KIND = "conv1x1_depthwise"
FUSED = "jaxcnn:" + KIND


@dataclass
class ChainSite:
    plan: RewritePlan
    uses: Uses  # of plan.jaxpr
    expand: Match
    depthwise: Match
    padding: tuple  # the depthwise's ((top, bottom), (left, right)), a folded pad included
    indices: tuple[int, ...]  # every equation the fused call replaces
    group: JaxprGroup
    decision: Decision | None = None


def _conv(m: Match) -> dict:
    return m.site.kwargs


def _expand_ok(m: Match) -> bool:
    k, s = _conv(m), m.site
    return (s.w_shape[:2] == (1, 1) and tuple(k["stride"]) == (1, 1) and tuple(k["dilation"]) == (1, 1)
            and k["groups"] == 1 and tuple(map(tuple, k["padding"])) == ((0, 0), (0, 0)) and not s.residual
            and k["activation"] in CHAIN_ACTIVATIONS and s.w_shape[2] <= CONV1X1_DEPTHWISE_MAX_IN)


def _depthwise_ok(m: Match) -> bool:
    k, s = _conv(m), m.site
    channels = s.w_shape[3]
    stride = tuple(k["stride"])
    return (s.w_shape[:3] == (3, 3, 1) and k["groups"] == channels and stride in ((1, 1), (2, 2))
            and tuple(k["dilation"]) == (1, 1) and not s.residual and k["activation"] in CHAIN_ACTIVATIONS)


def chain_sites(plan: RewritePlan, path: str = "") -> list[ChainSite]:
    """Every expand -> depthwise chain of plan's jaxpr and its call bodies (see the module
    docstring), whether optimize rewrote its convs or left them to XLA."""
    uses = Uses(plan.jaxpr)
    convs = {m.out_var: m for m in [*plan.matches.values(), *declined_convs(plan, uses)] if m.op == "conv2d"}
    found = []
    for dw in convs.values():
        if not _depthwise_ok(dw) or dw.site.layout not in FUSED_LAYOUTS:
            continue
        layout = dw.site.layout
        # A zero pad before the depthwise (ZeroPadding2D) is part of its match and its padding.
        padding = tuple((int(lo), int(hi)) for lo, hi in _conv(dw)["padding"])
        x_dw = dw.in_vars[0]
        if any(not 0 <= v <= MAX_DEPTHWISE_PAD for pair in padding for v in pair):
            continue
        source = view_source(uses, x_dw, convs)
        if source is None:
            continue
        ex = convs[source[0]]
        if (ex is dw or not _expand_ok(ex) or ex.site.layout != layout or ex.site.dtype != dw.site.dtype
                or ex.site.w_shape[3] != dw.site.w_shape[3]):
            continue
        # The expand's output reaches the depthwise alone (through the view and the pad).
        first = source[1][-1] if source[1] else dw.eqn_indices[0]
        if ex.out_var in uses.outputs or uses.readers.get(ex.out_var, []) != [first]:
            continue
        x_nhwc = nhwc_shape(ex.site.x_shape, layout)
        stride = _conv(dw)["stride"][0]
        channels = dw.site.w_shape[3]
        if not conv1x1_depthwise_fused(x_nhwc, channels, stride, ex.site.dtype, padding):
            continue  # float32 or a shape the kernel does not take: nothing to gain
        indices = tuple(sorted({*ex.eqn_indices, *source[1], *dw.eqn_indices}))
        if not uses.internal(indices, dw.out_var):
            continue
        group = JaxprGroup(KIND, path, x_nhwc, nhwc_shape(tuple(dw.out_var.aval.shape), layout), ex.site.dtype,
                           (tuple(ex.site.w_shape), tuple(dw.site.w_shape)), indices,
                           dict(layout=layout, stride=stride, padding=padding,
                                activations=(_conv(ex)["activation"], _conv(dw)["activation"])))
        found.append(ChainSite(plan, uses, ex, dw, padding, indices, group))
    for child, child_path in call_bodies(plan, path):
        found.extend(chain_sites(child, child_path))
    return found


def _in_vars(site: ChainSite) -> tuple:
    """What the fused call reads: the expand's input and operands, then the depthwise's."""
    return (*site.expand.in_vars, *site.depthwise.in_vars[1:])


def _fused(site: ChainSite):
    """(x, w1, b1, wd, bd) -> the chain's output: HWIO weights with their epilogues folded."""
    out_dtype = site.depthwise.out_var.aval.dtype

    def fused(x, w1, b1, wd, bd):
        return conv1x1_depthwise(x, w1, wd, b1, bd, stride=site.group.attrs["stride"],
                                 activations=site.group.attrs["activations"], padding=site.padding).astype(out_dtype)
    return as_nhwc_op(site.group.attrs["layout"], fused)


def _build(site: ChainSite):
    """The chain's build on the match's own in_vars: each conv's epilogue folded on every call."""
    ex, dw = site.expand, site.depthwise
    n_ex = len(ex.in_vars) - 1
    fused = _fused(site)

    def build(x, *vals):
        _, w1, b1, _ = ex.operands(x, *vals[:n_ex])
        _, wd, bd, _ = dw.operands(x, *vals[n_ex:])
        return fused(x, w1, b1, wd, bd)
    return build


def _rule() -> tuple[str, str]:
    return FUSED, "the fused kernel runs this chain (scripts/bench_chain.py: faster than XLA's layers)"


def _decision_site(site: ChainSite) -> DecisionSite:
    in_vars = _in_vars(site)
    traced = Match(KIND, site.indices, site.depthwise.out_var, in_vars, site.expand.site, ())
    candidates = [Candidate(BASELINE, subgraph_fn(site.uses, traced)), Candidate(FUSED, _build(site))]
    g = site.group
    names = [*site.expand.replaced, "|", *site.depthwise.replaced]
    fields = dict(kind=KIND, x=list(g.x_shape), w=[list(w) for w in g.weight_shapes], dtype=g.dtype,
                  layout=g.attrs["layout"], stride=g.attrs["stride"], padding=[list(p) for p in site.padding],
                  activations=list(g.attrs["activations"]), formulation=formulation(names, in_vars),
                  candidates=[c.name for c in candidates])
    return DecisionSite(fields, candidates, [v.aval for v in in_vars], _rule)


def _separate_ms(m: Match) -> float | None:
    """The time of the conv as optimize decided it alone (None where it was not measured)."""
    d = m.decision
    return None if d is None else d.times_ms.get(d.choice)


def decide_chains(sites: list[ChainSite], decide=decide_all) -> None:
    """Sets each site's decision: the fused kernel, or BASELINE (the convs as optimize decided
    them). A measured fused kernel must also beat the two convs as decided alone."""
    for site, d in zip(sites, decide([_decision_site(s) for s in sites])):
        fused_ms = d.times_ms.get(FUSED)
        alone = [_separate_ms(site.expand), _separate_ms(site.depthwise)]
        if d.choice == FUSED and fused_ms is not None and None not in alone and sum(alone) <= fused_ms:
            d = Decision(BASELINE, d.source, f"the convs as decided alone ({sum(alone):.4f} ms) beat the fused "
                         f"kernel", d.times_ms, d.errors)
        site.decision = d


def replace_chain(site: ChainSite) -> None:
    """Puts one conv1x1_depthwise match in place of the two conv matches (and the pad)."""
    plan = site.plan
    for m in (site.expand, site.depthwise):
        planned = plan.matches.get(max(m.eqn_indices))
        if planned is m:
            plan.matches.pop(max(m.eqn_indices))
        plan.skipped.difference_update(m.eqn_indices)
    g = site.group
    s = site.expand.site
    kwargs = dict(stride=g.attrs["stride"], padding=site.padding, activations=g.attrs["activations"],
                  layout=g.attrs["layout"])
    match = Match(KIND, site.indices, site.depthwise.out_var, _in_vars(site),
                  Site(KIND, s.layout, s.x_shape, g.dtype, s.w_shape, s.bias or site.depthwise.site.bias, kwargs,
                       folded=s.folded or site.depthwise.site.folded),
                  (*site.expand.replaced, *site.depthwise.replaced),
                  build=_build(site), algorithm="fused")
    match.decision = site.decision
    match.path = site.expand.path
    match.fold_parts, match.prefolded_build = (site.expand, site.depthwise), _fused(site)
    plan.matches[max(site.indices)] = match
    plan.skipped.update(j for j in site.indices if j != max(site.indices))

