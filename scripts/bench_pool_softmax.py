#!/usr/bin/env python3
"""Pooling and softmax benchmark: jaxcnn's kernels against XLA's own ops and a copy.

For every case x dtype (x layout for pooling): fresh random inputs; an accuracy check of
jaxcnn against XLA on them; then, in one profiler trace, the device time (sum of GPU kernel
durations, jaxcnn/profile/device_time.py) of
  - jaxcnn:  jaxcnn.max_pool2d / avg_pool2d / softmax / log_softmax,
  - xla:     XLA's version of the same op in the same layout (lax.reduce_window;
             jax.nn.softmax / log_softmax on the input dtype),
  - copy:    a jitted elementwise `-a` over a buffer of (in + out) / 2 bytes, i.e. the same
             bytes read + written as the op's minimum traffic, on the same GPU.
Bandwidth = (bytes in + bytes out) / time; "% copy" = copy time / op time. Goals from the
issue: jaxcnn >= 80% of copy and >= 1.3x XLA.

Writes bench_pool_softmax.json (environment + rows) and bench_pool_softmax.md into --out
after every row, and prints the markdown last. Exit status: 0 when every row passed its
accuracy check and timed, 2 when some row failed, 1 on a crash.

  python scripts/bench_pool_softmax.py --out /tmp/bench_ps                # full suite
  python scripts/bench_pool_softmax.py --out /tmp/bench_ps --ops softmax --dtypes bf16
  JAX_PLATFORMS=cpu python scripts/bench_pool_softmax.py --quick --out /tmp/smoke
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench_common import (DTYPES, SquareCase, add_timing_options, case_key, csv_of, environment,
                          failed_accuracy, fmt, has_speedup, int_list, normal_input, relative_accuracy,
                          report_header, run_rows, status, summary_report, table_head, table_row, timed,
                          timed_rows_summary, timing_defaults, top_kernels, us, variant_times, write_report)

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxcnn
from jaxcnn.ops.pool2d.config import make_pool_config, pool2d_output_shape
from jaxcnn.profile.gpu_specs import lookup_gpu_spec

LAYOUTS = ("NHWC", "NCHW", "CHWN")
REPORT = "bench_pool_softmax"  # bench_pool_softmax.json / .md
GOAL_PCT_COPY = 80.0
GOAL_SPEEDUP = 1.3
# avg pooling / softmax: allowed max |jaxcnn - xla| relative to max |xla| (a few roundings of
# the dtype; XLA's bf16 softmax itself computes in bf16).
TOLERANCE = {"bf16": 2e-2, "fp16": 4e-3, "fp32": 1e-5}


@dataclass(frozen=True)
class PoolCase(SquareCase):
    """A pooling layer, NHWC-logical input [n, hw, hw, c]."""

    mode: str  # "max" | "avg"
    window: int
    stride: int
    padding: Any = "VALID"

    def x_shape(self, n: int, layout: str) -> tuple[int, ...]:
        dims = dict(zip("NHWC", self.x_nhwc(n)))
        return tuple(dims[d] for d in layout)


@dataclass(frozen=True)
class SoftmaxCase:
    name: str
    rows: int
    cols: int
    log: bool = False


# The pool layers of the zoo's CNNs (torchvision's ceil_mode pools as SAME here).
POOL_CASES = (
    PoolCase("vgg_pool1", 224, 64, "max", 2, 2),
    PoolCase("vgg_pool2", 112, 128, "max", 2, 2),
    PoolCase("vgg_pool5", 14, 512, "max", 2, 2),
    PoolCase("alexnet_pool1", 55, 96, "max", 3, 2),
    PoolCase("alexnet_pool2", 27, 256, "max", 3, 2),
    PoolCase("googlenet_pool1", 112, 64, "max", 3, 2, "SAME"),
    PoolCase("googlenet_inc3_pool", 28, 192, "max", 3, 1, 1),
    PoolCase("googlenet_pool4", 14, 480, "max", 3, 2, "SAME"),
    PoolCase("googlenet_avgpool", 7, 1024, "avg", 7, 1),
    PoolCase("squeezenet_pool1", 111, 64, "max", 3, 2),
    PoolCase("squeezenet_pool3", 27, 256, "max", 3, 2),
    PoolCase("resnet_pool1", 112, 64, "max", 3, 2, 1),
    PoolCase("resnet_avgpool", 7, 2048, "avg", 7, 1),
    PoolCase("avg3x3s1_pad", 28, 256, "avg", 3, 1, 1),
)
SOFTMAX_CASES = (
    SoftmaxCase("cls1000_n1", 1, 1000),
    SoftmaxCase("cls1000_n64", 64, 1000),
    SoftmaxCase("cls1000_n256", 256, 1000),
    SoftmaxCase("cls1000_n256_log", 256, 1000, log=True),
    SoftmaxCase("attn_16k_x_1024", 16384, 1024),
    SoftmaxCase("rows4096_x_4096", 4096, 4096),
    SoftmaxCase("rows4096_x_32768", 4096, 32768),
    SoftmaxCase("rows4096_x_32768_log", 4096, 32768, log=True),
    SoftmaxCase("rows256_x_131072", 256, 131072),  # past the registers: online two-pass
    SoftmaxCase("odd_8191_x_1001", 8191, 1001),
)
QUICK_POOL = (PoolCase("tiny_max", 9, 8, "max", 3, 2), PoolCase("tiny_avg", 8, 4, "avg", 2, 2, 1))
QUICK_SOFTMAX = (SoftmaxCase("tiny", 4, 33), SoftmaxCase("tiny_log", 3, 1000, log=True))


# ---------------------------------------------------------------- the ops being compared


def xla_pool(x, *, case: PoolCase, layout: str):
    cfg = make_pool_config(x.shape, x.dtype, mode=case.mode, window=case.window,
                           stride=case.stride, padding=case.padding, layout=layout)
    h, w = cfg.spatial_axes
    dims, strides, pads = [1] * 4, [1] * 4, [(0, 0)] * 4
    dims[h], dims[w] = cfg.window
    strides[h], strides[w] = cfg.stride
    pads[h], pads[w] = cfg.padding
    if case.mode == "max":
        return lax.reduce_window(x, -jnp.inf, lax.max, dims, strides, pads)
    # flax.linen.avg_pool: sum in the input dtype, divide by the full window.
    return lax.reduce_window(x, 0.0, lax.add, dims, strides, pads) / (case.window**2)


def jaxcnn_pool(x, *, case: PoolCase, layout: str):
    fn = jaxcnn.max_pool2d if case.mode == "max" else jaxcnn.avg_pool2d
    return fn(x, case.window, case.stride, padding=case.padding, layout=layout)


def copy_op(a):
    return -a


def random_input(shape, dtype: str, key_text: str, seed: int):
    return normal_input(case_key(seed, key_text), shape, DTYPES[dtype])


# ---------------------------------------------------------------- one row


def _accuracy(ours, theirs, exact: bool, dtype: str) -> dict[str, Any]:
    """Max pooling is exact in every dtype; avg pooling and softmax within TOLERANCE."""
    return relative_accuracy(ours, theirs, 0.0 if exact else TOLERANCE[dtype])


def _timed(fns: dict[str, tuple[Callable, tuple]], iters: int, warmup: int) -> dict[str, dict]:
    return timed([(k, f, a) for k, (f, a) in fns.items()], iters, warmup)


def _row(op: str, name: str, layout: str | None, dtype: str, shape, out_shape, bytes_moved,
         accuracy, timings) -> dict[str, Any]:
    med = {k: t.get("median_ms") for k, t in timings.items()}
    ours, xla, copy = med.get("jaxcnn"), med.get("xla"), med.get("copy")
    gbps = {k: (bytes_moved / (v * 1e-3) / 1e9 if v else None) for k, v in med.items()}
    pct = {k: (100.0 * copy / v if (copy and v) else None) for k, v in med.items() if k != "copy"}
    speedup = xla / ours if (ours and xla) else None
    ok = accuracy["ok"] and not any("error" in t for t in timings.values())
    return dict(
        op=op, case=name, layout=layout, dtype=dtype, shape=list(shape), out_shape=list(out_shape),
        bytes_moved=bytes_moved, accuracy=accuracy, timings=timings, gbps=gbps,
        pct_of_copy=pct, speedup_vs_xla=speedup,
        meets_goal=(pct.get("jaxcnn") or 0) >= GOAL_PCT_COPY and (speedup or 0) >= GOAL_SPEEDUP,
        ok=ok,
    )


def copy_input(bytes_moved: int, dtype: str):
    """A buffer whose read + write moves bytes_moved bytes."""
    itemsize = jnp.dtype(DTYPES[dtype]).itemsize
    return jnp.zeros((max(1, bytes_moved // (2 * itemsize)),), DTYPES[dtype])


def pool_row(case: PoolCase, n: int, layout: str, dtype: str, *, iters, warmup, seed):
    shape = case.x_shape(n, layout)
    x = random_input(shape, dtype, f"{case.name}/{n}/{layout}/{dtype}", seed)
    cfg = make_pool_config(shape, x.dtype, mode=case.mode, window=case.window, stride=case.stride,
                           padding=case.padding, layout=layout)
    out_shape = pool2d_output_shape(shape, x.dtype, cfg)
    itemsize = jnp.dtype(DTYPES[dtype]).itemsize
    bytes_moved = (math.prod(shape) + math.prod(out_shape)) * itemsize
    ours = functools.partial(jaxcnn_pool, case=case, layout=layout)
    theirs = functools.partial(xla_pool, case=case, layout=layout)
    try:
        accuracy = _accuracy(jax.jit(ours)(x), jax.jit(theirs)(x), case.mode == "max", dtype)
    except Exception as exc:
        accuracy = failed_accuracy(exc)
    timings = _timed(dict(jaxcnn=(ours, (x,)), xla=(theirs, (x,)),
                          copy=(copy_op, (copy_input(bytes_moved, dtype),))), iters, warmup)
    name = f"{case.name}_n{n}"
    return _row(f"{case.mode}_pool2d", name, layout, dtype, shape, out_shape, bytes_moved,
                accuracy, timings)


def softmax_row(case: SoftmaxCase, dtype: str, *, iters, warmup, seed):
    shape = (case.rows, case.cols)
    x = random_input(shape, dtype, f"{case.name}/{dtype}", seed) * 3
    itemsize = jnp.dtype(DTYPES[dtype]).itemsize
    bytes_moved = 2 * math.prod(shape) * itemsize
    ours = jaxcnn.log_softmax if case.log else jaxcnn.softmax
    theirs = jax.nn.log_softmax if case.log else jax.nn.softmax
    try:
        want = jax.jit(lambda x: theirs(x.astype(jnp.float32)))(x)  # fp32 oracle on the device
        accuracy = _accuracy(jax.jit(ours)(x), want, False, dtype)
    except Exception as exc:
        accuracy = failed_accuracy(exc)
    timings = _timed(dict(jaxcnn=(ours, (x,)), xla=(theirs, (x,)),
                          copy=(copy_op, (copy_input(bytes_moved, dtype),))), iters, warmup)
    op = "log_softmax" if case.log else "softmax"
    return _row(op, case.name, None, dtype, shape, shape, bytes_moved, accuracy, timings)


# ---------------------------------------------------------------- reports


def summary_table(rows: list[dict]) -> list[str]:
    lines = table_head(["op", "case", "layout", "dtype", "shape -> out", "MB", "jaxcnn us", "XLA us", "copy us",
                        "jaxcnn GB/s", "copy GB/s", "jaxcnn % copy", "XLA % copy", "XLA/jaxcnn", "goal",
                        "max rel diff", "status"])
    for r in rows:
        t = r["timings"]
        shape = "x".join(map(str, r["shape"]))
        out = "x".join(map(str, r["out_shape"]))
        cells = [
            r["op"], r["case"], r["layout"] or "-", r["dtype"], f"{shape} -> {out}",
            f"{r['bytes_moved'] / 2**20:.1f}", us(t.get("jaxcnn", {})), us(t.get("xla", {})),
            us(t.get("copy", {})), fmt(r["gbps"].get("jaxcnn"), ".0f"),
            fmt(r["gbps"].get("copy"), ".0f"), fmt(r["pct_of_copy"].get("jaxcnn"), ".0f"),
            fmt(r["pct_of_copy"].get("xla"), ".0f"), fmt(r["speedup_vs_xla"], ".2f"),
            "yes" if r["meets_goal"] else "no", fmt(r["accuracy"].get("max_rel_diff"), ".1e"),
            status(r),
        ]
        lines.append(table_row(cells))
    return lines


def kernel_table(rows: list[dict]) -> list[str]:
    lines = ["| op | case | layout | dtype | variant | kernels per call | top kernels (us per call) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        for variant, t in r["timings"].items():
            lines.append(table_row([r["op"], r["case"], r["layout"] or "-", r["dtype"], variant,
                                    fmt(t.get("kernels_per_call"), ".1f"), top_kernels(t, 3)]))
    return lines


@timed_rows_summary(lambda r: has_speedup(r) and r["pct_of_copy"].get("jaxcnn"))
def goal_summary(timed: list[dict]) -> list[str]:
    lines = []
    for op in sorted({r["op"] for r in timed}):
        sel = [r for r in timed if r["op"] == op]
        pct = np.array([r["pct_of_copy"]["jaxcnn"] for r in sel])
        spd = np.array([r["speedup_vs_xla"] for r in sel])
        lines.append(
            f"- {op}: {len(sel)} rows; jaxcnn % copy median {np.median(pct):.0f} (min {pct.min():.0f}); "
            f"XLA/jaxcnn median {np.median(spd):.2f} (min {spd.min():.2f}); "
            f"both goals met in {sum(r['meets_goal'] for r in sel)} rows"
        )
    return lines


def render_markdown(env: dict, rows: list[dict], iters: int) -> str:
    header = [
        *report_header("# jaxcnn pooling and softmax vs XLA", env, rows),
        f"- times: median per-call device time over {iters} synced calls (sum of GPU kernel "
        "durations in a profiler trace), us. MB = bytes in + bytes out.",
        "- copy: jitted `-a` over (in + out) / 2 bytes (same bytes read + written) on the same GPU; "
        "% copy = copy time / op time. XLA: lax.reduce_window (flax-style pools) / jax.nn.softmax "
        "in the input dtype, same layout.",
        f"- goal: jaxcnn >= {GOAL_PCT_COPY:.0f}% of copy and XLA/jaxcnn >= {GOAL_SPEEDUP}.",
    ]
    return summary_report(header, goal_summary(rows), summary_table(rows), kernel_table(rows))


def write_reports(out_dir: Path, env: dict, rows: list[dict], iters: int) -> str:
    return write_report(out_dir, REPORT, dict(environment=env, rows=rows), render_markdown(env, rows, iters))


def progress_line(r: dict) -> str:
    t = r["timings"]
    return (f"{r['op']:<12} {r['case']:<26} {r['layout'] or '-':<5} {r['dtype']:<5} "
            f"{variant_times(t, {'jaxcnn': 'jaxcnn', 'xla': 'xla', 'copy': 'copy'}, width=9)}  %copy {fmt(r['pct_of_copy'].get('jaxcnn'), '.0f'):>4}  "
            f"xla/jaxcnn {fmt(r['speedup_vs_xla'], '.2f'):>5}  {status(r)}")


# ---------------------------------------------------------------- command line


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help=f"directory for {REPORT}.json / {REPORT}.md")
    p.add_argument("--ops", type=csv_of(("pool", "softmax"), "op"), default=["pool", "softmax"])
    p.add_argument("--dtypes", type=csv_of(DTYPES, "dtype"), default=["bf16", "fp32"])
    p.add_argument("--layouts", type=csv_of(LAYOUTS, "layout"), default=list(LAYOUTS))
    p.add_argument("--batches", type=int_list, default=[1, 64],
                   help="pooling batch sizes (default 1,64)")
    all_names = [c.name for c in POOL_CASES + SOFTMAX_CASES + QUICK_POOL + QUICK_SOFTMAX]
    p.add_argument("--cases", type=csv_of(all_names, "case"), help="case names (default: all)")
    add_timing_options(p, "measurement")
    p.add_argument("--quick", action="store_true", help="tiny cases, few iterations: a smoke test")
    args = p.parse_args(argv)
    pools, softmaxes = (QUICK_POOL, QUICK_SOFTMAX) if args.quick else (POOL_CASES, SOFTMAX_CASES)
    if args.cases:
        pools = [c for c in POOL_CASES + QUICK_POOL if c.name in args.cases]
        softmaxes = [c for c in SOFTMAX_CASES + QUICK_SOFTMAX if c.name in args.cases]
    args.pool_cases = pools if "pool" in args.ops else []
    args.softmax_cases = softmaxes if "softmax" in args.ops else []
    if args.quick:
        args.batches = [2]
    timing_defaults(args, args.quick)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    env = environment(lookup_gpu_spec())
    common = dict(iters=args.iters, warmup=args.warmup, seed=args.seed)
    jobs = [functools.partial(softmax_row, case, dtype, **common)
            for case in args.softmax_cases for dtype in args.dtypes]
    jobs += [functools.partial(pool_row, case, n, layout, dtype, **common)
             for case in args.pool_cases for n in args.batches
             for dtype in args.dtypes for layout in args.layouts]
    return run_rows(jobs, progress_line, lambda rows: write_reports(args.out, env, rows, args.iters))


if __name__ == "__main__":
    sys.exit(main())
