"""jaxcnn.fold_weights (one batched launch) vs XLA's jnp fold (a fusion per weight) on the weight
sets of real CNNs: every conv's fp32 weights scaled per output channel (inference BatchNorm),
cast to bf16 and laid out as the convs read them, biases cast alongside.

Layouts: "hwio" (no permutation: the layout jaxcnn's kernels read) and "ohwi" (XLA's NHWC
16-bit convs). Device time (median of synced calls), bytes moved (fp32 in + bf16 out) and % of
the bandwidth floor.

  python scripts/bench_weight_fold.py --out DIR [--models resnet50,mobilenetv2] [--quick]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import bench_common as bc
import jax
import jax.numpy as jnp
import numpy as np

import jaxcnn

LAYOUTS = {"hwio": (0, 1, 2, 3), "ohwi": (3, 0, 1, 2)}


def resnet50_weights() -> list[tuple[int, int, int, int]]:
    """HWIO shapes of ResNet-50's 53 convs (stem, bottlenecks with their projections)."""
    shapes = [(7, 7, 3, 64)]
    cin = 64
    for mid, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(1, 1, cin, mid), (3, 3, mid, mid), (1, 1, mid, 4 * mid)]
            if b == 0:
                shapes.append((1, 1, cin, 4 * mid))
            cin = 4 * mid
    return shapes


def mobilenetv2_weights() -> list[tuple[int, int, int, int]]:
    """HWIO shapes of MobileNetV2's convs (depthwise as H, W, 1, C), width 1.0."""
    shapes = [(3, 3, 3, 32)]
    cin = 32
    for t, c, n in ((1, 16, 1), (6, 24, 2), (6, 32, 3), (6, 64, 4), (6, 96, 3), (6, 160, 3), (6, 320, 1)):
        for _ in range(n):
            mid = cin * t
            if t != 1:
                shapes.append((1, 1, cin, mid))
            shapes += [(3, 3, 1, mid), (1, 1, mid, c)]
            cin = c
    return shapes + [(1, 1, 320, 1280)]


MODELS = {"resnet50": resnet50_weights, "mobilenetv2": mobilenetv2_weights}


def fold_case(shapes, perm, seed: int = 0):
    """(jaxcnn fn, XLA fn, args, bytes moved) of one model's fold."""
    rng = np.random.default_rng(seed)
    ws = [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes]
    ss = [jnp.asarray(rng.uniform(0.5, 1.5, s[3]), jnp.float32) for s in shapes]
    bs = [jnp.asarray(rng.standard_normal(s[3]), jnp.float32) for s in shapes]
    n = len(shapes)

    def ours(ws, ss, bs):
        return jaxcnn.fold_weights(ws, ss, [3] * n, [perm] * n, [jnp.bfloat16] * n, bs, [jnp.bfloat16] * n)

    def xla(ws, ss, bs):
        return ([jnp.transpose((w * s).astype(jnp.bfloat16), perm) for w, s in zip(ws, ss)]
                + [b.astype(jnp.bfloat16) for b in bs])

    elements = sum(int(np.prod(s)) for s in shapes)
    vectors = sum(s[3] for s in shapes)
    moved = elements * (4 + 2) + vectors * (4 + 4 + 2)  # weights fp32 -> bf16; scale + bias in, bias out
    return ours, xla, (ws, ss, bs), moved


def row(model: str, layout: str, iters: int, warmup: int) -> dict:
    ours, xla, args, moved = fold_case(MODELS[model](), LAYOUTS[layout])
    got = jax.jit(ours)(*args)
    want = jax.jit(xla)(*args)
    exact = all(np.array_equal(np.asarray(g).view(np.uint16), np.asarray(r).view(np.uint16)) for g, r in zip(got, want))
    timings = bc.timed([("jaxcnn", ours, args), ("xla", xla, args)], iters, warmup)
    out = dict(model=model, layout=layout, convs=len(MODELS[model]()), bytes=moved, exact=exact, timings=timings,
               ok=exact and all("median_ms" in t for t in timings.values()))
    floor_ms = moved / bc.FLOOR_BANDWIDTH * 1e3
    for name, t in timings.items():
        if "median_ms" in t:
            out[f"{name}_pct_floor"] = 100 * floor_ms / t["median_ms"]
            out[f"{name}_tb_s"] = moved / (t["median_ms"] * 1e-3) / 1e12
    return out


def markdown(env: dict, rows: list[dict]) -> str:
    lines = bc.report_header("# Weight fold: jaxcnn.fold_weights vs XLA's jnp fold", env, rows) + [
        "- per model: every conv's fp32 weights x per-output-channel factors -> bf16 in the layout, biases -> bf16;"
        " one fold_weights call vs XLA's fusion per weight. Times: device time, median us.",
        f"- % floor = (bytes moved / {bc.FLOOR_BANDWIDTH / 1e12:.2f} TB/s) / median; exact = bit-identical outputs.",
        "",
        bc.table_row(["model", "layout", "convs", "MB moved", "jaxcnn us", "XLA us", "XLA / jaxcnn",
                      "jaxcnn TB/s (% floor)", "XLA TB/s (% floor)", "exact", "jaxcnn kernels"]),
        bc.table_row(["---"] * 11),
    ]
    for r in rows:
        t = r["timings"]
        ratio = (t["xla"]["median_ms"] / t["jaxcnn"]["median_ms"]
                 if all("median_ms" in t[k] for k in ("xla", "jaxcnn")) else None)
        lines.append(bc.table_row([
            r["model"], r["layout"], str(r["convs"]), f"{r['bytes'] / 1e6:.1f}",
            bc.us(t["jaxcnn"]), bc.us(t["xla"]), bc.fmt(ratio, ".2f"),
            f"{bc.fmt(r.get('jaxcnn_tb_s'), '.2f')} ({bc.fmt(r.get('jaxcnn_pct_floor'), '.0f')}%)",
            f"{bc.fmt(r.get('xla_tb_s'), '.2f')} ({bc.fmt(r.get('xla_pct_floor'), '.0f')}%)",
            "yes" if r["exact"] else "NO", bc.top_kernels(t["jaxcnn"], 2)]))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--models", type=bc.csv_of(MODELS, "model"), default=list(MODELS))
    p.add_argument("--layouts", type=bc.csv_of(LAYOUTS, "layout"), default=list(LAYOUTS))
    p.add_argument("--quick", action="store_true", help="a smoke test: few timed calls")
    bc.add_timing_options(p)
    args = p.parse_args(argv)
    bc.timing_defaults(args, args.quick)
    env = bc.environment(None)
    stem = bc.dated_stem("weight_fold")
    jobs = [lambda m=m, lay=lay: row(m, lay, args.iters, args.warmup) for m in args.models for lay in args.layouts]

    def progress(r):
        return f"{r['model']} {r['layout']}: {bc.variant_times(r['timings'], {'jaxcnn': 'jaxcnn', 'xla': 'xla'})}"

    return bc.run_rows(jobs, progress, lambda rows: bc.write_report(args.out, stem, dict(env=env, rows=rows),
                                                                      markdown(env, rows)))


if __name__ == "__main__":
    bc.exit_with(main)
