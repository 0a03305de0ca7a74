#!/usr/bin/env python3
"""Zero-skipping conv benchmark (issue 8): jaxcnn.sparse_conv2d vs our dense conv vs XLA.

Three sections, all device time (sum of GPU kernel durations per call in one profiler trace
per case group, jaxcnn/profile/device_time.py), median and p10-p90 spread over --iters calls:

1. synthetic: VGG-19 and AlexNet conv layer shapes (zoo layer tables; the image layers with
   C=3 are left out: their input is not a ReLU output) at each batch and dtype, inputs with
   exactly s zeros at random places for s in --sparsities. Dense paths: ours (jaxcnn.conv2d
   "auto") and XLA; for fp32 both at HIGHEST (fp32-accurate, what the sparse kernel computes)
   and DEFAULT (TF32). Per layer: crossover sparsity (from which sparse beats the best dense
   of the same precision class; and vs XLA HIGHEST), speedup vs XLA HIGHEST at 90% zeros
   (issue goal: >= 2x for fp32), % of floor (floor = max(useful FLOPs at the fp32 CUDA-core
   peak, x+w+y bytes at HBM bandwidth); useful = dense FLOPs x (1 - s)), max rel err vs XLA
   HIGHEST in fp32 on the same values.
2. real: the actual ReLU outputs feeding each conv layer of the zoo's VGG-19, AlexNet and
   ResNet-50 (random He-init weights, smooth random images normalized like ImageNet input:
   jaxcnn.tuning.sparse_dispatch.realistic_images): measured sparsity, sparse vs dense vs XLA.
3. pool: sparse_conv2d_pool (fused ReLU + max-pool) vs XLA conv + bias + ReLU + reduce_window
   (and vs our dense conv + jaxcnn.max_pool2d, and jaxcnn.conv2d_pool where present) on the
   VGG-19 / AlexNet layers followed by a pool, at 0% / 50% / 90% zeros and the real sparsity.

Writes <gpu>-<date>-<label>.json / .md into --out after every group, prints the markdown last.
--quick: two layers, four sparsities, few iterations, VGG-19 real inputs at N=1 and the issue's
fused headline (VGG conv1_2, N=64, bf16): a few minutes on an H200. --store-crossovers writes
each synthetic layer's crossover into the dispatch table (jaxcnn.tuning.sparse_dispatch).

  python scripts/bench_sparse.py --out benchmarks/results
  python scripts/bench_sparse.py --out /tmp/sparse --quick
  JAX_PLATFORMS=cpu python scripts/bench_sparse.py --out /tmp/smoke --quick --iters 1
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Callable

from bench_common import (DTYPES, check_dtypes, dated_stem, environment, final_status, int_list,
                          report_header, str_list, table_head, timing_defaults, write_report)

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxcnn
from jaxcnn.tuning import sparse_dispatch
from jaxcnn._native import queries
from jaxcnn._native.plans import plan_text
from jaxcnn.ops.conv2d.config import make_config
from jaxcnn.ops.sparse_conv2d.config import SparseConfig, kernel_params
from jaxcnn.models import XLA_OPS, get_model, layer_table
from jaxcnn.models.layers import Net
from jaxcnn.profile import device_times
from jaxcnn.profile.gpu_specs import lookup_gpu_spec

DEFAULT_SPARSITIES = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99)
QUICK_SPARSITIES = (0.0, 0.5, 0.9, 0.99)
QUICK_LAYERS = ("vgg19/conv3_2", "alexnet/conv3")
GOAL_SPARSITY, GOAL_SPEEDUP = 0.9, 2.0
POOL_GOAL_HEADLINE, POOL_GOAL_ALL = 1.5, 1.3
# H200 fallbacks when the GPU is not in jaxcnn.profile.gpu_specs.
FP32_PEAK, HBM_BW = 66.9e12, 4.8e12
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 4e-3}  # max rel err vs XLA HIGHEST (fp32 math)


# ---------------------------------------------------------------- layers and inputs


def conv_layers(model: str, batch: int) -> list[dict]:
    """Conv layers of a zoo model whose input is a ReLU output (C > 3), with the pool that
    follows each one (if any): name, x shape, w shape, stride, padding, pool."""
    table = layer_table(model, batch)
    out = []
    for i, info in enumerate(table):
        if info.op != "conv2d" or info.input_shape[-1] <= 3 or (info.groups or 1) != 1:
            continue
        nxt = table[i + 1] if i + 1 < len(table) else None
        pool = None
        if nxt is not None and nxt.op == "maxpool" and nxt.input_shapes[0] == info.output_shape:
            pool = dict(window=tuple(nxt.window), stride=tuple(nxt.stride), padding=tuple(map(tuple, nxt.padding)))
        out.append(dict(name=f"{model}/{info.name}", x=tuple(info.input_shape), w=tuple(info.weight_shape),
                        stride=tuple(info.stride), padding=tuple(map(tuple, info.padding)), pool=pool,
                        activation=info.activation))
    return out


def unique_layers(layers: list[dict]) -> list[dict]:
    """One layer per distinct (x, w, stride, padding): VGG's repeated convs time the same."""
    seen, out = {}, []
    for layer in layers:
        key = (layer["x"], layer["w"], layer["stride"], layer["padding"])
        if key in seen:
            seen[key]["also"].append(layer["name"])
            continue
        seen[key] = {**layer, "also": []}
        out.append(seen[key])
    return out


def weights(w_shape, dtype, seed: int):
    key = jax.random.PRNGKey(seed)
    fan_in = math.prod(w_shape[:3])
    w = (jax.random.normal(key, w_shape) * math.sqrt(2.0 / fan_in)).astype(dtype)
    b = (0.01 * jax.random.normal(jax.random.fold_in(key, 1), w_shape[-1:])).astype(dtype)
    return w, b


def real_activations(model: str, batch: int, dtype, seed: int) -> list[tuple[dict, jax.Array]]:
    """(layer, its actual input) for each conv layer of `model` on realistic images."""
    spec = get_model(model)
    params = spec.init(seed, dtype)
    images = sparse_dispatch.realistic_images(jax.random.PRNGKey(seed + 1), batch, spec.image_size,
                                              spec.channels, dtype)

    def run(params, x):
        inputs = []

        def conv(x, w, b=None, **kw):
            inputs.append(x)
            return XLA_OPS["conv2d"](x, w, b, **kw)

        spec.body(Net({**XLA_OPS, "conv2d": conv}, params), x)
        return inputs

    acts = jax.jit(run)(params, images)
    infos = [i for i in spec.layers(batch, dtype) if i.op == "conv2d"]
    out = []
    for info, x in zip(infos, acts):
        if info.input_shape[-1] <= 3 or (info.groups or 1) != 1:
            continue
        layer = dict(name=f"{model}/{info.name}", x=tuple(info.input_shape), w=tuple(info.weight_shape),
                     stride=tuple(info.stride), padding=tuple(map(tuple, info.padding)),
                     activation=info.activation, pool=None, w_value=params[info.name]["w"],
                     b_value=params[info.name]["b"])
        out.append((layer, x))
    return out


# ---------------------------------------------------------------- measuring


def dense_fns(layer: dict, dtype: str) -> dict[str, Callable]:
    kw = dict(stride=layer["stride"], padding=layer["padding"], activation="relu")
    fns = {}
    if dtype == "fp32":
        fns["ours_highest"] = lambda x, w, b: jaxcnn.conv2d(x, w, b, precision="highest", **kw)
        fns["xla_highest"] = lambda x, w, b: jaxcnn.conv2d(x, w, b, precision="highest", algorithm="xla", **kw)
        fns["ours_default"] = lambda x, w, b: jaxcnn.conv2d(x, w, b, **kw)
        fns["xla_default"] = lambda x, w, b: jaxcnn.conv2d(x, w, b, algorithm="xla", **kw)
    else:
        fns["ours"] = lambda x, w, b: jaxcnn.conv2d(x, w, b, **kw)
        fns["xla"] = lambda x, w, b: jaxcnn.conv2d(x, w, b, algorithm="xla", **kw)
    return fns


def sparse_fn(layer: dict) -> Callable:
    kw = dict(stride=layer["stride"], padding=layer["padding"], activation="relu")
    return lambda x, w, b: jaxcnn.sparse_conv2d(x, w, b, **kw)


def timed(cases: list[tuple[str, Callable, tuple]], iters: int, warmup: int) -> dict[str, dict]:
    try:
        result = device_times(cases, iters=iters, warmup=warmup)
        return {k: {**{f: getattr(t, f) for f in ("median_ms", "p10_ms", "p90_ms", "is_device_time")},
                    "kernels": [dict(name=s.name, us_per_call=s.us_per_call) for s in t.kernels[:3]]}
                for k, t in result.items()}
    except Exception as exc:  # record and go on: one broken case must not stop the sweep
        return {k: dict(error=f"{type(exc).__name__}: {exc}"[:300]) for k, _, _ in cases}


def rel_err(ours, ref) -> float | None:
    a = np.asarray(jnp.asarray(ours, jnp.float32), np.float64)
    b = np.asarray(jnp.asarray(ref, jnp.float32), np.float64)
    if not np.isfinite(a).all():
        return None
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def xla_highest_f32(layer: dict, x, w, b):
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    kw = dict(stride=layer["stride"], padding=layer["padding"], activation="relu")
    return jax.jit(lambda x, w, b: jaxcnn.conv2d(x, w, b, precision="highest", algorithm="xla", **kw))(
        f32(x), f32(w), f32(b))


def floors(layer: dict, n: int, dtype: str, sparsity: float, spec) -> float:
    """ms: useful FLOPs at the fp32 CUDA-core peak vs bytes at HBM bandwidth, the larger."""
    (nx, h, wd, c), (r, s, _, k) = (n, *layer["x"][1:]), layer["w"]
    (pt, pb), (pl, pr) = layer["padding"]
    p = (h + pt + pb - r) // layer["stride"][0] + 1
    q = (wd + pl + pr - s) // layer["stride"][1] + 1
    flops = 2.0 * nx * p * q * k * r * s * c * (1.0 - sparsity)
    item = jnp.dtype(DTYPES[dtype]).itemsize
    bytes_moved = item * (nx * h * wd * c + r * s * c * k + nx * p * q * k)
    peak = spec.compute["fp32"].per_s if spec and "fp32" in spec.compute else FP32_PEAK
    bandwidth = spec.memory.per_s if spec else HBM_BW
    return 1e3 * max(flops / peak, bytes_moved / bandwidth)


def med(t: dict) -> float | None:
    return t.get("median_ms")


def synthetic_row(layer: dict, n: int, dtype: str, sparsities, args, spec) -> dict:
    dt = DTYPES[dtype]
    x_shape = (n, *layer["x"][1:])
    w, b = weights(layer["w"], dt, args.seed)
    key = jax.random.PRNGKey(args.seed + 7)
    x_half = sparse_dispatch.sparse_input(key, x_shape, 0.5, dt)
    cases = [(name, fn, (x_half, w, b)) for name, fn in dense_fns(layer, dtype).items()]
    inputs = {}
    for i, s in enumerate(sparsities):
        inputs[s] = sparse_dispatch.sparse_input(jax.random.fold_in(key, i + 1), x_shape, s, dt)
        cases.append((f"sparse@{s:g}", sparse_fn(layer), (inputs[s], w, b)))
    times = timed(cases, args.iters, args.warmup)
    errors = {}
    for s in (0.0, GOAL_SPARSITY):
        if s in inputs:
            try:
                errors[f"{s:g}"] = rel_err(jax.jit(sparse_fn(layer))(inputs[s], w, b),
                                           xla_highest_f32(layer, inputs[s], w, b))
            except Exception as exc:
                errors[f"{s:g}"] = None
                errors["error"] = f"{type(exc).__name__}: {exc}"[:200]
    sparse_ms = [med(times[f"sparse@{s:g}"]) for s in sparsities]
    dense_names = [k for k in times if not k.startswith("sparse")]
    accurate = [k for k in dense_names if dtype != "fp32" or k.endswith("highest")]
    best_dense = min((med(times[k]) for k in accurate if med(times.get(k, {}))), default=None)
    crossover = {}
    if best_dense and all(v is not None for v in sparse_ms):
        crossover["vs_best_dense"] = sparse_dispatch.find_crossover(sparsities, sparse_ms, best_dense)
        xla_key = "xla_highest" if dtype == "fp32" else "xla"
        if med(times.get(xla_key, {})):
            crossover["vs_xla"] = sparse_dispatch.find_crossover(sparsities, sparse_ms, med(times[xla_key]))
        if dtype == "fp32":
            any_dense = min((med(times[k]) for k in dense_names if med(times.get(k, {}))), default=None)
            crossover["vs_best_dense_any_precision"] = sparse_dispatch.find_crossover(
                sparsities, sparse_ms, any_dense)
        if args.store_crossovers:
            table = sparse_dispatch.CrossoverTable(args.crossover_cache)
            for prec in (("highest", "default") if dtype == "fp32" else ("default",)):
                names = [k for k in dense_names if dtype != "fp32" or k.endswith(prec)]
                best = min(names, key=lambda k: med(times[k]) or math.inf)
                record = sparse_dispatch.Crossover(
                    sparse_dispatch.device_kind(),
                    sparse_dispatch.layer_key(x_shape, layer["w"], dt, stride=layer["stride"],
                                              padding=layer["padding"], precision=prec),
                    tuple(sparsities), tuple(sparse_ms), med(times[best]),
                    "xla" if best.startswith("xla") else "jaxcnn", {k: med(times[k]) for k in names},
                    sparse_dispatch.find_crossover(sparsities, sparse_ms, med(times[best])))
                table.put(record)
                if args.db:
                    from jaxcnn.store import Store

                    with Store(args.db) as store:
                        sparse_dispatch.record_crossover(store, record, name=layer["name"])
    xla_ref = med(times.get("xla_highest" if dtype == "fp32" else "xla", {}))
    goal = None
    if GOAL_SPARSITY in sparsities and xla_ref and med(times[f"sparse@{GOAL_SPARSITY:g}"]):
        goal = xla_ref / med(times[f"sparse@{GOAL_SPARSITY:g}"])
    floor = {f"{s:g}": floors(layer, n, dtype, s, spec) for s in sparsities}
    pct = {f"{s:g}": (100.0 * floor[f"{s:g}"] / med(times[f"sparse@{s:g}"])
                      if med(times[f"sparse@{s:g}"]) else None) for s in sparsities}
    plan = plan_text(queries.sparse_conv_plan(_plan_params(layer, n, dtype)))
    ok = all("error" not in t for t in times.values()) and all(
        e is not None and e <= TOLERANCE[dtype] for k, e in errors.items() if k != "error")
    return dict(section="synthetic", layer=layer["name"], also=layer.get("also", []), n=n, dtype=dtype,
                x=x_shape, w=layer["w"], sparsities=list(sparsities), timings=times, crossover=crossover,
                speedup_vs_xla_at_90=goal, floor_ms=floor, pct_of_floor=pct, max_rel_err_vs_xla=errors,
                plan=plan, ok=ok)


def _plan_params(layer: dict, n: int, dtype: str) -> dict:
    x_shape = (n, *layer["x"][1:])
    cfg = make_config(x_shape, layer["w"], stride=layer["stride"], padding=layer["padding"], activation="relu")
    return kernel_params(x_shape, layer["w"], SparseConfig(cfg),
                         np.float32 if dtype == "fp32" else np.float16)


def real_row(layer: dict, x, dtype: str, args) -> dict:
    w, b = layer["w_value"], layer["b_value"]
    cases = [(name, fn, (x, w, b)) for name, fn in dense_fns(layer, dtype).items()]
    cases.append(("sparse", sparse_fn(layer), (x, w, b)))
    times = timed(cases, args.iters, args.warmup)
    sparsity = float(jnp.mean(x == 0))
    try:
        err = rel_err(jax.jit(sparse_fn(layer))(x, w, b), xla_highest_f32(layer, x, w, b))
    except Exception:
        err = None
    xla_key = "xla_highest" if dtype == "fp32" else "xla"
    dense_names = [k for k in times if k != "sparse" and (dtype != "fp32" or k.endswith("highest"))]
    best_dense = min((med(times[k]) for k in dense_names if med(times.get(k, {}))), default=None)
    s_ms = med(times["sparse"])
    ok = all("error" not in t for t in times.values()) and err is not None and err <= TOLERANCE[dtype]
    return dict(section="real", layer=layer["name"], n=x.shape[0], dtype=dtype, x=tuple(x.shape),
                w=layer["w"], sparsity=sparsity, timings=times,
                speedup_vs_xla=(med(times[xla_key]) / s_ms) if (s_ms and med(times.get(xla_key, {}))) else None,
                speedup_vs_best_dense=(best_dense / s_ms) if (s_ms and best_dense) else None,
                max_rel_err_vs_xla=err, ok=ok)


def pool_fns(layer: dict, dtype: str) -> dict[str, Callable]:
    pool = layer["pool"]
    conv_kw = dict(stride=layer["stride"], padding=layer["padding"])
    prec = "highest" if dtype == "fp32" else None
    dims = ((1, *pool["window"], 1), (1, *pool["stride"], 1), ((0, 0), *pool["padding"], (0, 0)))

    def xla(precision):
        def fn(x, w, b):
            y = jaxcnn.conv2d(x, w, b, activation="relu", algorithm="xla", precision=precision, **conv_kw)
            return lax.reduce_window(y, -jnp.inf, lax.max, *dims)
        return fn

    fns = {"sparse_pool": lambda x, w, b: jaxcnn.sparse_conv2d_pool(
        x, w, b, **conv_kw, pool_window=pool["window"], pool_stride=pool["stride"], pool_padding=pool["padding"])}
    if dtype == "fp32":
        fns["xla_highest"] = xla("highest")
        fns["xla_default"] = xla(None)
    else:
        fns["xla"] = xla(None)
    fns["ours_dense_unfused"] = lambda x, w, b: jaxcnn.max_pool2d(
        jaxcnn.conv2d(x, w, b, activation="relu", precision=prec, **conv_kw), pool["window"], pool["stride"],
        padding=pool["padding"])
    if hasattr(jaxcnn, "conv2d_pool"):  # part B's dense fused kernel, where merged
        fns["ours_dense_fused"] = lambda x, w, b: jaxcnn.conv2d_pool(
            x, w, b, **conv_kw, pool_window=pool["window"], pool_stride=pool["stride"],
            pool_padding=pool["padding"])
    return fns


def pool_row(layer: dict, n: int, dtype: str, sparsity: float | str, x, args) -> dict:
    dt = DTYPES[dtype]
    w, b = weights(layer["w"], dt, args.seed)
    fns = pool_fns(layer, dtype)
    times = timed([(k, fn, (x, w, b)) for k, fn in fns.items()], args.iters, args.warmup)
    try:
        got = jax.jit(fns["sparse_pool"])(x, w, b)
        f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
        ref = jax.jit(pool_fns(layer, "fp32")["xla_highest"])(f32(x), f32(w), f32(b))
        err = rel_err(got, ref)
    except Exception:
        err = None
    xla_key = "xla_highest" if dtype == "fp32" else "xla"
    s_ms = med(times["sparse_pool"])
    ok = all("error" not in t for t in times.values()) and err is not None and err <= TOLERANCE[dtype]
    return dict(section="pool", layer=layer["name"], n=n, dtype=dtype, x=tuple(x.shape), w=layer["w"],
                pool=layer["pool"], sparsity=float(jnp.mean(x == 0)), sparsity_kind=sparsity, timings=times,
                speedup_vs_xla=(med(times[xla_key]) / s_ms) if (s_ms and med(times.get(xla_key, {}))) else None,
                max_rel_err_vs_xla=err, ok=ok)


# ---------------------------------------------------------------- reports


def _f(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def _t(t: dict) -> str:
    if "error" in t:
        return "error"
    return f"{t['median_ms'] * 1e3:.1f} ({t['p10_ms'] * 1e3:.0f}-{t['p90_ms'] * 1e3:.0f})"


def render(env: dict, rows: list[dict], args) -> str:
    lines = [*report_header(f"# jaxcnn zero-skipping conv vs dense vs XLA ({args.label})", env, rows,
                            fallback="the jaxcnn columns are the XLA fallback.", jaxlib=False),
             f"- times: median (p10-p90) per-call device time over {args.iters} calls, us. Sparse = the "
             "whole op (the tile kernel and its split sum, or the encode + walk kernels). fp32 dense: `_highest` fp32-accurate, `_default` TF32.",
             "- crossover: lowest sparsity from which sparse beats the dense path (linear "
             "interpolation on the grid); '-' never. % floor: floor / sparse time, floor = max(useful "
             "FLOPs at the fp32 CUDA-core peak, bytes at HBM bandwidth).",
             f"- goals (issue 8): fp32 at {GOAL_SPARSITY:.0%} zeros >= {GOAL_SPEEDUP}x XLA HIGHEST; fused "
             f"pool >= {POOL_GOAL_HEADLINE}x XLA on VGG conv1_2 N=64 bf16, >= {POOL_GOAL_ALL}x on VGG's pooled layers.",
             "", "## Summary", "", *summary(rows), ""]
    syn = [r for r in rows if r["section"] == "synthetic"]
    if syn:
        lines += ["## Synthetic sparsity sweep", ""]
        for r in syn:
            dense = [k for k in r["timings"] if not k.startswith("sparse")]
            lines += [f"### {r['layer']} N={r['n']} {r['dtype']} x{list(r['x'])} w{list(r['w'])}"
                      + (f" (same shape: {', '.join(r['also'])})" if r["also"] else ""), "",
                      "dense: " + ", ".join(f"{k} {_t(r['timings'][k])}" for k in dense),
                      "; crossover " + ", ".join(f"{k} {_f(v, '.0%') if v is not None else '-'}"
                                                  for k, v in r["crossover"].items())
                      + f"; XLA/sparse at 90%: {_f(r['speedup_vs_xla_at_90'])}; max rel err vs XLA "
                      + ", ".join(f"{k}: {_f(v, '.1e') if isinstance(v, float) else v}"
                                  for k, v in r["max_rel_err_vs_xla"].items())
                      + f"; plan `{r['plan']}`", "",
                      "| sparsity | sparse us | XLA/sparse | best dense/sparse | % floor |", "|---|---|---|---|---|"]
            xla_key = "xla_highest" if r["dtype"] == "fp32" else "xla"
            best = min((med(r["timings"][k]) for k in dense
                        if med(r["timings"][k]) and (r["dtype"] != "fp32" or k.endswith("highest"))), default=None)
            for s in r["sparsities"]:
                t = r["timings"][f"sparse@{s:g}"]
                m = med(t)
                lines.append(f"| {s:.0%} | {_t(t)} | {_f(med(r['timings'].get(xla_key, {})) / m if m and med(r['timings'].get(xla_key, {})) else None)} "
                             f"| {_f(best / m if m and best else None)} | {_f(r['pct_of_floor'][f'{s:g}'], '.0f')} |")
            lines.append("")
    lines += _section_table(
        rows, "real", "## Real ReLU outputs (zoo models, random-init weights, realistic images)",
        ["layer", "N", "dtype", "x", "zeros", "sparse us",
         "dense us (fp32: ours_highest, xla_highest, ours_default, xla_default; else ours, xla)", "XLA/sparse",
         "best dense/sparse", "max rel err"], _real_line)
    lines += _section_table(
        rows, "pool", "## Fused conv + ReLU + max-pool",
        ["layer", "N", "dtype", "pool", "zeros", "sparse_pool us", "XLA conv+reduce_window us", "ours unfused us",
         "ours dense fused us", "XLA/sparse_pool", "max rel err"], _pool_line)
    return "\n".join(lines) + "\n"



def _section_table(rows: list[dict], section: str, title: str, columns: list[str],
                   line: Callable[[dict], str]) -> list[str]:
    """The report section of the rows of one section: its title and a table, a line per row (no
    such rows: nothing)."""
    sel = [r for r in rows if r["section"] == section]
    return [title, "", *table_head(columns), *map(line, sel), ""] if sel else []


def _real_line(r: dict) -> str:
    dense = ", ".join(_t(v) for k, v in r["timings"].items() if k != "sparse")
    return (f"| {r['layer']} | {r['n']} | {r['dtype']} | {'x'.join(map(str, r['x']))} | {r['sparsity']:.1%} "
            f"| {_t(r['timings']['sparse'])} | {dense} | {_f(r['speedup_vs_xla'])} "
            f"| {_f(r['speedup_vs_best_dense'])} | {_f(r['max_rel_err_vs_xla'], '.1e')} |")


def _pool_line(r: dict) -> str:
    t = r["timings"]
    xla = t.get("xla_highest") or t.get("xla") or {}
    p = r["pool"]
    return (f"| {r['layer']} | {r['n']} | {r['dtype']} | {p['window'][0]}x{p['window'][1]}/{p['stride'][0]} "
            f"| {r['sparsity']:.1%} ({r['sparsity_kind']}) | {_t(t['sparse_pool'])} | {_t(xla)} "
            f"| {_t(t.get('ours_dense_unfused', {'error': 1}))} | {_t(t['ours_dense_fused']) if 'ours_dense_fused' in t else '-'} "
            f"| {_f(r['speedup_vs_xla'])} | {_f(r['max_rel_err_vs_xla'], '.1e')} |")
def summary(rows: list[dict]) -> list[str]:
    out = []
    syn = [r for r in rows if r["section"] == "synthetic" and r["speedup_vs_xla_at_90"] is not None]
    for dtype in ("fp32", "bf16", "fp16"):
        for n in sorted({r["n"] for r in syn if r["dtype"] == dtype}):
            sel = [r for r in syn if r["dtype"] == dtype and r["n"] == n]
            spd = np.array([r["speedup_vs_xla_at_90"] for r in sel])
            cross = [r["crossover"].get("vs_best_dense") for r in sel]
            met = f" (goal >= {GOAL_SPEEDUP}x: {int((spd >= GOAL_SPEEDUP).sum())}/{len(spd)} layers)" if dtype == "fp32" else ""
            out.append(f"- {dtype} N={n}: XLA{' HIGHEST' if dtype == 'fp32' else ''}/sparse at 90% zeros "
                       f"median {np.median(spd):.2f}x (min {spd.min():.2f}, max {spd.max():.2f}){met}; crossover vs "
                       f"best dense: " + ", ".join(f"{r['layer'].split('/')[-1]} {_f(c, '.0%') if c is not None else 'never'}"
                                                   for r, c in zip(sel, cross)))
    real = [r for r in rows if r["section"] == "real" and r["speedup_vs_best_dense"] is not None]
    for model in sorted({r["layer"].split("/")[0] for r in real}):
        sel = [r for r in real if r["layer"].startswith(model + "/")]
        wins = sum(r["speedup_vs_best_dense"] > 1 for r in sel)
        out.append(f"- real {model}: zeros {min(r['sparsity'] for r in sel):.0%}-{max(r['sparsity'] for r in sel):.0%}; "
                   f"sparse beats the best dense on {wins}/{len(sel)} layer runs")
    pools = [r for r in rows if r["section"] == "pool" and r["speedup_vs_xla"] is not None]
    for r in pools:
        if r["layer"] == "vgg19/conv1_2" and r["n"] == 64 and r["dtype"] == "bf16":
            out.append(f"- fused headline VGG conv1_2 N=64 bf16 at {r['sparsity']:.0%} zeros: XLA/sparse_pool "
                       f"{r['speedup_vs_xla']:.2f}x (goal >= {POOL_GOAL_HEADLINE}x: "
                       f"{'met' if r['speedup_vs_xla'] >= POOL_GOAL_HEADLINE else 'not met'})")
    if pools:
        spd = np.array([r["speedup_vs_xla"] for r in pools])
        out.append(f"- fused pool rows: XLA/sparse_pool median {np.median(spd):.2f}x (min {spd.min():.2f}); "
                   f">= {POOL_GOAL_ALL}x on {int((spd >= POOL_GOAL_ALL).sum())}/{len(spd)}")
    bad = [r for r in rows if not r["ok"]]
    out.append(f"- {len(rows) - len(bad)}/{len(rows)} rows ok" + (
        "; failing: " + ", ".join(f"{r['section']}:{r['layer']}:N{r['n']}:{r['dtype']}" for r in bad[:10]) if bad else ""))
    return out or ["- no rows"]


def write_reports(out: Path, stem: str, env: dict, rows: list[dict], args) -> str:
    return write_report(out, stem, dict(environment=env, rows=rows, args=vars_(args)), render(env, rows, args),
                        default=str)


def vars_(args) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--label", default="sparse")
    p.add_argument("--batches", type=int_list)
    p.add_argument("--dtypes", type=str_list)
    p.add_argument("--models", type=str_list, help="synthetic layer shapes from (default vgg19,alexnet)")
    p.add_argument("--real-models", type=str_list, help="real ReLU inputs from (default vgg19,alexnet,resnet50)")
    p.add_argument("--layers", type=str_list, help="synthetic layer name prefixes, e.g. vgg19/conv3")
    p.add_argument("--sparsities", type=lambda s: tuple(float(v) for v in s.split(",")))
    p.add_argument("--sections", type=str_list, default=["synthetic", "real", "pool"])
    p.add_argument("--pool-layers", type=str_list, help="pooled layer name prefixes")
    p.add_argument("--pool-batches", type=int_list)
    p.add_argument("--iters", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a few minutes on an H200 (see the top)")
    p.add_argument("--store-crossovers", action="store_true", help="write crossovers to the dispatch table")
    p.add_argument("--crossover-cache", type=Path, help="dispatch table path (default: its default)")
    p.add_argument("--db", type=Path, help="also record real-input sparsity (and stored crossovers) in this SQLite store")
    args = p.parse_args(argv)
    q = args.quick
    args.batches = args.batches or [1, 64]
    args.dtypes = args.dtypes or ["fp32", "bf16"]
    check_dtypes(p, args.dtypes)
    args.models = args.models or ["vgg19", "alexnet"]
    args.real_models = args.real_models or (["vgg19"] if q else ["vgg19", "alexnet", "resnet50"])
    args.sparsities = args.sparsities or (QUICK_SPARSITIES if q else DEFAULT_SPARSITIES)
    if any(not 0 <= s <= 1 for s in args.sparsities):
        p.error("--sparsities must be in [0, 1]")
    args.layers = args.layers or (list(QUICK_LAYERS) if q else None)
    timing_defaults(args, q, quick_iters=5)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    spec = lookup_gpu_spec()
    env = environment(spec)
    stem = dated_stem(args.label)
    rows: list[dict] = []
    write_reports(args.out, stem, env, rows, args)  # fail early on a bad --out

    def add(row):
        rows.append(row)
        status = "ok" if row["ok"] else "FAIL"
        extra = row.get("speedup_vs_xla_at_90") or row.get("speedup_vs_xla")
        print(f"[{row['section']}] {row['layer']:<22} N={row['n']:<3} {row['dtype']:<4} XLA/sparse "
              f"{_f(extra)} {status}", flush=True)
        write_reports(args.out, stem, env, rows, args)

    if "synthetic" in args.sections:
        for model in args.models:
            for n in args.batches:
                layers = unique_layers(conv_layers(model, n))
                if args.layers:
                    layers = [l for l in layers if any(l["name"].startswith(k) for k in args.layers)]
                for layer in layers:
                    for dtype in args.dtypes:
                        add(synthetic_row(layer, n, dtype, args.sparsities, args, spec))
    if "real" in args.sections:
        for model in args.real_models:
            for n in ([1] if args.quick else args.batches):
                for dtype in args.dtypes:
                    measured = []
                    for i, (layer, x) in enumerate(real_activations(model, n, DTYPES[dtype], args.seed)):
                        add(real_row(layer, x, dtype, args))
                        measured.append(sparse_dispatch.LayerSparsity(
                            i, layer["name"], layer["x"], layer["w"], layer["stride"], layer["padding"],
                            rows[-1]["sparsity"]))
                    if args.db:
                        from jaxcnn.store import Store

                        with Store(args.db) as store:
                            sparse_dispatch.record_sparsity(store, model, measured, batch=n, dtype=DTYPES[dtype],
                                                            note="bench_sparse real ReLU inputs")
    if "pool" in args.sections:
        acts_memo: dict[tuple, dict] = {}

        def real_input(name, n, dt):
            """The layer's real input at batch n (computed at N=1 and tiled in --quick)."""
            model, n_run = name.split("/")[0], 1 if args.quick else n
            key = (model, n_run, jnp.dtype(dt).name)
            if key not in acts_memo:
                acts_memo.clear()  # one model's activations at a time
                acts_memo[key] = {l["name"]: a for l, a in real_activations(model, n_run, dt, args.seed)}
            x = acts_memo[key].get(name)
            return None if x is None else jnp.tile(x, (-(-n // x.shape[0]), 1, 1, 1))[:n]

        pooled = [l for m in ("vgg19", "alexnet") for l in conv_layers(m, 1) if l["pool"]]
        if args.pool_layers:
            pooled = [l for l in pooled if any(l["name"].startswith(k) for k in args.pool_layers)]
            jobs = [(l["name"], n, d) for l in pooled for n in (args.pool_batches or args.batches)
                    for d in args.dtypes]
        elif args.quick:
            jobs = [("vgg19/conv1_2", 64, "bf16")]
        else:
            jobs = [(l["name"], n, d) for l in pooled for n in (args.pool_batches or args.batches)
                    for d in args.dtypes]
        levels = (0.9,) if args.quick else (0.0, 0.5, 0.9)
        for name, n, dtype in jobs:
            layer = next(l for l in pooled if l["name"] == name)
            dt = DTYPES[dtype]
            x_shape = (n, *layer["x"][1:])
            for s in levels:
                x = sparse_dispatch.sparse_input(jax.random.PRNGKey(args.seed + 11), x_shape, s, dt)
                add(pool_row(layer, n, dtype, f"{s:.0%} synthetic", x, args))
            x = real_input(name, n, dt)
            if x is not None:
                add(pool_row(layer, n, dtype, "real", x, args))
    markdown = write_reports(args.out, stem, env, rows, args)
    return final_status(markdown, rows)


if __name__ == "__main__":
    sys.exit(main())
