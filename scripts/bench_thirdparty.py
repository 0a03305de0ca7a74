#!/usr/bin/env python3
"""jaxcnn.optimize on CNNs nobody here wrote (issue 32): Keras 3 applications on the JAX backend
(ResNet50, MobileNetV2, VGG16, InceptionV3) and Flax linen / nnx / Equinox ResNets with inference
BatchNorm, from benchmarks/thirdparty_models.py, each as a new user runs it: XLA's program
(jax.jit(apply)) against jax.jit(jaxcnn.optimize(apply)), optimize called with no arguments.

Per model x batch x dtype (default 1 and 64, bf16 and fp32):
  - device time (sum of GPU kernel durations, jaxcnn.profile.device_times, both programs in one
    trace): median and p10-p90 over --iters calls; ratio = XLA / optimized (> 1: optimize wins);
  - host wall time per call (median, a sync after each call);
  - first call (trace + rewrite + tuning + compile + run) of the optimized function and of XLA's;
    jaxcnn's tuning caches on disk per GPU, so a repeated run measures a warm cache;
  - max |optimized - XLA| / max |XLA| of the outputs, and the rewrites (counts per jaxcnn op and
    per replaced lax pattern; the full optimized.explain() text in the JSON);
  - the roofline floor: compute = FLOPs of XLA's program (jax cost analysis) / the dtype's peak
    (jaxcnn.profile.gpu_specs; fp32 at the TF32 tensor-core peak, what XLA's default precision
    runs float32 convs at), memory = the "bytes accessed" of XLA's compiled program / the GPU's
    bandwidth (and the bytes of weights + input + output, the least any program moves);
  - the top 5 kernels of the optimized program by device time (and of XLA's, in the JSON).
Goals (issue 32), geometric mean of the ratios over the four Keras models per batch and dtype:
bf16 >= 1.5 at N=64, >= 1.3 at N=1, fp32 >= 1.2; no model slower than XLA (beyond the run-to-run
spread: optimized p10 > XLA p90, as scripts/bench_optimize_flax.py judges it).

Writes <gpu>-<date>-<name>.{json,md} into --out after every row (a time-out keeps the rows done)
and prints the markdown. Exit status: 0 when every row ran and its outputs matched, 2 otherwise.

  python scripts/bench_thirdparty.py --out benchmarks/results
  python scripts/bench_thirdparty.py --out /tmp/tp --quick           (2 Keras models, bf16, N=1 and 64)
  JAX_PLATFORMS=cpu python scripts/bench_thirdparty.py --smoke --out /tmp/tp   (tiny images, host wall time)
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import math
import sys
import time
import traceback
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

# bench_optimize_flax puts the repository root on sys.path (benchmarks.*, jaxcnn from a checkout)
from bench_optimize_flax import TOLERANCE, cell_ms, slower_beyond_spread, timing_dict  # noqa: E402
from bench_common import (DTYPES, dated_stem, environment, int_list, run_rows, str_list,  # noqa: E402
                          timing_defaults, write_report)
from bench_common import fmt as _fmt  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxcnn  # noqa: E402
from benchmarks import thirdparty_models as tm  # noqa: E402
from jaxcnn.profile import device_times, wall_time  # noqa: E402
from jaxcnn.profile.gpu_specs import floor_ms, lookup_gpu_spec  # noqa: E402
from jaxcnn.profile.jaxpr_flops import function_flops  # noqa: E402
from jaxcnn.tuning.decision import measurement_costs  # noqa: E402

KERAS_MODELS = ["keras_resnet50", "keras_mobilenetv2", "keras_vgg16", "keras_inceptionv3"]
# Models no goal names (--generalization): whether the speedups carry over to patterns the
# goal's models do not have; their geomean is reported apart, without a goal.
GENERALIZATION_MODELS = ["keras_efficientnetb0", "keras_mobilenetv3small", "keras_resnet50v2", "keras_densenet121",
                         "keras_convnexttiny", "keras_inceptionresnetv2"]
DEFAULT_MODELS = KERAS_MODELS + ["linen_resnet50", "nnx_resnet18", "equinox_resnet18"]
QUICK_MODELS = ["keras_resnet50", "keras_mobilenetv2"]
# Geometric-mean goals over KERAS_MODELS by (dtype, batch); None: any batch. Every row: >= 1.0.
GEOMEAN_GOALS = {("bf16", 64): 1.5, ("bf16", 1): 1.3, ("fp32", None): 1.2}
# The gpu_specs ceiling each dtype's convs run at under XLA's default precision.
PRECISION_CLASS = {"bf16": "bf16", "fp16": "fp16", "fp32": "tf32"}
SMOKE_HW = 64  # --smoke image side (InceptionV3: its minimum, below)
SMOKE_CLASSES = 10
TOP_KERNELS = 5
# How a row passes the model's weights: "args" (fn(params, x), Keras's stateless_call, Flax's
# apply) or "closed" (fn(x) closing over them: constants of the traced program).
WEIGHTS = ("args", "closed")


def geomean_goal(dtype: str, batch: int) -> float | None:
    return GEOMEAN_GOALS.get((dtype, batch), GEOMEAN_GOALS.get((dtype, None)))


def library_versions() -> dict:
    """Versions of the model libraries, read without importing them."""
    versions = {}
    for package in ("keras", "flax", "equinox"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def rewrite_summary(rewrites) -> dict:
    """Counts of the rewrites per jaxcnn op and per replaced lax pattern ("a + b -> op")."""
    ops: dict[str, int] = {}
    patterns: dict[str, int] = {}
    for r in rewrites:
        ops[r.op] = ops.get(r.op, 0) + 1
        pattern = f"{' + '.join(r.replaced)} -> {r.op}"
        patterns[pattern] = patterns.get(pattern, 0) + 1
    return dict(ops=ops, patterns=patterns)


def first_call_s(fn, args) -> tuple[float, object]:
    """Seconds of fn's first call (trace, compile, run, sync) and its output."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - start, out


def measuring_summary(costs) -> dict:
    """What the decision owner's measurements took of a first call (decision.MeasurementCost)."""
    return dict(measurements=len(costs), sites=sum(c.sites for c in costs), runs=sum(c.runs for c in costs),
                compile_s=sum(c.compile_s for c in costs), timing_s=sum(c.timing_s for c in costs))


def max_rel_diff(got, want) -> float:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def cost_of(fn, args) -> dict:
    """FLOPs (from the traced HLO: convolutions as written; where XLA's cost analysis gives
    none, the convs and matmuls of the jaxpr) and bytes accessed (after XLA's fusion: what its
    kernels move) of fn, whose jitted compile is already cached."""
    lowered = jax.jit(fn).lower(*args)
    compiled = lowered.compile()
    flops = (lowered.cost_analysis() or {}).get("flops")
    compiled_cost = compiled.cost_analysis() or {}
    if isinstance(compiled_cost, (list, tuple)):  # older jax: one dict per program
        compiled_cost = compiled_cost[0] if compiled_cost else {}
    source = "xla cost analysis"
    if not flops:
        flops, source = function_flops(fn, *args), "jaxpr convs and matmuls"
    return dict(flops=flops, flops_source=source, bytes_accessed=compiled_cost.get("bytes accessed"))


def io_bytes(m, out) -> int:
    """Bytes of the weights, the input and the output: the least any program reads and writes."""
    return sum(int(leaf.nbytes) for leaf in jax.tree.leaves((m.params, m.x, out)))


def floors(cost: dict, least_bytes: int, spec, dtype: str) -> dict | None:
    if spec is None or not cost.get("flops") or not cost.get("bytes_accessed"):
        return None
    floor = floor_ms(cost["flops"], cost["bytes_accessed"], spec, PRECISION_CLASS[dtype])
    floor["least_memory_ms"] = least_bytes / spec.memory.per_s * 1e3
    floor["precision"] = PRECISION_CLASS[dtype]
    return floor


def kernel_list(timing) -> list[dict]:
    """A timing's top kernels: name, us per call, launches per call, share of the call's time."""
    total_us = timing.median_ms * 1e3
    return [dict(name=k.name, us_per_call=k.us_per_call, launches_per_call=k.launches_per_call,
                 share=k.us_per_call / total_us if total_us else None) for k in timing.kernels]


def model_function(m, weights: str):
    """(fn, args, as_params_fn) of model m run with its weights as an argument (weights="args":
    fn(params, x)) or closed over (weights="closed": fn(x), the weights constants of the traced
    program, as a Keras model called inside jax.jit has them); as_params_fn turns a callable of
    fn's arguments into one of (params, x)."""
    if weights == "args":
        return m.apply, (m.params, m.x), lambda fn: fn
    if weights == "closed":
        params = m.params
        return (lambda x: m.apply(params, x)), (m.x,), lambda fn: (lambda _params, x: fn(x))
    raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")


def run_row(name: str, batch: int, dtype: str, iters: int, warmup: int, hw: int | None = None,
            num_classes: int | None = None, spec=None, top_kernels: int = TOP_KERNELS, weights: str = "args") -> dict:
    """One model x batch x dtype x weights form. A failing jaxcnn.optimize is recorded
    (optimize_error) and XLA's program is still timed; a failing build or XLA run ends the row
    (error). Where the whole-program check declines the rewrites, the rewritten program is timed
    too ("rewritten": by how much, and on which kernels, it lost)."""
    row = dict(model=name, library=tm.MODELS[name][0], n=batch, dtype=dtype, weights=weights, ok=False,
               timings={}, first_call_s={}, wall_ms={})
    started = time.perf_counter()
    try:
        size = hw if hw is None else max(hw, min_image_size(name))
        m = tm.build(name, batch=batch, hw=size, dtype=DTYPES[dtype], num_classes=num_classes)
        row["input_shape"] = list(m.x.shape)
        apply, args, as_params_fn = model_function(m, weights)
        xla_jit = jax.jit(apply)
        row["first_call_s"]["xla"], want = first_call_s(xla_jit, args)
        row["cost"] = cost_of(apply, args)
        row["io_bytes"] = io_bytes(m, want)
        row["floor"] = floors(row["cost"], row["io_bytes"], spec, dtype)
        cases = [("xla", apply, args)]
        try:
            opt = jaxcnn.optimize(apply)
            opt_jit = jax.jit(opt)
            with measurement_costs() as costs:
                row["first_call_s"]["optimized"], got = first_call_s(opt_jit, args)
            row["first_call_measuring"] = measuring_summary(costs)
            row["max_rel_diff"] = max_rel_diff(got, want)
            row["accurate"] = bool(math.isfinite(row["max_rel_diff"]) and row["max_rel_diff"] <= TOLERANCE[dtype])
            if not row["accurate"]:
                # Two programs that round differently (16-bit, or float32 convs on TF32 tensor
                # cores as XLA's default precision runs them) drift apart in a deep model: judge
                # both against the same model in float32 at HIGHEST precision instead.
                row.update(float32_errors(name, batch, size, num_classes, m, as_params_fn(opt_jit), as_params_fn(xla_jit)))
                row["accurate"] = bool(math.isfinite(row["err_f32_optimized"])
                                       and row["err_f32_optimized"] <= max(TOLERANCE[dtype],
                                                                            ERROR_GROWTH * row["err_f32_xla"]))
            row["rewrites"] = rewrite_summary(opt.rewrites(*args))
            row["runs_rewrites"] = opt.runs_rewrites(*args)
            row["explain"] = opt.explain(*args)
            cases.append(("optimized", opt, args))
            if row["runs_rewrites"] is False and row["rewrites"]["ops"]:
                cases.append(("rewritten", opt.rewritten(*args), args))
        except Exception as e:  # optimize's failure is the finding: keep XLA's numbers beside it
            row["optimize_error"] = f"{type(e).__name__}: {e}"[:1000]
            row["traceback"] = traceback.format_exc()[-3000:]
        # Round-robin calls: a clock or temperature drift during the trace falls on both programs.
        times = device_times(cases, iters=iters, warmup=warmup, top_k=top_kernels, interleave=True)
        row["timings"] = {k: timing_dict(t) for k, t in times.items()}
        row["top_kernels"] = {k: kernel_list(t) for k, t in times.items()}
        row["device_time"] = all(t.is_device_time for t in times.values())
        for key, fn, _ in cases[:2]:
            row["wall_ms"][key] = wall_time(fn, *args, iters=iters, warmup=warmup).median_ms
        if "optimized" in times:
            row["ratio"] = times["xla"].median_ms / times["optimized"].median_ms
            row["slower_beyond_spread"] = slower_beyond_spread(
                {"optimized": row["timings"]["optimized"], "original": row["timings"]["xla"]})
        row["ok"] = bool(row.get("accurate"))
    except Exception as e:  # one broken row must not hide the others
        row["error"] = f"{type(e).__name__}: {e}"[:1000]
        row["traceback"] = traceback.format_exc()[-3000:]
    row["seconds"] = time.perf_counter() - started
    return row


# An optimized program passes when its error against float32 (HIGHEST precision) is at most this
# many times XLA's own error (or within TOLERANCE): BatchNorm folded into 16-bit (or TF32-rounded)
# weights and bias rounds differently from XLA's unfolded program, as every inference engine's
# folding does.
ERROR_GROWTH = 2.0
# Images both programs and the float32 reference model run for that judgement (more batches of fresh
# inputs where the row's batch is smaller): one image's output is too few numbers for a stable
# error, and the error is their relative RMS (||y - y32|| / ||y32|| over all of them), not the
# largest single difference, which one outlier decides.
ACCURACY_IMAGES = 8


def _vs_f32(row) -> str:
    if "err_f32_optimized" not in row:
        return ""
    return (f" (vs f32, rel RMS over {row['accuracy_images']} images, opt / XLA "
            f"{row['err_f32_optimized']:.1e} / {row['err_f32_xla']:.1e})")


def accuracy_inputs(x, images: int = ACCURACY_IMAGES, seed: int = 1) -> list:
    """x, then batches of fresh standard-normal inputs of x's shape and dtype, until they hold at
    least `images` images."""
    inputs, key = [x], jax.random.PRNGKey(seed)
    while len(inputs) * x.shape[0] < images:
        key, sub = jax.random.split(key)
        inputs.append(jax.random.normal(sub, x.shape, jnp.float32).astype(x.dtype))
    return inputs


def rel_rms(errors_sq: float, reference_sq: float) -> float:
    return math.sqrt(errors_sq / reference_sq) if reference_sq > 0 else math.inf


def float32_errors(name, batch, size, num_classes, m, optimized, xla, images: int = ACCURACY_IMAGES) -> dict:
    """The optimized and XLA's programs (jitted callables of (params, x)) against the float32 model
    with the same weights at HIGHEST precision (no TF32), over accuracy_inputs(m.x): relative RMS
    errors (the judgement) and the largest relative difference of either (max |y - y32| /
    max |y32|, for the record)."""
    m32 = tm.build(name, batch=batch, hw=size, dtype=jnp.float32, num_classes=num_classes)
    params32 = jax.tree.map(lambda a, b: jnp.asarray(a, b.dtype), m.params, m32.params)
    reference_jit = jax.jit(m32.apply)

    def reference(params, x):
        # True float32 arithmetic: XLA's default precision runs float32 convs and matmuls on TF32
        # tensor cores (10-bit mantissa), which would put the reference's own error into both.
        with jax.default_matmul_precision("highest"):
            return reference_jit(params, x)

    sums = {"optimized": 0.0, "xla": 0.0, "reference": 0.0}
    largest = {"optimized": 0.0, "xla": 0.0}
    inputs = accuracy_inputs(m.x, images)
    for x in inputs:
        ref = np.asarray(reference(params32, jnp.asarray(x, jnp.float32)), np.float64)
        sums["reference"] += float(np.sum(ref ** 2))
        for key, fn in (("optimized", optimized), ("xla", xla)):
            err = np.asarray(fn(m.params, x), np.float64) - ref
            sums[key] += float(np.sum(err ** 2))
            largest[key] = max(largest[key], float(np.max(np.abs(err))) / max(float(np.max(np.abs(ref))), 1e-30))
    return dict(err_f32_optimized=rel_rms(sums["optimized"], sums["reference"]),
                err_f32_xla=rel_rms(sums["xla"], sums["reference"]),
                max_err_f32_optimized=largest["optimized"], max_err_f32_xla=largest["xla"],
                accuracy_images=len(inputs) * int(m.x.shape[0]))


def min_image_size(name: str) -> int:
    """The smallest image side model `name` builds at (--hw is raised to it): Keras's
    InceptionV3 75, every other model here 32 (five stride-2 stages)."""
    return 75 if tm.MODELS[name][1] == "InceptionV3" else 32


# The model sets a geomean is taken over: the goal's Keras models, and the generalization check's.
GEOMEAN_SETS = {"goal": KERAS_MODELS, "generalization": GENERALIZATION_MODELS}


def geomeans(rows: list[dict]) -> list[dict]:
    """Geometric mean of the ratios per model set (GEOMEAN_SETS), batch, dtype and weights form;
    the goal set's against its goal, the generalization set's without one."""
    out = []
    for n, dtype, weights in sorted({(r["n"], r["dtype"], r.get("weights", "args")) for r in rows}):
        group = [r for r in rows if r["n"] == n and r["dtype"] == dtype and r.get("weights", "args") == weights
                 and "ratio" in r]
        device = all(r["device_time"] for r in group)
        for models_set, models in GEOMEAN_SETS.items():
            ratios = [r["ratio"] for r in group if r["model"] in models]
            if not ratios:
                continue
            goal = geomean_goal(dtype, n) if models_set == "goal" else None
            value = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
            complete = len(ratios) == len(models)
            met = None if goal is None or not device or not complete else value >= goal
            out.append(dict(set=models_set, n=n, dtype=dtype, weights=weights, geomean=value, models=len(ratios),
                            of=len(models), goal=goal, met=met))
    return out


def _verdict(met) -> str:
    return "-" if met is None else ("met" if met else "MISSED")


def _kernel_text(kernels: list[dict]) -> str:
    return "; ".join(f"{k['name'][:70]} {k['us_per_call']:.1f} us ({k['share']:.0%}, x{k['launches_per_call']:g})"
                     for k in kernels if k.get("share") is not None) or "-"


def render_markdown(env: dict, rows: list[dict], iters: int) -> str:
    device_time = bool(rows) and all(r.get("device_time") for r in rows)
    versions = env.get("libraries", {})
    lines = [
        "# jaxcnn.optimize on third-party CNNs (Keras 3, Flax, Equinox)",
        "",
        f"- device: {env['device_kind']} ({env.get('nvidia_smi') or 'no nvidia-smi'}); jax {env['jax']}, "
        f"jaxlib {env['jaxlib']}; " + ", ".join(f"{k} {v}" for k, v in versions.items()) + f"; {env['date_utc']}",
        f"- times: median [p10-p90] per call over {iters} synced calls (XLA's and the optimized program's "
        "calls alternating in one trace), ms, "
        + ("device time (sum of GPU kernel durations)." if device_time else
           "HOST WALL TIME (no GPU trace: not a device-time measurement)."),
        "- ratio = XLA / optimized: jax.jit(apply) vs jax.jit(jaxcnn.optimize(apply)), optimize with no arguments.",
        "- wall = host wall time per call (median); first call = trace + rewrite + tuning + compile + run, s.",
        "- rel diff = max |optimized - XLA| / max |XLA| of the model outputs; where a row exceeds the"
        " tolerance, `vs f32` gives both programs' error against the same model in float32 at HIGHEST"
        " precision (no TF32; relative RMS"
        f" over at least {ACCURACY_IMAGES} images; accurate: the optimized error <= {ERROR_GROWTH}x XLA's own).",
        "",
        "| model | N | dtype | XLA ms | optimized ms | ratio | wall XLA / opt ms | first call XLA / opt s | rel diff "
        "| rewrites | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ops = r.get("rewrites", {}).get("ops", {})
        rw = ", ".join(f"{n} {op}" for op, n in ops.items()) or ("-" if "rewrites" not in r else "none")
        if r.get("runs_rewrites") is False and ops:
            lost = r["timings"].get("rewritten")
            lost = f", rewritten {lost['median_ms']:.3f} ms" if lost else ""
            rw = f"none run: XLA's program measured faster (found {rw}{lost})"
        wall = f"{_fmt(r['wall_ms'].get('xla'), '.3f')} / {_fmt(r['wall_ms'].get('optimized'), '.3f')}"
        first = f"{_fmt(r['first_call_s'].get('xla'), '.1f')} / {_fmt(r['first_call_s'].get('optimized'), '.1f')}"
        if "error" in r:
            status = "FAIL: " + r["error"][:120]
        elif "optimize_error" in r:
            status = "OPTIMIZE FAILED: " + r["optimize_error"][:120]
        else:
            status = "ok" if r["ok"] else "INACCURATE"
        lines.append(f"| {_label(r)} | {r['n']} | {r['dtype']} | {cell_ms(r['timings'].get('xla'))} | "
                     f"{cell_ms(r['timings'].get('optimized'))} | {_fmt(r.get('ratio'), '.3f')} | {wall} | {first} | "
                     f"{_fmt(r.get('max_rel_diff'), '.1e')}{_vs_f32(r)} | {rw} | {status} |")

    floored = [r for r in rows if r.get("floor")]
    lines += ["", "## Floors", ""]
    if not floored:
        lines.append("- no floor: the device has no entry in jaxcnn.profile.gpu_specs (or no cost analysis).")
    else:
        lines += [
            "Compute floor = XLA program's FLOPs (XLA's cost analysis, else the jaxpr's convs and matmuls) / "
            "the dtype's peak (fp32: TF32); memory floor = its compiled "
            "bytes accessed / DRAM bandwidth (least = weights + input + output bytes); % = floor / time.",
            "",
            "| model | N | dtype | GFLOP | compute floor ms | MB accessed | memory floor ms | least memory ms "
            "| XLA % of floor | optimized % of floor |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in floored:
            f, c = r["floor"], r["cost"]
            pct = {k: (f"{f['floor_ms'] / r['timings'][k]['median_ms']:.0%}" if k in r["timings"] else "-")
                   for k in ("xla", "optimized")}
            lines.append(f"| {_label(r)} | {r['n']} | {r['dtype']} | {c['flops'] / 1e9:.1f} | {f['compute_ms']:.3f} | "
                         f"{c['bytes_accessed'] / 1e6:.1f} | {f['memory_ms']:.3f} | {f['least_memory_ms']:.3f} | "
                         f"{pct['xla']} | {pct['optimized']} |")

    lines += ["", "## Rewrites (replaced lax pattern -> jaxcnn op: count)", ""]
    for r in rows:
        if "rewrites" in r:
            patterns = r["rewrites"]["patterns"]
            lines.append(f"- {_label(r)} N={r['n']} {r['dtype']}: "
                         + ("; ".join(f"{p}: {n}" for p, n in patterns.items()) or "none"))

    lines += ["", "## Top kernels of the optimized program (us per call, share of its time, launches)", ""]
    with_kernels = [r for r in rows if r.get("top_kernels", {}).get("optimized")]
    for r in with_kernels:
        lines.append(f"- {_label(r)} N={r['n']} {r['dtype']}: {_kernel_text(r['top_kernels']['optimized'][:TOP_KERNELS])}")
    if not with_kernels:
        lines.append("- none: no GPU kernel trace.")

    measured = [r for r in rows if r.get("first_call_measuring", {}).get("measurements")]
    if measured:
        lines += ["", "## First call of optimize(fn): the decision owner's measurements", "",
                  "Of each first call (trace, rewrite, decisions, compile, run): the measurements the decision "
                  "owner made (sites and block decisions, the whole program), their candidate runs, and the seconds "
                  "spent compiling them (on its compile threads) and timing them.", "",
                  "| model | N | dtype | first call s | measurements | sites | runs | compile s | timing s |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in measured:
            f = r["first_call_measuring"]
            lines.append(f"| {_label(r)} | {r['n']} | {r['dtype']} | {_fmt(r['first_call_s'].get('optimized'), '.1f')} | "
                         f"{f['measurements']} | {f['sites']} | {f['runs']} | {f['compile_s']:.1f} | {f['timing_s']:.1f} |")

    lines += ["", "## Goals", ""]
    for g in geomeans(rows):
        partial = "" if g["models"] == g["of"] else f" ({g['models']} of {g['of']} models)"
        form = "" if g["weights"] == "args" else f", weights {g['weights']} over"
        if g["set"] == "generalization":
            lines.append(f"- generalization geomean (models outside the goal's list) N={g['n']} {g['dtype']}{form}: "
                         f"{g['geomean']:.3f}x{partial} (no goal; every model should be >= 1.0x)")
            continue
        goal = "-" if g["goal"] is None else f">= {g['goal']}x"
        lines.append(f"- Keras geomean N={g['n']} {g['dtype']}{form}: {g['geomean']:.3f}x{partial} (goal {goal}): "
                     f"{_verdict(g['met']) if device_time else 'n/a (wall time)'}")
    timed = [r for r in rows if "ratio" in r]
    if timed and device_time:
        beyond = [r for r in timed if r["slower_beyond_spread"]]
        below = [r for r in timed if r["ratio"] < 1.0 and not r["slower_beyond_spread"]]
        lines.append("- never slower (slower = optimized p10 > XLA p90): "
                     + ("yes" if not beyond else "NO: " + ", ".join(_where(r) for r in beyond)))
        lines.append("- median ratio < 1.0 inside the spread: " + (", ".join(_where(r) for r in below) or "none"))
    elif timed:
        lines.append("- never slower: n/a (host wall time)")
    failed = [r for r in rows if "optimize_error" in r or "error" in r]
    if failed:
        lines += ["", "## Failures", ""]
        lines += [f"- {_label(r)} N={r['n']} {r['dtype']}: {r.get('optimize_error') or r.get('error')}" for r in failed]
    return "\n".join(lines) + "\n"


def _label(row: dict) -> str:
    """The row's model, and how its weights reach it where they are not arguments."""
    weights = row.get("weights", "args")
    return row["model"] if weights == "args" else f"{row['model']} (weights {weights} over)"


def _where(row: dict) -> str:
    return f"{_label(row)} N={row['n']} {row['dtype']} ({row['ratio']:.3f}x)"


def write_reports(out: Path, env: dict, rows: list[dict], iters: int, stem: str) -> str:
    report = dict(environment=env, rows=rows, geomeans=geomeans(rows), goals={
        f"{dtype} N={'any' if n is None else n}": goal for (dtype, n), goal in GEOMEAN_GOALS.items()})
    return write_report(out, stem, report, render_markdown(env, rows, iters))


def progress_line(row: dict) -> str:
    problem = row.get("error") or row.get("optimize_error") or ("" if row["ok"] else "inaccurate")
    return (f"{row['model']:<20} N={row['n']:<3} {row['dtype']} {row.get('weights', 'args')} ratio {_fmt(row.get('ratio'), '.3f'):>6} rel diff "
            f"{_fmt(row.get('max_rel_diff'), '.1e')}{_vs_f32(row)} first call "
            f"{_fmt(row['first_call_s'].get('optimized'), '.1f')} s "
            f"{'ok' if row['ok'] else 'FAIL ' + problem[:200]} ({row['seconds']:.0f} s)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="directory for the reports")
    p.add_argument("--name", default="thirdparty", help="report name: <gpu>-<date>-NAME.{md,json}")
    p.add_argument("--models", type=str_list, help=f"among {sorted(tm.MODELS)} (default {DEFAULT_MODELS})")
    p.add_argument("--batches", type=int_list)
    p.add_argument("--dtypes", type=str_list, help="among bf16, fp16, fp32 (default bf16,fp32)")
    p.add_argument("--hw", type=int, help="image side (default each model's own: 224, InceptionV3 299)")
    p.add_argument("--num-classes", type=int, help="classifier width (default each model's own: 1000)")
    p.add_argument("--iters", type=int, help="timed calls (default 20; --smoke 2)")
    p.add_argument("--warmup", type=int, help="untimed calls (default 3; --smoke 1)")
    p.add_argument("--kernels", type=int, default=TOP_KERNELS,
                   help=f"kernels kept per program in the JSON, longest first (default {TOP_KERNELS}; the"
                        " markdown lists the top few)")
    p.add_argument("--weights", type=str_list, default=["args"],
                   help=f"how the weights reach the model, among {WEIGHTS}: 'args' fn(params, x), 'closed' fn(x) "
                        "closing over them (default args)")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_MODELS}, bf16, N=1 and 64")
    p.add_argument("--generalization", action="store_true",
                   help=f"the models outside the goal's list instead of the default: {GENERALIZATION_MODELS}")
    p.add_argument("--smoke", action="store_true",
                   help=f"a cheap run that anything can do (CPU too): {SMOKE_HW}x{SMOKE_HW} images (InceptionV3 its "
                        f"minimum 75), N=1, {SMOKE_CLASSES} classes, 2 timed calls")
    args = p.parse_args(argv)
    args.models = args.models or (QUICK_MODELS if args.quick else
                                  GENERALIZATION_MODELS if args.generalization else DEFAULT_MODELS)
    args.dtypes = args.dtypes or (["bf16"] if args.quick else ["bf16", "fp32"])
    bad = ([m for m in args.models if m not in tm.MODELS] + [d for d in args.dtypes if d not in DTYPES]
           + [w for w in args.weights if w not in WEIGHTS])
    if bad:
        p.error(f"unknown models/dtypes/weights {bad}: models {sorted(tm.MODELS)}, dtypes {list(DTYPES)}, "
                f"weights {list(WEIGHTS)}")
    args.batches = args.batches or ([1] if args.smoke else [1, 64])
    if args.smoke:
        args.hw = args.hw or SMOKE_HW
        args.num_classes = args.num_classes or SMOKE_CLASSES
    timing_defaults(args, args.smoke, quick_iters=2)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    spec = lookup_gpu_spec()
    env = environment(spec)
    env["libraries"] = library_versions()
    stem = dated_stem(args.name)
    jobs = [functools.partial(run_row, name, n, dtype, args.iters, args.warmup, args.hw, args.num_classes, spec,
                              args.kernels, weights)
            for weights in args.weights for name in args.models for dtype in args.dtypes for n in args.batches]
    return run_rows(jobs, progress_line, lambda rows: write_reports(args.out, env, rows, args.iters, stem))


if __name__ == "__main__":
    sys.exit(main())
