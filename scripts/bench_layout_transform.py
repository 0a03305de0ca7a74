#!/usr/bin/env python3
"""Layout-transform benchmark: jaxcnn.to_layout against XLA's transpose and a plain copy.

For every activation shape x batch x dtype: one profiler trace (jaxcnn/profile/device_time.py)
times, per-call device time, the copy references of the tensor's bytes (jnp.copy and an
elementwise negation: the better is the measured copy bandwidth) and, for each of the 6
directions between NHWC, NCHW and CHWN, jaxcnn.to_layout and XLA's jnp.transpose of the
same input. Every jaxcnn result is checked bit-equal to jnp.transpose on the device.
% of copy = copy time / jaxcnn time (100 = as fast as a copy of the same bytes).
Writes bench_layout_transform.json (environment + rows) and .md into --out after every group.

Exit status: 0 when every row is exact and timed, 2 when some row failed, 1 on a crash.

  python scripts/bench_layout_transform.py --out /tmp/bench_lt
  python scripts/bench_layout_transform.py --out /tmp/bench_lt --shapes vgg_c1_1 --batches 64 --dtypes bf16
  JAX_PLATFORMS=cpu python scripts/bench_layout_transform.py --quick --out /tmp/smoke
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench_common import (DTYPES, add_timing_options, case_key, csv_of, final_status, fmt, int_list,
                          normal_input, table_head, table_row, timing_defaults, write_report)

import jax
import jax.numpy as jnp

import jaxcnn
from jaxcnn.ops import layout_axes
from jaxcnn.profile import device_times
from jaxcnn.profile.environment import collect_environment
from jaxcnn.profile.gpu_specs import lookup_gpu_spec

DIRECTIONS = [f"{s}->{d}" for s, d in itertools.permutations(layout_axes.LAYOUTS, 2)]
REPORT = "bench_layout_transform"  # bench_layout_transform.json / .md
TARGET_PCT_OF_COPY = 80.0


@dataclass(frozen=True)
class Activation:
    """One activation tensor, logical [N, C, H, W] with N given per run."""

    name: str
    c: int
    h: int
    w: int


# Inputs and outputs of VGG-16, ResNet-50 and SqueezeNet 1.1 layers (224x224 ImageNet).
SUITE = (
    Activation("image_3x224", 3, 224, 224),  # every model's input (C=3: skinny transposes)
    Activation("vgg_c1_1", 64, 224, 224),
    Activation("vgg_c3_1", 256, 56, 56),  # also ResNet-50 stage-1 output
    Activation("vgg_c4_1", 512, 28, 28),  # also ResNet-50 stage-2 output
    Activation("vgg_c5_1", 512, 14, 14),
    Activation("resnet_stem", 64, 112, 112),
    Activation("resnet_s3_out", 1024, 14, 14),
    Activation("resnet_s4_out", 2048, 7, 7),  # H*W = 49: no 16-byte vectors along S
    Activation("sq_fire2_squeeze", 16, 55, 55),  # H*W = 3025 (odd)
    Activation("sq_fire2_expand", 128, 55, 55),
    Activation("sq_fire9_expand", 512, 13, 13),
)
QUICK = (Activation("tiny_odd", 3, 5, 7), Activation("tiny_even", 16, 8, 8))
BY_NAME = {a.name: a for a in SUITE + QUICK}


def make_logical(act: Activation, n: int, dtype: str, seed: int) -> jax.Array:
    return normal_input(case_key(seed, f"{act.name}/{n}/{dtype}"), (n, act.c, act.h, act.w), DTYPES[dtype])


def transform_fns(src: str, dst: str) -> dict[str, Callable]:
    perm = layout_axes.permutation(src, dst)
    return {
        "jaxcnn": lambda x: jaxcnn.to_layout(x, src, dst),
        "xla": lambda x: jnp.transpose(x, perm),
    }


COPY_FNS: dict[str, Callable] = {"copy": jnp.copy, "negate": jnp.negative}


@jax.jit
def _bit_equal(a, b):
    return jnp.array_equal(
        jax.lax.bitcast_convert_type(a, jnp.uint16 if a.dtype.itemsize == 2 else jnp.uint32),
        jax.lax.bitcast_convert_type(b, jnp.uint16 if b.dtype.itemsize == 2 else jnp.uint32),
    )


def _median(timing) -> float | None:
    return timing.median_ms if timing is not None else None


def bench_group(act: Activation, n: int, dtype: str, *, directions, iters, warmup, seed) -> list[dict]:
    """All directions of one tensor, timed in one trace."""
    logical = make_logical(act, n, dtype, seed)
    inputs = {lay: jax.block_until_ready(jnp.einsum("nchw->" + lay.lower(), logical)) for lay in layout_axes.LAYOUTS}
    del logical
    nbytes = inputs["NHWC"].size * inputs["NHWC"].dtype.itemsize
    cases: list[tuple[Any, Callable, tuple]] = [(("copy", k), f, (inputs["NHWC"],)) for k, f in COPY_FNS.items()]
    exact: dict[str, bool | str] = {}
    for direction in directions:
        src, dst = direction.split("->")
        fns = transform_fns(src, dst)
        try:
            got = jax.jit(fns["jaxcnn"])(inputs[src])
            exact[direction] = bool(_bit_equal(got, jax.jit(fns["xla"])(inputs[src])))
            del got
        except Exception as exc:  # record and go on: one broken direction must not stop the run
            exact[direction] = f"{type(exc).__name__}: {exc}"
            continue
        cases += [((direction, variant), fn, (inputs[src],)) for variant, fn in fns.items()]
    timings = device_times(cases, iters=iters, warmup=warmup)
    copy_ms = {k: _median(timings.get(("copy", k))) for k in COPY_FNS}
    known = [v for v in copy_ms.values() if v]
    best_copy = min(known) if known else None
    rows = []
    for direction in directions:
        ours, xla = timings.get((direction, "jaxcnn")), timings.get((direction, "xla"))
        ok_exact = exact[direction] is True
        row = dict(
            activation=act.name,
            n=n,
            dtype=dtype,
            direction=direction,
            logical_shape=[n, act.c, act.h, act.w],
            bytes=nbytes,
            exact=exact[direction] if isinstance(exact[direction], bool) else False,
            error=None if isinstance(exact[direction], bool) else exact[direction],
            jaxcnn=None if ours is None else ours.to_dict(),
            xla=None if xla is None else xla.to_dict(),
            copy_ms=copy_ms,
            best_copy_ms=best_copy,
        )
        row.update(derived(row))
        row["ok"] = ok_exact and ours is not None
        rows.append(row)
    return rows


def derived(row: dict) -> dict:
    ours = (row["jaxcnn"] or {}).get("median_ms")
    xla = (row["xla"] or {}).get("median_ms")
    copy = row["best_copy_ms"]
    moved = 2 * row["bytes"]  # read once, written once
    return dict(
        jaxcnn_gbps=moved / (ours * 1e-3) / 1e9 if ours else None,
        copy_gbps=moved / (copy * 1e-3) / 1e9 if copy else None,
        pct_of_copy=100.0 * copy / ours if ours and copy else None,
        xla_pct_of_copy=100.0 * copy / xla if xla and copy else None,
        xla_over_jaxcnn=xla / ours if ours and xla else None,
    )


# ---------------------------------------------------------------- reports


def _ms(timing: dict | None) -> str:
    return "-" if not timing else f"{timing['median_ms']:.4f}"


def summary_lines(rows: list[dict]) -> list[str]:
    pcts = [r["pct_of_copy"] for r in rows if r["pct_of_copy"] is not None]
    ratios = [r["xla_over_jaxcnn"] for r in rows if r["xla_over_jaxcnn"] is not None]
    if not pcts:
        return ["- no timed rows"]
    below = [f"{r['activation']}/N={r['n']}/{r['dtype']}/{r['direction']} ({r['pct_of_copy']:.0f}%)"
             for r in rows if r["pct_of_copy"] is not None and r["pct_of_copy"] < TARGET_PCT_OF_COPY]
    return [
        f"- % of copy bandwidth: median {statistics.median(pcts):.0f}%, min {min(pcts):.0f}%, "
        f"{len(pcts) - len(below)}/{len(pcts)} rows >= {TARGET_PCT_OF_COPY:.0f}%",
        f"- XLA transpose / jaxcnn time: median {statistics.median(ratios):.2f}, "
        f"min {min(ratios):.2f}, max {max(ratios):.2f}" if ratios else "- no XLA ratios",
        f"- below {TARGET_PCT_OF_COPY:.0f}%: " + ("; ".join(below[:40]) or "none"),
    ]


def table_lines(rows: list[dict]) -> list[str]:
    lines = table_head(["activation", "N", "dtype", "direction", "MiB", "jaxcnn ms", "XLA ms", "copy ms",
                        "jaxcnn GB/s", "% copy", "XLA % copy", "XLA/jaxcnn", "jaxcnn kernel", "status"])
    for r in rows:
        kernels = (r["jaxcnn"] or {}).get("kernels") or []
        kernel = kernels[0]["name"][:90] if kernels else "-"
        status = "ok" if r["ok"] else ("FAIL: " + (r["error"] or ("not exact" if not r["exact"] else "not timed")))[:100]
        cells = [
            r["activation"], str(r["n"]), r["dtype"], r["direction"], f"{r['bytes'] / 2**20:.1f}",
            _ms(r["jaxcnn"]), _ms(r["xla"]), fmt(r["best_copy_ms"], ".4f"), fmt(r["jaxcnn_gbps"], ".0f"),
            fmt(r["pct_of_copy"], ".0f"), fmt(r["xla_pct_of_copy"], ".0f"), fmt(r["xla_over_jaxcnn"], ".2f"),
            f"`{kernel}`", status,
        ]
        lines.append(table_row(cells))
    return lines


def render_markdown(env: dict, rows: list[dict], iters: int) -> str:
    extra = env["extra"]
    git = extra["git"] or {}
    warn = []
    if not extra["jaxcnn_cuda_available"]:
        warn.append(f"> **WARNING: jaxcnn CUDA kernels are NOT available ({extra['jaxcnn_cuda_unavailable_reason']}): "
                    "the jaxcnn column is its XLA fallback.**")
    if any((r["jaxcnn"] or {}).get("is_device_time") is False for r in rows):
        warn.append("> **WARNING: some rows have no GPU trace: their times are host wall time.**")
    header = [
        "# jaxcnn.to_layout vs XLA transpose vs copy",
        "",
        *warn,
        "",
        f"- device: {extra['device_kind']} ({extra['nvidia_smi'] or 'no nvidia-smi'}); jax {env['jax_version']}, "
        f"jaxlib {env['jaxlib_version']}; commit {git.get('commit', 'unknown')}{' (dirty)' if git.get('dirty') else ''}; "
        f"{extra['date_utc']}",
        f"- times: median per-call device time over {iters} synced calls (profiler kernel sums), ms. "
        "copy = the faster of jnp.copy and jnp.negative of the same tensor (read + write of the same bytes), "
        "timed in the same trace. % copy = copy / time; XLA/jaxcnn > 1: jaxcnn is faster.",
        "",
        "## Summary",
        "",
        *summary_lines(rows),
        "",
        "## Rows",
        "",
    ]
    return "\n".join(header + table_lines(rows)) + "\n"


def write_reports(out: Path, env: dict, rows: list[dict], iters: int) -> str:
    spec = lookup_gpu_spec()
    report = dict(environment=env, gpu_memory_ceiling_bytes_per_s=None if spec is None else spec.memory.per_s,
                  target_pct_of_copy=TARGET_PCT_OF_COPY, rows=rows)
    return write_report(out, REPORT, report, render_markdown(env, rows, iters))


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the .json and .md reports")
    parser.add_argument("--shapes", type=csv_of(BY_NAME, "shape"), help="activation names (default: the suite)")
    parser.add_argument("--batches", type=int_list, help="default 1,64 (--quick: 2)")
    parser.add_argument("--dtypes", type=csv_of(DTYPES, "dtype"), default=["bf16", "fp32"])
    parser.add_argument("--directions", type=csv_of(DIRECTIONS, "direction"), default=DIRECTIONS)
    add_timing_options(parser, "case")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, few iterations: a smoke test")
    args = parser.parse_args(argv)
    args.shapes = [BY_NAME[s] for s in args.shapes] if args.shapes else list(QUICK if args.quick else SUITE)
    args.batches = args.batches or ([2] if args.quick else [1, 64])
    timing_defaults(args, args.quick)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = collect_environment()
    env["argv"] = sys.argv[1:]
    rows: list[dict] = []
    markdown = write_reports(args.out, env, rows, args.iters)  # fail early on a bad --out
    for act in args.shapes:
        for n in args.batches:
            for dtype in args.dtypes:
                group = bench_group(act, n, dtype, directions=args.directions, iters=args.iters,
                                    warmup=args.warmup, seed=args.seed)
                rows += group
                for r in group:
                    print(f"{r['activation']:<18} N={r['n']:<3} {r['dtype']:<5} {r['direction']:<11} "
                          f"jaxcnn {_ms(r['jaxcnn']):>9} xla {_ms(r['xla']):>9} copy {fmt(r['best_copy_ms'], '.4f'):>9} "
                          f"%copy {fmt(r['pct_of_copy'], '.0f'):>4} xla/jaxcnn {fmt(r['xla_over_jaxcnn'], '.2f'):>5} "
                          f"{'ok' if r['ok'] else 'FAIL'}", flush=True)
                markdown = write_reports(args.out, env, rows, args.iters)
    return final_status(markdown, rows)


if __name__ == "__main__":
    sys.exit(main())
