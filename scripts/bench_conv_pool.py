#!/usr/bin/env python3
"""Fused conv + bias + ReLU + max-pool benchmark: jaxcnn.conv2d_pool against XLA and against
jaxcnn's own unfused layers.

For every pooled layer (the conv right before each pool) of VGG-19 (3x3 convs, 2x2/2 pools) and
AlexNet (torchvision channels, overlapping 3x3/2 pools) at each batch (default 1 and 64) and
dtype (default bf16 and fp32): fresh random inputs; an accuracy check of jaxcnn.conv2d_pool
against XLA on them; then, in one profiler trace, the device time (sum of GPU kernel durations,
jaxcnn/profile/device_time.py) of
  - jaxcnn:   jaxcnn.conv2d_pool (one fused kernel; the pre-pool activation stays on chip; fp32
              at precision "default" = TF32 tensor cores),
  - xla:      lax.conv_general_dilated + bias + ReLU + lax.reduce_window under jit (as a JAX
              user writes the layer; fp32 at XLA's DEFAULT precision, i.e. TF32),
  - jaxcnn_highest / xla_highest (fp32 only): both at precision "highest" (fp32-accurate: our
              CUDA-core FMA kernel, XLA's fp32 conv),
  - unfused:  jaxcnn.conv2d(activation="relu") then jaxcnn.max_pool2d (two of our kernels).
Floor = max(bytes / 3.97e12 B/s, FLOPs / peak) with bytes = x + w + pooled y (the pre-pool tensor
is never stored) and peak the GPU's tensor-core rate for bf16/fp16 and its TF32 rate for fp32
(jaxcnn.profile.gpu_specs). Times are median per-call device times with their p10-p90
spread; XLA/jaxcnn = the speedup. Issue 8 goals (bf16): >= 1.5x XLA on VGG c1_2 at N=64, >= 1.3x
across VGG-19's pooled layers.

Writes <gpu>-<date>-conv_pool[_LABEL].json (environment + rows) and .md into --out after every
row, and prints the markdown last. Exit status: 0 when every row passed its accuracy check and
timed, 2 when some row failed, 1 on a crash.

  python scripts/bench_conv_pool.py --out /tmp/bench_conv_pool
  python scripts/bench_conv_pool.py --out /tmp/bench_conv_pool --quick          # ~2 min on an H200
  python scripts/bench_conv_pool.py --out /tmp/b --layers vgg19/c1_2 --batches 64 --dtypes bf16
  JAX_PLATFORMS=cpu python scripts/bench_conv_pool.py --smoke --out /tmp/smoke   # tiny, any machine
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from bench_common import (DTYPES, FLOOR_BANDWIDTH, SquareCase, add_timing_options, case_key, check_dtypes,
                          environment, failed_accuracy, fmt, he_weights, headline_line, int_list,
                          kernel_table, markdown_table, normal_input, relative_accuracy, report_header,
                          run_rows, small_bias, speedup_spread, status, summary_report, str_list, timed,
                          timed_rows_summary, timing_defaults, us, variant_times, write_report)
from gpu_check_report import gpu_slug

import jax
import jax.numpy as jnp
import numpy as np

import jaxcnn
from jaxcnn._native import queries
from jaxcnn._native.plans import plan_text
from jaxcnn.ops.conv2d_pool.config import make_conv_pool_config
from jaxcnn.ops.conv2d_pool.reference import xla_conv_pool
from jaxcnn.profile.gpu_specs import lookup_gpu_spec

# Peak class of gpu_specs per dtype: tensor cores (fp32 at precision "default" runs TF32).
PEAK_CLASS = {"bf16": "bf16", "fp16": "fp16", "fp32": "tf32"}
GOAL_HEADLINE, GOAL_VGG = 1.5, 1.3
# max |jaxcnn - xla| / max |xla|: XLA rounds the conv output to the dtype before the bias (two
# roundings for half types, one here); fp32 XLA DEFAULT is TF32.
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3, "fp32": 5e-3}


@dataclass(frozen=True)
class Layer(SquareCase):
    """A conv (HWIO [r, r, c, k], stride, symmetric padding) on [n, hw, hw, c], then max pool."""

    k: int
    r: int = 3
    stride: int = 1
    padding: int = 1
    pool: int = 2
    pool_stride: int = 2


LAYERS = (
    Layer("vgg19/c1_2", 224, 64, 64), Layer("vgg19/c2_2", 112, 128, 128),
    Layer("vgg19/c3_4", 56, 256, 256), Layer("vgg19/c4_4", 28, 512, 512),
    Layer("vgg19/c5_4", 14, 512, 512),
    Layer("alexnet/conv1", 224, 3, 64, r=11, stride=4, padding=2, pool=3),
    Layer("alexnet/conv2", 27, 64, 192, r=5, padding=2, pool=3),
    Layer("alexnet/conv5", 13, 256, 256, pool=3),
    # Network stems (C = 3: the tensor-core kernel's flat-K mode).
    Layer("squeezenet1_1/conv1", 224, 3, 64, stride=2, padding=0, pool=3),
    Layer("squeezenet1_0/conv1", 224, 3, 96, r=7, stride=2, padding=0, pool=3),
)
SMOKE_LAYERS = (Layer("tiny", 9, 16, 16, pool=3),)
# --quick: the headline layer and one of each family, bf16, N=64 (+ the headline at N=1).
QUICK = (("vgg19/c1_2", 64, "bf16"), ("vgg19/c1_2", 1, "bf16"), ("vgg19/c4_4", 64, "bf16"),
         ("alexnet/conv2", 64, "bf16"), ("vgg19/c3_4", 64, "fp32"))
QUICK_ITERS, QUICK_WARMUP = 10, 2  # --quick's timed and untimed calls (--smoke: 2 and 1)


def layer_kwargs(layer: Layer) -> dict:
    return dict(stride=layer.stride, padding=layer.padding, pool_window=layer.pool,
                pool_stride=layer.pool_stride)


def operands(layer: Layer, n: int, dtype: str, seed: int):
    kx, kw, kb = jax.random.split(case_key(seed, f"{layer.name}/{n}/{dtype}"), 3)
    dt = DTYPES[dtype]
    return (normal_input(kx, layer.x_nhwc(n), dt),
            he_weights(kw, (layer.r, layer.r, layer.c, layer.k), layer.r * layer.r * layer.c, dt),
            small_bias(kb, layer.k, dt))


def variants(layer: Layer, dtype: str):
    """(name, fn(x, w, b)) of every timed implementation of the layer."""
    kw = layer_kwargs(layer)

    def cfg_of(x, w, precision=None):
        return make_conv_pool_config(x.shape, w.shape, **kw, precision=precision)

    def ours(x, w, b):
        return jaxcnn.conv2d_pool(x, w, b, **kw)

    def xla(x, w, b):
        return xla_conv_pool(x, w, b, cfg_of(x, w))

    def xla_highest(x, w, b):
        return xla_conv_pool(x, w, b, cfg_of(x, w, "highest"))

    def ours_highest(x, w, b):
        return jaxcnn.conv2d_pool(x, w, b, **kw, precision="highest")

    def unfused(x, w, b):
        y = jaxcnn.conv2d(x, w, b, stride=layer.stride, padding=layer.padding, activation="relu")
        return jaxcnn.max_pool2d(y, layer.pool, layer.pool_stride)

    out = [("jaxcnn", ours), ("xla", xla)]
    if dtype == "fp32":
        out += [("jaxcnn_highest", ours_highest), ("xla_highest", xla_highest)]
    return out + [("unfused", unfused)]


def layer_row(layer: Layer, n: int, dtype: str, *, spec, iters: int, warmup: int, seed: int):
    x, w, b = operands(layer, n, dtype, seed)
    cfg = make_conv_pool_config(x.shape, w.shape, **layer_kwargs(layer))
    out_shape = jax.eval_shape(lambda x, w, b: jaxcnn.conv2d_pool(x, w, b, **layer_kwargs(layer)),
                               x, w, b).shape
    p = (layer.hw + 2 * layer.padding - layer.r) // layer.stride + 1
    itemsize = jnp.dtype(DTYPES[dtype]).itemsize
    bytes_moved = (x.size + w.size + b.size + math.prod(out_shape)) * itemsize
    flops = 2 * n * p * p * layer.k * layer.r * layer.r * layer.c
    fns = variants(layer, dtype)
    try:
        accuracy = relative_accuracy(jax.jit(fns[0][1])(x, w, b), jax.jit(fns[1][1])(x, w, b), TOLERANCE[dtype])
    except Exception as exc:  # record and go on: one broken config must not stop the suite
        accuracy = failed_accuracy(exc)
    timings = timed([(name, fn, (x, w, b)) for name, fn in fns], iters, warmup)
    med = {k: t.get("median_ms") for k, t in timings.items()}
    peak = spec.compute.get(PEAK_CLASS[dtype]) if spec is not None else None
    bytes_floor_ms = bytes_moved / FLOOR_BANDWIDTH * 1e3
    flops_floor_ms = flops / peak.per_s * 1e3 if peak is not None else None
    floor_ms = max(bytes_floor_ms, flops_floor_ms or 0.0)
    ours, xla = med.get("jaxcnn"), med.get("xla")
    return dict(
        layer=layer.name, n=n, dtype=dtype, hw=layer.hw, c=layer.c, k=layer.k, r=layer.r,
        stride=layer.stride, padding=layer.padding, pool=layer.pool, pool_stride=layer.pool_stride,
        out_shape=list(out_shape), bytes_moved=bytes_moved, gflop=flops / 1e9,
        bytes_floor_ms=bytes_floor_ms, flops_floor_ms=flops_floor_ms, floor_ms=floor_ms,
        peak_class=PEAK_CLASS[dtype], accuracy=accuracy,
        config=plan_text(queries.conv_pool_plan(x.shape, w.shape, DTYPES[dtype], cfg)),
        timings=timings,
        pct_of_floor={k: (100.0 * floor_ms / v if v else None) for k, v in med.items()},
        tflops={k: (flops / (v * 1e-3) / 1e12 if v else None) for k, v in med.items()},
        speedup_vs_xla=xla / ours if (ours and xla) else None,
        speedup_vs_unfused=med.get("unfused") / ours if (ours and med.get("unfused")) else None,
        ok=accuracy["ok"] and not any("error" in t for t in timings.values()),
    )


def _spread(t: dict) -> str:
    if "p10_ms" not in t:
        return "-"
    return f"{t['p10_ms'] * 1e3:.1f}-{t['p90_ms'] * 1e3:.1f}"


def summary_table(rows: list[dict]) -> list[str]:
    return markdown_table([
        "layer", "N", "dtype", "conv", "pool", "MB", "GFLOP", "floor us", "jaxcnn us (p10-p90)",
        "XLA us (p10-p90)", "HIGHEST jaxcnn / XLA us", "unfused us", "XLA/jaxcnn", "unfused/jaxcnn",
        "jaxcnn % floor", "jaxcnn TFLOP/s", "max rel diff", "status"], rows, _summary_cells)


def _summary_cells(r: dict) -> list[str]:
    t = r["timings"]
    conv = f"{r['hw']}x{r['hw']} {r['c']}->{r['k']} {r['r']}x{r['r']}/{r['stride']} p{r['padding']}"
    return [r["layer"], str(r["n"]), r["dtype"], conv, f"{r['pool']}x{r['pool']}/{r['pool_stride']}",
            f"{r['bytes_moved'] / 2**20:.1f}", f"{r['gflop']:.1f}", f"{r['floor_ms'] * 1e3:.1f}",
            f"{us(t.get('jaxcnn', {}))} ({_spread(t.get('jaxcnn', {}))})",
            f"{us(t.get('xla', {}))} ({_spread(t.get('xla', {}))})",
            (f"{us(t['jaxcnn_highest'])} / {us(t['xla_highest'])}"
             if "xla_highest" in t else "-"),
            us(t.get("unfused", {})), fmt(r["speedup_vs_xla"], ".2f"),
            fmt(r["speedup_vs_unfused"], ".2f"), fmt(r["pct_of_floor"].get("jaxcnn"), ".0f"),
            fmt(r["tflops"].get("jaxcnn"), ".0f"),
            fmt(r["accuracy"].get("max_rel_diff"), ".1e"), status(r)]


@timed_rows_summary()
def goal_summary(timed: list[dict]) -> list[str]:
    lines = [headline_line("vgg19/c1_2, N=64, bf16", r, GOAL_HEADLINE) for r in timed
             if r["layer"] == "vgg19/c1_2" and r["n"] == 64 and r["dtype"] == "bf16"]
    vgg = [r for r in timed if r["layer"].startswith("vgg19/") and r["dtype"] == "bf16"
           and r["n"] == 64]
    if vgg:
        spd = np.array([r["speedup_vs_xla"] for r in vgg])
        ours = sum(r["timings"]["jaxcnn"]["median_ms"] for r in vgg)
        xla = sum(r["timings"]["xla"]["median_ms"] for r in vgg)
        lines.append(f"- VGG-19 pooled layers, N=64 bf16: XLA/jaxcnn min {spd.min():.2f}, median "
                     f"{np.median(spd):.2f} over {len(spd)} layers (goal >= {GOAL_VGG} across them, "
                     f"every layer: {'met' if spd.min() >= GOAL_VGG else 'not met'}); summed "
                     f"jaxcnn {ours * 1e3:.1f} us vs XLA {xla * 1e3:.1f} us: {xla / ours:.2f}x "
                     f"({'met' if xla / ours >= GOAL_VGG else 'not met'} as a total)")
    for dtype in sorted({r["dtype"] for r in timed}):
        for n in sorted({r["n"] for r in timed}):
            sel = [r for r in timed if r["n"] == n and r["dtype"] == dtype]
            if sel:
                lines.append(f"- {dtype} N={n}: {speedup_spread(r['speedup_vs_xla'] for r in sel)}")
    return lines


def render_markdown(env: dict, rows: list[dict], iters: int, label: str) -> str:
    header = [
        *report_header(f"# jaxcnn fused conv + bias + ReLU + max-pool vs XLA{f' ({label})' if label else ''}",
                       env, rows),
        f"- times: median per-call device time over {iters} synced calls (sum of GPU kernel "
        "durations in a profiler trace), us, with the p10-p90 spread. MB = x + w + pooled y.",
        f"- floor = max(MB / {FLOOR_BANDWIDTH / 1e12:.2f} TB/s, GFLOP / peak) with the GPU's "
        "bf16/fp16 tensor-core peak, TF32 peak for fp32; % floor = floor / time.",
        "- xla: lax conv (x's dtype; fp32 at DEFAULT = TF32, as jaxcnn's fp32 default) + bias + "
        "ReLU + reduce_window under jit; HIGHEST: both fp32-accurate; unfused: "
        "jaxcnn.conv2d(relu) then jaxcnn.max_pool2d.",
        f"- goals (issue 8, bf16): VGG c1_2 N=64 XLA/jaxcnn >= {GOAL_HEADLINE}; >= {GOAL_VGG} "
        "across VGG-19's pooled layers.",
    ]
    return summary_report(header, goal_summary(rows), summary_table(rows), kernel_table(rows, "layer", launch_config=True))


def report_stem(env: dict, label: str) -> str:
    date = str(env.get("date_utc") or "")[:10] or "undated"
    return f"{gpu_slug(env)}-{date}-conv_pool{f'_{label}' if label else ''}"


def write_reports(out_dir: Path, env: dict, rows: list[dict], iters: int, label: str) -> str:
    return write_report(out_dir, report_stem(env, label), dict(environment=env, label=label, rows=rows),
                        render_markdown(env, rows, iters, label))


def progress_line(r: dict) -> str:
    t = r["timings"]
    times = variant_times(t, {"jaxcnn": "jaxcnn", "xla": "xla", "unfused": "unfused"})
    return (f"{r['layer']:<14} N={r['n']:<3} {r['dtype']:<5} {times}  "
            f"XLA/jaxcnn {fmt(r['speedup_vs_xla'], '.2f'):>5}  {status(r)}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="directory for the JSON and markdown")
    p.add_argument("--label", default="", help="suffix of the report names")
    p.add_argument("--batches", type=int_list, default=[1, 64])
    p.add_argument("--dtypes", type=str_list, default=["bf16", "fp32"])
    p.add_argument("--layers", type=str_list, help="layer names (prefix match)")
    add_timing_options(p, quick_iters=QUICK_ITERS, quick_warmup=QUICK_WARMUP)
    p.add_argument("--quick", action="store_true",
                   help="headline layer + one layer of each family (~2 minutes on an H200)")
    p.add_argument("--smoke", action="store_true", help="one tiny layer, 2 iterations: any machine")
    args = p.parse_args(argv)
    check_dtypes(p, args.dtypes)
    by_name = {layer.name: layer for layer in LAYERS + SMOKE_LAYERS}
    if args.smoke:
        args.jobs = [(SMOKE_LAYERS[0], 2, d) for d in args.dtypes]
    elif args.quick:
        args.jobs = [(by_name[name], n, dtype) for name, n, dtype in QUICK]
    else:
        layers = LAYERS
        if args.layers:
            layers = [la for la in LAYERS if any(la.name.startswith(k) for k in args.layers)]
        args.jobs = [(la, n, d) for la in layers for d in args.dtypes for n in args.batches]
    if args.smoke:
        timing_defaults(args, True, quick_iters=2, quick_warmup=1)
    else:
        timing_defaults(args, args.quick, quick_iters=QUICK_ITERS, quick_warmup=QUICK_WARMUP)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    spec = lookup_gpu_spec()
    env = environment(spec)
    common = dict(spec=spec, iters=args.iters, warmup=args.warmup, seed=args.seed)
    jobs = [functools.partial(layer_row, layer, n, dtype, **common) for layer, n, dtype in args.jobs]
    return run_rows(jobs, progress_line, lambda rows: write_reports(args.out, env, rows, args.iters, args.label))


if __name__ == "__main__":
    sys.exit(main())
