"""The fusion plan: which groups of a zoo model (or, through decide_groups, of a user jaxpr)
run fused, from a cost model checked by autotuning on the device.

    from jaxcnn import fusion
    plan = fusion.plan_fusion("squeezenet1_1", batch=64, dtype="bfloat16")   # costs="auto"
    print(plan.explain())                      # group, members, candidates, choice and why
    y = jax.jit(lambda p, x: plan.apply(p, x))(params, x)

Candidates of a group: "fused" (jaxcnn.fire / jaxcnn.inception / jaxcnn.conv2d_pool /
jaxcnn.conv1x1_depthwise), "xla"
(the zoo's layers on XLA's ops: what a plain JAX model runs) and, when measuring, "jaxcnn"
(the same layers one jaxcnn kernel each). Where the CUDA kernels run, every candidate's device
time is measured (one profiler trace for all groups) and cached per GPU kind, shapes and dtype
in the autotune cache (jaxcnn.tuning.autotune_cache); the decision is the fastest measured candidate. Elsewhere
the decision is jaxcnn.costmodel.fusion_cost's estimate, fused vs XLA.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from jaxcnn.costmodel import fusion_cost as cost_model
from jaxcnn.tuning.fusion_groups import KINDS, FusionGroup, conv2d_pool_fn, find_groups
from jaxcnn.models import get_model
from jaxcnn.models.backends import JAXCNN_OPS, XLA_OPS, get_ops
from jaxcnn.models.googlenet import inception
from jaxcnn.models.layers import Net, bind_layer
from jaxcnn.models.mobilenet import expand_depthwise, inverted_residual_block
from jaxcnn.models.squeezenet import fire
from jaxcnn.ops.fire.api import fire_block
from jaxcnn.ops.inception.api import inception_block
from jaxcnn.costmodel.roofline import KERNEL_FLOOR_MS
from jaxcnn.tuning import case_timing
from jaxcnn.tuning import measure as measuring
from jaxcnn.tuning.autotune_cache import AutotuneCache, created_now
from jaxcnn.tuning.layout_apply import LayoutOps
from jaxcnn.tuning.layout_plan import ChainPlan
from jaxcnn.tuning.text_table import fmt_ms, text_table
from jaxcnn.tuning.tuner_args import check_cache_and_gpu, check_iters, dtype_name, resolve_spec

CANDIDATES = ("fused", "xla", "jaxcnn")
RESTS = ("xla", "jaxcnn")
# Kinds whose group is a whole zoo block: "jaxcnn" swaps the block's op table; the others
# (conv_pool, expand_depthwise) run just their members on jaxcnn's kernels.
WHOLE_BLOCK_KINDS = ("fire", "inception")
COSTS = ("auto", "measured", "model")


@dataclass(frozen=True)
class Candidate:
    """One version of a group: its time (ms) or why it cannot run."""

    name: str
    time_ms: float | None
    source: str  # "measured" (device time), "wall" (no device trace), "model"
    note: str = ""
    error: str = ""
    dram_bytes: float | None = None  # model versions only
    launches: int | None = None

    @property
    def ok(self) -> bool:
        return self.time_ms is not None and math.isfinite(self.time_ms)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class GroupDecision:
    group: FusionGroup
    candidates: tuple[Candidate, ...]
    choice: str  # a candidate name
    reason: str
    source: str  # "measured" | "model"

    def candidate(self, name: str) -> Candidate | None:
        return next((c for c in self.candidates if c.name == name), None)

    def time(self, name: str) -> float | None:
        c = self.candidate(name)
        return c.time_ms if c is not None and c.ok else None

    def to_dict(self) -> dict[str, Any]:
        g = self.group
        return dict(group=g.name, kind=g.kind, members=list(g.member_names), modes=list(g.modes),
                    x_shape=list(g.x_shape), y_shape=list(g.y_shape), dtype=g.dtype,
                    candidates=[c.to_dict() for c in self.candidates], choice=self.choice,
                    reason=self.reason, source=self.source)


@dataclass(frozen=True)
class FusionPlan:
    """plan_fusion's answer: a decision per group, and how to run the model with it."""

    model: str
    batch: int
    dtype: str
    decisions: tuple[GroupDecision, ...]
    source: str  # "measured", "model" or "mixed"
    device: str
    skipped: Mapping[str, str]  # kind -> why it was not considered
    note: str = ""

    @property
    def fused_groups(self) -> tuple[str, ...]:
        return tuple(d.group.name for d in self.decisions if d.choice == "fused")

    def choices(self) -> dict[str, str]:
        """{group name: chosen candidate}."""
        return {d.group.name: d.choice for d in self.decisions}

    def total(self, name: str | None = None) -> float | None:
        """Sum over groups of candidate `name`'s time (None: the chosen ones)."""
        times = [d.time(name or d.choice) for d in self.decisions]
        return None if not times or any(t is None for t in times) else float(sum(times))

    def to_dict(self) -> dict[str, Any]:
        return dict(model=self.model, batch=self.batch, dtype=self.dtype, source=self.source,
                    device=self.device, skipped=dict(self.skipped), note=self.note,
                    fused_groups=list(self.fused_groups), chosen_ms=self.total(),
                    xla_ms=self.total("xla"), groups=[d.to_dict() for d in self.decisions])

    def explain(self) -> str:
        lines = [f"{self.model} batch={self.batch} {self.dtype}: fusion plan ({self.source} costs on "
                 f"{self.device}){'; ' + self.note if self.note else ''}"]
        rows = []
        for i, d in enumerate(self.decisions):
            fused, xla = d.candidate("fused"), d.candidate("xla")
            mib = "-"
            if fused is not None and xla is not None and fused.dram_bytes and xla.dram_bytes:
                mib = f"{xla.dram_bytes / 2**20:.2f}->{fused.dram_bytes / 2**20:.2f}"
            launches = "-"
            if fused is not None and xla is not None and fused.launches and xla.launches:
                launches = f"{xla.launches}->{fused.launches}"
            cand = lambda name: (fmt_ms(d.time(name)) if d.candidate(name) is None  # noqa: E731
                                 or d.candidate(name).ok else "error")
            rows.append([str(i), d.group.name, d.group.kind, d.group.short_members(), cand("fused"),
                         cand("xla"), cand("jaxcnn") if d.candidate("jaxcnn") else "-", mib, launches,
                         d.choice, d.reason])
        if rows:
            lines.append(text_table(["#", "group", "kind", "members", "fused ms", "XLA ms", "jaxcnn ms",
                                 "DRAM MiB XLA->fused", "kernels", "choice", "why"], rows))
        else:
            lines.append("no fusable group (fire modules, inception blocks, conv->ReLU->max pool, "
                         "expand->depthwise)")
        for d in self.decisions:
            for c in d.candidates:
                if c.error:
                    lines.append(f"  {d.group.name} {c.name}: cannot run: {c.error}")
        chosen, xla = self.total(), self.total("xla")
        if chosen is not None and xla is not None and chosen > 0:
            lines.append(f"groups: {len(self.fused_groups)} of {len(self.decisions)} fused; "
                         f"chosen {fmt_ms(chosen)} ms vs XLA {fmt_ms(xla)} ms over the groups "
                         f"(XLA/plan = {xla / chosen:.2f}); the other layers run as XLA")
        if self.source in ("model", "mixed"):
            lines.append(f"model: per kernel max(FLOPs / peak, DRAM bytes / bandwidth, "
                         f"{KERNEL_FLOOR_MS} ms) + {cost_model.LAUNCH_MS} ms launch "
                         "(assumed); measured device times replace it where the CUDA kernels run")
        for kind, why in self.skipped.items():
            lines.append(f"skipped kind {kind}: {why}")
        return "\n".join(lines)

    def apply(self, params, x, *, rest: Any = "xla", softmax: bool = False):
        """Run the model on NHWC images `x`: fused groups through their fused kernels (the
        backends-table route of Net.block), "jaxcnn"-chosen groups layer by layer on jaxcnn's
        kernels, everything else on `rest`: "xla" or "jaxcnn" (that backend's ops), or a
        jaxcnn.layouts ChainPlan of the same model (each other layer in the plan's layout and
        kernel, as apply_plan runs it, "jaxcnn"-chosen groups included; pass it where its
        explain() beats XLA). Works under jit, grad and vmap."""
        spec = get_model(self.model)
        table = spec.layers(x.shape[0], x.dtype)
        layout_ops = None
        if isinstance(rest, str):
            if rest not in RESTS:
                raise ValueError(f"rest must be one of {RESTS} or a jaxcnn.layouts ChainPlan, got {rest!r}")
            ops = get_ops(rest)
        else:
            if not isinstance(rest, ChainPlan):
                raise TypeError(f"rest must be one of {RESTS} or a jaxcnn.layouts ChainPlan, got "
                                f"{type(rest).__name__}")
            if rest.model not in (None, self.model):
                raise ValueError(f"rest is a layout plan of {rest.model!r}, this plan is of {self.model!r}")
            layout_ops = LayoutOps(table, rest.assignments(), JAXCNN_OPS)
            ops = layout_ops.table()
        net = _PlannedNet(ops, params, self, table, layout_ops)
        logits = spec.body(net, x)
        return net.softmax("softmax", logits) if softmax else logits


# --------------------------------------------------------------------------- running groups


def fused_block_fn(kind: str, ops: Mapping[str, Callable] | None = None) -> Callable:
    """The backends-table entry `ops[kind](layers, params, x)` running a zoo block fused;
    `ops`: the table the layers outside the fused kernel run on (default XLA's)."""
    if kind == "inverted_residual":
        return functools.partial(inverted_residual_block, ops=ops)
    if kind == "fire":
        return fire_block
    if kind == "inception":
        return inception_block
    raise ValueError(f"no fused block for kind {kind!r}")


def _conv_pool_call(conv, pool, x, w, b):
    return conv2d_pool_fn()(x, w, b, stride=tuple(conv.stride), padding=tuple(map(tuple, conv.padding)),
                            dilation=tuple(conv.dilation), pool_window=tuple(pool.window),
                            pool_stride=tuple(pool.stride), pool_padding=tuple(map(tuple, pool.padding)))


class _PlannedNet(Net):
    """A Net whose blocks run as the plan chose, and whose planned conv->pool pairs run as one
    conv2d_pool call (the conv's own result is still returned to the body, so any other reader
    stays correct; under jit XLA drops it when the pool was its only reader)."""

    def __init__(self, ops, params, plan: FusionPlan, table, layout_ops=None):
        # With a layout plan the rest runs through jaxcnn.tuning.layout_apply's LayoutOps, which counts
        # the ops it runs: layers a fused kernel replaces are skipped over in its count.
        self._layout_ops = layout_ops
        self._jaxcnn_ops = JAXCNN_OPS
        self._names = [info.name for info in table]
        self._choice = plan.choices()
        self._groups = {d.group.name: d.group for d in plan.decisions}
        # What a fused block's other layers run on: the layout table, or the rest's (unwrapped:
        # the wrappers below name a layer by the count of layers run, a fused block's are in).
        self._block_ops = ops
        self._straight = {d.group.members[0].name: d.group for d in plan.decisions
                          if d.group.kind == "conv_pool" and d.choice == "fused"}
        # Groups other than whole blocks measured fastest as jaxcnn kernels (without a layout plan).
        self._per_layer = set() if layout_ops is not None else {
            m.name for d in plan.decisions if d.group.kind not in WHOLE_BLOCK_KINDS and d.choice == "jaxcnn"
            for m in d.group.members}
        self._pending: dict[int, tuple] = {}
        super().__init__(self._wrap(ops), params)

    def _wrap(self, ops):
        if not self._straight and not self._per_layer:
            return dict(ops)
        pools = {g.members[1].name: g for g in self._straight.values()}

        def base(op, name):
            return (self._jaxcnn_ops if name in self._per_layer else ops)[op]

        def conv2d(x, w, b=None, **kw):
            name = self._names[len(self.layers)]
            y = base("conv2d", name)(x, w, b, **kw)
            if name in self._straight:
                self._pending[id(y)] = (y, x, w, b, self._straight[name])
            return y

        def maxpool(x, **kw):
            name = self._names[len(self.layers)]
            hit = self._pending.get(id(x))
            if name in pools and hit is not None and hit[0] is x and hit[4] is pools[name]:
                _, cx, w, b, group = hit
                if self._layout_ops is not None:
                    self._layout_ops.index += 1  # the pool layer, run inside conv2d_pool
                return _conv_pool_call(group.members[0], group.members[1], cx, w, b)
            return base("maxpool", name)(x, **kw)

        return {**ops, "conv2d": conv2d, "maxpool": maxpool}

    def _fused(self, kind, name):
        fn = fused_block_fn(kind, self._block_ops)
        if self._layout_ops is None:
            return fn

        def counted(layers, params, x):
            # The group's layers; the block's others (a project conv) count themselves.
            self._layout_ops.index += len(self._groups[name].members)
            return fn(layers, params, x)

        return counted

    def block(self, kind, name, body, x, **kwargs):
        choice = self._choice.get(name)
        saved = self.ops
        if choice == "fused":
            self.ops = {**saved, kind: self._fused(kind, name)}
        elif choice == "jaxcnn" and self._layout_ops is None and self._groups[name].kind in WHOLE_BLOCK_KINDS:
            self.ops = {k: v for k, v in self._jaxcnn_ops.items() if k != kind}
        else:
            self.ops = {k: v for k, v in saved.items() if k != kind}
        try:
            return super().block(kind, name, body, x, **kwargs)
        finally:
            self.ops = saved


def _block_body(group: FusionGroup) -> tuple[Callable, dict]:
    if group.kind == "fire":
        return fire, dict(group.attrs)
    if group.kind == "inception":
        return inception, dict(filters=group.attrs["filters"])
    raise ValueError(f"group kind {group.kind!r} is not a zoo block")


def group_fn(group: FusionGroup, version: str) -> Callable:
    """fn(params, x) running the group alone as candidate `version`; params are the members'
    {layer name: {"w", "b"}} (group_params makes random ones)."""
    if version not in CANDIDATES:
        raise ValueError(f"version must be one of {CANDIDATES}, got {version!r}")
    ops = JAXCNN_OPS if version == "jaxcnn" else XLA_OPS
    if group.kind == "conv_pool":
        conv, pool = group.members

        if version == "fused":
            return lambda p, x: _conv_pool_call(conv, pool, x, p[conv.name]["w"], p[conv.name]["b"])

        def unfused(p, x):
            y = ops["conv2d"](x, p[conv.name]["w"], p[conv.name]["b"], **conv.op_kwargs())
            return ops["maxpool"](y, **pool.op_kwargs())

        return unfused
    if group.kind == "expand_depthwise":
        ex, _, dw, _ = group.members
        if version == "fused":
            return lambda p, x: expand_depthwise(x, p[ex.name], p[dw.name], group.attrs["stride"])

        def layers(p, x):
            for m in group.members:
                x = bind_layer(m, ops)(x, *((p[m.name]["w"], p[m.name]["b"]) if m.weight_shape else ()))
            return x

        return layers
    body, kwargs = _block_body(group)
    table = {**ops, group.kind: fused_block_fn(group.kind)} if version == "fused" else ops
    return lambda p, x: Net(table, p).block(group.kind, group.name, body, x, **kwargs)


def group_params(group: FusionGroup, seed: int = 0):
    """He-normal weights and small biases for the group's convs, and a positive random input
    (measure.random_array), all drawn with NumPy: jax.random would compile one program per shape,
    seconds per group on a CPU."""
    rng = np.random.default_rng([seed, len(group.members), *group.x_shape])
    params = {}
    for m in group.members:
        if m.weight_shape is None:
            continue
        std = math.sqrt(2.0 / math.prod(m.weight_shape[:-1]))
        params[m.name] = {"w": jnp.asarray((rng.standard_normal(m.weight_shape) * std).astype(np.float32), m.dtype),
                          "b": jnp.asarray((0.01 * rng.standard_normal(m.weight_shape[-1:])).astype(np.float32),
                                           m.dtype)}
    x = jnp.asarray(measuring.random_array(tuple(group.x_shape), group.dtype, rng))
    return params, x


# --------------------------------------------------------------------------- deciding


def _model_decision(group: FusionGroup, spec, spec_note: str) -> GroupDecision:
    fused = cost_model.fused_cost(group, spec)
    xla = cost_model.unfused_cost(group, spec)
    cands = tuple(Candidate(v.name, v.time_ms, "model", note=f"{v.launches} kernels", dram_bytes=v.dram_bytes,
                            launches=v.launches) for v in (fused, xla))
    saved = (xla.dram_bytes - fused.dram_bytes) / 2**20
    launches = xla.launches - fused.launches
    what = f"saves {saved:.2f} MiB of DRAM traffic and {launches} kernel launches"
    if group.kind == "fire" and not cost_model.fire_uses_tensor_cores(group):
        what += "; fused fire runs on CUDA-core FMA (fp32, channels not multiples of 8 or squeeze > 64)"
    if group.kind == "expand_depthwise" and not cost_model.expand_depthwise_fused(group):
        what += "; conv1x1_depthwise runs XLA's two convs here (needs bf16/fp16, channels multiples of 8, C <= 256)"
    if fused.time_ms < xla.time_ms:
        choice, why = "fused", f"model: fused {fmt_ms(fused.time_ms)} < XLA {fmt_ms(xla.time_ms)} ms ({what})"
    else:
        choice, why = "xla", f"model: fused {fmt_ms(fused.time_ms)} >= XLA {fmt_ms(xla.time_ms)} ms ({what})"
    return GroupDecision(group, cands, choice, why, "model")


def _measured_decision(group, record, model: GroupDecision, cached: bool) -> GroupDecision:
    cands = []
    for name in CANDIDATES:
        entry = record["candidates"].get(name)
        if entry is None:
            continue
        m = model.candidate(name)
        cands.append(Candidate(name, entry.get("time_ms"), entry.get("source", "measured"),
                               entry.get("note", ""), entry.get("error", ""),
                               m.dram_bytes if m else None, m.launches if m else None))
    ok = [c for c in cands if c.ok]
    if not ok:
        return dataclasses.replace(model, reason=model.reason + "; nothing ran on the device")
    best = min(ok, key=lambda c: c.time_ms)
    xla = next((c for c in ok if c.name == "xla"), None)
    vs = f" (XLA/{best.name} = {xla.time_ms / best.time_ms:.2f})" if xla and best is not xla else ""
    agree = "agrees with" if (best.name == "fused") == (model.choice == "fused") else "overrules"
    why = (f"measured{' (cache)' if cached else ''}: {best.name} fastest {fmt_ms(best.time_ms)} ms{vs}; "
           f"{agree} the model ({model.choice})")
    return GroupDecision(group, tuple(cands), best.name, why, "measured")


def _group_key(device: str, group: FusionGroup) -> str:
    return AutotuneCache.key(device=device, op="fusion_group", **group.cache_fields())


@measuring.outside_traces
def _measure_groups(groups: Sequence[FusionGroup], store, iters: int, warmup: int, refresh: bool):
    """{group name: (record, cached)}: every candidate of every uncached group in one trace
    (run outside any enclosing jit trace)."""
    device = measuring.device_kind()
    out, cases, errors, todo = {}, [], {}, []
    for group in groups:
        hit = None if (store is None or refresh) else store.get(_group_key(device, group))
        if hit is not None and all(c in hit.get("candidates", {}) for c in CANDIDATES):
            out[group.name] = (hit, True)
            continue
        todo.append(group)
        params, x = group_params(group)
        for version in CANDIDATES:
            fn = group_fn(group, version)
            error = measuring.try_run(fn, (params, x))
            if error:
                errors[(group.name, version)] = error
            else:
                cases.append(((group.name, version), fn, (params, x)))
    measured = case_timing.time_cases(cases, iters, warmup) if cases else {}
    records = {}
    for group in todo:
        cands = {}
        for version in CANDIDATES:
            if (group.name, version) in errors:
                cands[version] = dict(time_ms=None, source="measured", error=errors[(group.name, version)])
                continue
            e = measured[(group.name, version)]
            cands[version] = dict(time_ms=e["time_ms"], source="measured" if e["measured"] else "wall",
                                  note=e["note"], kernels=e["kernels"])
        record = dict(op="fusion_group", kind=group.kind, device=device, created=created_now(),
                      iters=iters, candidates=cands)
        records[_group_key(device, group)] = record
        out[group.name] = (record, False)
    if store is not None:
        store.put_many(records)
    return out, device


def decide_groups(groups: Sequence[FusionGroup], *, costs: str = "auto", cache: Any = None,
                  iters: int = 20, warmup: int = 3, refresh: bool = False, gpu: Any = None):
    """(decisions, source, device, note) for `groups`: measured where the CUDA kernels run
    (costs "auto"/"measured"), else the cost model. Shared by zoo models and user functions."""
    if costs not in COSTS:
        raise ValueError(f"costs must be one of {COSTS}, got {costs!r}")
    check_iters(iters, warmup)
    store = check_cache_and_gpu(cache, gpu)
    measure = measuring.should_measure({"auto": None, "measured": True, "model": False}[costs])
    spec, spec_note = resolve_spec(gpu, measured=measure)
    decisions = [_model_decision(g, spec, spec_note) for g in groups]
    device = spec.name
    if measure and groups:
        records, device = _measure_groups(groups, store, iters, warmup, refresh)
        decisions = [_measured_decision(g, records[g.name][0], d, records[g.name][1])
                     for g, d in zip(groups, decisions)]
    sources = {d.source for d in decisions} or {"measured" if measure else "model"}
    source = sources.pop() if len(sources) == 1 else "mixed"
    return decisions, source, device, spec_note if source != "measured" else ""


def plan_fusion(model: str, batch: int = 1, dtype: Any = "bfloat16", *, costs: str = "auto",
                kinds: Sequence[str] = KINDS, cache: Any = None, iters: int = 20, warmup: int = 3,
                refresh: bool = False, gpu: Any = None) -> FusionPlan:
    """Find the fusable groups of zoo model `model` and decide each one.

    costs: "auto" (measured where jaxcnn's CUDA kernels run, else the model), "measured"
      (RuntimeError without them) or "model".
    kinds: group kinds to consider ("fire", "inception", "conv_pool", "expand_depthwise";
      conv_pool only when jaxcnn.ops.conv2d_pool exists, else it is listed as skipped).
    cache: the autotune cache (jaxcnn.tuning.autotune_cache) (None: the default file, False: none, a path).
    gpu: the GPU spec the model uses (name or GpuSpec; default: this GPU, else H200).
    """
    if costs not in COSTS:
        raise ValueError(f"costs must be one of {COSTS}, got {costs!r}")
    dtype = dtype_name(dtype)
    check_iters(iters, warmup)
    check_cache_and_gpu(cache, gpu)
    groups, skipped = find_groups(model, batch, dtype, kinds=kinds)
    decisions, source, device, note = decide_groups(groups, costs=costs, cache=cache, iters=iters,
                                                    warmup=warmup, refresh=refresh, gpu=gpu)
    return FusionPlan(model, int(batch), dtype, tuple(decisions), source, device, dict(skipped), note)
