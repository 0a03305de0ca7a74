"""Fusion in a plain JAX function: fire-shaped groups in the jaxpr that jaxcnn.optimize
rewrites, decided like the zoo's groups and replaced by one `jaxcnn.fire` each.

    fast = fusion.optimize(model_fn)                 # jaxcnn.optimize + fused fire modules
    y = jax.jit(fast)(params, x)
    print(fast.explain(params, x))                   # the group decisions, then every rewrite

A group is what jaxcnn.optimize matches as three NHWC conv2d sites (stride 1, ReLU): a 1x1
"squeeze" whose output only two convs read, a 1x1 and a 3x3 (padding 1) "expand", whose outputs
only one channel concatenate reads, in that order. Searched in call bodies too (jit,
custom_jvp/vjp). Weights in any order are transposed to HWIO, as optimize does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxcnn.fusion.groups import FusionGroup
from jaxcnn.fusion.planner import GroupDecision, _fmt_ms, _table, decide_groups
from jaxcnn.models.layers import LayerInfo
from jaxcnn.ops.conv_args import conv2d_flops
from jaxcnn.optimize.patterns import Match, Site, Uses
from jaxcnn.optimize.rewrite import Optimized, Plan, build_plan

GROUPS = ("auto", "all", "none")


@dataclass(frozen=True)
class JaxprGroup:
    """A fire-shaped group of a traced function: where it is and its shapes."""

    kind: str
    path: str
    x_shape: tuple[int, ...]
    y_shape: tuple[int, ...]
    dtype: str
    weight_shapes: tuple[tuple[int, ...], ...]  # HWIO: squeeze, expand 1x1, expand 3x3
    eqn_indices: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{self.path or 'top'}@{self.eqn_indices[-1]}"

    def describe(self) -> str:
        where = f" in {self.path}" if self.path else ""
        ws = ", ".join("x".join(map(str, w)) for w in self.weight_shapes)
        return (f"{self.kind}: x {'x'.join(map(str, self.x_shape))} {self.dtype}, weights {ws} -> "
                f"{'x'.join(map(str, self.y_shape))}{where}")

    def to_group(self) -> FusionGroup:
        """The same fire module as a zoo-style FusionGroup (synthetic LayerInfos), so the cost
        model and the autotuner treat it like a model's."""
        sq_w, e1_w, e3_w = self.weight_shapes
        n, h, w, _ = self.x_shape
        s_shape = (n, h, w, sq_w[3])
        item = np.dtype(self.dtype).itemsize

        def conv(role, x_shape, w_shape, y_shape, pad):
            moved = (math.prod(x_shape) + math.prod(w_shape) + w_shape[3] + math.prod(y_shape)) * item
            return LayerInfo(f"{self.name}/{role}", "conv2d", self.dtype, (x_shape,), y_shape, w_shape,
                             (w_shape[3],), stride=(1, 1), padding=((pad, pad), (pad, pad)),
                             dilation=(1, 1), groups=1, activation="relu", block=self.name,
                             flops=conv2d_flops(x_shape, w_shape, y_shape), bytes=moved)

        y1, y3 = (n, h, w, e1_w[3]), (n, h, w, e3_w[3])
        members = (conv("squeeze1x1", self.x_shape, sq_w, s_shape, 0), conv("expand1x1", s_shape, e1_w, y1, 0),
                   conv("expand3x3", s_shape, e3_w, y3, 1),
                   LayerInfo(f"{self.name}/concat", "concat", self.dtype, (y1, y3), self.y_shape,
                             block=self.name, bytes=(math.prod(y1) + math.prod(y3) + math.prod(self.y_shape)) * item))
        return FusionGroup(self.name, "fire", members, self.x_shape, self.y_shape, self.dtype,
                           ("straight", "split", "merge"),
                           dict(squeeze=sq_w[3], expand1x1=e1_w[3], expand3x3=e3_w[3]))


@dataclass
class _FireSite:
    plan: Plan
    concat: int
    sq: Match
    e1: Match
    e3: Match
    group: JaxprGroup


def _conv_ok(m: Match, kernel: int) -> bool:
    s = m.site
    pad = kernel // 2
    return (s.layout == "NHWC" and s.w_shape[:2] == (kernel, kernel) and s.kwargs["activation"] == "relu"
            and tuple(s.kwargs["stride"]) == (1, 1) and tuple(s.kwargs["dilation"]) == (1, 1)
            and s.kwargs["groups"] == 1 and tuple(map(tuple, s.kwargs["padding"])) == ((pad, pad),) * 2)


def _fire_sites(plan: Plan, path: str = "") -> list[_FireSite]:
    jaxpr = plan.jaxpr
    uses = Uses(jaxpr)
    convs = {m.out_var: m for m in plan.matches.values() if m.op == "conv2d"}
    found = []
    for i, eqn in enumerate(jaxpr.eqns):
        if i in plan.skipped or i in plan.matches or eqn.primitive.name != "concatenate":
            continue
        if len(eqn.invars) != 2 or eqn.params.get("dimension") != 3:
            continue
        e1, e3 = (convs.get(v) for v in eqn.invars)
        if e1 is None or e3 is None or e1.in_vars[0] is not e3.in_vars[0]:
            continue
        sq = convs.get(e1.in_vars[0])
        if sq is None or not (_conv_ok(sq, 1) and _conv_ok(e1, 1) and _conv_ok(e3, 3)):
            continue
        if len({sq.site.dtype, e1.site.dtype, e3.site.dtype}) != 1:
            continue
        # The squeeze feeds the two expands only, the expands the concatenate only.
        if sq.out_var in uses.outputs or sorted(uses.readers.get(sq.out_var, [])) != sorted(
                (e1.eqn_indices[0], e3.eqn_indices[0])):
            continue
        if any(m.out_var in uses.outputs or uses.readers.get(m.out_var, []) != [i] for m in (e1, e3)):
            continue
        indices = tuple(sorted({*sq.eqn_indices, *e1.eqn_indices, *e3.eqn_indices, i}))
        group = JaxprGroup("fire", path, tuple(sq.site.x_shape), tuple(eqn.outvars[0].aval.shape),
                           sq.site.dtype, (tuple(sq.site.w_shape), tuple(e1.site.w_shape),
                                           tuple(e3.site.w_shape)), indices)
        found.append(_FireSite(plan, i, sq, e1, e3, group))
    for i, child in plan.calls.items():
        eqn = jaxpr.eqns[i]
        name = eqn.params.get("name", "")
        label = f"{eqn.primitive.name}[{name}]" if name else eqn.primitive.name
        found.extend(_fire_sites(child, f"{path}/{label}" if path else label))
    return found


def find_jaxpr_groups(fn: Callable, *args, **kwargs) -> list[JaxprGroup]:
    """Fire-shaped groups in `fn`'s jaxpr on these arguments (see the module docstring)."""
    closed = jax.make_jaxpr(lambda a, k: fn(*a, **k))(args, kwargs)
    return [site.group for site in _fire_sites(build_plan(closed.jaxpr, "auto"))]


def _replace(site: _FireSite) -> None:
    """Puts one fire match in place of the three conv matches and the concatenate."""
    plan = site.plan
    parts = (site.sq, site.e1, site.e3)
    for m in parts:
        plan.matches.pop(max(m.eqn_indices))
        plan.skipped.difference_update(m.eqn_indices)
    # Weights in the user's order go to HWIO through each conv eqn's dimension numbers.
    to_hwio = [_to_hwio(plan.jaxpr.eqns[m.eqn_indices[0]]) for m in parts]
    # Read x once, then (w[, b]) of each conv: the expands' input is the squeeze, inside.
    counts = [len(m.in_vars) - 1 for m in parts]

    def build(x, *vals):
        from jaxcnn.ops.fire import fire

        it = iter(vals)
        ws, bs = [], []
        for perm, count in zip(to_hwio, counts):
            w, *b = [next(it) for _ in range(count)]
            ws.append(w if perm == (0, 1, 2, 3) else jnp.transpose(w, perm))
            bs.append(b[0] if b else None)
        return fire(x, *ws, *bs)

    indices = site.group.eqn_indices
    out = plan.jaxpr.eqns[site.concat].outvars[0]
    in_vars = (site.sq.in_vars[0],) + tuple(v for m in parts for v in m.in_vars[1:])
    g = site.group
    match = Match("fire", indices, out, in_vars,
                  Site("fire", "NHWC", g.x_shape, g.dtype, None, all(len(m.in_vars) == 3 for m in parts),
                       dict(squeeze=g.weight_shapes[0][3], expand1x1=g.weight_shapes[1][3],
                            expand3x3=g.weight_shapes[2][3])),
                  ("conv_general_dilated(squeeze)+bias+relu", "expand 1x1", "expand 3x3", "concatenate"),
                  build=build, algorithm="auto")
    plan.matches[max(indices)] = match
    plan.skipped.update(j for j in indices if j != max(indices))


def _to_hwio(conv_eqn) -> tuple[int, ...]:
    o_axis, i_axis, r_axis, s_axis = conv_eqn.params["dimension_numbers"].rhs_spec
    return (r_axis, s_axis, i_axis, o_axis)


class FusedOptimized(Optimized):
    """jaxcnn.optimize's rewrites plus one jaxcnn.fire per chosen fire-shaped group."""

    def __init__(self, fn, example_args, policy, groups, decide_kwargs):
        if not (callable(groups) or groups in GROUPS):
            raise ValueError(f"groups must be one of {GROUPS} or a callable(JaxprGroup) -> bool, got {groups!r}")
        if policy == "xla":
            raise ValueError("policy='xla' rewrites nothing, so there is nothing to fuse: use fn itself")
        self.groups = groups
        self.decide_kwargs = decide_kwargs
        self._decisions: dict[int, list] = {}
        super().__init__(fn, example_args, policy)

    def _traced(self, args, kwargs):
        traced = super()._traced(args, kwargs)
        if id(traced) not in self._decisions:
            sites = _fire_sites(traced.plan)
            chosen: list = []
            if self.groups == "auto" and sites:
                decisions, *_ = decide_groups([s.group.to_group() for s in sites], **self.decide_kwargs)
                chosen = [(s, d.choice == "fused", d) for s, d in zip(sites, decisions)]
            else:
                for s in sites:
                    take = (self.groups == "all") if isinstance(self.groups, str) else bool(self.groups(s.group))
                    chosen.append((s, take, None))
            for s, take, _ in chosen:
                if take:
                    _replace(s)
            self._decisions[id(traced)] = [(s.group, take, d) for s, take, d in chosen]
        return traced

    def decisions(self, *args, **kwargs) -> list[tuple[JaxprGroup, bool, GroupDecision | None]]:
        """(group, fused?, the planner's decision or None) per fire-shaped group found."""
        traced = self._traced(*self._args(args, kwargs))
        return self._decisions[id(traced)]

    def explain(self, *args, **kwargs) -> str:
        rows = []
        for g, take, d in self.decisions(*args, **kwargs):
            why = d.reason if d is not None else f"groups={self.groups!r}"
            times = (_fmt_ms(d.time("fused")), _fmt_ms(d.time("xla"))) if d is not None else ("-", "-")
            rows.append([g.name, g.describe(), *times, "fused" if take else "as optimize", why])
        head = (_table(["group", "what", "fused ms", "XLA ms", "choice", "why"], rows) if rows
                else "no fire-shaped group")
        return head + "\n" + super().explain(*args, **kwargs)


def optimize(fn: Callable, *, example_args=None, policy="auto", groups: Any = "auto",
             costs: str = "auto", cache: Any = None, iters: int = 20, warmup: int = 3) -> FusedOptimized:
    """`jaxcnn.optimize(fn, policy=policy)` plus fused fire modules.

    groups: "auto" (each fire-shaped group decided like a zoo model's: measured where the CUDA
      kernels run, else the cost model; `costs`, `cache`, `iters`, `warmup` as plan_fusion's),
      "all", "none", or a callable(JaxprGroup) -> bool.
    Returns a callable with .explain(*args) (decisions, then every rewrite), .decisions(*args)
    and .rewrites(*args); it works under jit, grad and vmap like jaxcnn.optimize's.
    """
    return FusedOptimized(fn, example_args, policy, groups,
                          dict(costs=costs, cache=cache, iters=iters, warmup=warmup))
