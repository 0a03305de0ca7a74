#!/usr/bin/env python3
"""A/B of optimize's conv policy on a model, in one process: the unmodified model, and
jaxcnn.optimize(fuse="auto") with (a) policy "auto", (b) every conv the Hopper wgmma kernel
takes on it, (c) XLA's convs wherever the wgmma kernel takes a conv. Device time (profiler kernel sums), median [p10-p90] over --iters calls, each
variant timed in the same trace, --reps times. Prints markdown rows.

  python scripts/bench_conv_policy.py --model linen_vgg19 --batches 1,64
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

import jaxcnn  # noqa: E402
from benchmarks import thirdparty_models as tm  # noqa: E402
from jaxcnn.optimize import policy as rewrite  # noqa: E402  (the conv rules)
from jaxcnn.profile import device_times  # noqa: E402


def wgmma_takes(site) -> bool:
    return bool(rewrite.unpooled_plan(site, "wgmma"))


def wgmma_everywhere(site):
    return "wgmma" if wgmma_takes(site) else rewrite.auto_policy(site)


def xla_3x3(site):
    if site.op == "conv2d" and wgmma_takes(site):
        return None
    return rewrite.auto_policy(site)


POLICIES = (("auto", "auto"), ("wgmma_everywhere", wgmma_everywhere), ("xla_3x3", xla_3x3))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="linen_vgg19")
    p.add_argument("--batches", type=lambda s: [int(v) for v in s.split(",")], default=[1, 64])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args()
    print("| model | N | rep | variant | rewrites | device ms [p10-p90] | original / variant |")
    print("|---|---|---|---|---|---|---|")
    for n in args.batches:
        m = tm.build(args.model, batch=n, dtype=jax.numpy.bfloat16)
        fns, rewrites = [("original", jax.jit(m.apply), (m.params, m.x))], {"original": "-"}
        for label, policy in POLICIES:
            opt = jaxcnn.optimize(m.apply, policy=policy, fuse="auto")
            ops = [r.op for r in opt.rewrites(m.params, m.x)]
            rewrites[label] = ", ".join(f"{ops.count(op)} {op}" for op in sorted(set(ops)))
            fns.append((label, jax.jit(opt), (m.params, m.x)))
        for rep in range(args.reps):
            times = device_times(fns, iters=args.iters, warmup=5)
            base = times["original"].median_ms
            for label, t in times.items():
                print(f"| {args.model} | {n} | {rep} | {label} | {rewrites[label]} | {t.median_ms:.3f} "
                      f"[{t.p10_ms:.3f}-{t.p90_ms:.3f}] | {base / t.median_ms:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
