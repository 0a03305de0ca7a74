"""The layout plan of a chain of layers: each node's time in every layout it can run in
(tuning.layer_autotune: measured or modelled), then the cheapest layout per node by an exact
dynamic program over the chain, transforms included; zoo models as chains; explain().

    plan = plan_model_layouts("squeezenet1_1", batch=64, dtype="bfloat16")
    print(plan.explain())
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxcnn.models import get_model
from jaxcnn.ops.layout_axes import LAYOUTS, check_layout
from jaxcnn.costmodel.roofline import memory_ms
from jaxcnn.profile.gpu_specs import GpuSpec
from jaxcnn.tuning.layer import POOL_OPS, Block, Layer
from jaxcnn.tuning.layer_autotune import autotune_conv, autotune_transforms, pool_choice
from jaxcnn.tuning.layer_choice import LayerChoice
from jaxcnn.tuning.text_table import fmt_ms, text_table
from jaxcnn.tuning.tuner_args import Shape, check_iters, dtype_name, resolve_spec, shape4


# --------------------------------------------------------------------------- costs of layers


@dataclass(frozen=True)
class LayerCost:
    """What choose_chain needs of one chain node: its time in each layout it can run in (with
    the algorithm, per member for a block), its activation shapes, and XLA's time if known."""

    name: str
    x_shape: Shape
    y_shape: Shape
    dtype: str
    times: Mapping[str, float]  # layout -> ms; a missing layout cannot run
    algorithms: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # per member
    members: tuple[str, ...] = ()  # layer names (one for a plain layer)
    source: str = "given"
    xla_ms: float | None = None
    op: str = ""
    # The same time in every layout (elementwise ops): it cannot sway the choice, so its
    # source does not count toward the plan's.
    layout_independent: bool = False

    def __post_init__(self) -> None:
        shape4(self.x_shape, f"{self.name or 'layer'} x_shape")
        shape4(self.y_shape, f"{self.name or 'layer'} y_shape")
        if not isinstance(self.times, Mapping) or not self.times:
            raise ValueError(f"layer {self.name!r}: times must be a non-empty {{layout: ms}} mapping")
        for lay, t in self.times.items():
            check_layout(lay, f"layer {self.name!r} times key")
            if not isinstance(t, (int, float, np.floating, np.integer)) or not t >= 0 or not math.isfinite(t):
                raise ValueError(f"layer {self.name!r}: time in {lay} must be a finite ms >= 0, got {t!r}")


def layer_cost(item: Any, *, costs: str = "auto", cache: Any = None, iters: int = 20, warmup: int = 3,
               gpu: str | GpuSpec | None = None) -> LayerCost:
    """LayerCost of a Layer, Block, jaxcnn.models LayerInfo, ConvChoice/PoolChoice or LayerCost.

    costs: "auto" (measured where the CUDA kernels run, else model), "measured" or "model"."""
    if costs not in ("auto", "measured", "model"):
        raise ValueError(f"costs must be 'auto', 'measured', 'model', a callable or a list of "
                         f"LayerCost; got {costs!r}")
    measure = {"auto": None, "measured": True, "model": False}[costs]
    if isinstance(item, LayerCost):
        return item
    if isinstance(item, LayerChoice):
        return _cost_from_choice(item)
    if isinstance(item, Block):
        parts = [layer_cost(layer, costs=costs, cache=cache, iters=iters, warmup=warmup, gpu=gpu)
                 for layer in item.layers]
        layouts = [lay for lay in LAYOUTS if all(lay in p.times for p in parts)]
        if not layouts:
            raise ValueError(f"block {item.name!r}: no layout in which every layer can run")
        xla = sum(p.xla_ms for p in parts) if all(p.xla_ms is not None for p in parts) else None
        sources = {p.source for p in parts if not p.layout_independent} or {parts[0].source}
        return LayerCost(item.name, item.x_shape, item.y_shape, item.dtype,
                         {lay: float(sum(p.times[lay] for p in parts)) for lay in layouts},
                         {lay: tuple(a for p in parts for a in p.algorithms[lay]) for lay in layouts},
                         tuple(m for p in parts for m in p.members),
                         sources.pop() if len(sources) == 1 else "mixed", xla, "block",
                         all(p.layout_independent for p in parts))
    if not isinstance(item, Layer):
        if hasattr(item, "input_shapes") and hasattr(item, "op"):
            item = Layer.from_layer_info(item)
        else:
            raise TypeError(f"a chain item must be a Layer, Block, LayerInfo, ConvChoice or LayerCost; "
                            f"got {type(item).__name__}")
    if item.op == "conv2d":
        choice = autotune_conv(item.x_shape, item.w_shape, item.dtype, stride=item.stride,
                               padding=item.padding, dilation=item.dilation, groups=item.groups,
                               activation=item.activation, precision=item.precision, bias=item.bias,
                               cache=cache, iters=iters, warmup=warmup, measure=measure, gpu=gpu,
                               name=item.name)
        return _cost_from_choice(choice)
    if item.op in POOL_OPS:
        return _cost_from_choice(pool_choice(item, cache, iters, warmup, measure, False, gpu))
    # Elementwise/concat: same bytes in every layout, so a constant that cannot sway the
    # choice; modelled even when measuring.
    spec, _ = resolve_spec(gpu, measured=False)
    t = memory_ms(item.bytes, spec)
    return LayerCost(item.name, item.x_shape, item.y_shape, item.dtype, {lay: t for lay in LAYOUTS},
                     {lay: ("xla",) for lay in LAYOUTS}, (item.name,), "model", t, item.op, True)


def _cost_from_choice(choice: LayerChoice) -> LayerCost:
    times = choice.times_by_layout()
    if not times:
        raise ValueError(f"layer {choice.layer.name!r}: no candidate can run "
                         f"({'; '.join(c.error for c in choice.candidates)})")
    return LayerCost(choice.layer.name, choice.layer.x_shape, choice.layer.y_shape, choice.layer.dtype,
                     times, {lay: (choice.best_in(lay).algorithm,) for lay in times},
                     (choice.layer.name,), choice.source, choice.xla_ms, choice.layer.op)


# --------------------------------------------------------------------------- the chain DP


@dataclass(frozen=True)
class Transform:
    """A layout transform of the activation entering chain node `before` (len(steps): the
    chain's output)."""

    before: int
    shape: Shape  # logical NHWC
    src: str
    dst: str
    time_ms: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ChainStep:
    name: str
    op: str
    layout: str
    algorithms: tuple[str, ...]  # per member layer
    members: tuple[str, ...]
    time_ms: float
    nhwc_ms: float | None  # the node's time in NHWC, for comparison
    xla_ms: float | None
    source: str

    @property
    def algorithm(self) -> str:
        """The member layers' algorithms, e.g. "tensor_core" or "tensor_core x3, xla"."""
        counts = dict.fromkeys(self.algorithms, 0)
        for a in self.algorithms:
            counts[a] += 1
        if len(counts) == 1:
            return self.algorithms[0]
        return ", ".join(a if n == 1 else f"{a} x{n}" for a, n in counts.items())

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["algorithm"] = self.algorithm
        return out


@dataclass(frozen=True)
class ChainPlan:
    """choose_chain's answer: a layout per node, the transforms between them, the totals."""

    steps: tuple[ChainStep, ...]
    transforms: tuple[Transform, ...]
    total_ms: float
    all_nhwc_ms: float | None  # every node in NHWC (inf -> None when some node cannot)
    xla_ms: float | None  # sum of XLA's per-layer times, when every node has one
    input_layout: str
    output_layout: str
    source: str
    model: str | None = None
    batch: int | None = None
    dtype: str | None = None
    note: str = ""

    @property
    def layer_ms(self) -> float:
        return float(sum(s.time_ms for s in self.steps))

    @property
    def transform_ms(self) -> float:
        return float(sum(t.time_ms for t in self.transforms))

    @property
    def layouts(self) -> tuple[str, ...]:
        return tuple(s.layout for s in self.steps)

    @property
    def speedup_vs_nhwc(self) -> float | None:
        if self.all_nhwc_ms is None or self.total_ms <= 0:
            return None
        return self.all_nhwc_ms / self.total_ms

    def assignments(self) -> dict[str, tuple[str, str]]:
        """{layer name: (layout, algorithm)} for every member layer of every node."""
        return {m: (s.layout, a) for s in self.steps for m, a in zip(s.members, s.algorithms)}

    def to_dict(self) -> dict[str, Any]:
        return dict(
            model=self.model, batch=self.batch, dtype=self.dtype, source=self.source, note=self.note,
            input_layout=self.input_layout, output_layout=self.output_layout,
            total_ms=self.total_ms, layer_ms=self.layer_ms, transform_ms=self.transform_ms,
            all_nhwc_ms=self.all_nhwc_ms, speedup_vs_nhwc=self.speedup_vs_nhwc, xla_ms=self.xla_ms,
            steps=[s.to_dict() for s in self.steps], transforms=[t.to_dict() for t in self.transforms],
        )

    def explain(self) -> str:
        title = f"{self.model} batch={self.batch} {self.dtype}: " if self.model else ""
        lines = [f"{title}layout plan ({self.source} costs){'; ' + self.note if self.note else ''}"]
        by_before = {t.before: t for t in self.transforms}
        rows = []
        for i, s in enumerate(self.steps):
            t = by_before.get(i)
            if t is not None:
                rows.append(["", f"  to_layout {t.src}->{t.dst}", "", "", fmt_ms(t.time_ms), "", ""])
            rows.append([str(i), s.name, s.layout, s.algorithm[:40], fmt_ms(s.time_ms),
                         fmt_ms(s.nhwc_ms), fmt_ms(s.xla_ms)])
        t = by_before.get(len(self.steps))
        if t is not None:
            rows.append(["", f"  to_layout {t.src}->{t.dst}", "", "", fmt_ms(t.time_ms), "", ""])
        lines.append(text_table(["#", "layer", "layout", "algorithm", "ms", "NHWC ms", "XLA ms"], rows))
        lines.append(f"total {fmt_ms(self.total_ms)} ms = layers {fmt_ms(self.layer_ms)} + "
                     f"{len(self.transforms)} transforms {fmt_ms(self.transform_ms)}")
        if self.all_nhwc_ms is not None:
            lines.append(f"all-NHWC {fmt_ms(self.all_nhwc_ms)} ms: speedup {self.speedup_vs_nhwc:.3f}x")
        if self.xla_ms is not None:
            lines.append(f"XLA (sum of per-layer times) {fmt_ms(self.xla_ms)} ms: "
                         f"XLA/plan = {self.xla_ms / self.total_ms:.3f}")
        counts = {lay: sum(1 for s in self.steps if s.layout == lay) for lay in LAYOUTS}
        lines.append("layers per layout: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        return "\n".join(lines)


TransformCost = Callable[[Shape, str, str, str], float]


def _transform_cost_fn(transform_costs: Any, costs_mode: str, nodes: Sequence[LayerCost], layouts,
                       cache, iters, warmup, gpu, input_layout, output_layout) -> tuple[TransformCost, str]:
    if callable(transform_costs):
        return transform_costs, "given"
    if transform_costs not in (None, "auto", "measured", "model"):
        raise ValueError(f"transform_costs must be None, 'auto', 'measured', 'model' or a callable "
                         f"(shape, dtype, src, dst) -> ms; got {transform_costs!r}")
    mode = transform_costs or costs_mode
    measure = {"auto": None, "measured": True, "model": False, "given": False}[mode]
    dtypes = {n.dtype for n in nodes}
    table: dict[tuple[Shape, str, str, str], float] = {}
    sources = set()
    for dtype in dtypes:
        shapes = [nodes[0].x_shape] + [n.y_shape for n in nodes]
        shapes = [s for s, n in zip(shapes, [nodes[0], *nodes]) if n.dtype == dtype]
        every = set(layouts) | {input_layout, output_layout}
        pairs = [(a, b) for a in every for b in every if a != b]
        found = autotune_transforms(shapes, dtype, pairs=pairs, cache=cache, iters=iters,
                                    warmup=warmup, measure=measure, gpu=gpu)
        for (s, a, b), (ms, src) in found.items():
            table[(s, dtype, a, b)] = ms
            if a != b:
                sources.add(src)
    return (lambda shape, dtype, a, b: table[(tuple(shape), dtype, a, b)]), (
        sources.pop() if len(sources) == 1 else "mixed" if sources else "model")


def choose_chain(layers: Sequence[Any], *, input_layout: str = "NHWC", output_layout: str = "NHWC",
                 costs: Any = "auto", transform_costs: Any = None, layouts: Sequence[str] = LAYOUTS,
                 cache: Any = None, iters: int = 20, warmup: int = 3,
                 gpu: str | GpuSpec | None = None) -> ChainPlan:
    """The cheapest layout for every node of a chain, by exact dynamic programming.

    layers: Layer / Block / LayerInfo / ConvChoice / LayerCost items; node i's input is node
      i-1's output (their shapes must agree).
    costs: "auto" | "measured" | "model" (see layer_cost), or a callable item -> LayerCost or
      {layout: ms}; LayerCost items are used as they are.
    transform_costs: None (same source as costs; "given" costs use the model), "auto",
      "measured", "model", or a callable (nhwc_shape, dtype, src, dst) -> ms.
    layouts: the layouts a node may use.

    The state is the layout of the activation between nodes; total = sum of node times + a
    transform wherever consecutive layouts differ (and from input_layout / to output_layout).
    O(L * |layouts|^2); ties keep the earlier layout in `layouts`.
    """
    input_layout = check_layout(input_layout, "input_layout")
    output_layout = check_layout(output_layout, "output_layout")
    if isinstance(layouts, str) or not isinstance(layouts, Sequence) or not layouts:
        raise TypeError(f"layouts must be a non-empty sequence of layout strings, got {layouts!r}")
    layouts = tuple(dict.fromkeys(check_layout(lay, "layouts item") for lay in layouts))
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or not layers:
        raise ValueError("layers must be a non-empty sequence")
    check_iters(iters, warmup)

    costs_mode = "given"
    if callable(costs):
        nodes = [_call_cost(costs, item, i) for i, item in enumerate(layers)]
    else:
        if costs not in ("auto", "measured", "model"):
            raise ValueError(f"costs must be 'auto', 'measured', 'model' or a callable, got {costs!r}")
        costs_mode = costs
        nodes = [layer_cost(item, costs=costs, cache=cache, iters=iters, warmup=warmup, gpu=gpu)
                 for item in layers]
    for i in range(1, len(nodes)):
        if tuple(nodes[i - 1].y_shape) != tuple(nodes[i].x_shape):
            raise ValueError(f"layers[{i}] ({nodes[i].name!r}) takes {nodes[i].x_shape} but "
                             f"layers[{i - 1}] ({nodes[i - 1].name!r}) gives {nodes[i - 1].y_shape}")
    if all(n.source == "given" for n in nodes) and transform_costs is None:
        transform_costs = "model"
    tcost, tsource = _transform_cost_fn(transform_costs, costs_mode, nodes, layouts, cache, iters,
                                        warmup, gpu, input_layout, output_layout)

    def trans(shape, dtype, a, b) -> float:
        if a == b:
            return 0.0
        t = float(tcost(tuple(shape), dtype, a, b))
        if not t >= 0 or not math.isfinite(t):
            raise ValueError(f"transform cost {a}->{b} of {shape} must be a finite ms >= 0, got {t!r}")
        return t

    best, back = _dp(nodes, layouts, input_layout, output_layout, trans)
    if best is None:
        raise ValueError(f"no assignment of layouts {layouts} lets every layer run")
    total, assignment = best
    steps, transforms = [], []
    prev = input_layout
    for i, (node, lay) in enumerate(zip(nodes, assignment)):
        if lay != prev:
            transforms.append(Transform(i, tuple(node.x_shape), prev, lay, trans(node.x_shape, node.dtype, prev, lay)))
        steps.append(ChainStep(node.name, node.op, lay, tuple(node.algorithms.get(lay, ("?",))),
                               node.members or (node.name,), float(node.times[lay]),
                               node.times.get("NHWC"), node.xla_ms, node.source))
        prev = lay
    if prev != output_layout:
        last = nodes[-1]
        transforms.append(Transform(len(nodes), tuple(last.y_shape), prev, output_layout,
                                    trans(last.y_shape, last.dtype, prev, output_layout)))
    all_nhwc = None
    if all("NHWC" in n.times for n in nodes):
        all_nhwc = (trans(nodes[0].x_shape, nodes[0].dtype, input_layout, "NHWC")
                    + sum(float(n.times["NHWC"]) for n in nodes)
                    + trans(nodes[-1].y_shape, nodes[-1].dtype, "NHWC", output_layout))
    xla = float(sum(n.xla_ms for n in nodes)) if all(n.xla_ms is not None for n in nodes) else None
    sources = {n.source for n in nodes if not n.layout_independent} or {nodes[0].source}
    sources |= {tsource}
    return ChainPlan(tuple(steps), tuple(transforms), float(total), all_nhwc, xla, input_layout,
                     output_layout, sources.pop() if len(sources) == 1 else "mixed")


def _call_cost(fn: Callable, item: Any, index: int) -> LayerCost:
    if isinstance(item, LayerCost):
        return item
    out = fn(item)
    if isinstance(out, LayerCost):
        return out
    if isinstance(out, Mapping):
        if isinstance(item, Block):
            x_shape, y_shape, dtype, name = item.x_shape, item.y_shape, item.dtype, item.name
            members = tuple(layer.name for layer in item.layers)
        elif isinstance(item, Layer):
            x_shape, y_shape, dtype, name, members = item.x_shape, item.y_shape, item.dtype, item.name, (item.name,)
        else:
            raise TypeError(f"layers[{index}]: a {{layout: ms}} cost needs a Layer or Block item, "
                            f"got {type(item).__name__}")
        times = {lay: (v[0] if isinstance(v, tuple) else v) for lay, v in out.items()}
        algos = {lay: ((v[1],) * len(members) if isinstance(v, tuple) else ("auto",) * len(members))
                 for lay, v in out.items()}
        return LayerCost(name, x_shape, y_shape, dtype, times, algos, members, "given", None,
                         "block" if isinstance(item, Block) else item.op)
    raise TypeError(f"costs callable must return a LayerCost or a {{layout: ms}} mapping for "
                    f"layers[{index}], got {type(out).__name__}")


def _dp(nodes: Sequence[LayerCost], layouts: tuple[str, ...], input_layout: str, output_layout: str,
        trans: Callable) -> tuple[tuple[float, list[str]] | None, Any]:
    """Exact DP: best[l] = cheapest cost of nodes 0..i with node i in layout l."""
    inf = math.inf
    first = nodes[0]
    best = {lay: (trans(first.x_shape, first.dtype, input_layout, lay) + first.times[lay]
                  if lay in first.times else inf) for lay in layouts}
    back: list[dict[str, str]] = []
    for i in range(1, len(nodes)):
        prev_node, node = nodes[i - 1], nodes[i]
        new, arg = {}, {}
        for lay in layouts:
            if lay not in node.times:
                new[lay], arg[lay] = inf, layouts[0]
                continue
            cand_cost, cand_prev = inf, layouts[0]
            for p in layouts:  # strict < : ties keep the earlier layout
                if best[p] == inf:
                    continue
                c = best[p] + trans(prev_node.y_shape, prev_node.dtype, p, lay)
                if c < cand_cost:
                    cand_cost, cand_prev = c, p
            new[lay], arg[lay] = cand_cost + node.times[lay], cand_prev
        best = new
        back.append(arg)
    last = nodes[-1]
    final_cost, final = inf, None
    for lay in layouts:
        if best[lay] == inf:
            continue
        c = best[lay] + trans(last.y_shape, last.dtype, lay, output_layout)
        if c < final_cost:
            final_cost, final = c, lay
    if final is None:
        return None, None
    assignment = [final]
    for arg in reversed(back):
        assignment.append(arg[assignment[-1]])
    assignment.reverse()
    return (final_cost, assignment), back


# --------------------------------------------------------------------------- zoo models


def model_chain(model_name: str, batch: int = 1, dtype: Any = "bfloat16", *,
                precision: Any = None, split_blocks: bool = False) -> list[Layer | Block]:
    """The 4-D part of a zoo model's layer table as a chain: consecutive layers of one block
    (fire, inception, residual: branches that meet again) become one Block that runs in one
    layout; the chain stops where activations become 2-D (dense, softmax), whose flatten needs
    NHWC order. split_blocks=True keeps every layer its own node (a linear-chain approximation:
    it treats branch layers as if they fed each other)."""
    if not isinstance(batch, (int, np.integer)) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    dtype = dtype_name(dtype)
    table = get_model(model_name).layers(int(batch), dtype)
    chain: list[Layer | Block] = []
    group: list[Layer] = []
    group_name = None

    def flush():
        nonlocal group, group_name
        if group:
            chain.append(Block(group_name, tuple(group)) if group_name is not None else group[0])
        group, group_name = [], None

    for info in table:
        if len(info.input_shapes[0]) != 4 or len(info.output_shape) != 4:
            break
        layer = Layer.from_layer_info(info, precision)
        block = None if split_blocks else info.block
        if block is None or block != group_name:
            flush()
        if block is None:
            chain.append(layer)
        else:
            group_name = block
            group.append(layer)
    flush()
    return chain


def plan_model_layouts(model_name: str, batch: int = 1, dtype: Any = "bfloat16", *,
                       costs: Any = "auto", layouts: Sequence[str] = LAYOUTS, cache: Any = None,
                       iters: int = 20, warmup: int = 3, gpu: str | GpuSpec | None = None,
                       precision: Any = None, split_blocks: bool = False) -> ChainPlan:
    """choose_chain over a zoo model's chain (model_chain), NHWC in and out."""
    chain = model_chain(model_name, batch, dtype, precision=precision, split_blocks=split_blocks)
    plan = choose_chain(chain, costs=costs, layouts=layouts, cache=cache, iters=iters,
                        warmup=warmup, gpu=gpu)
    note = ("blocks run in one layout" if not split_blocks else "blocks split (approximation)")
    note += "; relu6/add/concat modelled (same bytes in every layout)"
    return dataclasses.replace(plan, model=model_name, batch=int(batch), dtype=dtype_name(dtype),
                               note=note)


# --------------------------------------------------------------------------- explain



def explain(obj: Any = None, *args: Any, **kwargs: Any) -> str:
    """A readable table for a choice or a plan: `explain(choice)`, `explain(plan)`, or the
    arguments of autotune_conv (`explain(x_shape, w_shape, dtype, ...)`), or a zoo model name
    with plan_model_layouts' arguments (`explain("vgg16", batch=8)`)."""
    if hasattr(obj, "explain") and callable(obj.explain):
        if args or kwargs:
            raise TypeError("explain(choice_or_plan) takes no further arguments")
        return obj.explain()
    if isinstance(obj, str):
        return plan_model_layouts(obj, *args, **kwargs).explain()
    if isinstance(obj, Sequence):
        return autotune_conv(obj, *args, **kwargs).explain()
    raise TypeError(f"explain takes a choice, a plan, conv shapes or a model name; got {type(obj).__name__}")
