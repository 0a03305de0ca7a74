"""Plan the buffers of zoo models (inference and a training step) with every packing algorithm,
next to the live-bytes lower bound and XLA's own assignment; tables and store records.

Two buffer sources per program:
- "jaxpr": intermediates of the traced program (lifetimes.jaxpr_buffers), inputs and outputs left
  out; the XLA number it compares with is memory_analysis().temp_size_in_bytes;
- "hlo": XLA's compiled, scheduled ENTRY computation (hlo.hlo_buffers) with in-place sharing,
  temps plus outputs live from their definition (XLA lets temps use an output's bytes before it
  is written), so the XLA number it compares with is temp + output size; the bound of the temps
  alone is kept too (temp_bound).
"""

from __future__ import annotations

import glob
import json
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

from jaxcnn.models import get_model
from jaxcnn.memory.footprint import memory_stats
from jaxcnn.memory.hlo import hlo_buffers, parse_buffer_assignment
from jaxcnn.memory.lifetimes import Buffer, jaxpr_buffers
from jaxcnn.memory.packing import ALGORITHMS, DEFAULT_ALIGNMENT, MIB, Plan, lower_bound
from jaxcnn.profile.environment import collect_environment

SOURCES = ("jaxpr", "hlo")
PEERS = ("greedy_by_size", "best_fit_decreasing")
# Goals of the planner (issue 5): ours within 2% of the bound, >= 45% below naive, never
# worse than a peer.
BOUND_GOAL = 1.02
NAIVE_GOAL = 0.55


def inference_fn(spec, backend: str = "xla") -> Callable:
    """(params, x) -> logits of the zoo model `spec`."""
    return lambda params, x: spec.apply(params, x, backend=backend)


def training_step(spec, backend: str = "xla", learning_rate: float = 0.01) -> Callable:
    """One SGD step of the zoo model `spec`: (params, x, labels) -> (new params, loss), the loss
    being softmax cross-entropy of the logits (in fp32) against integer labels [N]."""

    def loss_fn(params, x, labels):
        logits = spec.apply(params, x, backend=backend).astype(jnp.float32)
        log_probs = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))

    def step(params, x, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
        new_params = jax.tree.map(lambda p, g: p - learning_rate * g.astype(p.dtype), params, grads)
        return new_params, loss

    return step


def example_args(spec, batch: int, dtype="float32", train: bool = False) -> tuple:
    """Abstract arguments (ShapeDtypeStruct) of inference_fn, or of training_step if `train`."""
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    params = spec.abstract_params(dtype)
    x = jax.ShapeDtypeStruct(spec.input_shape(batch), jnp.dtype(dtype))
    if not train:
        return params, x
    return params, x, jax.ShapeDtypeStruct((batch,), jnp.int32)


@dataclass
class SourcePlan:
    """Every algorithm's plan of one buffer set, its bounds and XLA's numbers."""

    source: str
    buffers: list[Buffer]
    plans: dict[str, Plan]
    seconds: dict[str, float]
    bound: int  # live-bytes peak of the buffers as they are
    aligned_bound: int  # the same with sizes rounded up to the plans' alignment
    xla_bytes: int | None  # XLA's number for the same buffers (module docstring)
    temp_bound: int | None = None  # hlo: bound of the temps alone, vs XLA's temp size
    # hlo: XLA's own offsets for our buffers (combined temp + output address space).
    xla_offsets: dict[str, int] = field(default_factory=dict)
    xla_arena: int | None = None

    @property
    def ours(self) -> Plan:
        return self.plans["pack_2d"]

    def goals(self) -> dict[str, bool]:
        ours = self.ours.arena_bytes
        naive = self.plans["naive"].arena_bytes
        return {
            "bound": ours <= BOUND_GOAL * self.bound if self.bound else ours == 0,
            "peers": all(ours <= self.plans[p].arena_bytes for p in PEERS),
            "naive": ours <= NAIVE_GOAL * naive if naive else True,
        }


@dataclass
class ModelPlan:
    model: str
    batch: int
    dtype: str
    backend: str
    train: bool
    platform: str
    xla: dict[str, int]  # memory_analysis fields
    compile_seconds: float
    sources: dict[str, SourcePlan]

    @property
    def mode(self) -> str:
        return "training" if self.train else "inference"


def plan_buffers(
    buffers: Sequence[Buffer], alignment: int = DEFAULT_ALIGNMENT,
    algorithms: Sequence[str] | None = None,
) -> tuple[dict[str, Plan], dict[str, float]]:
    """Each algorithm's validated plan and its planning time in seconds."""
    names = list(ALGORITHMS) if algorithms is None else list(algorithms)
    unknown = [n for n in names if n not in ALGORITHMS]
    if unknown:
        raise ValueError(f"algorithms must be among {list(ALGORITHMS)}, got {unknown}")
    plans, seconds = {}, {}
    for name in names:
        start = time.perf_counter()
        plans[name] = ALGORITHMS[name](buffers, alignment=alignment)
        seconds[name] = time.perf_counter() - start
        plans[name].validate(buffers)
    return plans, seconds


def _compile(fn: Callable, args: tuple) -> tuple[Any, str | None, float]:
    """Compile fn(*args); XLA's buffer-assignment dump text too where the backend writes it."""
    with tempfile.TemporaryDirectory(prefix="jaxcnn_xla_dump_") as dump:
        start = time.perf_counter()
        lowered = jax.jit(fn).lower(*args)
        try:
            compiled = lowered.compile(compiler_options={"xla_dump_to": dump})
        except Exception:  # a backend that rejects the dump option still compiles without it
            compiled = lowered.compile()
        seconds = time.perf_counter() - start
        files = sorted(glob.glob(f"{dump}/*after_optimizations-buffer-assignment.txt"))
        text = open(files[-1]).read() if files else None
    return compiled, text, seconds


def _xla_layout(assignment_text: str | None, buffers: Sequence[Buffer]):
    """Offsets XLA gave our buffers, its temp and live-out allocations laid end to end."""
    if assignment_text is None:
        return {}, None
    allocations = parse_buffer_assignment(assignment_text)
    base, starts = 0, {}
    for alloc in allocations:
        if alloc["kind"] in ("temp", "live-out"):
            starts[alloc["index"]] = base
            base += alloc["size"]
    where = {}
    for alloc in allocations:
        if alloc["index"] in starts:
            for value in alloc["values"]:
                where.setdefault(value["name"], starts[alloc["index"]] + value["offset"])
    offsets = {b.name: where[b.name] for b in buffers if b.name in where}
    return offsets, base


def plan_model(
    model: str, batch: int, *, train: bool = False, dtype="float32", backend: str = "xla",
    sources: Sequence[str] = SOURCES, alignment: int = DEFAULT_ALIGNMENT,
) -> ModelPlan:
    """Compile the zoo model's inference (or training step) once and plan each buffer source."""
    bad = [s for s in sources if s not in SOURCES]
    if bad or not sources:
        raise ValueError(f"sources must be a non-empty subset of {SOURCES}, got {list(sources)}")
    spec = get_model(model)
    fn = training_step(spec, backend) if train else inference_fn(spec, backend)
    args = example_args(spec, batch, dtype, train)
    compiled, assignment, compile_seconds = _compile(fn, args)
    stats = memory_stats(compiled)
    temp, output = stats.get("temp_size_in_bytes"), stats.get("output_size_in_bytes")
    out = {}
    for source in sources:
        temp_bound, xla_offsets, xla_arena = None, {}, None
        if source == "jaxpr":
            buffers = jaxpr_buffers(fn, *args)
            xla_bytes = temp
        else:
            text = compiled.as_text()
            buffers = hlo_buffers(text, roles=("temp", "output"), outputs_from_definition=True)
            temp_bound = lower_bound(hlo_buffers(text, roles=("temp",)))
            xla_bytes = None if temp is None or output is None else temp + output
            xla_offsets, xla_arena = _xla_layout(assignment, buffers)
        plans, seconds = plan_buffers(buffers, alignment)
        out[source] = SourcePlan(
            source, buffers, plans, seconds, lower_bound(buffers), lower_bound(buffers, alignment),
            xla_bytes, temp_bound, xla_offsets, xla_arena,
        )
    return ModelPlan(model, batch, jnp.dtype(dtype).name, backend, train, jax.default_backend(),
                     stats, compile_seconds, out)


def _mib(value) -> str:
    return "-" if value is None else f"{value / MIB:.2f}"


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def summary(plan: ModelPlan, source: str) -> str:
    """Markdown table of one source: every algorithm vs the bound and XLA."""
    sp = plan.sources[source]
    xla_label = "XLA temp" if source == "jaxpr" else "XLA temp + output"
    rows = [
        f"{plan.model} {plan.mode} batch={plan.batch} {plan.dtype} backend={plan.backend} "
        f"source={source} on {plan.platform}: {len(sp.buffers)} buffers",
        "",
        "| | MiB | / bound | / XLA | plan s | winner |",
        "|---|---:|---:|---:|---:|---|",
        f"| lower bound | {_mib(sp.bound)} | 1.000 | {_ratio(sp.bound, sp.xla_bytes)} | | |",
    ]
    for name, p in sp.plans.items():
        rows.append(f"| {name} | {_mib(p.arena_bytes)} | {_ratio(p.arena_bytes, sp.bound)} | "
                    f"{_ratio(p.arena_bytes, sp.xla_bytes)} | {sp.seconds[name]:.3f} | {p.detail} |")
    rows.append(f"| {xla_label} | {_mib(sp.xla_bytes)} | {_ratio(sp.xla_bytes, sp.bound)} | "
                f"1.000 | | |")
    if sp.temp_bound is not None:
        rows.append(f"| bound of temps alone vs XLA temp | {_mib(sp.temp_bound)} | | "
                    f"{_ratio(sp.temp_bound, plan.xla.get('temp_size_in_bytes'))} | | |")
    goals = sp.goals()
    rows.append("")
    rows.append("goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in goals.items()))
    return "\n".join(rows)


def to_record(plan: ModelPlan) -> list[dict]:
    """One flat JSON-ready row per source."""
    rows = []
    for source, sp in plan.sources.items():
        row = dict(
            model=plan.model, mode=plan.mode, batch=plan.batch, dtype=plan.dtype,
            backend=plan.backend, platform=plan.platform, source=source,
            n_buffers=len(sp.buffers), lower_bound=sp.bound, aligned_lower_bound=sp.aligned_bound,
            xla_bytes=sp.xla_bytes, temp_bound=sp.temp_bound, xla_memory=plan.xla,
            compile_seconds=round(plan.compile_seconds, 3),
            winner=sp.ours.detail, goals=sp.goals(),
        )
        for name, p in sp.plans.items():
            row[name] = p.arena_bytes
            row[f"{name}_seconds"] = round(sp.seconds[name], 4)
        rows.append(row)
    return rows


def store_plan(store, plan: ModelPlan, *, device: str | None = None, note: str = "",
               environment: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Record each source as a run of kind 'plan' with one plan per algorithm (buffers with
    lifetimes and offsets) and XLA's: offsets from its buffer assignment where the backend
    dumped one (hlo source), else none. Each run's note ends with its source (`note` defaults
    to the plan's mode). Returns {source: run id}. Each run records the
    environment (default: this process's) and its git commit."""
    environment = collect_environment() if environment is None else environment
    git = (environment.get("extra") or {}).get("git") or {}
    runs = {}
    for source, sp in plan.sources.items():
        extra = dict(mode=plan.mode, source=source, xla_memory=plan.xla,
                     xla_compare=("temp" if source == "jaxpr" else "temp+output"),
                     temp_bound=sp.temp_bound, aligned_lower_bound=sp.aligned_bound)
        run_id = store.add_run(
            "plan", model=plan.model, backend=plan.backend, batch=plan.batch, dtype=plan.dtype,
            device=device or plan.platform, note=f"{note or plan.mode} {source}",
            git_commit=git.get("commit"), environment=environment, extra=extra,
        )
        for name, p in sp.plans.items():
            rows = [dict(name=b.name, size_bytes=b.size_bytes, start_step=b.start, end_step=b.end,
                         offset_bytes=p.offsets[b.name]) for b in sp.buffers]
            store.add_plan(run_id, name, p.arena_bytes, sp.bound, rows,
                           seconds=sp.seconds[name], extra={"detail": p.detail, "alignment": p.alignment})
        if sp.xla_bytes is not None:
            arena = sp.xla_arena if sp.xla_arena is not None else sp.xla_bytes
            rows = []
            for b in sp.buffers:
                off = sp.xla_offsets.get(b.name)
                if off is not None and off + b.size_bytes > arena:
                    off = None  # a merged buffer XLA did not keep in one place
                rows.append(dict(name=b.name, size_bytes=b.size_bytes, start_step=b.start,
                                 end_step=b.end, offset_bytes=off))
            store.add_plan(run_id, "xla", arena, sp.bound, rows,
                           extra={"memory_analysis": plan.xla, "offsets_from": (
                               "buffer assignment" if sp.xla_offsets else None)})
        runs[source] = run_id
    return runs


def dumps(records: list[dict]) -> str:
    return json.dumps(records, indent=1, sort_keys=True)
