#!/usr/bin/env python3
"""Data-parallel inference of jaxcnn.optimize'd SqueezeNet 1.1 and VGG-19 (written in Flax linen,
benchmarks/thirdparty_models.py) on 1 GPU vs all visible GPUs: params replicated, the batch
sharded with NamedSharding over a 1-D "data" mesh, one jit of the optimized function.

Two scalings per model and dtype (default bf16, 224x224):
  - weak:   a fixed per-GPU batch (--per-gpu, default 64): global batch = per-GPU x GPUs;
  - strong: a fixed global batch (--global-batch, default 128) split over the GPUs.
Throughput, images/s:
  - device: global batch / (summed GPU kernel time of the call / GPU count), i.e. from the mean
    per-GPU busy time (jaxcnn.profile.device_times; all GPU planes of the trace are summed);
  - wall:   --wall-iters calls issued back to back, one sync at the end: global batch x iters / elapsed.
scaling = throughput on k GPUs / throughput on 1 GPU (goal: >= 1.9x on 2 GPUs, weak scaling).
Each compiled multi-GPU program is checked for collectives (all-gather, all-to-all,
collective-permute, all-reduce: data-parallel inference needs none) and its output against the
1-GPU result.

Writes <gpu>-<date>-multigpu.{json,md} into --out and prints the markdown. Exit status 0 when
every row ran, had no all-gather and matched; 2 otherwise.

  python scripts/bench_multigpu.py --out /tmp/mgpu
  python scripts/bench_multigpu.py --out /tmp/mgpu --quick
  XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \\
      python scripts/bench_multigpu.py --quick --out /tmp/smoke      (host devices: a smoke test)
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # benchmarks.thirdparty_models (and jaxcnn from a checkout)

from bench_common import (DTYPES, dated_stem, environment, final_status, fmt, int_list, str_list,  # noqa: E402
                          table_row, timing_defaults, write_report)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxcnn  # noqa: E402
from benchmarks import thirdparty_models as tm  # noqa: E402
from jaxcnn.profile import device_times  # noqa: E402
from jaxcnn.profile.gpu_specs import lookup_gpu_spec  # noqa: E402

TOLERANCE = {"bf16": 5e-2, "fp16": 1e-2, "fp32": 1e-3}  # k GPUs vs 1 GPU, max rel diff
COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce", "reduce-scatter")
GOAL_2GPU = 1.9


def run_config(name, dtype, n_devices, batch, iters, warmup, hw, policy="auto", fuse="auto",
               wall_iters=200) -> dict:
    """One (model, GPU count, global batch) point."""
    row = dict(model=name, dtype=dtype, gpus=n_devices, batch=batch, policy=policy, fuse=fuse, ok=False)
    try:
        m = tm.build(name, batch=batch, hw=hw, dtype=DTYPES[dtype])
        mesh = jax.make_mesh((n_devices,), ("data",), devices=jax.devices()[:n_devices])
        params = jax.device_put(m.params, NamedSharding(mesh, P()))
        x = jax.device_put(m.x, NamedSharding(mesh, P("data")))
        fast = jax.jit(jaxcnn.optimize(m.apply, policy=policy, fuse=fuse))
        hlo = fast.lower(params, x).compile().as_text()
        row["collectives"] = {c: hlo.count(c + "(") + hlo.count(c + "-start(") for c in COLLECTIVES
                              if c in hlo}
        row["all_gather"] = "all-gather" in hlo
        y = np.asarray(fast(params, x), np.float32)
        if n_devices > 1:  # the same call on one GPU
            one = jax.devices()[0]
            want = np.asarray(jax.jit(jaxcnn.optimize(m.apply, policy=policy, fuse=fuse))(jax.device_put(m.params, one),
                                                                  jax.device_put(m.x, one)), np.float32)
            row["max_rel_diff"] = float(np.max(np.abs(y - want)) / max(float(np.max(np.abs(want))), 1e-30))
        t = device_times([("optimized", fast, (params, x))], iters=iters, warmup=warmup)["optimized"]
        per_gpu_ms = t.median_ms / n_devices if t.is_device_time else t.median_ms
        row.update(device_ms=t.median_ms, per_gpu_busy_ms=per_gpu_ms, p10_ms=t.p10_ms, p90_ms=t.p90_ms,
                   is_device_time=t.is_device_time, method=t.method, note=t.note)
        row["images_per_s_device"] = batch / (per_gpu_ms / 1e3)
        jax.block_until_ready(fast(params, x))
        start = time.perf_counter()
        outs = [fast(params, x) for _ in range(wall_iters)]
        jax.block_until_ready(outs)
        row["wall_ms_per_call"] = (time.perf_counter() - start) / wall_iters * 1e3
        row["images_per_s_wall"] = batch / (row["wall_ms_per_call"] / 1e3)
        row["ok"] = not row["all_gather"] and row.get("max_rel_diff", 0.0) <= TOLERANCE[dtype]
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:500]
        row["traceback"] = traceback.format_exc()[-3000:]
    return row


def render_markdown(env, rows, args) -> str:
    lines = [
        "# Data-parallel inference: jaxcnn.optimize'd Flax models on 1 vs all GPUs",
        "",
        f"- device: {jax.device_count()} x {env['device_kind']} ({env.get('nvidia_smi') or 'no nvidia-smi'}); "
        f"jax {env['jax']}; {env['date_utc']}",
        f"- {args.hw}x{args.hw} images; params replicated, batch sharded (NamedSharding, mesh axis 'data');"
        f" {args.iters} device-timed calls and {args.wall_iters} wall-timed calls per point; jaxcnn.optimize(policy={args.policy!r}, fuse={args.fuse!r}).",
        "- device img/s: global batch / (summed GPU kernel time per call / GPUs); wall img/s: calls issued back"
        " to back, one sync at the end. scaling: vs the same model's 1-GPU row of that scaling kind.",
        f"- goal: weak scaling >= {GOAL_2GPU}x on 2 GPUs.",
        *(["- NO GPU TRACE on some rows: their 'device' columns are host wall time per synced call."]
          if any(not r.get("is_device_time", True) for r in rows) else []),
        "",
        "| model | dtype | scaling | GPUs | global batch | per-GPU busy ms | device img/s | wall img/s |"
        " scaling (device) | scaling (wall) | collectives | rel diff vs 1 GPU | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        coll = ", ".join(f"{k} {v}" for k, v in r.get("collectives", {}).items()) or "none"
        status = "ok" if r["ok"] else ("FAIL: " + r.get("error", "all-gather or mismatch"))[:100]
        lines.append(table_row([
            r["model"], r["dtype"], r["kind"], str(r["gpus"]), str(r["batch"]), fmt(r.get("per_gpu_busy_ms"), ".3f"),
            fmt(r.get("images_per_s_device"), ".0f"), fmt(r.get("images_per_s_wall"), ".0f"),
            fmt(r.get("scaling_device"), ".2f"), fmt(r.get("scaling_wall"), ".2f"), coll,
            fmt(r.get("max_rel_diff"), ".1e"), status]))
    lines += ["", "## Goal", ""]
    for r in rows:
        if r["kind"] == "weak" and r["gpus"] == 2 and "scaling_device" in r:
            met = min(r["scaling_device"], r.get("scaling_wall", 0.0)) >= GOAL_2GPU
            verdict = ("met" if met else "MISSED") if r.get("is_device_time") else "n/a (no GPU trace)"
            lines.append(f"- {r['model']} {r['dtype']} 2 GPUs: {r['scaling_device']:.2f}x device, "
                         f"{fmt(r.get('scaling_wall'), '.2f')}x wall (goal {GOAL_2GPU}x): {verdict}")
    if not any(r["gpus"] == 2 for r in rows):
        lines.append(f"- no 2-GPU row ({jax.device_count()} device(s) visible)")
    return "\n".join(lines) + "\n"


def write_reports(out: Path, stem: str, env, rows, args) -> str:
    return write_report(out, stem, dict(environment=env, rows=rows), render_markdown(env, rows, args))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--name", default="multigpu", help="report name: <gpu>-<date>-NAME.{md,json}")
    p.add_argument("--models", type=str_list, default=["linen_squeezenet1_1", "linen_vgg19"])
    p.add_argument("--dtypes", type=str_list, default=["bf16"])
    p.add_argument("--per-gpu", type=int, help="weak scaling: batch per GPU (default 64; --quick 16)")
    p.add_argument("--global-batch", type=int, help="strong scaling: global batch (default 128; --quick 32)")
    p.add_argument("--gpus", type=int_list,
                   help="GPU counts (default: 1 and every power of two up to all visible, and all)")
    p.add_argument("--hw", type=int, default=224)
    p.add_argument("--iters", type=int, help="default 20; --quick 5")
    p.add_argument("--warmup", type=int, help="default 3; --quick 1")
    p.add_argument("--policy", choices=["auto", "all", "autotune", "xla"], default="auto",
                   help="jaxcnn.optimize's policy (autotune: jaxcnn.layouts' measured choice per conv, XLA kept where "
                        "it wins; xla: the unmodified model, the baseline for the wall-time scaling)")
    p.add_argument("--wall-iters", type=int, help="calls issued back to back for the wall time (default 200; "
                                                   "--quick 10)")
    p.add_argument("--fuse", choices=["none", "auto", "all"], default="auto",
                   help="jaxcnn.optimize's fuse= (default auto: fire modules and conv->max-pool pairs where the "
                        "fusion planner measures them faster, as the 1-GPU optimize benchmark)")
    p.add_argument("--quick", action="store_true", help="smaller batches, fewer calls: ~2-3 min")
    args = p.parse_args(argv)
    bad = [m for m in args.models if m not in tm.MODELS] + [d for d in args.dtypes if d not in DTYPES]
    if bad:
        p.error(f"unknown models/dtypes {bad}")
    total = jax.device_count()
    args.gpus = args.gpus or sorted({1, total, *(2 ** i for i in range(total.bit_length()) if 2 ** i <= total)})
    if any(g < 1 or g > total for g in args.gpus):
        p.error(f"--gpus must be within 1..{total}")
    args.per_gpu = args.per_gpu or (16 if args.quick else 64)
    args.global_batch = args.global_batch or (32 if args.quick else 128)
    timing_defaults(args, args.quick, quick_iters=5)
    args.wall_iters = args.wall_iters or (10 if args.quick else 200)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    env = environment(lookup_gpu_spec())
    stem = dated_stem(args.name)
    rows: list[dict] = []
    for name in args.models:
        for dtype in args.dtypes:
            for kind in ("weak", "strong"):
                base = None
                for g in args.gpus:
                    batch = args.per_gpu * g if kind == "weak" else args.global_batch
                    if batch % g:
                        continue
                    t0 = time.time()
                    row = run_config(name, dtype, g, batch, args.iters, args.warmup, args.hw, args.policy,
                                     args.fuse, args.wall_iters)
                    row["kind"] = kind
                    if g == 1:
                        base = row
                    elif base is not None:
                        for key in ("device", "wall"):
                            if f"images_per_s_{key}" in row and f"images_per_s_{key}" in base:
                                row[f"scaling_{key}"] = row[f"images_per_s_{key}"] / base[f"images_per_s_{key}"]
                    rows.append(row)
                    print(f"{name:<22} {dtype} {kind:<6} GPUs={g} batch={batch:<4} device img/s "
                          f"{fmt(row.get('images_per_s_device'), '.0f')} wall img/s {fmt(row.get('images_per_s_wall'), '.0f')}"
                          f" scaling {fmt(row.get('scaling_device'), '.2f')}/{fmt(row.get('scaling_wall'), '.2f')} "
                          f"{'ok' if row['ok'] else 'FAIL ' + row.get('error', '')} ({time.time() - t0:.0f} s)", flush=True)
                    write_reports(args.out, stem, env, rows, args)
    markdown = write_reports(args.out, stem, env, rows, args)
    return final_status(markdown, rows, require_rows=True)


if __name__ == "__main__":
    sys.exit(main())
