#!/usr/bin/env python3
"""Layer benchmark: jaxcnn.conv2d against XLA's convolution, accuracy and per-call device time.

For every layer x dtype: fresh random inputs; relative L2 error of jaxcnn.conv2d and of XLA
against an XLA float32 Precision.HIGHEST reference computed on the device; then device time
(profiler kernel sums, see jaxcnn/profile/device_time.py) of conv + bias + ReLU through
jaxcnn and through XLA at DEFAULT precision (and HIGHEST for float32), all in one run.
Writes bench_layers.json (environment + rows) and bench_layers.md into --out after every
row, and prints the markdown last.

The first 8 layers are the XLA baseline suite of /work/shared/baseline (same shapes), so
the XLA columns can be checked against h200-xla-device-time-2026-11-21.json.

Exit status: 0 when every row passed its accuracy check and timed, 2 when some row failed
(reports are still written), 1 on a crash.

  python scripts/bench_layers.py --out /tmp/bench                 # full suite, bf16+fp32
  python scripts/bench_layers.py --out /tmp/bench --layers vgg_c3_1 --dtypes bf16
  JAX_PLATFORMS=cpu python scripts/bench_layers.py --quick --out /tmp/smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench_common import (DTYPES, add_timing_options, case_key, csv_of, environment, fmt, run_rows, status,
                          timing_defaults, write_report)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import jaxcnn  # noqa: E402
from jaxcnn.costmodel.conv_layer import ConvShape  # noqa: E402
from jaxcnn.ops.conv2d.config import conv2d_flops, padding_pairs  # noqa: E402
from jaxcnn.profile import device_time  # noqa: E402
from jaxcnn.profile.gpu_specs import GpuSpec, floor_ms, lookup_gpu_spec, precision_class  # noqa: E402

# Relative L2 error allowed against the float32 HIGHEST reference: a few output roundings in
# the dtype (fp32 allows TF32, which XLA's DEFAULT uses too).
TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 2e-3}
# precision="highest" must be fp32-accurate (issue goal: rel err <= 1e-5).
HIGHEST_TOLERANCE = 1e-5
DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")
REPORT = "bench_layers"  # bench_layers.json / .md


@dataclass(frozen=True)
class Layer(ConvShape):
    """One convolution: x [n, h, w, c], weights [r, s, c // groups, k] (ConvShape's sizes
    first), then its name and the conv's arguments."""

    name: str
    stride: int = 1
    padding: Any = 0  # anything jaxcnn.conv2d takes: int, (ph, pw), pairs, "SAME", "VALID"
    dilation: int = 1
    groups: int = 1

    @property
    def x_shape(self) -> tuple[int, ...]:
        return self.x_nhwc

    @property
    def w_shape(self) -> tuple[int, ...]:
        return (self.r, self.s, self.c // self.groups, self.k)

    @property
    def window(self) -> tuple[int, int]:
        """The dilated filter's extent."""
        return ((self.r - 1) * self.dilation + 1, (self.s - 1) * self.dilation + 1)

    @property
    def fan_in(self) -> int:
        return self.r * self.s * (self.c // self.groups)

    def describe(self) -> str:
        return (
            f"{self.n}x{self.h}x{self.w}x{self.c}->{self.k} {self.r}x{self.s} "
            f"stride {self.stride} pad {self.padding} dil {self.dilation} groups {self.groups}"
        )


def _square(name, n, hw, c, k, rs, stride, padding, **kw) -> Layer:
    return Layer(n, hw, hw, c, k, rs, rs, name=name, stride=stride, padding=padding, **kw)


# Same shapes as /work/shared/baseline/measure_xla_baseline.py.
BASELINE_LAYERS = (
    _square("vgg_c1_2", 64, 224, 64, 64, 3, 1, 1),
    _square("vgg_c3_1", 64, 56, 128, 256, 3, 1, 1),
    _square("vgg_c5_1", 64, 14, 512, 512, 3, 1, 1),
    _square("alex_c2", 64, 27, 96, 256, 5, 1, 2),
    _square("sq_fire_sq", 64, 55, 128, 16, 1, 1, 0),
    _square("sq_fire_ex3", 64, 55, 16, 64, 3, 1, 1),
    _square("vgg_c3_1_b1", 1, 56, 128, 256, 3, 1, 1),
    _square("resnet_1x1_b64", 64, 56, 64, 256, 1, 1, 0),
)
# Shapes the baseline does not cover: few input channels, depthwise, grouped, dilated.
EXTRA_LAYERS = (
    _square("resnet_stem_7x7s2", 64, 224, 3, 64, 7, 2, 3),
    _square("mbv1_dw3x3", 64, 56, 128, 128, 3, 1, 1, groups=128),
    _square("mbv2_dw3x3_s2", 64, 112, 96, 96, 3, 2, 1, groups=96),
    _square("resnext_g32_3x3", 64, 56, 128, 128, 3, 1, 1, groups=32),
    _square("deeplab_3x3_d2", 16, 64, 256, 256, 3, 1, 2, dilation=2),
)
# Tiny versions for smoke tests (--quick): every code path, seconds on a CPU.
QUICK_LAYERS = (
    Layer(2, 8, 8, 8, 16, 3, 3, name="tiny_3x3", padding=1),
    Layer(2, 8, 8, 16, 8, 1, 1, name="tiny_1x1", padding="VALID"),
    Layer(2, 16, 16, 3, 8, 7, 7, name="tiny_stem_s2", stride=2, padding="SAME"),
    Layer(2, 8, 8, 8, 8, 3, 3, name="tiny_dw", padding=1, groups=8),
    Layer(2, 9, 7, 8, 16, 3, 3, name="tiny_grouped_9x7", padding="SAME", groups=4),
    Layer(2, 9, 9, 8, 8, 3, 3, name="tiny_dilated", padding=2, dilation=2),
)
# VGG-19's unpooled 3x3 convs (bf16 on Hopper: the wgmma kernel), by --layers name only.
VGG19_UNPOOLED = tuple(
    _square(f"vgg19_{name}{suffix}", n, hw, c, k, 3, 1, 1)
    for name, hw, c, k in (("c2_1", 112, 64, 128), ("c3_2", 56, 256, 256), ("c4_1", 28, 256, 512),
                           ("c4_2", 28, 512, 512), ("c5_2", 14, 512, 512))
    for n, suffix in ((64, ""), (1, "_b1"))
)
SUITE = BASELINE_LAYERS + EXTRA_LAYERS
LAYERS_BY_NAME = {layer.name: layer for layer in SUITE + QUICK_LAYERS + VGG19_UNPOOLED}


# ---------------------------------------------------------------- the ops being compared


def xla_conv_bias_relu(x, w, b, *, layer: Layer, precision: lax.Precision):
    y = lax.conv_general_dilated(
        x,
        w,
        (layer.stride, layer.stride),
        padding_pairs(layer.padding, (layer.h, layer.w), layer.window, (layer.stride, layer.stride)),
        rhs_dilation=(layer.dilation, layer.dilation),
        dimension_numbers=DIMENSION_NUMBERS,
        feature_group_count=layer.groups,
        precision=precision,
    )
    return jnp.maximum(y + b, 0)


def jaxcnn_conv_bias_relu(x, w, b, *, layer: Layer, precision=None, algorithm="auto"):
    return jaxcnn.conv2d(
        x,
        w,
        b,
        stride=layer.stride,
        padding=layer.padding,
        dilation=layer.dilation,
        groups=layer.groups,
        activation="relu",
        precision=precision,
        algorithm=algorithm,
    )


EXTRA_VARIANTS = ("jaxcnn_direct",)  # on request (--extra-variants): the CUDA-core kernel


def variants(layer: Layer, dtype: str, extra: tuple[str, ...] = ()) -> dict[str, Callable]:
    """The functions to time, by name; all compute relu(conv(x, w) + b)."""
    fns = {
        "jaxcnn": functools.partial(jaxcnn_conv_bias_relu, layer=layer),
        "xla_default": functools.partial(
            xla_conv_bias_relu, layer=layer, precision=lax.Precision.DEFAULT
        ),
    }
    if "jaxcnn_direct" in extra:
        fns["jaxcnn_direct"] = functools.partial(
            jaxcnn_conv_bias_relu, layer=layer, precision="highest", algorithm="direct"
        )
    if dtype == "fp32":
        fns["jaxcnn_highest"] = functools.partial(
            jaxcnn_conv_bias_relu, layer=layer, precision="highest"
        )
        fns["xla_highest"] = functools.partial(
            xla_conv_bias_relu, layer=layer, precision=lax.Precision.HIGHEST
        )
    return fns


def make_inputs(layer: Layer, dtype: str, seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Random x ~ N(0, 1), w ~ N(0, 1/fan_in), b ~ N(0, 0.01), drawn in float32, cast to dtype."""
    kx, kw, kb = jax.random.split(case_key(seed, f"{layer.name}/{dtype}"), 3)
    x = jax.random.normal(kx, layer.x_shape, jnp.float32)
    w = jax.random.normal(kw, layer.w_shape, jnp.float32) / math.sqrt(layer.fan_in)
    b = 0.1 * jax.random.normal(kb, (layer.k,), jnp.float32)
    return tuple(a.astype(DTYPES[dtype]) for a in (x, w, b))


# ---------------------------------------------------------------- work and traffic


def output_shape(layer: Layer) -> tuple[int, ...]:
    structs = [
        jax.ShapeDtypeStruct(shape, jnp.float32)
        for shape in (layer.x_shape, layer.w_shape, (layer.k,))
    ]
    fn = functools.partial(xla_conv_bias_relu, layer=layer, precision=lax.Precision.DEFAULT)
    return jax.eval_shape(fn, *structs).shape


def conv_flops(layer: Layer, out_shape: tuple[int, ...]) -> float:
    return float(conv2d_flops(layer.x_shape, layer.w_shape, out_shape))


def min_bytes(layer: Layer, out_shape: tuple[int, ...], dtype: str) -> int:
    """Each of x, w, bias and y moved exactly once."""
    elements = math.prod(layer.x_shape) + math.prod(layer.w_shape) + layer.k + math.prod(out_shape)
    return elements * jnp.dtype(DTYPES[dtype]).itemsize


# ---------------------------------------------------------------- accuracy


@jax.jit
def _rel_l2(y, ref):
    return jnp.linalg.norm(y.astype(jnp.float32) - ref) / jnp.linalg.norm(ref)


def _error_vs(fn: Callable, inputs: tuple, ref: jax.Array) -> float:
    """Relative L2 error of jit(fn)(*inputs) against ref; raises on a wrong shape or dtype."""
    y = jax.jit(fn)(*inputs)
    if y.shape != ref.shape or y.dtype != inputs[0].dtype:
        raise ValueError(
            f"output {y.dtype}{list(y.shape)}, expected {inputs[0].dtype}{list(ref.shape)}"
        )
    return float(_rel_l2(y, ref))


def check_accuracy(
    layer: Layer, dtype: str, inputs: tuple, fns: dict[str, Callable]
) -> dict[str, Any]:
    """Errors of jaxcnn and XLA DEFAULT against XLA float32 HIGHEST on the same inputs."""
    reference = functools.partial(xla_conv_bias_relu, layer=layer, precision=lax.Precision.HIGHEST)
    ref = jax.jit(reference)(*(a.astype(jnp.float32) for a in inputs))
    tolerance = TOLERANCE[dtype]
    result = dict(
        tolerance=tolerance,
        xla_default_rel_l2=_finite_or_none(_error_vs(fns["xla_default"], inputs, ref)),
    )
    errors = []
    for name, tol in (("jaxcnn", tolerance), ("jaxcnn_highest", HIGHEST_TOLERANCE)):
        if name not in fns:
            continue
        try:
            error = _finite_or_none(_error_vs(fns[name], inputs, ref))
        except Exception as exc:  # record and go on: one broken config must not stop the suite
            error = None
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
        else:
            if error is None:
                errors.append(f"{name}: non-finite output")
            elif error > tol:
                errors.append(f"{name}: rel L2 {error:.2e} > {tol:.0e}")
        result[f"{name}_rel_l2"] = error
    return dict(result, ok=not errors, error="; ".join(errors) or None)


# ---------------------------------------------------------------- timing


def time_variant(fn: Callable, inputs: tuple, iters: int, warmup: int) -> dict[str, Any]:
    try:
        return device_time(fn, *inputs, iters=iters, warmup=warmup).to_dict()
    except Exception as exc:  # record and go on, as in check_accuracy
        return dict(error=f"{type(exc).__name__}: {exc}")


def throughput(
    timing: dict[str, Any], flops: float, bytes_moved: int, floor: dict | None
) -> dict[str, Any]:
    """TFLOP/s, GB/s and % of floor (floor / median) of one timing."""
    if "median_ms" not in timing:
        return {}
    seconds = timing["median_ms"] * 1e-3
    return dict(
        tflops=flops / seconds / 1e12,
        gbps=bytes_moved / seconds / 1e9,
        pct_of_floor=None if floor is None else 100.0 * floor["floor_ms"] / timing["median_ms"],
    )


def _speedup(timings: dict[str, dict], baseline: str, ours: str = "jaxcnn") -> float | None:
    """baseline median / our median: > 1 means jaxcnn is faster."""
    ours, theirs = timings.get(ours, {}), timings.get(baseline, {})
    if "median_ms" not in ours or "median_ms" not in theirs:
        return None
    return theirs["median_ms"] / ours["median_ms"]


def _floor(
    flops: float, bytes_moved: int, spec: GpuSpec | None, dtype: str
) -> dict[str, Any] | None:
    if spec is None:
        return None
    return dict(
        floor_ms(flops, bytes_moved, spec, dtype), gpu=spec.name, precision=precision_class(dtype)
    )


def bench_row(
    layer: Layer, dtype: str, *, iters: int, warmup: int, seed: int, spec: GpuSpec | None,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Accuracy and timings of one layer in one dtype."""
    out_shape = output_shape(layer)
    flops = conv_flops(layer, out_shape)
    bytes_moved = min_bytes(layer, out_shape, dtype)
    floor = _floor(flops, bytes_moved, spec, dtype)
    inputs = make_inputs(layer, dtype, seed)
    fns = variants(layer, dtype, extra)
    accuracy = check_accuracy(layer, dtype, inputs, fns)
    timings = {}
    for name, fn in fns.items():
        timing = time_variant(fn, inputs, iters, warmup)
        timings[name] = dict(timing, **throughput(timing, flops, bytes_moved, floor))
    return dict(
        layer=layer.name,
        dtype=dtype,
        config=dict(dataclasses.asdict(layer), out_shape=list(out_shape)),
        gflop=flops / 1e9,
        min_bytes=bytes_moved,
        accuracy=accuracy,
        floor=floor,
        timings=timings,
        speedup_vs_xla_default=_speedup(timings, "xla_default"),
        # fp32-accurate against fp32-accurate.
        speedup_vs_xla_highest=_speedup(timings, "xla_highest", ours="jaxcnn_highest"),
        ok=accuracy["ok"] and not any("error" in t for t in timings.values()),
    )


# ---------------------------------------------------------------- reports


def warnings_for(env: dict[str, Any], rows: list[dict]) -> list[str]:
    """Loud caveats that make the numbers mean less than they seem."""
    found = []
    if not env["jaxcnn_cuda_available"]:
        found.append(
            "jaxcnn CUDA kernels are NOT available ("
            f"{env['jaxcnn_cuda_unavailable_reason']}): the jaxcnn column is its XLA fallback, "
            "so jaxcnn-vs-XLA numbers mean nothing."
        )
    wall_timed = sorted(
        {
            f"{r['layer']}/{r['dtype']}"
            for r in rows
            for t in r["timings"].values()
            if t.get("is_device_time") is False
        }
    )
    if wall_timed:
        found.append(
            f"no GPU trace for {len(wall_timed)} rows: their times are host wall time "
            "(dispatch included), not device time."
        )
    if env["gpu_spec"] is None:
        found.append(f"no ceilings for device '{env['device_kind']}': floors are left out.")
    return found


def _time_cell(timing: dict[str, Any]) -> str:
    if "median_ms" not in timing:
        return "error" if timing else "-"
    return f"{timing['median_ms']:.4f} [{timing['p10_ms']:.4f}-{timing['p90_ms']:.4f}]"


def _highest_cell(timing: dict[str, Any], rel_err: float | None) -> str:
    if not timing:
        return "-"
    return f"{_time_cell(timing)} ({fmt(rel_err, '.1e')})"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def summary_table(rows: list[dict]) -> list[str]:
    lines = [
        "| layer | dtype | shape | GFLOP | rel err jaxcnn (XLA) | jaxcnn ms [p10-p90] | XLA ms "
        "| jaxcnn HIGHEST ms (rel err) | XLA HIGHEST ms | XLA/jaxcnn | jaxcnn TFLOP/s | jaxcnn GB/s "
        "| floor ms (bound) | jaxcnn % floor | status |",
        "|" + "---|" * 15,
    ]
    for row in rows:
        acc, t, floor = row["accuracy"], row["timings"], row["floor"]
        ours = t.get("jaxcnn", {})
        speedups = [fmt(row["speedup_vs_xla_default"], ".2f")]
        if row["speedup_vs_xla_highest"] is not None:
            speedups.append(f"{row['speedup_vs_xla_highest']:.2f} (HIGHEST)")
        floor_cell = "-" if floor is None else f"{floor['floor_ms']:.4f} ({floor['bound']})"
        cells = [
            row["layer"],
            row["dtype"],
            _describe(row["config"]),
            f"{row['gflop']:.4g}",
            f"{fmt(acc['jaxcnn_rel_l2'], '.1e')} ({fmt(acc['xla_default_rel_l2'], '.1e')})",
            _time_cell(ours),
            _time_cell(t.get("xla_default", {})),
            _highest_cell(t.get("jaxcnn_highest", {}), acc.get("jaxcnn_highest_rel_l2")),
            _time_cell(t.get("xla_highest", {})),
            " / ".join(speedups),
            fmt(ours.get("tflops"), ".4g"),
            fmt(ours.get("gbps"), ".4g"),
            floor_cell,
            fmt(ours.get("pct_of_floor"), ".0f"),
            status(row),
        ]
        lines.append("| " + " | ".join(_md_escape(c) for c in cells) + " |")
    return lines


def _describe(config: dict[str, Any]) -> str:
    fields = {f.name for f in dataclasses.fields(Layer)}
    return Layer(**{k: v for k, v in config.items() if k in fields}).describe()


def kernel_table(rows: list[dict], top: int = 3, name_chars: int = 70) -> list[str]:
    lines = [
        "| layer | dtype | variant | kernels per call | top kernels (us per call) |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        for variant, timing in row["timings"].items():
            kernels = timing.get("kernels") or []
            # Backticks keep template brackets (<float>) from being read as HTML.
            listed = "; ".join(
                f"`{k['name'][:name_chars]}` {k['us_per_call']:.1f}" for k in kernels[:top]
            )
            cells = [
                row["layer"],
                row["dtype"],
                variant,
                fmt(timing.get("kernels_per_call"), ".1f"),
                listed or "-",
            ]
            lines.append("| " + " | ".join(_md_escape(c) for c in cells) + " |")
    return lines


def _ceilings_line(gpu_spec: dict[str, Any] | None) -> str:
    if gpu_spec is None:
        return "- ceilings: none known for this device"
    memory = gpu_spec["memory"]
    compute = [
        f"{name} {c['per_s'] / 1e12:.4g} TFLOP/s ({c['source']})"
        for name, c in gpu_spec["compute"].items()
    ]
    return (
        f"- ceilings ({gpu_spec['name']}): memory {memory['per_s'] / 1e12:.3g} TB/s "
        f"({memory['source']}), " + ", ".join(compute)
    )


def render_markdown(env: dict[str, Any], rows: list[dict], iters: int) -> str:
    git = env["git"] or {}
    dirty = " (dirty)" if git.get("dirty") else ""
    header = [
        "# jaxcnn.conv2d vs XLA: layer benchmark",
        "",
        *[f"> **WARNING: {w}**" for w in warnings_for(env, rows)],
        "",
        f"- device: {env['device_kind']} ({env['nvidia_smi'] or 'no nvidia-smi'}); "
        f"jax {env['jax']}, jaxlib {env['jaxlib']}; {env['packages']}",
        f"- commit {git.get('commit', 'unknown')}{dirty}; {env['date_utc']}",
        f"- op: conv + bias + ReLU in every column. Times: median per-call device time (sum of GPU "
        f"kernel durations in a profiler trace) over {iters} synced calls, [p10-p90], in ms.",
        "- XLA/jaxcnn > 1 means jaxcnn is faster. rel err: relative L2 vs XLA float32 HIGHEST.",
        "- floor = max(FLOPs / peak of the dtype, min bytes / bandwidth), FLOPs of direct "
        "convolution; fp32 floors use the fp32 non-tensor peak. % floor = floor / median: over "
        "100 means fewer FLOPs (FFT, Winograd) or TF32 (XLA DEFAULT for fp32).",
        _ceilings_line(env["gpu_spec"]),
        "",
    ]
    return (
        "\n".join(header + summary_table(rows) + ["", "## Kernels", ""] + kernel_table(rows)) + "\n"
    )


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def write_reports(out_dir: Path, env: dict[str, Any], rows: list[dict], iters: int) -> str:
    return write_report(out_dir, REPORT, dict(environment=env, rows=rows), render_markdown(env, rows, iters))


def progress_line(row: dict[str, Any]) -> str:
    t = row["timings"]
    speedup = fmt(row["speedup_vs_xla_default"], ".2f")
    return (
        f"{row['layer']:<20} {row['dtype']:<5} jaxcnn {_time_cell(t['jaxcnn']):<28} "
        f"xla {_time_cell(t['xla_default']):<28} xla/jaxcnn {speedup:>5} "
        f"err {fmt(row['accuracy']['jaxcnn_rel_l2'], '.1e')} {status(row)}"
    )


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, required=True, help=f"directory for {REPORT}.{{json,md}}"
    )
    parser.add_argument("--dtypes", type=csv_of(DTYPES, "dtype"), default=["bf16", "fp32"])
    parser.add_argument(
        "--layers",
        type=csv_of(LAYERS_BY_NAME, "layer"),
        help="comma-separated layer names (default: the suite; --quick: tiny layers)",
    )
    add_timing_options(parser, "measurement")
    parser.add_argument(
        "--quick", action="store_true", help="tiny layers and few iterations: a smoke test"
    )
    parser.add_argument("--extra-variants", type=csv_of(EXTRA_VARIANTS, "variant"),
                        default=[], help="also time these (jaxcnn_direct: the CUDA-core kernel)")
    args = parser.parse_args(argv)
    args.layers = (
        [LAYERS_BY_NAME[n] for n in args.layers]
        if args.layers
        else list(QUICK_LAYERS if args.quick else SUITE)
    )
    timing_defaults(args, args.quick)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = lookup_gpu_spec()
    env = environment(spec)
    for warning in warnings_for(env, []):
        print(f"WARNING: {warning}", file=sys.stderr, flush=True)
    common = dict(iters=args.iters, warmup=args.warmup, seed=args.seed, spec=spec,
                  extra=tuple(args.extra_variants))
    jobs = [functools.partial(bench_row, layer, dtype, **common)
            for layer in args.layers for dtype in args.dtypes]
    return run_rows(jobs, progress_line, lambda rows: write_reports(args.out, env, rows, args.iters))


if __name__ == "__main__":
    sys.exit(main())
