"""Buffer planning of every zoo model: inference and a training step (SGD on softmax
cross-entropy), for each batch size, on both buffer sources (the jaxpr's intermediates and XLA's
compiled HLO buffers). Per row: naive, greedy-by-size (TFLite), best-fit decreasing (XLA-style),
pack_2d (ours), the live-bytes lower bound, XLA's temp (and temp + output) from
memory_analysis, and planning seconds. Writes OUT/LABEL-planner_zoo.{md,json}; with --db, every
plan (buffers with lifetimes and offsets, per algorithm and XLA's) goes into the store.

    nice python scripts/plan_zoo.py --out benchmarks/results                 # CPU, label cpu-DATE
    python scripts/plan_zoo.py --out DIR --label h200-2026-11-21 --db plans.sqlite   # on a GPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import traceback
from pathlib import Path

import jax

from jaxcnn.models import list_models
from jaxcnn.memory.packing import MIB
from jaxcnn.memory.report import BOUND_GOAL, NAIVE_GOAL, SOURCES, plan_model, store_plan, to_record

ALGOS = ("naive", "greedy_by_size", "best_fit_decreasing", "pack_2d")


def _mib(v) -> str:
    return "-" if v is None else f"{v / MIB:.2f}"


def markdown(records: list[dict], failures: list[dict], args, seconds: float) -> str:
    lines = [
        f"# Buffer planner on the zoo ({args.label})",
        "",
        f"Device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}, "
        f"dtype {args.dtype}, backend {args.backend}, alignment 256 B for the planners. "
        f"Command: `python scripts/plan_zoo.py {' '.join(sys.argv[1:])}` ({seconds:.0f} s).",
        "",
        "Sources: **jaxpr** = intermediates of the traced program (inputs/outputs excluded), "
        "compared with XLA's temp size; **hlo** = XLA's compiled ENTRY buffers with in-place "
        "operand sharing, temps + outputs (outputs live from their definition, as XLA lets temps "
        "use an output's bytes before it is written), compared with XLA's temp + output size. "
        "`temp bound/XLA temp` is the bound of the hlo temps alone over XLA's temp size (above 1 "
        "where XLA put temps into output allocations); `XLA peak` is memory_analysis' "
        "peak_memory (all allocations). MiB columns; `ours/bound` = pack_2d over "
        "the lower bound; goals: ours <= "
        f"{BOUND_GOAL}x bound, <= every peer, <= {NAIVE_GOAL:.2f}x naive.",
        "",
    ]
    for source in SOURCES:
        rows = [r for r in records if r["source"] == source]
        if not rows:
            continue
        xla_col = "XLA temp" if source == "jaxpr" else "XLA temp+out"
        lines += [
            f"## source: {source}",
            "",
            "| model | mode | batch | buffers | naive | greedy | best-fit | ours | bound | ours/bound "
            f"| ours/naive | {xla_col} | ours/XLA | temp bound/XLA temp | XLA peak | ours s | winner "
            "| goals |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in rows:
            ours, bound, xla = r["pack_2d"], r["lower_bound"], r["xla_bytes"]
            temp = r["xla_memory"].get("temp_size_in_bytes")
            missed = [k for k, ok in r["goals"].items() if not ok]
            lines.append(
                f"| {r['model']} | {r['mode']} | {r['batch']} | {r['n_buffers']} | "
                + " | ".join(_mib(r[a]) for a in ALGOS)
                + f" | {_mib(bound)} | {ours / bound if bound else 1:.4f} | "
                f"{ours / r['naive'] if r['naive'] else 0:.3f} | {_mib(xla)} | "
                f"{ours / xla if xla else float('nan'):.3f} | "
                + (f"{r['temp_bound'] / temp:.3f}" if r["temp_bound"] is not None and temp else "-")
                + f" | {_mib(r['xla_memory'].get('peak_memory_in_bytes'))}"
                + f" | {r['pack_2d_seconds']:.2f} | {r['winner']} | "
                + ("all met" if not missed else "missed: " + ", ".join(missed)) + " |"
            )
        lines.append("")
    if failures:
        lines += ["## not planned", ""]
        lines += [f"- {f['model']} {f['mode']} batch {f['batch']}: {f['error']}" for f in failures]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results", help="directory for the .md and .json")
    parser.add_argument("--label", default=None, help="file prefix (default: <platform>-<date>)")
    parser.add_argument("--models", default=",".join(list_models()))
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--backend", default="xla", choices=("xla", "jaxcnn"))
    parser.add_argument("--db", default=None, help="also record every plan in this store")
    args = parser.parse_args(argv)
    args.label = args.label or f"{jax.default_backend()}-{datetime.date.today().isoformat()}"
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in list_models()]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {list_models()}")
    modes = [m for m in args.modes.split(",") if m]
    if not set(modes) <= {"inference", "training"}:
        parser.error("--modes takes inference and/or training")
    batches = [int(b) for b in args.batches.split(",") if b]

    store = None
    if args.db:
        from jaxcnn.store import Store

        store = Store(args.db)
    records, failures, start = [], [], time.perf_counter()
    for model in models:
        for mode in modes:
            for batch in batches:
                t0 = time.perf_counter()
                try:
                    plan = plan_model(model, batch, train=mode == "training", dtype=args.dtype,
                                      backend=args.backend)
                except Exception as err:  # keep going: one model's failure is a row of the report
                    traceback.print_exc()
                    failures.append(dict(model=model, mode=mode, batch=batch, error=repr(err)[:300]))
                    continue
                rows = to_record(plan)
                records += rows
                if store is not None:
                    store_plan(store, plan, note=f"{args.label} {mode}")
                print(f"{model} {mode} b{batch}: {time.perf_counter() - t0:.1f} s; " + "; ".join(
                    f"{r['source']} ours/bound {r['pack_2d'] / r['lower_bound']:.4f}" if r["lower_bound"]
                    else r["source"] for r in rows), file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    if store is not None:
        store.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(label=args.label, device=jax.devices()[0].device_kind, platform=jax.default_backend(),
                jax=jax.__version__, dtype=args.dtype, backend=args.backend, seconds=round(seconds, 1),
                command=" ".join(sys.argv))
    (out / f"{args.label}-planner_zoo.json").write_text(
        json.dumps(dict(meta=meta, rows=records, failures=failures), indent=1, sort_keys=True))
    (out / f"{args.label}-planner_zoo.md").write_text(markdown(records, failures, args, seconds))
    print(f"wrote {out}/{args.label}-planner_zoo.md and .json ({seconds:.0f} s)", file=sys.stderr)
    return 0 if not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
