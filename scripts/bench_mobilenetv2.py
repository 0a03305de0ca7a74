#!/usr/bin/env python3
"""MobileNetV2 end to end with the fusion plan (issue 7's straight conv -> depthwise chain).

For each batch (default 1 and 64), bf16, 224x224: the zoo model on XLA's ops vs
jaxcnn.fusion.plan_fusion's plan (cost model; each inverted residual's expand 1x1 + ReLU6 ->
depthwise 3x3 + ReLU6 as one jaxcnn.conv1x1_depthwise where it chose so) run by plan.apply.
Device time per forward (jaxcnn.profile.device_times: median, p10-p90), host wall latency per
synced call (median), kernels per call, and the logits' max abs difference relative to XLA's
largest logit. Writes OUTDIR/mobilenetv2_e2e.json and prints one JSON line per batch.

  python scripts/bench_mobilenetv2.py --out /tmp/mnv2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxcnn import fusion
from jaxcnn.models import get_model
from jaxcnn.profile import device_times

MODEL = "mobilenetv2"


def wall_ms(fn, args, iters: int) -> float:
    jitted = jax.jit(fn)
    jitted(*args).block_until_ready()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jitted(*args).block_until_ready()
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples) * 1e3)


def batch_row(batch: int, iters: int) -> dict:
    spec = get_model(MODEL)
    params = spec.init(0, "bfloat16")
    x = jax.random.normal(jax.random.PRNGKey(1), spec.input_shape(batch), jnp.float32)
    x = x.astype(jnp.bfloat16)
    plan = fusion.plan_fusion(MODEL, batch, "bfloat16", costs="model", cache=False)
    forwards = {"xla": lambda p, x: spec.apply(p, x, backend="xla"),
                "fusion": lambda p, x: plan.apply(p, x)}
    logits = {k: np.asarray(jax.jit(f)(params, x), np.float32) for k, f in forwards.items()}
    scale = max(float(np.max(np.abs(logits["xla"]))), 1e-30)
    timings = device_times([(k, f, (params, x)) for k, f in forwards.items()], iters=iters)
    wall = {k: wall_ms(f, (params, x), 30) for k, f in forwards.items()}
    return dict(
        model=MODEL, batch=batch, dtype="bf16",
        fused_groups=sum(d.choice == "fused" for d in plan.decisions),
        rel_diff=float(np.max(np.abs(logits["fusion"] - logits["xla"]))) / scale,
        device_ms={k: t.median_ms for k, t in timings.items()},
        device_p10_p90_ms={k: (t.p10_ms, t.p90_ms) for k, t in timings.items()},
        kernels_per_call={k: t.kernels_per_call for k, t in timings.items()},
        wall_ms=wall,
        device_speedup=timings["xla"].median_ms / timings["fusion"].median_ms,
        wall_speedup=wall["xla"] / wall["fusion"],
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", type=lambda s: [int(v) for v in s.split(",")], default=[1, 64])
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for batch in args.batches:
        rows.append(batch_row(batch, args.iters))
        print(json.dumps(rows[-1]))
    report = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, rows=rows)
    (args.out / "mobilenetv2_e2e.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
