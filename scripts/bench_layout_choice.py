#!/usr/bin/env python3
"""Layout-choice benchmark: autotune + choose_chain on zoo models, then the chosen chain end to
end against all-NHWC jaxcnn and XLA.

For every model x batch x dtype:
  1. plan = jaxcnn.layouts.plan_model_layouts(costs="measured"): every conv candidate
     (layout x kernel family), XLA's conv, pools in each layout and the layout transforms are
     timed (device time, one trace per layer; cached in --cache), then the exact chain DP.
  2. nhwc = the same with layouts=("NHWC",) (best NHWC kernel per layer; from the cache).
  3. One profiler trace times, end to end (device time per forward): the chosen plan
     (apply_plan), the all-NHWC plan, jaxcnn's default model (backend "jaxcnn", algorithm
     "auto") and XLA (backend "xla"). The plan's logits are checked against XLA's.
Writes bench_layout_choice.json (environment, plans, per-layer choices, end-to-end times) and
bench_layout_choice.md into --out after every case.

Exit status: 0 when every case ran and matched, 2 when some case failed, 1 on a crash.

  python scripts/bench_layout_choice.py --out /tmp/bench_lc
  python scripts/bench_layout_choice.py --out /tmp/bench_lc --models squeezenet1_1 --batches 64 --dtypes bf16
  JAX_PLATFORMS=cpu python scripts/bench_layout_choice.py --quick --out /tmp/smoke   # model costs
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import traceback
from pathlib import Path
from typing import Any

from bench_common import exit_with

import jax
import jax.numpy as jnp
import numpy as np

import jaxcnn
from jaxcnn import layouts
from jaxcnn.models import get_model
from jaxcnn.profile import device_times
from jaxcnn.profile.environment import collect_environment

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
JSON_NAME = "bench_layout_choice.json"
MD_NAME = "bench_layout_choice.md"
# Logits of the plan vs XLA: bf16 activations and TF32 tensor cores differ from XLA's own
# rounding by this much relative to the logits' scale.
TOLERANCE = {"float32": 2e-2, "bfloat16": 1e-1, "float16": 5e-2}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--models", default="squeezenet1_1,vgg16,mobilenetv2")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--iters", type=int, default=20, help="timed calls per layer candidate and per forward")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cache", help="autotune cache (default: OUT/autotune.json)")
    p.add_argument("--split-blocks", action="store_true", help="per-layer layouts inside blocks")
    p.add_argument("--quick", action="store_true", help="lenet5 and squeezenet1_1 at batch 2, fp32, 3 iters")
    return p.parse_args(argv)


def rel_diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def run_case(model: str, batch: int, dtype: str, args, cache: str, costs: str) -> dict[str, Any]:
    kw = dict(costs=costs, cache=cache, iters=args.iters, warmup=args.warmup, split_blocks=args.split_blocks)
    plan = layouts.plan_model_layouts(model, batch, dtype, **kw)
    nhwc = layouts.plan_model_layouts(model, batch, dtype, layouts=("NHWC",), **kw)
    spec = get_model(model)
    params = spec.init(0, dtype)
    x = jax.random.normal(jax.random.PRNGKey(1), spec.input_shape(batch), jnp.float32).astype(dtype)
    forwards = {
        "chosen": lambda p, x: layouts.apply_plan(plan, p, x),
        "all_nhwc": lambda p, x: layouts.apply_plan(nhwc, p, x),
        "jaxcnn_auto": lambda p, x: spec.apply(p, x, backend="jaxcnn"),
        "xla": lambda p, x: spec.apply(p, x, backend="xla"),
    }
    outputs = {name: jax.jit(fn)(params, x) for name, fn in forwards.items()}
    diffs = {name: rel_diff(out, outputs["xla"]) for name, out in outputs.items() if name != "xla"}
    timings = device_times([(name, fn, (params, x)) for name, fn in forwards.items()],
                           iters=args.iters, warmup=args.warmup)
    e2e = {name: dict(median_ms=t.median_ms, p10_ms=t.p10_ms, p90_ms=t.p90_ms,
                      is_device_time=t.is_device_time, method=t.method, note=t.note)
           for name, t in timings.items()}
    ok = all(d <= TOLERANCE[dtype] for d in diffs.values())
    return dict(
        model=model, batch=batch, dtype=dtype, ok=ok, costs=costs, rel_diff_vs_xla=diffs,
        predicted=dict(plan_ms=plan.total_ms, all_nhwc_ms=plan.all_nhwc_ms, xla_sum_ms=plan.xla_ms,
                       speedup_vs_nhwc=plan.speedup_vs_nhwc),
        end_to_end=e2e,
        layouts={lay: plan.layouts.count(lay) for lay in layouts.LAYOUTS},
        transforms=len(plan.transforms),
        plan=plan.to_dict(), explain=plan.explain(),
    )


def markdown(env: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Layout choice: chosen chain vs all-NHWC jaxcnn vs XLA",
        "",
        f"GPU: {env.get('gpu_name') or 'none (model costs)'}; jax {env.get('jax_version')}; "
        f"jaxcnn {env.get('jaxcnn_version')}; {env.get('extra', {}).get('date_utc')}",
        "",
        "End-to-end device time per forward (ms, median). `pred` = the DP's predicted total "
        "(sum of per-layer kernel times + transforms); NHWC/NCHW/CHWN = chain nodes per layout.",
        "",
        "| model | N | dtype | chosen | all-NHWC | jaxcnn auto | XLA | chosen vs NHWC | chosen vs XLA | pred chosen | pred NHWC | NHWC/NCHW/CHWN | transforms | max rel diff | ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['batch']} | {r['dtype']} | error: {r['error'][:80]} |" + " |" * 12)
            continue
        e = {k: v["median_ms"] for k, v in r["end_to_end"].items()}
        lay = r["layouts"]
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['dtype']} | {e['chosen']:.3f} | {e['all_nhwc']:.3f} | "
            f"{e['jaxcnn_auto']:.3f} | {e['xla']:.3f} | {e['all_nhwc'] / e['chosen']:.2f}x | "
            f"{e['xla'] / e['chosen']:.2f}x | {r['predicted']['plan_ms']:.3f} | "
            f"{(r['predicted']['all_nhwc_ms'] or float('nan')):.3f} | "
            f"{lay['NHWC']}/{lay['NCHW']}/{lay['CHWN']} | {r['transforms']} | "
            f"{max(r['rel_diff_vs_xla'].values()):.1e} | {'yes' if r['ok'] else 'NO'} |")
    wall = [f"{r['model']} N={r['batch']} {r['dtype']}" for r in rows if "end_to_end" in r
            and not all(t["is_device_time"] for t in r["end_to_end"].values())]
    if wall:
        lines += ["", f"Host wall time, not device time (no GPU kernel trace): {', '.join(wall)}."]
    lines += ["", "## Plans", ""]
    for r in rows:
        if "explain" in r:
            lines += ["```", r["explain"], "```", ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models, batches, dtypes = args.models.split(","), [int(b) for b in args.batches.split(",")], args.dtypes.split(",")
    if args.quick:
        models, batches, dtypes, args.iters, args.warmup = ["lenet5", "squeezenet1_1"], [2], ["fp32"], 3, 1
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        print(f"unknown dtypes {unknown}; use {', '.join(DTYPES)}", file=sys.stderr)
        return 1
    cache = args.cache or str(out / "autotune.json")
    costs = "measured" if jaxcnn.cuda_available() else "model"
    if costs == "model":
        print(f"no CUDA kernels ({jaxcnn.cuda_unavailable_reason()}): model costs, host timings",
              file=sys.stderr)
    env = collect_environment()
    rows: list[dict[str, Any]] = []
    for model, batch, dt in itertools.product(models, batches, dtypes):
        dtype = DTYPES[dt]
        print(f"== {model} N={batch} {dtype}", file=sys.stderr, flush=True)
        try:
            row = run_case(model, batch, dtype, args, cache, costs)
            e = row["end_to_end"]
            print(f"   chosen {e['chosen']['median_ms']:.3f} ms, all-NHWC {e['all_nhwc']['median_ms']:.3f}, "
                  f"XLA {e['xla']['median_ms']:.3f}; layouts {row['layouts']}", file=sys.stderr, flush=True)
        except Exception as err:  # keep going: one failing case must not lose the others
            row = dict(model=model, batch=batch, dtype=dtype, ok=False, error=f"{type(err).__name__}: {err}",
                       traceback=traceback.format_exc())
            print(row["traceback"], file=sys.stderr)
        rows.append(row)
        (out / JSON_NAME).write_text(json.dumps(dict(environment=env, rows=rows), indent=1, default=str))
        (out / MD_NAME).write_text(markdown(env, rows))
    print(f"wrote {out / JSON_NAME} and {out / MD_NAME}", file=sys.stderr)
    return 0 if all(r.get("ok") for r in rows) else 2


if __name__ == "__main__":
    exit_with(main)
