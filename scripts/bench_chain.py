#!/usr/bin/env python3
"""Straight conv-chain benchmark: jaxcnn.conv3x3_conv1x1 / jaxcnn.conv1x1_depthwise against
XLA's unfused composition.

Cases: ResNet-50's bottleneck conv2 -> conv3 (3x3 then 1x1, ReLU then no activation: the
residual add follows) at 56x56, 28x28 and 14x14, a VGG-style 3x3 -> 1x1 with ReLU on both, and
MobileNetV2's expand -> depthwise pairs (ReLU6 on both, stride 1 and 2), at each batch (default
1 and 64) and dtype (default bf16). Each row: fresh random inputs; an accuracy check of the
jaxcnn op against XLA's composition on them (lax.conv_general_dilated with float32
accumulation, bias, activation, rounded to the dtype between the convs: what the fused kernels
compute); then, in one profiler trace, the device time (sum of GPU kernel durations,
jaxcnn/profile/device_time.py) of
  - jaxcnn:    the fused op (conv3x3_conv1x1 with algorithm="fused": its default "auto"
               currently runs XLA's convs for 3x3 -> 1x1, the fused kernel having measured
               0.2-0.8x of them on an H100),
  - xla:       that composition under jit,
  - xla_plain: what a plain JAX model runs (the zoo's xla_conv2d: conv output in the dtype,
               then bias and activation); up to ~3x faster than xla on an H100 (xla's convs
               write float32).
XLA/jaxcnn = the faster of the two XLA times / jaxcnn's (the speedup over the best XLA
baseline); the JSON also holds each variant's ratio.
Memory floor = (x + y + weight bytes) / 3.97e12 s (H200 HBM3e, as the issue's floors); compute
floor = FLOPs / the GPU spec's tensor-core peak for the dtype (jaxcnn/profile/gpu_specs.py;
none on an unknown GPU); "% floor" = the larger floor / time. "t saved" = 2 x the intermediate's
bytes: the write and the read the fusion avoids.

Writes bench_chain[_LABEL].json (environment + rows) and bench_chain[_LABEL].md into --out after
every row, and prints the markdown last. Exit status: 0 when every row passed its accuracy check
and timed, 2 when some row failed, 1 on a crash.

  python scripts/bench_chain.py --out /tmp/bench_chain --label h100
  python scripts/bench_chain.py --out /tmp/bench_chain --batches 64 --cases resnet50,mnv2_14
  JAX_PLATFORMS=cpu python scripts/bench_chain.py --quick --out /tmp/smoke
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_common import (DTYPES, FLOOR_BANDWIDTH, case_key, case_sweep_args, case_sweep_jobs,
                          case_sweep_parser, environment, fmt, he_weights, kernel_table, markdown_table,
                          normal_input, report_header, report_name, run_rows, small_bias, speedup_spread,
                          status, summary_report, timed, timed_rows_summary, us, variant_times, write_report)

import jax
import jax.numpy as jnp
import numpy as np

import jaxcnn
from jaxcnn.models.backends import xla_conv2d
from jaxcnn.ops.chain.config import conv1x1_depthwise_fused, conv3x3_conv1x1_fused
from jaxcnn.ops.chain.reference import chain_layer
from jaxcnn.profile.gpu_specs import lookup_gpu_spec, precision_class

# max |jaxcnn - xla| relative to max |xla|: both round t once, so a few ulps of the dtype
# (an intermediate rounded the other way, different fp32 summation orders).
TOLERANCE = {"bf16": 5e-2, "fp16": 1e-2, "fp32": 1e-4}
VARIANTS = ("jaxcnn", "xla", "xla_plain")


@dataclass(frozen=True)
class ChainCase:
    """3x3 -> 1x1 (op "3x3_1x1": x [n, hw, hw, c] -> m -> k) or 1x1 -> depthwise 3x3
    (op "1x1_dw": c -> m, then the depthwise over m at `stride`)."""

    name: str
    op: str
    hw: int
    c: int
    m: int
    k: int = 0
    stride: int = 1
    acts: tuple = ("relu", "relu")
    batch: int | None = None  # fixed batch (the quick cases), else every --batches


def _mnv2(hw, c, m, stride):
    return ChainCase(f"mnv2_{hw}_{c}_{m}_s{stride}", "1x1_dw", hw, c, m, stride=stride,
                     acts=("relu6", "relu6"))


CHAIN_CASES = (
    ChainCase("resnet50_56_64_64_256", "3x3_1x1", 56, 64, 64, 256, acts=("relu", None)),
    ChainCase("resnet50_28_128_128_512", "3x3_1x1", 28, 128, 128, 512, acts=("relu", None)),
    ChainCase("resnet50_14_256_256_1024", "3x3_1x1", 14, 256, 256, 1024, acts=("relu", None)),
    ChainCase("vgg_28_128_128_128", "3x3_1x1", 28, 128, 128, 128),
    *(_mnv2(*a) for a in ((112, 16, 96, 2), (56, 24, 144, 1), (56, 24, 144, 2), (28, 32, 192, 1),
                          (28, 32, 192, 2), (14, 64, 384, 1), (14, 96, 576, 1), (14, 96, 576, 2),
                          (7, 160, 960, 1))),
)
QUICK_CASES = (
    ChainCase("tiny_3x3_1x1", "3x3_1x1", 9, 16, 24, 32, acts=("relu", None), batch=2),
    ChainCase("tiny_1x1_dw_s2", "1x1_dw", 9, 16, 24, stride=2, acts=("relu6", "relu6"), batch=2),
)


def _out_hw(case: ChainCase) -> int:
    return (case.hw - 1) // case.stride + 1


def operands(case: ChainCase, n: int, dtype: str, seed: int):
    """(x, first weight, first bias, second weight, second bias) in the op's operand order."""
    k = jax.random.split(case_key(seed, f"{case.name}/{n}/{dtype}"), 5)
    dt = DTYPES[dtype]
    x = normal_input(k[0], (n, case.hw, case.hw, case.c), dt)
    if case.op == "3x3_1x1":
        return (x, he_weights(k[1], (3, 3, case.c, case.m), 9 * case.c, dt), small_bias(k[2], case.m, dt),
                he_weights(k[3], (1, 1, case.m, case.k), case.m, dt), small_bias(k[4], case.k, dt))
    return (x, he_weights(k[1], (1, 1, case.c, case.m), case.c, dt), small_bias(k[2], case.m, dt),
            he_weights(k[3], (3, 3, 1, case.m), 9, dt), small_bias(k[4], case.m, dt))


def _plain_conv(x, w, b, act, *, stride=1, padding=0, groups=1):
    """One layer as a plain JAX model runs it (the zoo's XLA backend)."""
    relu = act is not None
    y = xla_conv2d(x, w, b, stride=(stride, stride), padding=((padding, padding),) * 2,
                   groups=groups, activation="relu" if relu else None)
    return jnp.minimum(y, jnp.asarray(6, y.dtype)) if act == "relu6" else y


def compositions(case: ChainCase) -> dict[str, Any]:
    """The three timed functions of (x, w_a, b_a, w_b, b_b)."""
    a1, a2 = case.acts
    if case.op == "3x3_1x1":
        def chain(conv, x, w3, b3, w1, b1):
            return conv(conv(x, w3, b3, a1, padding=1), w1, b1, a2)

        def ours(x, w3, b3, w1, b1):
            # "fused": time the kernel ("auto", the default, currently runs XLA's convs here).
            return jaxcnn.conv3x3_conv1x1(x, w3, w1, b3, b1, activations=case.acts,
                                          algorithm="fused")
    else:
        def chain(conv, x, w1, b1, wd, bd):
            return conv(conv(x, w1, b1, a1), wd, bd, a2, stride=case.stride, padding=1,
                        groups=wd.shape[3])

        def ours(x, w1, b1, wd, bd):
            return jaxcnn.conv1x1_depthwise(x, w1, wd, b1, bd, stride=case.stride,
                                            activations=case.acts)
    return dict(jaxcnn=ours, xla=functools.partial(chain, chain_layer),
                xla_plain=functools.partial(chain, _plain_conv))


def _accuracy(ours, theirs, dtype: str) -> dict[str, Any]:
    a = np.asarray(ours.astype(jnp.float32), np.float64)
    b = np.asarray(theirs.astype(jnp.float32), np.float64)
    if a.shape != b.shape:
        return dict(ok=False, max_abs_diff=None, max_rel_diff=None, error=f"shape {a.shape} != {b.shape}")
    if not np.isfinite(a).all():
        return dict(ok=False, max_abs_diff=None, max_rel_diff=None,
                    error=f"{int((~np.isfinite(a)).sum())} non-finite outputs")
    abs_diff = float(np.max(np.abs(a - b))) if a.size else 0.0
    rel = abs_diff / max(float(np.max(np.abs(b))) if b.size else 0.0, 1e-30)
    ok = rel <= TOLERANCE[dtype]
    return dict(ok=ok, max_abs_diff=abs_diff, max_rel_diff=rel, tolerance=TOLERANCE[dtype],
                error=None if ok else f"max rel diff {rel:.2e} > {TOLERANCE[dtype]:.0e}")


def chain_row(case: ChainCase, n: int, dtype: str, *, spec, iters: int, warmup: int, seed: int):
    ops = operands(case, n, dtype, seed)
    itemsize = jnp.dtype(DTYPES[dtype]).itemsize
    hw2, pq = case.hw * case.hw, _out_hw(case) ** 2
    if case.op == "3x3_1x1":
        flops = 2 * n * hw2 * (9 * case.c * case.m + case.m * case.k)
        y_elems = n * hw2 * case.k
        fused = conv3x3_conv1x1_fused(ops[0].shape, case.m, case.k, DTYPES[dtype])
    else:
        flops = 2 * n * (hw2 * case.c * case.m + pq * 9 * case.m)
        y_elems = n * pq * case.m
        fused = conv1x1_depthwise_fused(ops[0].shape, case.m, case.stride, DTYPES[dtype])
    bytes_moved = sum(o.size for o in ops) * itemsize + y_elems * itemsize  # x + y + weights
    t_saved = 2 * n * hw2 * case.m * itemsize  # t written and read back by the unfused pair
    memory_floor_ms = bytes_moved / FLOOR_BANDWIDTH * 1e3
    peak = spec.compute.get(precision_class(DTYPES[dtype])) if spec is not None else None
    compute_floor_ms = flops / peak.per_s * 1e3 if peak is not None else None
    floor_ms = max(memory_floor_ms, compute_floor_ms or 0.0)

    fns = compositions(case)
    try:
        accuracy = _accuracy(jax.jit(fns["jaxcnn"])(*ops), jax.jit(fns["xla"])(*ops), dtype)
    except Exception as exc:  # record and go on: one broken config must not stop the suite
        accuracy = dict(ok=False, max_abs_diff=None, max_rel_diff=None, error=f"{type(exc).__name__}: {exc}")
    timings = timed([(k, fns[k], ops) for k in VARIANTS], iters, warmup)
    med = {k: t.get("median_ms") for k, t in timings.items()}
    ours = med.get("jaxcnn")
    xla_best = min((med[k] for k in VARIANTS[1:] if med.get(k)), default=None)
    return dict(
        case=case.name, op=case.op, n=n, dtype=dtype, hw=case.hw, c=case.c, m=case.m, k=case.k,
        stride=case.stride, acts=list(case.acts), fused=fused, bytes_moved=bytes_moved,
        t_bytes_saved=t_saved, gflop=flops / 1e9, memory_floor_ms=memory_floor_ms,
        compute_floor_ms=compute_floor_ms,
        compute_peak=None if peak is None else dict(per_s=peak.per_s, source=peak.source),
        floor_ms=floor_ms, accuracy=accuracy, timings=timings,
        pct_of_floor={k: (100.0 * floor_ms / v if v else None)
                      for k, v in {**med, "xla_best": xla_best}.items()},
        speedup_vs_xla=xla_best / ours if (ours and xla_best) else None,
        speedup_by_variant={k: (med[k] / ours if (ours and med.get(k)) else None) for k in VARIANTS[1:]},
        ok=accuracy["ok"] and not any("error" in t for t in timings.values()),
    )


def _spread(t: dict) -> str:
    """median [p10-p90] in us."""
    if "median_ms" not in t:
        return us(t)
    return f"{t['median_ms'] * 1e3:.1f} [{t['p10_ms'] * 1e3:.1f}-{t['p90_ms'] * 1e3:.1f}]"


def _channels(r: dict) -> str:
    if r["op"] == "3x3_1x1":
        return f"{r['c']}->{r['m']}->{r['k']}"
    return f"{r['c']}->{r['m']} dw/{r['stride']}"


def summary_table(rows: list[dict]) -> list[str]:
    return markdown_table([
        "case", "N", "dtype", "HxW", "channels", "acts", "fused", "MB", "t saved MB", "GFLOP",
        "mem floor us", "compute floor us", "jaxcnn us [p10-p90]", "XLA us [p10-p90]", "XLA plain us",
        "XLA/jaxcnn", "f32-acc XLA/jaxcnn", "kernels jaxcnn/XLA/plain", "jaxcnn % floor", "XLA % floor",
        "max abs diff", "max rel diff", "status"], rows, _summary_cells)


def _summary_cells(r: dict) -> list[str]:
    t = r["timings"]
    kernels = "/".join(fmt(t.get(v, {}).get("kernels_per_call"), ".0f") for v in VARIANTS)
    return [r["case"], str(r["n"]), r["dtype"], f"{r['hw']}x{r['hw']}", _channels(r),
            ",".join(str(a) for a in r["acts"]), "yes" if r["fused"] else "no",
            f"{r['bytes_moved'] / 2**20:.2f}", f"{r['t_bytes_saved'] / 2**20:.2f}",
            f"{r['gflop']:.2f}", f"{r['memory_floor_ms'] * 1e3:.1f}",
            fmt(r["compute_floor_ms"] and r["compute_floor_ms"] * 1e3, ".1f"),
            _spread(t.get("jaxcnn", {})), _spread(t.get("xla", {})), us(t.get("xla_plain", {})),
            fmt(r["speedup_vs_xla"], ".2f"), fmt(r["speedup_by_variant"]["xla"], ".2f"), kernels,
            fmt(r["pct_of_floor"].get("jaxcnn"), ".0f"), fmt(r["pct_of_floor"].get("xla_best"), ".0f"),
            fmt(r["accuracy"].get("max_abs_diff"), ".1e"),
            fmt(r["accuracy"].get("max_rel_diff"), ".1e"), status(r)]


@timed_rows_summary()
def speedup_summary(timed: list[dict]) -> list[str]:
    lines = []
    for op in sorted({r["op"] for r in timed}):
        for n in sorted({r["n"] for r in timed if r["op"] == op}):
            sel = [r for r in timed if r["op"] == op and r["n"] == n]
            floor = [r["pct_of_floor"]["jaxcnn"] for r in sel if r["pct_of_floor"].get("jaxcnn")]
            lines.append(f"- {op}, N={n}: {speedup_spread(r['speedup_vs_xla'] for r in sel)}; jaxcnn % floor "
                         f"median {fmt(float(np.median(floor)) if floor else None, '.0f')}")
    return lines


def render_markdown(env: dict, rows: list[dict], iters: int, label: str) -> str:
    unfused = ["rows with fused = no run XLA's unfused convs inside jaxcnn too."] if any(
        not r["fused"] for r in rows) else []
    spec = env.get("gpu_spec")
    header = [
        *report_header(f"# jaxcnn straight conv chains (3x3->1x1, 1x1->depthwise) vs XLA"
                       f"{f' ({label})' if label else ''}", env, rows, more_warnings=unfused),
        f"- times: per-call device time over {iters} synced calls (sum of GPU kernel durations in "
        "a profiler trace), us: median [p10-p90].",
        f"- MB = x + y + weights; mem floor = MB / {FLOOR_BANDWIDTH / 1e12:.2f} TB/s; compute floor "
        f"= GFLOP / {spec['name'] + ' tensor-core peak of the dtype' if spec else '(no GPU spec: none)'}; "
        "% floor = the larger floor / time. t saved = 2 x intermediate bytes (its write and read).",
        "- XLA: lax convs with float32 accumulation, bias, activation, rounded between the convs "
        "(the fused op's definition, the accuracy oracle); XLA plain: a plain JAX model's layers "
        "(conv in the dtype, then bias and activation). XLA/jaxcnn and XLA % floor use the faster "
        "of the two.",
        "- jaxcnn 3x3->1x1 rows time `conv3x3_conv1x1(..., algorithm=\"fused\")`: its default "
        "`algorithm=\"auto\"` currently picks XLA's unfused convs for every 3x3->1x1 shape "
        "(the fused kernel measured slower than cuDNN's convs on an H100).",
    ]
    return summary_report(header, speedup_summary(rows), summary_table(rows), kernel_table(rows, "case"))


def write_reports(out_dir: Path, env: dict, rows: list[dict], iters: int, label: str) -> str:
    return write_report(out_dir, report_name("bench_chain", label), dict(environment=env, label=label, rows=rows),
                        render_markdown(env, rows, iters, label))


def progress_line(r: dict) -> str:
    t = r["timings"]
    times = variant_times(t, {"jaxcnn": "jaxcnn", "xla": "xla", "plain": "xla_plain"})
    return (f"{r['case']:<26} N={r['n']:<3} {r['dtype']:<5} {times}  "
            f"XLA/jaxcnn {fmt(r['speedup_vs_xla'], '.2f'):>5}  "
            f"% floor {fmt(r['pct_of_floor'].get('jaxcnn'), '.0f'):>3}  "
            f"rel diff {fmt(r['accuracy'].get('max_rel_diff'), '.1e')}  {status(r)}")


def parse_args(argv=None):
    return case_sweep_args(case_sweep_parser(__doc__, "bench_chain", quick="tiny cases"), argv,
                           CHAIN_CASES, QUICK_CASES)


def main(argv=None) -> int:
    args = parse_args(argv)
    spec = lookup_gpu_spec()
    env = environment(spec)
    jobs = case_sweep_jobs(args, functools.partial(chain_row, spec=spec))
    return run_rows(jobs, progress_line, lambda rows: write_reports(args.out, env, rows, args.iters, args.label))


if __name__ == "__main__":
    sys.exit(main())
