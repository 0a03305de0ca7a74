#!/usr/bin/env python3
"""Memory-planning benchmark: donation savings, max-batch predictions vs verification and the
rematerialization table for zoo models, from XLA's compiled memory_analysis (nothing runs, so
it works the same on CPU and GPU; the numbers are those of the backend jax runs on).

Sections (each model x case; the report is rewritten after every case):
  donation   training step (--optimizer) at each --batches: footprint
             (argument + output - alias + temp) with jax.jit vs with jaxcnn.plan_donation's
             donate_argnums, alias_size_in_bytes, which arguments were donated;
  max_batch  inference and training step under --budget: the affine-fit prediction, the
             verified batch (footprint(n) <= budget < footprint(n + 1)), compiles, fit residual;
  remat      training step of each of --remat-models with a budget of
             --remat-fraction x the plain footprint: every candidate policy's recompute FLOPs,
             residual bytes, predicted and measured footprint, and the advice
             (--remat-models MODEL:BATCH,...).
Writes OUT/LABEL-memory_planning.json and .md; with --db also records every result as 'plan'
runs (metric names: jaxcnn/memory/records.py).

Exit status: 0 when every case ran, 2 when some case failed, 1 on a crash.

  python scripts/bench_memory_planning.py --out benchmarks/results --label h200-2026-11-21
  nice python scripts/bench_memory_planning.py --out /tmp/mp --label cpu --models lenet5,squeezenet1_1 \\
      --sections donation,max_batch --budget 1GiB
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parents[1]

try:
    import jaxcnn  # noqa: F401
except ImportError:  # run from a checkout that is not pip-installed
    sys.path.append(str(REPO_ROOT))

import jax

from jaxcnn.models import list_models
from jaxcnn.memory.batch import max_batch, parse_bytes
from jaxcnn.memory.donation import measure_donation
from jaxcnn.memory.remat import remat_advice
from jaxcnn.memory.training import train_step, training_args
from jaxcnn.profile.environment import collect_environment

SECTIONS = ("donation", "max_batch", "remat")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--label", required=True, help="file name prefix, e.g. h200-2026-11-21")
    p.add_argument("--models", default=",".join(list_models()))
    p.add_argument("--batches", default="1,64", help="donation section batches")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--optimizer", default="adam", choices=("adam", "sgd_momentum"))
    p.add_argument("--max-batch-models", help="models of the max_batch section (default: --models)")
    p.add_argument("--budget", default="8GiB", help="max_batch budget")
    p.add_argument("--limit", type=int, default=4096, help="largest batch max_batch considers")
    p.add_argument("--remat-models", default="lenet5:64,squeezenet1_1:8,mobilenetv2:8",
                   help="MODEL[:BATCH] list (batch defaults to --remat-batch)")
    p.add_argument("--remat-batch", type=int, default=8)
    p.add_argument("--remat-fraction", type=float, default=0.8)
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--db", help="also record the results in this store")
    args = p.parse_args(argv)
    args.sections = [s for s in args.sections.split(",") if s]
    bad = set(args.sections) - set(SECTIONS)
    if bad:
        p.error(f"unknown sections {sorted(bad)}; use {', '.join(SECTIONS)}")
    args.models = [m for m in args.models.split(",") if m]
    args.remat_models = [(m.split(":")[0], int(m.split(":")[1]) if ":" in m else args.remat_batch)
                         for m in args.remat_models.split(",") if m]
    args.max_batch_models = ([m for m in args.max_batch_models.split(",") if m] if args.max_batch_models
                             else args.models)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.budget_bytes = parse_bytes(args.budget)
    args.dtype = DTYPES[args.dtype]
    return args


def mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def donation_case(model: str, batch: int, args) -> dict[str, Any]:
    step = train_step(model, args.optimizer)
    savings = measure_donation(step, *training_args(model, batch, args.dtype, args.optimizer))
    plan = savings.plan
    return dict(
        model=model, batch=batch, donated=[d.label for d in plan.decisions if d.donated],
        kept={d.label: d.reason for d in plan.decisions if not d.donated},
        donated_bytes=plan.donated_bytes, alias_before=savings.before.get("alias_size_in_bytes", 0),
        alias_after=savings.alias_bytes, footprint_before=savings.peak_before, footprint_after=savings.peak_after,
        saved_bytes=savings.saved_bytes, temp_before=savings.before.get("temp_size_in_bytes"),
        temp_after=savings.after.get("temp_size_in_bytes"),
        xla_peak_before=savings.before.get("peak_memory_in_bytes"),
        xla_peak_after=savings.after.get("peak_memory_in_bytes"), _result=savings,
    )


def max_batch_case(model: str, train: bool, args) -> dict[str, Any]:
    kwargs = dict(train=train, dtype=args.dtype)
    if train:
        kwargs["optimizer"] = args.optimizer
    result = max_batch(model, args.budget_bytes, limit=args.limit, **kwargs)
    return dict(model=model, mode="train" if train else "inference", **result.as_dict(), _result=result)


def remat_case(model: str, batch: int, args) -> dict[str, Any]:
    plain = remat_advice(model, 2**62, batch=batch, dtype=args.dtype, optimizer=args.optimizer)
    budget = int(args.remat_fraction * plain.row("none").measured)
    advice = remat_advice(model, budget, batch=batch, dtype=args.dtype, optimizer=args.optimizer,
                          measure_all=True)
    return dict(model=model, batch=batch, budget_bytes=budget, chosen=advice.chosen,
                rows=[r.__dict__ for r in advice.rows], _result=advice)


def table_rows(results: list[dict], key: str, cells: Callable[[dict], list[str]]) -> list[str]:
    """A section's markdown table rows: the cells(r) of each result; one that failed, its model, its
    `key` column and its error, the other cells left empty."""
    return [f"| {r['model']} | {r[key]} | error: {r['error']} |||||||||" if "error" in r
            else "| " + " | ".join(cells(r)) + " |" for r in results]


def donation_cells(r: dict) -> list[str]:
    saved_pct = 100 * r["saved_bytes"] / r["footprint_before"]
    return [r["model"], str(r["batch"]), ", ".join(r["donated"]), mib(r["footprint_before"]),
            mib(r["footprint_after"]), mib(r["saved_bytes"]), f"{saved_pct:.1f}", str(r["alias_before"]),
            mib(r["alias_after"]), mib(r["donated_bytes"]), f"{mib(r['temp_before'])} / {mib(r['temp_after'])}"]


def max_batch_cells(r: dict) -> list[str]:
    fit = f"{r['fit_intercept'] / 2**20:.2f} + {r['fit_slope'] / 2**20:.3f}"
    verified = f"{r['batch']}{'' if r['verified'] else ' (unverified)'}"
    return [r["model"], r["mode"], str(r["predicted_batch"]), verified, str(r["predicted_batch"] - r["batch"]),
            mib(r["footprint"]), mib(r["next_footprint"]), fit, f"{100 * r['fit_max_relative_residual']:.2f}",
            str(r["compiles"]), f"{r['seconds']:.1f}"]


def markdown(env: dict, args, results: dict[str, list]) -> str:
    device = env["extra"]["device_kind"]
    lines = [
        f"# Memory planning: donation, max batch, rematerialization ({device})", "",
        f"jax {env['jax_version']}, backend {env['platform']}, dtype {args.dtype}, optimizer {args.optimizer}. "
        "Footprint = argument + output - alias + temp bytes of XLA's `compiled.memory_analysis()` "
        "(nothing runs). Generated by `scripts/bench_memory_planning.py`.", "",
    ]
    if env["platform"] == "cpu":
        lines += ["On CPU, XLA hands chains of convolutions to YNNPACK (`ynn_fusion` in the compiled HLO); "
                  "their intermediates live inside the library, outside XLA's buffer assignment, so "
                  "memory_analysis undercounts them (VGG-16 inference: 0.11 MiB temp at batch 1, where one "
                  "224x224x64 fp32 activation alone is 12.25 MiB). Footprints of such programs are lower "
                  "bounds. (XLA GPU allocates cuDNN workspaces as custom-call results, so it counts them.)", ""]
    if "donation" in args.sections:
        lines += ["## Donation (training step: params + optimizer state)", "",
                  "| model | batch | donated | footprint before MiB | after MiB | saved MiB | saved % | "
                  "alias before | alias after MiB | donated MiB | temp before / after MiB |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += table_rows(results["donation"], "batch", donation_cells)
        kept = {k: v for r in results["donation"] if "kept" in r for k, v in r["kept"].items()}
        if kept:
            lines += ["", "Kept: " + "; ".join(f"{k}: {v}" for k, v in sorted(kept.items())), ""]
    if "max_batch" in args.sections:
        lines += ["## Max batch under a budget", "",
                  f"Budget {args.budget} ({args.budget_bytes} bytes), limit {args.limit}. Probes at 1, 2, 4; "
                  "`verified` n has footprint(n) <= budget < footprint(n + 1) by compiling both.", "",
                  "| model | mode | predicted | verified | error | footprint at n MiB | at n+1 MiB | "
                  "fit MiB + MiB/img | fit residual % | compiles | seconds |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += table_rows(results["max_batch"], "mode", max_batch_cells)
        lines.append("")
    if "remat" in args.sections:
        lines += ["## Rematerialization advice (training step)", "",
                  f"Budget = {args.remat_fraction} x the plain step's footprint. predicted: program-order "
                  "live bytes of the jaxpr; pred. resid.: plain minus the residual bytes the policy stops "
                  "saving; measured: the compiled step. On CPU, XLA expands jax's optimization barriers "
                  "before a late CSE pass that merges the recomputation back into the forward pass, so "
                  "measured footprints there stay near `none` for most policies; the GPU pipeline removes "
                  "the barriers only after scheduling.", ""]
        for r in results["remat"]:
            if "error" in r:
                lines += [f"### {r['model']}: error: {r['error']}", ""]
                continue
            lines += [f"### {r['model']} batch {r['batch']}, budget {mib(r['budget_bytes'])} MiB: "
                      f"{'use ' + r['chosen'] if r['chosen'] else 'no candidate fits'}", "",
                      "| policy | recompute GFLOP | residual MiB | predicted MiB | pred. resid. MiB | "
                      "measured MiB | fits |",
                      "|---|---:|---:|---:|---:|---:|---|"]
            for row in r["rows"]:
                lines.append(
                    f"| {row['policy']}{' (chosen)' if row['policy'] == r['chosen'] else ''} | "
                    f"{row['recompute_flops'] / 1e9:.3f} | {mib(row['residual_bytes'])} | {mib(row['predicted'])} | "
                    f"{mib(row['predicted_residuals'])} | {mib(row['measured'])} | "
                    f"{'-' if row['fits'] is None else 'yes' if row['fits'] else 'no'} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def record(args, section: str, case: dict) -> None:
    from jaxcnn.memory import records
    from jaxcnn.store import Store

    with Store(args.db) as store:
        if section == "donation":
            records.record_donation(store, case["_result"], model=case["model"], batch=case["batch"], dtype=args.dtype,
                                    extra=dict(optimizer=args.optimizer))
        elif section == "max_batch":
            records.record_max_batch(store, case["_result"], model=case["model"], dtype=args.dtype,
                                     train=case["mode"] == "train", optimizer=args.optimizer)
        else:
            records.record_remat(store, case["_result"], dtype=args.dtype, optimizer=args.optimizer)


def rewrite_markdown(json_path: Path, argv) -> None:
    """Rebuild the markdown of a finished run from its JSON (after editing markdown())."""
    data = json.loads(json_path.read_text())
    args = parse_args(argv)
    json_path.with_suffix(".md").write_text(markdown(data["environment"], args, data["results"]))


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = collect_environment()
    results: dict[str, list] = {s: [] for s in SECTIONS}
    cases = []
    if "donation" in args.sections:
        cases += [("donation", m, lambda m=m, b=b: donation_case(m, b, args), dict(model=m, batch=b))
                  for m in args.models for b in args.batches]
    if "max_batch" in args.sections:
        cases += [("max_batch", m, lambda m=m, t=t: max_batch_case(m, t, args),
                   dict(model=m, mode="train" if t else "inference"))
                  for m in args.max_batch_models for t in (False, True)]
    if "remat" in args.sections:
        cases += [("remat", m, lambda m=m, b=b: remat_case(m, b, args), dict(model=m, batch=b))
                  for m, b in args.remat_models]
    failed = 0
    for section, model, run, ident in cases:
        start = time.perf_counter()
        try:
            case = run()
            case["seconds"] = time.perf_counter() - start
            if args.db:
                record(args, section, case)
        except Exception as err:  # one failing case must not lose the others
            traceback.print_exc()
            case = dict(ident, error=f"{type(err).__name__}: {str(err)[:200]}", seconds=time.perf_counter() - start)
            failed += 1
        status = f" ERROR {case['error']}" if "error" in case else ""
        print(f"[{section}] {model} {ident} {case['seconds']:.1f}s{status}", flush=True)
        results[section].append(case)
        public = {s: [{k: v for k, v in c.items() if not k.startswith("_")} for c in rs] for s, rs in results.items()}
        (out / f"{args.label}-memory_planning.json").write_text(json.dumps(
            dict(environment=env, settings=dict(dtype=args.dtype, optimizer=args.optimizer, budget=args.budget,
                                                limit=args.limit, remat_models=args.remat_models,
                                                remat_fraction=args.remat_fraction, backend=jax.default_backend()),
                 results=public), indent=1, default=str))
        (out / f"{args.label}-memory_planning.md").write_text(markdown(env, args, public))
    return 2 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
