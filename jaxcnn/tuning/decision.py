"""One decision: which candidate runs a site (a conv with its epilogue, a fused group, ...).

Candidates are XLA's own version of the site's subgraph (the baseline: what the user's program
runs without jaxcnn) and jaxcnn's replacements. On a GPU where jaxcnn's kernels run, every
candidate is measured once (device time from profiler kernel events, all candidates of all
pending sites in one trace), the fastest wins only if it beats the baseline by MIN_GAIN, and
the record is cached on disk per GPU, shapes, dtypes and formulation; later processes read the
cache. Elsewhere (CPU, no library) and where JAXCNN_MEASURE=0 finds no cached record, a rule
given by the caller decides and the decision says so.
A kernel of jaxcnn's that loses to XLA is therefore never chosen by a measurement.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax

from jaxcnn._native.library import cuda_available
from jaxcnn.profile.device_time import device_times
from jaxcnn.tuning.autotune_cache import AutotuneCache, as_cache
from jaxcnn.tuning.measure import (RandomInputs, device_kind, error_line, outside_traces, runtime_errors,
                                   should_measure, try_run)

BASELINE = "xla"  # the site's subgraph exactly as traced
# A replacement must be this much faster than the baseline to be chosen: smaller gains are
# within run-to-run spread of one measurement and would make the choice flip between runs.
MIN_GAIN = 0.03
# Bump when the candidates' kernels change enough that cached measurements no longer hold.
DECISION_VERSION = 1
MEASURE_ITERS = 10
MEASURE_WARMUP = 2
# Threads compiling a measurement's candidates (XLA compiles outside the GIL): $JAXCNN_COMPILE_THREADS,
# else 8. Only jaxcnn's candidates compile in parallel: those XLA autotunes compile one at a time
# (measure.AUTOTUNE_LOCK), so more threads than this no longer shorten a first call
# (docs/results.md, "First call").
COMPILE_THREADS_ENV = "JAXCNN_COMPILE_THREADS"
COMPILE_THREADS = 8


def compile_threads() -> int:
    """$JAXCNN_COMPILE_THREADS (a positive integer), else COMPILE_THREADS."""
    value = os.environ.get(COMPILE_THREADS_ENV, "").strip()
    if not value:
        return COMPILE_THREADS
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{COMPILE_THREADS_ENV} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Candidate:
    """One way to run a site: `fn(*inputs)` computes the site's output.

    A candidate whose program does part of its work once for many sites (the weight prologue's
    one fold of every conv's weights) says so: `fn` then takes `prepare(*inputs)`, made untimed,
    and its time gets the site's share of the shared op instead: `shared(*inputs)` (that op on
    this site alone) measured, less `shared_floor(*inputs)` (the same op on this site with its
    bulk left out: the fixed costs that one op for all sites pays once)."""

    name: str
    fn: Callable[..., Any]
    prepare: Callable[..., Any] | None = None
    shared: Callable[..., Any] | None = None
    shared_floor: Callable[..., Any] | None = None
    # Candidates of one site with the same prepared_as (not None) prepare the same inputs and
    # share the same work (the fold of the weights into one layout): made and timed once.
    prepared_as: Any = None


@dataclass
class Decision:
    """What runs a site and why: source "measured" (this process), "cached" (an earlier
    measurement on this GPU) or "rule" (no measurement possible here)."""

    choice: str
    source: str
    reason: str
    times_ms: dict[str, float | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def explain(self) -> str:
        parts = []
        for name, t in sorted(self.times_ms.items(), key=lambda kv: (kv[1] is None, kv[1] or 0.0)):
            mark = "*" if name == self.choice else ""
            parts.append(f"{mark}{name} {t:.4f} ms" if t is not None else f"{name} failed")
        times = f" [{', '.join(parts)}]" if parts else ""
        return f"{self.choice} ({self.source}: {self.reason}){times}"


@dataclass
class Site:
    """A site waiting for its decision: its cache key fields, candidates (the baseline among
    them), the avals of its inputs and the rule used where nothing can be measured."""

    key_fields: dict
    candidates: Sequence[Candidate]
    input_avals: Sequence[Any]
    rule: Callable[[], tuple[str, str]]  # () -> (choice, reason)


@dataclass(frozen=True)
class MeasurementCost:
    """What one measurement of pending sites cost on the host: the sites and timed runs (a
    candidate's fn, or its shared work or floor), seconds compiling and first-running them
    (compile_threads() threads, prepare included) and seconds of timed calls."""

    sites: int
    runs: int
    compile_s: float
    timing_s: float


_COST_RECORDERS: list[list[MeasurementCost]] = []


@contextlib.contextmanager
def measurement_costs():
    """Collects a MeasurementCost for every measurement the decision owner makes inside the
    block (what part of a first call deciding takes):

        with measurement_costs() as costs:
            optimized(*args)
        compile_s = sum(c.compile_s for c in costs)
    """
    costs: list[MeasurementCost] = []
    _COST_RECORDERS.append(costs)
    try:
        yield costs
    finally:  # by identity: two recorders holding the same costs compare equal
        _COST_RECORDERS[:] = [r for r in _COST_RECORDERS if r is not costs]


def site_key(device: str, fields: dict) -> str:
    """The cache key: the device, the decision version and the site's own fields."""
    return AutotuneCache.key(device=device, op="site", version=DECISION_VERSION, **fields)


def fingerprint(text: str) -> str:
    """A short stable hash (of a site's formulation, e.g. its traced equations)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def can_measure() -> bool:
    """Measurements run only where jaxcnn's CUDA kernels run (elsewhere they would time the
    lax reference), unless JAXCNN_MEASURE=0 turns them off (cached ones are still read)."""
    return should_measure(None)


def can_read_measurements() -> bool:
    """Cached measurements apply where jaxcnn's CUDA kernels run (they were made with them)."""
    return cuda_available()


def decide_all(sites: Sequence[Site], *, cache: Any = None, measure: bool | None = None) -> list[Decision]:
    """The decision for each site: a cached measurement of this GPU where one exists, else a
    measurement (the uncached sites together) where measuring is allowed, else the rule."""
    measure = can_measure() if measure is None else measure
    store = as_cache(cache)
    gpu = measure or can_read_measurements()
    if not gpu:
        return [_rule_decision(s) for s in sites]
    device = device_kind()
    keys = [site_key(device, s.key_fields) for s in sites]
    entries = store.load() if store else {}
    pending = {}
    for key, s in zip(keys, sites):
        if _usable(entries.get(key), s) is None and key not in pending:
            pending[key] = s
    if pending and measure:
        records = outside_traces(_measure_sites)(pending)
        if store:
            store.put_many(records)
        entries = {**entries, **records}
    decisions = []
    for key, s in zip(keys, sites):
        d = _usable(entries.get(key), s, cached=key not in pending)
        decisions.append(d if d is not None else _rule_decision(s))
    return decisions


def _rule_decision(s: Site) -> Decision:
    choice, reason = s.rule()
    return Decision(choice, "rule", reason)


def _usable(record: Any, s: Site, cached: bool = True) -> Decision | None:
    """The Decision a cache record gives for `s`, None when it lacks one of s's candidates."""
    if not isinstance(record, dict) or not isinstance(record.get("times_ms"), dict):
        return None
    times = record["times_ms"]
    names = [c.name for c in s.candidates]
    if not all(n in times for n in names):
        return None
    errors = record.get("errors") if isinstance(record.get("errors"), dict) else {}
    clean = {n: (float(times[n]) if isinstance(times[n], (int, float)) else None) for n in names}
    choice, reason = choose(clean)
    return Decision(choice, "cached" if cached else "measured", reason, clean, {n: errors[n] for n in names if n in errors})


def choose(times_ms: dict[str, float | None]) -> tuple[str, str]:
    """(winner, why) from measured times: the fastest candidate, if it beats the baseline by
    MIN_GAIN; else the baseline."""
    base = times_ms.get(BASELINE)
    ran = {n: t for n, t in times_ms.items() if t is not None}
    if base is None:
        return BASELINE, "the baseline could not be measured; kept as traced"
    best = min(ran, key=ran.get)
    if best != BASELINE and ran[best] < base * (1 - MIN_GAIN):
        return best, f"{base / ran[best]:.2f}x the traced subgraph"
    if best == BASELINE:
        return BASELINE, "XLA's own subgraph measured fastest"
    return BASELINE, f"{best} only {base / ran[best]:.2f}x the traced subgraph (< {1 + MIN_GAIN:.2f}x)"


def candidate_runs(key: Any, c: Candidate, args: tuple) -> list[tuple]:
    """What timing candidate c on a site's inputs runs, as (case key, fn, inputs, candidate whose
    prepare makes fn's inputs, or None): its fn at (key, c.name) and, where it shares work across
    sites, that work on this site and its floor at shared_cases(key, c); the candidate's time is
    its fn's plus shared_share_ms of the two. Candidates of one site prepared alike give the
    same shared cases: the caller runs each case once."""
    runs = [((key, c.name), c.fn, args, c)]
    cases = shared_cases(key, c)
    if cases is not None:
        runs.append((cases[0], c.shared, args, None))
        runs.append((cases[1], c.shared_floor, args, None))
    return runs


def preparation(c: Candidate) -> Any:
    """What c's prepared inputs and shared work are the same for: c.prepared_as, else c itself."""
    return c.name if c.prepared_as is None else ("prepared as", c.prepared_as)


def shared_cases(key: Any, c: Candidate) -> tuple[tuple, tuple] | None:
    """The case keys of c's shared work on site `key` and of its floor (None: c shares none)."""
    if c.shared is None:
        return None
    return (key, preparation(c), "shared"), (key, preparation(c), "floor")


def shared_share_ms(alone_ms: float, floor_ms: float) -> float:
    """A site's share of work shared across sites: that work on the site alone less its floor
    (the fixed costs every site shares), never negative."""
    return max(0.0, alone_ms - floor_ms)


def prepared(c: Candidate, args: tuple) -> tuple[tuple, str]:
    """(fn's inputs, '' or the error that stopped prepare)."""
    if c.prepare is None:
        return args, ""
    try:
        return tuple(jax.block_until_ready(jax.jit(c.prepare)(*args))), ""
    except runtime_errors() as err:
        return args, f"prepare: {error_line(err)}"


def _measure_sites(pending: dict[str, Site]) -> dict[str, dict]:
    """Times every runnable candidate of every pending site in one profiler trace: its fn on its
    (prepared) inputs and, where it shares work across sites, that work on this site and its
    floor. Each preparation and case runs once, however many candidates share it."""
    random_input = RandomInputs()
    runs = {}  # case key -> (fn, site inputs, preparation key or None)
    preparations = {}  # (site key, preparation) -> (candidate, site inputs)
    for key, s in pending.items():
        args = tuple(random_input(a) for a in s.input_avals)
        for c in s.candidates:
            for case, fn, site_args, prepare in candidate_runs(key, c, args):
                prep = None
                if prepare is not None and prepare.prepare is not None:
                    prep = (key, preparation(prepare))
                    preparations.setdefault(prep, (prepare, site_args))
                runs.setdefault(case, (fn, site_args, prep))

    # Compiling dominates a first measurement: prepare, then compile (and run once) the
    # candidates on several threads; the timed calls below then hit jax's compile cache.
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=compile_threads()) as pool:
        made = dict(zip(preparations, pool.map(lambda item: prepared(*item), preparations.values())))

        def compile_run(run):
            fn, args, prep = run
            args, error = made[prep] if prep is not None else (args, "")
            return args, error or try_run(fn, args)

        outcomes = dict(zip(runs, pool.map(compile_run, runs.values())))
    compiled = time.perf_counter()
    errors = {case: error for case, (_, error) in outcomes.items() if error}
    cases = [(case, runs[case][0], args) for case, (args, error) in outcomes.items() if not error]
    timings = device_times(cases, iters=MEASURE_ITERS, warmup=MEASURE_WARMUP) if cases else {}
    cost = MeasurementCost(len(pending), len(runs), compiled - started, time.perf_counter() - compiled)
    for recorder in _COST_RECORDERS:
        recorder.append(cost)
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    def ms(case) -> float | None:
        t = timings.get(case)
        return float(t.median_ms) if t is not None else None

    records = {}
    for key, s in pending.items():
        times, errs, notes, shared = {}, {}, {}, {}
        for c in s.candidates:
            t = timings.get((key, c.name))
            times[c.name] = ms((key, c.name))
            if (key, c.name) in errors:
                errs[c.name] = errors[(key, c.name)]
            elif t is not None and not t.is_device_time:
                notes[c.name] = t.note
            share_cases = shared_cases(key, c)
            if share_cases is not None and times[c.name] is not None:
                alone, floor = ms(share_cases[0]), ms(share_cases[1])
                if alone is None or floor is None:
                    times[c.name] = None
                    errs[c.name] = (errors.get(share_cases[0]) or errors.get(share_cases[1])
                                    or "its shared work could not be measured")
                else:
                    shared[c.name] = shared_share_ms(alone, floor)
                    times[c.name] += shared[c.name]
        records[key] = dict(op="site", created=created, iters=MEASURE_ITERS, times_ms=times, errors=errs,
                            notes=notes, fields=json.loads(json.dumps(s.key_fields, default=list)))
        if shared:
            records[key]["shared_ms"] = shared  # included in times_ms
    return records
