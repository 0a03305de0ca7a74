#!/usr/bin/env python3
"""conv2d(algorithm="auto") against XLA's own convolution over a random shape sweep and every
zoo conv layer (issue 33): is "auto" ever the slow choice, and is it correct?

Cases:
  - --cases random convs drawn from --seed: N in {1..64}, H and W 5..80 (odd, not square), C and
    K odd (3, 17, 300, ...) or multiples of 8/32/64, R and S in {1, 3, 5, 7}, strides 1, 2 and
    (1, 2), every padding form (SAME, VALID, an int, an (h, w) pair, explicit ((t, b), (l, r))),
    dilations 1-3, groups 1 / 2 / 4 / depthwise, the three layouts and the four dtype kinds
    (bf16, fp16, fp32 at precision "default", fp32 at "highest"), a bias always, an activation
    (none, relu, relu6, silu), some with a residual. Each draw's work is bounded (LIMITS) so the
    sweep stays minutes long: N halves until FLOPs, elements and the reference's FLOPs fit.
  - every distinct conv layer of the zoo models (jaxcnn.models) at N = 64 and 1, NHWC, in bf16,
    fp32 and fp32 "highest".
Per case, in one process: jaxcnn.conv2d(..., algorithm="auto") and algorithm="xla" (XLA's conv,
then the epilogue as a JAX user writes it: the baseline), each jitted.
  - decisions: each chunk of cases is decided in one batch (jaxcnn.tuning.decision.decide_all of
    jaxcnn.tuning.conv_choice.conv_site) into a fresh autotune cache under the output directory,
    which JAXCNN_AUTOTUNE_CACHE points at, so the "auto" traces read them back; the choice, its
    source and explain() text, the candidates' times and the seconds the batch took are kept;
  - correctness: fresh random inputs (x ~ N(0, 1), w ~ N(0, 1/fan-in), bias and residual never
    zero); the first and last image of the batch against a float64 numpy reference, max |error| /
    max |reference|, within tolerance() (from the dtype, the precision and the reduction length);
    a NaN or inf anywhere in auto's output fails; XLA's own error is kept beside it;
  - timing: device time (jaxcnn.profile.device_times: profiler kernel events, a chunk's cases
    and both variants in one trace), median and p10-p90 over --iters calls; ratio = XLA / auto;
    % of floor from jaxcnn.profile.gpu_specs (FLOPs at the dtype's peak, bytes at the bandwidth).
Without CUDA kernels (a CPU), "auto" runs the lax reference and times are host wall time: the
report says so and draws no speedup verdicts.

Writes <gpu>-<date>-<name>.{json,md} into --out after every chunk and prints the markdown. A
chunk expected to end past --budget-s (default BUDGET_S) is not started: the report counts the
cases not reached, and a second run with --resume <that report's JSON> runs them and writes one
report of all. Exit status: 0 when every case that ran was correct, 2 otherwise.

  python scripts/bench_conv_sweep.py --out benchmarks/results
  python scripts/bench_conv_sweep.py --out /tmp/sweep --quick
  JAX_PLATFORMS=cpu python scripts/bench_conv_sweep.py --out /tmp/sweep --quick
"""

# The sweep's other jobs live beside it in scripts/: conv_sweep_cases (the random shapes and the
# zoo layers), conv_sweep_correctness (the float64 reference and the tolerance) and
# conv_sweep_report (the distributions, issue 33's goals, the markdown and JSON). This file
# measures (decisions, compiles, device times) and holds the command line; it re-exports the
# names tests/repo/test_conv_sweep_script.py takes from it (__all__).

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import math
import os
import sys
import time
import traceback
import zlib
from pathlib import Path
from typing import Any, Sequence

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

# bench_optimize_flax puts the repository root on sys.path (jaxcnn from a checkout)
from bench_common import device_slug as gpu_slug  # noqa: E402
from bench_common import environment, final_status  # noqa: E402
from bench_optimize_flax import timing_dict  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxcnn  # noqa: E402
from jaxcnn.layouts import AutotuneCache  # noqa: E402
from jaxcnn.profile import device_times  # noqa: E402
from jaxcnn.profile.gpu_specs import floor_ms, lookup_gpu_spec  # noqa: E402
from jaxcnn.tuning.conv_choice import conv_site, decide_conv  # noqa: E402
from jaxcnn.tuning.decision import compile_threads, decide_all  # noqa: E402
from jaxcnn.tuning.measure import run_once  # noqa: E402

from conv_sweep_cases import (  # noqa: E402
    ACTIVATIONS, CHUNK_BYTES, CHUNK_CASES, DEFAULT_CASES, DEFAULT_SEED, KINDS, LIMITS, PRECISION_CLASS,
    QUICK_LIMITS, QUICK_ZOO_LAYERS, REFERENCE_IMAGES, ZOO_BATCHES, ZOO_KINDS, Case, Limits, random_cases,
    zoo_cases, zoo_layers)
from conv_sweep_correctness import (  # noqa: E402
    ACTIVATIONS_F64, check, explicit_padding, reference_f64, reference_for, rel_error, sample_images, tolerance)
from conv_sweep_report import WORST, distributions, goals, render_markdown, write_reports  # noqa: E402

__all__ = [
    # cases
    "ACTIVATIONS", "DEFAULT_CASES", "DEFAULT_SEED", "KINDS", "LIMITS", "QUICK_LIMITS", "QUICK_ZOO_LAYERS",
    "REFERENCE_IMAGES", "ZOO_BATCHES", "ZOO_KINDS", "Case", "Limits", "random_cases", "zoo_cases", "zoo_layers",
    # correctness
    "ACTIVATIONS_F64", "explicit_padding", "reference_f64", "rel_error", "tolerance",
    # report
    "WORST", "distributions", "goals", "render_markdown", "write_reports",
    # this file: measuring and the command line
    "QUICK_CASES", "QUICK_ITERS", "VARIANTS", "chunks", "run_chunk", "parse_args", "main",
]

QUICK_CASES, QUICK_ITERS = 24, 5
VARIANTS = ("auto", "xla")  # conv2d's algorithm argument: jaxcnn's decision, and XLA's conv (the baseline)
# The documented variable naming jaxcnn's default autotune cache (jaxcnn.layouts.default_cache_path).
AUTOTUNE_CACHE_ENV = "JAXCNN_AUTOTUNE_CACHE"
# Default --budget-s: a few minutes, so a GPU check runs the sweep beside its build and tests;
# --resume finishes a longer sweep in a second run.
BUDGET_S = 270.0


# ---------------------------------------------------------------- inputs


@functools.partial(jax.jit, static_argnames=("shapes", "scales", "dtype"))
def _normal_arrays(key, shapes, scales, dtype):
    """scale * N(0, 1) arrays of `shapes`, drawn in float32 and cast to dtype."""
    keys = jax.random.split(key, len(shapes))
    return tuple((scale * jax.random.normal(k, shape)).astype(dtype) for k, shape, scale in zip(keys, shapes, scales))


def draw_inputs(case: Case, seed: int) -> tuple:
    """x, w, bias (and the residual) in the case's dtype: x, residual ~ N(0, 1), w ~ N(0, 1/fan-in),
    bias ~ N(0, 0.01). Keyed by input_key: a case's inputs do not depend on the others, and cases
    that differ only in precision get the same ones (and share the compiled draw)."""
    root = jax.random.key(seed, impl="rbg")  # compiles in a fraction of threefry's time per shape
    key = jax.random.fold_in(root, zlib.crc32(case.input_key.encode()))
    shapes = (case.x_shape, case.w_shape, (case.k,)) + ((case.out_shape(),) if case.residual else ())
    scales = (1.0, 1.0 / math.sqrt(case.terms), 0.1) + ((1.0,) if case.residual else ())
    return _normal_arrays(key, shapes, scales, case.dtype)


def conv2d_fn(case: Case, algorithm: str):
    """conv2d of the case with `algorithm`, over (x, w, bias[, residual])."""

    def fn(x, w, b, residual=None):
        return jaxcnn.conv2d(x, w, b, residual=residual, stride=case.stride, padding=case.padding,
                             dilation=case.dilation, groups=case.groups, activation=case.activation,
                             layout=case.layout, precision=case.precision, algorithm=algorithm)

    return fn


@functools.partial(jax.jit, static_argnames=("layout", "images"))
def compare(y_auto, y_xla, x, residual, *, layout: str, images: tuple[int, ...]):
    """The sampled images of auto's and XLA's outputs and of the inputs (NHWC, float32) and, over
    the whole outputs, whether auto's is finite, max |auto - XLA| and max |XLA|."""

    def sampled(a):
        return jnp.transpose(a, [layout.index(d) for d in "NHWC"])[np.array(images)].astype(jnp.float32)

    auto, xla = y_auto.astype(jnp.float32), y_xla.astype(jnp.float32)
    return dict(y_auto=sampled(y_auto), y_xla=sampled(y_xla), x=sampled(x),
                residual=None if residual is None else sampled(residual), finite=jnp.all(jnp.isfinite(auto)),
                diff=jnp.max(jnp.abs(auto - xla)), scale=jnp.max(jnp.abs(xla)))


# ---------------------------------------------------------------- running a chunk


def chunks(cases: Sequence[Case]) -> list[list[Case]]:
    """Consecutive cases, at most CHUNK_CASES and about CHUNK_BYTES (x3: inputs and two outputs)."""
    out, current, size = [], [], 0.0
    for case in cases:
        b = 3 * case.bytes()
        if current and (len(current) >= CHUNK_CASES or size + b > CHUNK_BYTES):
            out.append(current)
            current, size = [], 0.0
        current.append(case)
        size += b
    return out + ([current] if current else [])


def avals(case: Case) -> tuple:
    dtype = jnp.dtype(case.dtype)
    struct = jax.ShapeDtypeStruct
    return (struct(case.x_shape, dtype), struct(case.w_shape, dtype), struct((case.k,), dtype),
            struct(case.out_shape(), dtype) if case.residual else None)


def decision_dict(d) -> dict:
    return dict(choice=d.choice, source=d.source, reason=d.reason, times_ms=dict(d.times_ms),
                errors=dict(d.errors), explain=d.explain())


def decide_chunk(cases: Sequence[Case], cache: Path) -> tuple[dict[str, dict], float, str | None]:
    """Each case's decision, all in one decide_all batch into `cache`; seconds it took; error."""
    start = time.perf_counter()
    try:
        sites = [conv_site(*avals(c), c.config()) for c in cases]
        decisions = decide_all(sites, cache=AutotuneCache(cache))
    except Exception as e:  # the decision owner failing is the finding: the traces will say more
        return {}, time.perf_counter() - start, f"{type(e).__name__}: {e}"[:1000]
    return {c.name: decision_dict(d) for c, d in zip(cases, decisions)}, time.perf_counter() - start, None


def prepare(case: Case, seed: int) -> dict:
    """Draw the inputs, compile and run auto and XLA once, compare them: on a compile thread."""
    out: dict[str, Any] = dict(case=case)
    try:
        args = draw_inputs(case, seed)
        out["args"] = args
        out["fns"] = {v: conv2d_fn(case, v) for v in VARIANTS}
        started = time.perf_counter()
        y_auto = run_once(out["fns"]["auto"], args)
        out["first_call_s"] = time.perf_counter() - started
        y_xla = run_once(out["fns"]["xla"], args)
        residual = args[3] if case.residual else None
        compared = jax.device_get(compare(y_auto, y_xla, args[0], residual, layout=case.layout,
                                          images=tuple(sample_images(case))))
        out["sampled"] = dict(compared, w=np.asarray(args[1], np.float32), b=np.asarray(args[2], np.float32))
    except Exception as e:  # one broken case must not hide the others
        out["error"] = f"{type(e).__name__}: {e}"[:1000]
        out["traceback"] = traceback.format_exc()[-3000:]
    return out


def run_chunk(cases: Sequence[Case], *, seed: int, iters: int, warmup: int, cache: Path, spec,
              memo: dict) -> tuple[list[dict], dict]:
    """Decide, compile, check and time one chunk; its rows and the seconds of each phase."""
    seconds = {}
    decisions, seconds["decide"], decide_error = decide_chunk(cases, cache)
    # conv2d's "auto" traces read the decisions from the same file (their default cache).
    os.environ[AUTOTUNE_CACHE_ENV] = str(cache)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=compile_threads()) as pool:
        prepared = list(pool.map(lambda c: prepare(c, seed), cases))
    seconds["compile"] = time.perf_counter() - started
    ready = [p for p in prepared if "error" not in p]
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as host:
        # The host's float64 references run while the device is timed.
        refs = host.submit(lambda: {p["case"].name: reference_for(p["case"], p["sampled"], memo) for p in ready})
        runs = [((p["case"].name, v), p["fns"][v], p["args"]) for p in ready for v in VARIANTS]
        times, time_error = {}, None
        try:
            times = device_times(runs, iters=iters, warmup=warmup, top_k=3) if runs else {}
        except Exception as e:  # recorded on every case of the chunk; the next chunk goes on
            time_error = f"timing: {type(e).__name__}: {e}"[:1000]
        seconds["time"] = time.perf_counter() - started
        references = refs.result()
    seconds["time_and_reference"] = time.perf_counter() - started
    rows = []
    for p in prepared:
        case = p["case"]
        row = dict(case.to_json(), decision=decisions.get(case.name), ok=False)
        if decide_error:
            row["decision_error"] = decide_error
        if "error" in p:
            row.update(error=p["error"], traceback=p["traceback"])
            rows.append(row)
            continue
        row["trace_decision"] = trace_decision(case, cache)
        row["first_call_s"] = p["first_call_s"]
        if isinstance(references[case.name], str):
            row["error"] = f"float64 reference: {references[case.name]}"
        elif time_error:
            row["error"] = time_error
        if "error" in row:
            rows.append(row)
            continue
        row["correctness"] = check(case, p["sampled"], references[case.name])
        row["timings"] = {v: timing_dict(times[(case.name, v)]) for v in VARIANTS}
        row["device_time"] = all(t["is_device_time"] for t in row["timings"].values())
        row["ratio"] = row["timings"]["xla"]["median_ms"] / row["timings"]["auto"]["median_ms"]
        row["floor"] = floor(case, spec)
        if row["floor"]:
            row["pct_of_floor"] = {v: 100 * row["floor"]["floor_ms"] / t["median_ms"]
                                   for v, t in row["timings"].items()}
        row["ok"] = row["correctness"]["ok"]
        rows.append(row)
    return rows, seconds


def trace_decision(case: Case, cache: Path) -> dict:
    """The decision conv2d's trace read (the same cache): its choice and source."""
    try:
        d = decide_conv(*avals(case), case.config(), cache=AutotuneCache(cache))
    except Exception as e:  # recorded: the auto trace met the same
        return dict(choice=None, source=None, error=f"{type(e).__name__}: {e}"[:1000])
    return dict(choice=d.choice, source=d.source)


def floor(case: Case, spec) -> dict | None:
    if spec is None:
        return None
    return dict(floor_ms(case.flops(), case.bytes(), spec, PRECISION_CLASS[case.kind]),
                precision=PRECISION_CLASS[case.kind])


# ---------------------------------------------------------------- command line


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="directory for <gpu>-<date>-NAME.{json,md}")
    p.add_argument("--name", default="conv_sweep", help="report name (default conv_sweep)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"random shapes and inputs (default {DEFAULT_SEED})")
    p.add_argument("--cases", type=int, help=f"random cases (default {DEFAULT_CASES}; --quick {QUICK_CASES})")
    p.add_argument("--iters", type=int, help=f"timed calls per variant (default 20; --quick {QUICK_ITERS})")
    p.add_argument("--warmup", type=int, help="untimed calls first (default 3; --quick 1)")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_CASES} small random cases, {QUICK_ITERS} calls, {QUICK_ZOO_LAYERS} zoo layers")
    p.add_argument("--no-zoo", action="store_true", help="random cases only")
    p.add_argument("--zoo-batches", type=lambda s: [int(v) for v in s.split(",")], default=list(ZOO_BATCHES))
    p.add_argument("--zoo-kinds", type=lambda s: s.split(","), default=list(ZOO_KINDS),
                   help=f"among {', '.join(KINDS)} (default {','.join(ZOO_KINDS)})")
    p.add_argument("--cache-dir", type=Path, help="where the fresh autotune caches go (default OUT/<report>-autotune)")
    p.add_argument("--resume", type=Path, metavar="JSON",
                   help="an earlier report of the same sweep (seed, cases, zoo): keep its rows, run the cases it lacks")
    p.add_argument("--budget-s", type=float, default=BUDGET_S,
                   help=f"start no chunk expected to end after this many seconds (default {BUDGET_S:g}; 0: none); "
                        "the report lists the cases not reached, --resume runs them")
    args = p.parse_args(argv)
    bad = [k for k in args.zoo_kinds if k not in KINDS]
    if bad:
        p.error(f"unknown --zoo-kinds {bad}; known: {', '.join(KINDS)}")
    args.cases = args.cases if args.cases is not None else (QUICK_CASES if args.quick else DEFAULT_CASES)
    args.iters = args.iters or (QUICK_ITERS if args.quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    return args


def resumed_rows(path: Path, seed: int) -> list[dict]:
    """The rows of an earlier report of the same seed (their cases are not run again)."""
    report = json.loads(path.read_text())
    if report["meta"]["seed"] != seed:
        raise ValueError(f"--resume {path} is a sweep of seed {report['meta']['seed']}, not {seed}")
    return report["rows"]


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    stem = f"{gpu_slug()}-{time.strftime('%Y-%m-%d', time.gmtime())}-{args.name}"
    cache_dir = args.cache_dir or args.out / f"{stem}-autotune"
    cache_dir.mkdir(parents=True, exist_ok=True)
    for stale in cache_dir.glob("chunk-*.json"):  # decisions start from nothing
        stale.unlink()
    rows: list[dict] = resumed_rows(args.resume, args.seed) if args.resume else []
    cases = random_cases(args.seed, args.cases, QUICK_LIMITS if args.quick else LIMITS)
    n_random = len(cases)
    if not args.no_zoo:
        cases += zoo_cases(args.zoo_batches, args.zoo_kinds, quick=args.quick)
    done = {r["name"] for r in rows}
    todo = [c for c in cases if c.name not in done]
    spec = lookup_gpu_spec()
    env = environment(spec)
    seconds = dict(decide=0.0, compile=0.0, time=0.0, time_and_reference=0.0, total=0.0)
    meta = dict(seed=args.seed, random_cases=n_random, zoo_cases=len(cases) - n_random, planned=len(cases),
                zoo_batches=args.zoo_batches, zoo_kinds=args.zoo_kinds, iters=args.iters, warmup=args.warmup,
                quick=args.quick, cache_dir=str(cache_dir), seconds=seconds, chunks=[], ran=0, budget_s=args.budget_s,
                resumed=dict(path=str(args.resume), rows=len(rows)) if args.resume else None,
                limits=dataclasses.asdict(QUICK_LIMITS if args.quick else LIMITS))
    markdown = write_reports(args.out, stem, env, rows, meta)  # fail early on a bad --out
    memo: dict[str, np.ndarray] = {}
    pending = chunks(todo)
    for i, chunk in enumerate(pending):
        ran = meta["ran"]
        expected = (time.perf_counter() - started) + (seconds["total"] / ran * len(chunk) if ran else 0.0)
        if ran and args.budget_s and expected > args.budget_s:
            meta["not_reached"] = [c.name for rest in pending[i:] for c in rest]
            print(f"budget: {len(meta['not_reached'])} cases not reached (--resume <this JSON> runs them)", flush=True)
            write_reports(args.out, stem, env, rows, meta)
            break
        cache = cache_dir / f"chunk-{i:03d}.json"
        chunk_rows, chunk_seconds = run_chunk(chunk, seed=args.seed, iters=args.iters, warmup=args.warmup,
                                              cache=cache, spec=spec, memo=memo)
        # Only the chunk's last inputs can recur (its fp32 zoo layer's "highest" twin, next chunk).
        memo = {k: v for k, v in memo.items() if k == chunk[-1].input_key}
        rows += chunk_rows
        for k, v in chunk_seconds.items():
            seconds[k] += v
        seconds["total"] = time.perf_counter() - started
        meta["chunks"].append(dict(cases=len(chunk), **chunk_seconds))
        meta["ran"] += len(chunk)
        bad = [r["name"] for r in chunk_rows if not r["ok"]]
        print(f"chunk {i + 1}/{len(pending)}: {len(chunk)} cases, "
              + ", ".join(f"{k} {v:.1f} s" for k, v in chunk_seconds.items())
              + (f"; NOT OK: {', '.join(bad)}" if bad else ""), flush=True)
        markdown = write_reports(args.out, stem, env, rows, meta)
    return final_status(markdown, rows, require_rows=True)


if __name__ == "__main__":
    sys.exit(main())
