#!/usr/bin/env python3
"""Fused fire module benchmark: jaxcnn.fire against XLA's unfused fire module.

For every fire module of SqueezeNet 1.0 and 1.1 (torchvision channels, 224x224 input) at each
batch (default 1 and 64) and dtype (default bf16), plus the issue's headline case (55x55,
128 -> 32 -> (128, 128), N = 64): fresh random inputs; an accuracy check of every jaxcnn.fire
algorithm against XLA's composition on them; then, in one profiler trace, the device time (sum
of GPU kernel durations, jaxcnn/profile/device_time.py) of
  - jaxcnn: jaxcnn.fire, algorithm "auto" (what users get),
  - fused:  algorithm "tensor_core" (the single mma.sync kernel),
  - wgmma:  algorithm "wgmma" (the squeeze conv, then both expands in one wgmma launch, or one
            each, into their slices of the output; JAXCNN_FIRE_WGMMA=conv_tc: three convs),
  - two_phase: algorithm "two_phase" (one cooperative launch: squeeze over the whole grid,
            grid barrier, expands; for small problems),
  - xla:    the zoo's fire module on XLA's ops under jit (squeeze conv + bias + ReLU, two
            expand convs + bias + ReLU, concatenate): what a plain JAX SqueezeNet runs.
fused/wgmma/two_phase are skipped (with their reason) where they cannot run.
Floor = (x bytes + y bytes) / 3.97e12 s (H200 HBM3e; weights are negligible); "% floor" =
floor / time; XLA/jaxcnn = the speedup. Issue goal for the headline case: >= 2.5x XLA.

Writes bench_fusion[_LABEL].json (environment + rows) and bench_fusion[_LABEL].md into --out
after every row, and prints the markdown last. Exit status: 0 when every row passed its
accuracy check and timed, 2 when some row failed, 1 on a crash.

  python scripts/bench_fusion.py --out /tmp/bench_fusion --label h200
  python scripts/bench_fusion.py --out /tmp/bench_fusion --batches 64 --cases headline
  JAX_PLATFORMS=cpu python scripts/bench_fusion.py --quick --out /tmp/smoke
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

from bench_common import (DTYPES, FLOOR_BANDWIDTH, SquareCase, case_key, case_sweep_args, case_sweep_jobs,
                          case_sweep_parser, environment, failed_accuracy, fmt, he_weights, headline_line,
                          kernel_table, markdown_table, normal_input, relative_accuracy, report_header,
                          report_name, run_rows, small_bias, speedup_spread, status, summary_report, timed,
                          timed_rows_summary, us, variant_times, write_report)

import jax
import jax.numpy as jnp

import jaxcnn
from jaxcnn._native import queries
from jaxcnn._native.plans import plan_text
from jaxcnn.models.backends import XLA_OPS
from jaxcnn.models.layers import Net
from jaxcnn.models.squeezenet import fire as zoo_fire
from jaxcnn.profile.gpu_specs import lookup_gpu_spec

GOAL_SPEEDUP = 2.5
# Forced algorithms timed next to "auto" (report column -> jaxcnn.fire algorithm).
FORCED_VARIANTS = (("fused", "tensor_core"), ("wgmma", "wgmma"), ("two_phase", "two_phase"))
# max |jaxcnn - xla| relative to max |xla|: XLA rounds each conv's output before its bias,
# jaxcnn once per conv; a few ulps of the dtype.
TOLERANCE = {"bf16": 5e-2, "fp16": 1e-2, "fp32": 1e-4}


@dataclass(frozen=True)
class FireCase(SquareCase):
    """One fire module: NHWC input [n, hw, hw, c] -> squeeze s -> expand (e, e)."""

    s: int
    e: int
    batch: int | None = None  # fixed batch (the headline case), else every --batches


FIRE_CASES = (
    FireCase("headline_55_128_32_128", 55, 128, 32, 128, batch=64),
    FireCase("sq1_0_fire2", 55, 96, 16, 64), FireCase("sq1_0_fire3", 55, 128, 16, 64),
    FireCase("sq1_0_fire4", 55, 128, 32, 128), FireCase("sq1_0_fire5", 27, 256, 32, 128),
    FireCase("sq1_0_fire6", 27, 256, 48, 192), FireCase("sq1_0_fire7", 27, 384, 48, 192),
    FireCase("sq1_0_fire8", 27, 384, 64, 256), FireCase("sq1_0_fire9", 13, 512, 64, 256),
    FireCase("sq1_1_fire2", 55, 64, 16, 64), FireCase("sq1_1_fire3", 55, 128, 16, 64),
    FireCase("sq1_1_fire4", 27, 128, 32, 128), FireCase("sq1_1_fire5", 27, 256, 32, 128),
    FireCase("sq1_1_fire6", 13, 256, 48, 192), FireCase("sq1_1_fire7", 13, 384, 48, 192),
    FireCase("sq1_1_fire8", 13, 384, 64, 256), FireCase("sq1_1_fire9", 13, 512, 64, 256),
)
QUICK_CASES = (FireCase("tiny", 9, 16, 8, 16, batch=2),)


def operands(case: FireCase, n: int, dtype: str, seed: int):
    k = jax.random.split(case_key(seed, f"{case.name}/{n}/{dtype}"), 7)
    dt = DTYPES[dtype]
    return (normal_input(k[0], case.x_nhwc(n), dt),
            he_weights(k[1], (1, 1, case.c, case.s), case.c, dt),
            he_weights(k[2], (1, 1, case.s, case.e), case.s, dt),
            he_weights(k[3], (3, 3, case.s, case.e), 9 * case.s, dt),
            small_bias(k[4], case.s, dt), small_bias(k[5], case.e, dt), small_bias(k[6], case.e, dt))


def xla_fire(x, wsq, we1, we3, bsq, be1, be3):
    """The zoo's fire module on XLA's ops (layer by layer, then concatenate)."""
    params = {"f/squeeze1x1": {"w": wsq, "b": bsq}, "f/expand1x1": {"w": we1, "b": be1},
              "f/expand3x3": {"w": we3, "b": be3}}
    return zoo_fire(Net(XLA_OPS, params), "f", x, squeeze=wsq.shape[3],
                    expand1x1=we1.shape[3], expand3x3=we3.shape[3])


def fire_row(case: FireCase, n: int, dtype: str, *, iters: int, warmup: int, seed: int):
    ops = operands(case, n, dtype, seed)
    itemsize = jnp.dtype(DTYPES[dtype]).itemsize
    bytes_moved = n * case.hw * case.hw * (case.c + 2 * case.e) * itemsize
    flops = 2 * n * case.hw * case.hw * (case.c * case.s + case.s * case.e + 9 * case.s * case.e)
    shape = (case.x_nhwc(n), case.s, case.e, case.e, DTYPES[dtype])
    variants = [("jaxcnn", jaxcnn.fire)]
    skipped = {}
    for name, algorithm in FORCED_VARIANTS:
        plan = queries.fire_plan(*shape, algorithm=algorithm)
        if plan is not None and plan.kernel is None:
            skipped[name] = plan.text  # the library's reason it cannot run
        else:
            variants.append((name, functools.partial(jaxcnn.fire, algorithm=algorithm)))
    want = jax.jit(xla_fire)(*ops)
    per_variant = {}
    for name, fn in variants:
        try:
            per_variant[name] = relative_accuracy(jax.jit(fn)(*ops), want, TOLERANCE[dtype])
        except Exception as exc:  # record and go on: one broken config must not stop the suite
            per_variant[name] = failed_accuracy(exc)
    # The row's accuracy: the first failing variant, else the worst difference of them all.
    failed = [(name, acc) for name, acc in per_variant.items() if not acc["ok"]]
    if failed:
        name, acc = failed[0]
        accuracy = dict(acc, error=f"{name}: {acc['error']}")
    else:
        accuracy = dict(ok=True, error=None, tolerance=TOLERANCE[dtype],
                        max_rel_diff=max(acc["max_rel_diff"] for acc in per_variant.values()))
    timings = timed([*((k, f, ops) for k, f in variants), ("xla", xla_fire, ops)], iters, warmup)
    # The fused kernel's launch configuration (tile, channel split, weight residency).
    config = plan_text(queries.fire_plan(*shape))
    med = {k: t.get("median_ms") for k, t in timings.items()}
    floor_ms = bytes_moved / FLOOR_BANDWIDTH * 1e3
    ours, xla = med.get("jaxcnn"), med.get("xla")
    return dict(
        case=case.name, n=n, dtype=dtype, hw=case.hw, c=case.c, s=case.s, e=case.e,
        bytes_moved=bytes_moved, gflop=flops / 1e9, floor_ms=floor_ms, accuracy=accuracy,
        accuracy_per_variant=per_variant, skipped=skipped, config=config,
        timings=timings,
        pct_of_floor={k: (100.0 * floor_ms / v if v else None) for k, v in med.items()},
        tflops={k: (flops / (v * 1e-3) / 1e12 if v else None) for k, v in med.items()},
        speedup_vs_xla=xla / ours if (ours and xla) else None,
        ok=accuracy["ok"] and not any("error" in t for t in timings.values()),
    )


def summary_table(rows: list[dict]) -> list[str]:
    return markdown_table([
        "case", "N", "dtype", "HxW", "C->S->(E,E)", "MB", "GFLOP", "floor us", "jaxcnn us", "XLA us",
        "jaxcnn % floor", "XLA % floor", "jaxcnn TFLOP/s", "XLA/jaxcnn", "fused us", "wgmma us",
        "two_phase us", "max rel diff", "status"], rows, _summary_cells)


def _summary_cells(r: dict) -> list[str]:
    t = r["timings"]
    return [r["case"], str(r["n"]), r["dtype"], f"{r['hw']}x{r['hw']}",
            f"{r['c']}->{r['s']}->({r['e']},{r['e']})", f"{r['bytes_moved'] / 2**20:.1f}",
            f"{r['gflop']:.2f}", f"{r['floor_ms'] * 1e3:.1f}", us(t.get("jaxcnn", {})),
            us(t.get("xla", {})), fmt(r["pct_of_floor"].get("jaxcnn"), ".0f"),
            fmt(r["pct_of_floor"].get("xla"), ".0f"), fmt(r["tflops"].get("jaxcnn"), ".0f"),
            fmt(r["speedup_vs_xla"], ".2f"), *(us(t[v]) if v in t else "-" for v, _ in FORCED_VARIANTS),
            fmt(r["accuracy"].get("max_rel_diff"), ".1e"),
            status(r)]


@timed_rows_summary()
def goal_summary(timed: list[dict]) -> list[str]:
    lines = []
    for r in timed:
        if r["case"].startswith("headline"):
            label = f"{r['case']}, N={r['n']}, {r['dtype']}"
            lines.append(f"{headline_line(label, r, GOAL_SPEEDUP)}, {r['pct_of_floor']['jaxcnn']:.0f}% of floor")
    for n in sorted({r["n"] for r in timed}):
        lines.append(f"- N={n}: {speedup_spread(r['speedup_vs_xla'] for r in timed if r['n'] == n)}")
    return lines


def render_markdown(env: dict, rows: list[dict], iters: int, label: str) -> str:
    header = [
        *report_header(f"# jaxcnn fused fire module vs XLA{f' ({label})' if label else ''}", env, rows),
        f"- times: median per-call device time over {iters} synced calls (sum of GPU kernel "
        "durations in a profiler trace), us. MB = x + y bytes.",
        f"- floor = MB / {FLOOR_BANDWIDTH / 1e12:.2f} TB/s; % floor = floor / time. XLA: the zoo's "
        "fire module (three convs + bias + ReLU, concatenate) under jit.",
        f"- goal (issue 7): headline case XLA/jaxcnn >= {GOAL_SPEEDUP}.",
    ]
    return summary_report(header, goal_summary(rows), summary_table(rows), kernel_table(rows, "case", launch_config=True))


def write_reports(out_dir: Path, env: dict, rows: list[dict], iters: int, label: str) -> str:
    return write_report(out_dir, report_name("bench_fusion", label), dict(environment=env, label=label, rows=rows),
                        render_markdown(env, rows, iters, label))


def progress_line(r: dict) -> str:
    t = r["timings"]
    times = variant_times(t, {"jaxcnn": "jaxcnn", "xla": "xla"})
    return (f"{r['case']:<24} N={r['n']:<3} {r['dtype']:<5} {times}  XLA/jaxcnn {fmt(r['speedup_vs_xla'], '.2f'):>5}  "
            f"% floor {fmt(r['pct_of_floor'].get('jaxcnn'), '.0f'):>3}  {status(r)}")


def parse_args(argv=None):
    return case_sweep_args(case_sweep_parser(__doc__, "bench_fusion", quick="tiny case"), argv,
                           FIRE_CASES, QUICK_CASES)


def main(argv=None) -> int:
    args = parse_args(argv)
    env = environment(lookup_gpu_spec())
    jobs = case_sweep_jobs(args, fire_row)
    return run_rows(jobs, progress_line, lambda rows: write_reports(args.out, env, rows, args.iters, args.label))


if __name__ == "__main__":
    sys.exit(main())
