"""Per-call GPU device time of a jitted function, read from `jax.profiler` traces.

Device time is the sum of the durations of the kernels (and memsets/copies) that the call
ran on the GPU streams, as recorded by CUPTI. It excludes host dispatch, which dominates the
wall time of small calls (~35 us per call on an H200), so it is what compares kernels with
kernels. It is the same measure as /work/shared/baseline/measure_xla_baseline.py, so numbers
are comparable with the stored XLA baselines.

Each of the `iters` traced calls runs inside a host `TraceAnnotation` and is followed by
`block_until_ready`. The trace is split into per-call times (`split_into_calls`) by the first
of these that applies:

1. "trace/periodic": the number of GPU events is a multiple of `iters` and every chunk of
   `len(events) / iters` consecutive events (ordered by start time) launches the same kernel
   names. The chunks are the calls. Exact whenever each call launches the same kernels, as
   a compiled XLA program does.
2. "trace/annotations": each GPU event goes to the call whose host annotation started last
   before the event started. Host and GPU events share the profiler's clock; call i's
   kernels are launched inside annotation i, after it starts, and finish before it ends
   (the sync is inside), so the annotation starts are the call boundaries. On an H200 the
   first kernel started 50-150 us after its annotation, a wide margin.
3. "trace/gaps": the device timeline is cut at its `iters - 1` widest idle gaps. Weakest:
   kernels of one call can sit tens of us apart (host work between launches), while calls
   are a few hundred us apart under the profiler.

Methods 2 and 3 say in `note` when the calls launched different numbers of kernels. Any way
the samples sum to the total kernel time of the trace, so `mean_ms` does not depend on the
split. Kernels on concurrent streams are summed, not merged: `median_span_ms` (first start to
last end) shows the overlap when it is below the median.

Without GPU kernel events (CPU backend, or CUPTI unavailable) the result falls back to host
wall time around `block_until_ready`, with `is_device_time=False` and the reason in `note`.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import glob
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

GPU_PLANE_PREFIX = "/device:GPU"
# CUPTI puts kernels/memsets/copies on "Stream #<id>(...)" lines; other lines of a GPU plane
# (if any) are derived views of the same events and would double count.
STREAM_LINE_MARKER = "stream"
# Host annotation around each traced call: marks call boundaries for the split (and makes kept
# traces readable in xprof).
CALL_ANNOTATION = "device_time_call"


class KernelEvent(NamedTuple):
    """One GPU activity (kernel, memset or copy) on a stream line, times in ns."""

    start_ns: float
    end_ns: float
    name: str

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class KernelStat:
    """Time one kernel name took per call, summed over its launches in that call."""

    name: str
    us_per_call: float
    launches_per_call: float


@dataclass(frozen=True)
class TimingStats:
    """Per-call samples and their summary, all in milliseconds."""

    samples_ms: tuple[float, ...]
    n: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    max_ms: float
    mean_ms: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class WallTiming(TimingStats):
    """Host latency per call, each call followed by `block_until_ready`."""

    device: str


@dataclass(frozen=True)
class DeviceTiming(TimingStats):
    """Per-call device time; `is_device_time=False` means the samples are host wall time."""

    device: str  # jax device_kind, e.g. "NVIDIA H200" or "cpu"
    is_device_time: bool
    method: str  # how calls were told apart: "trace/periodic|annotations|gaps", or "wall"
    note: str  # why a fallback was taken, or doubts about the split; "" when clean
    kernels: tuple[KernelStat, ...]  # top kernels by time per call
    kernels_per_call: float | None
    # First kernel start to last kernel end: above median_ms by the idle gaps inside a call,
    # below it when kernels on concurrent streams overlapped.
    median_span_ms: float | None


def stats_fields(samples_ms: Sequence[float]) -> dict[str, Any]:
    """The TimingStats fields of a list of per-call samples (linear-interpolated percentiles)."""
    values = np.asarray(samples_ms, dtype=np.float64)
    p10, median, p90 = np.percentile(values, [10, 50, 90])
    return dict(
        samples_ms=tuple(float(v) for v in values),
        n=int(values.size),
        median_ms=float(median),
        p10_ms=float(p10),
        p90_ms=float(p90),
        min_ms=float(values.min()),
        max_ms=float(values.max()),
        mean_ms=float(values.mean()),
    )


def _device_kind() -> str:
    return jax.devices()[0].device_kind


def _jit_and_warm_up(fn: Callable, args: tuple, iters: int, warmup: int) -> Callable:
    """Jit fn and run it at least once, so compilation and autotuning stay out of timings."""
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    jitted = jax.jit(fn)
    for _ in range(max(warmup, 1)):
        jax.block_until_ready(jitted(*args))
    return jitted


def _wall_samples_ms(jitted: Callable, args: tuple, iters: int) -> list[float]:
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(jitted(*args))
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def wall_time(fn: Callable, *args, iters: int = 20, warmup: int = 3) -> WallTiming:
    """Host latency of jit(fn)(*args) per call, with a sync after every call."""
    jitted = _jit_and_warm_up(fn, args, iters, warmup)
    samples = _wall_samples_ms(jitted, args, iters)
    return WallTiming(**stats_fields(samples), device=_device_kind())


def gpu_kernel_events(profile_data) -> list[KernelEvent]:
    """All activities on the stream lines of the GPU planes, ordered by start time."""
    events = []
    for plane in profile_data.planes:
        if not plane.name.startswith(GPU_PLANE_PREFIX):
            continue
        for line in plane.lines:
            if STREAM_LINE_MARKER not in line.name.lower():
                continue
            events.extend(KernelEvent(ev.start_ns, ev.end_ns, ev.name) for ev in line.events)
    return sorted(events)


def _split_periodic(events: list[KernelEvent], n_calls: int) -> list[list[KernelEvent]] | None:
    """Equal chunks when every chunk launches the same kernel names; None otherwise."""
    if len(events) % n_calls:
        return None
    size = len(events) // n_calls
    calls = [events[i * size : (i + 1) * size] for i in range(n_calls)]
    # Compare as multisets: kernels of one call on different streams may start in any order.
    signature = collections.Counter(ev.name for ev in calls[0])
    if any(collections.Counter(ev.name for ev in call) != signature for call in calls[1:]):
        return None
    return calls


def call_annotation_starts(profile_data) -> list[float]:
    """Start times (ns) of the per-call host annotations, in order."""
    return sorted(
        ev.start_ns
        for plane in profile_data.planes
        if not plane.name.startswith(GPU_PLANE_PREFIX)
        for line in plane.lines
        for ev in line.events
        if ev.name == CALL_ANNOTATION
    )


def _split_at_call_starts(
    events: list[KernelEvent], call_starts_ns: Sequence[float]
) -> list[list[KernelEvent]] | None:
    """Each event to the call that started last before it; None if a call gets no event."""
    if not call_starts_ns or events[0].start_ns < call_starts_ns[0]:
        return None
    calls: list[list[KernelEvent]] = [[] for _ in call_starts_ns]
    for ev in events:
        calls[bisect.bisect_right(call_starts_ns, ev.start_ns) - 1].append(ev)
    return calls if all(calls) else None


def _split_at_gaps(events: list[KernelEvent], n_calls: int) -> list[list[KernelEvent]]:
    """Cut the timeline at its n_calls - 1 widest idle gaps."""
    busy_until = np.maximum.accumulate([ev.end_ns for ev in events])
    starts = np.array([ev.start_ns for ev in events])
    gaps = starts[1:] - busy_until[:-1]  # gaps[i]: idle time before events[i + 1]
    # Stable sort so that ties cut at the earliest gap, deterministically.
    cut_after = np.sort(np.argsort(-gaps, kind="stable")[: n_calls - 1])
    bounds = [0, *(int(i) + 1 for i in cut_after), len(events)]
    return [events[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]


def split_into_calls(
    events: list[KernelEvent], n_calls: int, call_starts_ns: Sequence[float] = ()
) -> tuple[list[list[KernelEvent]], str, str]:
    """Split time-ordered events of n_calls calls into calls -> (calls, method, note).

    call_starts_ns: host start time of each call, if known. Needs at least n_calls events;
    see the module docstring for the methods.
    """
    if len(events) < n_calls:
        raise ValueError(f"{len(events)} GPU events cannot hold {n_calls} calls")
    calls = _split_periodic(events, n_calls)
    if calls is not None:
        return calls, "trace/periodic", ""
    calls, method = None, "trace/annotations"
    if len(call_starts_ns) == n_calls:
        calls = _split_at_call_starts(events, call_starts_ns)
    if calls is None:
        calls, method = _split_at_gaps(events, n_calls), "trace/gaps"
    counts = sorted({len(call) for call in calls})
    note = f"calls launched different kernel counts {counts}" if len(counts) > 1 else ""
    return calls, method, note


def _busy_ms(call: list[KernelEvent]) -> float:
    return sum(ev.duration_ns for ev in call) / 1e6


def _span_ms(call: list[KernelEvent]) -> float:
    return (max(ev.end_ns for ev in call) - call[0].start_ns) / 1e6


def top_kernels(calls: list[list[KernelEvent]], top_k: int) -> tuple[KernelStat, ...]:
    """The top_k kernel names by total time, averaged per call."""
    total_ns: dict[str, float] = collections.defaultdict(float)
    launches: dict[str, int] = collections.defaultdict(int)
    for call in calls:
        for ev in call:
            total_ns[ev.name] += ev.duration_ns
            launches[ev.name] += 1
    ranked = sorted(total_ns, key=lambda name: -total_ns[name])[:top_k]
    n_calls = len(calls)
    return tuple(
        KernelStat(name, total_ns[name] / n_calls / 1e3, launches[name] / n_calls)
        for name in ranked
    )


def timing_from_events(
    events: list[KernelEvent],
    n_calls: int,
    device: str,
    top_k: int = 5,
    call_starts_ns: Sequence[float] = (),
) -> DeviceTiming:
    """DeviceTiming of n_calls calls whose GPU events are `events` (see split_into_calls)."""
    calls, method, note = split_into_calls(events, n_calls, call_starts_ns)
    return DeviceTiming(
        **stats_fields([_busy_ms(call) for call in calls]),
        device=device,
        is_device_time=True,
        method=method,
        note=note,
        kernels=top_kernels(calls, top_k),
        kernels_per_call=len(events) / n_calls,
        median_span_ms=float(np.median([_span_ms(call) for call in calls])),
    )


@contextlib.contextmanager
def _trace_directory(keep_in: str | None):
    """The directory to trace into: keep_in if given, else a temporary one removed after."""
    if keep_in is not None:
        os.makedirs(keep_in, exist_ok=True)
        yield keep_in
        return
    with tempfile.TemporaryDirectory(prefix="jaxcnn_trace_") as tmp:
        yield tmp


def _profiler_start_error(trace_dir: str) -> str | None:
    """Start a trace into trace_dir; the error message if the profiler refused, else None."""
    try:
        jax.profiler.start_trace(trace_dir)
    except RuntimeError as err:  # e.g. another trace is already running
        return str(err)
    return None


def _run_traced_calls(jitted: Callable, args: tuple, iters: int) -> None:
    """Run iters synced, annotated calls in the started trace, then stop it."""
    try:
        for i in range(iters):
            with jax.profiler.TraceAnnotation(CALL_ANNOTATION, call=i):
                jax.block_until_ready(jitted(*args))
    finally:
        jax.profiler.stop_trace()


def _read_trace(trace_dir: str) -> tuple[list[KernelEvent], list[float]]:
    """GPU events and call annotation starts of the newest trace in trace_dir."""
    # One process writes one file per trace; a kept trace_dir may hold older ones too.
    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        return [], []
    profile_data = jax.profiler.ProfileData.from_file(max(paths, key=os.path.getmtime))
    return gpu_kernel_events(profile_data), call_annotation_starts(profile_data)


def _wall_fallback(jitted: Callable, args: tuple, iters: int, note: str) -> DeviceTiming:
    return DeviceTiming(
        **stats_fields(_wall_samples_ms(jitted, args, iters)),
        device=_device_kind(),
        is_device_time=False,
        method="wall",
        note=note,
        kernels=(),
        kernels_per_call=None,
        median_span_ms=None,
    )


def device_time(
    fn: Callable,
    *args,
    iters: int = 20,
    warmup: int = 3,
    top_k: int = 5,
    trace_dir: str | None = None,
) -> DeviceTiming:
    """Per-call GPU kernel time of jit(fn)(*args) over `iters` synced calls.

    trace_dir: keep the raw trace there (for xprof/TensorBoard); by default it goes to a
    temporary directory that is removed. Falls back to host wall time (is_device_time=False,
    reason in `note`) when the trace has no GPU kernel events, e.g. on the CPU backend.
    """
    jitted = _jit_and_warm_up(fn, args, iters, warmup)
    with _trace_directory(trace_dir) as directory:
        start_error = _profiler_start_error(directory)
        if start_error is not None:
            return _wall_fallback(jitted, args, iters, f"profiler did not start: {start_error}")
        _run_traced_calls(jitted, args, iters)
        events, call_starts = _read_trace(directory)
    if len(events) < iters:
        reason = (
            f"{len(events)} GPU kernel events for {iters} calls (backend {jax.default_backend()})"
        )
        return _wall_fallback(jitted, args, iters, f"no device trace: {reason}")
    return timing_from_events(events, iters, _device_kind(), top_k, call_starts)


def device_times(
    cases: Sequence[tuple[Any, Callable, tuple]],
    *,
    iters: int = 20,
    warmup: int = 3,
    top_k: int = 5,
    progress: Callable[[Any], None] | None = None,
    interleave: bool = False,
) -> dict[Any, DeviceTiming]:
    """device_time of many (key, fn, args) cases in ONE profiler trace.

    Starting and reading a trace costs far more than a small layer's calls, so a profile of
    a whole model traces all its layers at once. Calls run case after case, each inside the
    per-call annotation; or, with `interleave`, round-robin (case 0, case 1, ..., case 0, ...),
    so that a drift of the GPU's clocks or temperature during the trace falls on every case
    alike: for comparing a few whole programs. Each call's events are those between its
    annotation and the next call's; a case's calls are then split as in device_time.
    """
    jitted = []
    for key, fn, args in cases:
        jitted.append(_jit_and_warm_up(fn, args, iters, warmup))
        if progress is not None:
            progress(key)
    if interleave:
        order = [i for _ in range(iters) for i in range(len(cases))]
    else:
        order = [i for i in range(len(cases)) for _ in range(iters)]
    events: list[KernelEvent] = []
    call_starts: list[float] = []
    with _trace_directory(None) as directory:
        start_error = _profiler_start_error(directory)
        if start_error is None:
            try:
                calls = collections.Counter()
                for i in order:
                    with jax.profiler.TraceAnnotation(CALL_ANNOTATION, call=calls[i]):
                        jax.block_until_ready(jitted[i](*cases[i][2]))
                    calls[i] += 1
            finally:
                jax.profiler.stop_trace()
            events, call_starts = _read_trace(directory)
    if start_error is not None or len(call_starts) != len(order) or len(events) < len(order):
        note = f"profiler did not start: {start_error}" if start_error else "no device trace"
        return {key: _wall_fallback(fn, args, iters, note) for fn, (key, _, args) in zip(jitted, cases)}
    starts = np.array([ev.start_ns for ev in events])
    bounds = np.searchsorted(starts, [*call_starts, np.inf])  # call p's events: bounds[p]:bounds[p + 1]
    case_events: list[list[KernelEvent]] = [[] for _ in cases]
    case_starts: list[list[float]] = [[] for _ in cases]
    for p, i in enumerate(order):
        case_events[i] += events[bounds[p] : bounds[p + 1]]
        case_starts[i].append(call_starts[p])
    out = {}
    for i, (key, _, _) in enumerate(cases):
        if len(case_events[i]) < iters:  # e.g. a case XLA compiled to no kernel at all
            out[key] = _wall_fallback(jitted[i], cases[i][2], iters, f"{len(case_events[i])} GPU events")
            continue
        out[key] = timing_from_events(case_events[i], iters, _device_kind(), top_k, case_starts[i])
    return out
