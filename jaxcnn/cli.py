"""`jaxcnn` command line: profile zoo models into the store, show layer tables, memory bounds,
layout and fusion plans, compare runs, start the dashboard."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Sequence

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "fp32": "float32", "float32": "float32"}
DASHBOARD_APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"


class CliError(Exception):
    """A user error: printed without a traceback, exit status 2."""


def _model_name(name: str) -> str:
    from jaxcnn.models import list_models

    if name not in list_models():
        raise CliError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
    return name


def _dtype(name: str) -> str:
    if name not in DTYPES:
        raise CliError(f"unknown dtype {name!r}; use one of {', '.join(sorted(DTYPES))}")
    return DTYPES[name]


def _backends(name: str) -> tuple[str, ...]:
    choices = {"both": ("xla", "jaxcnn"), "xla": ("xla",), "jaxcnn": ("jaxcnn",)}
    if name not in choices:
        raise CliError(f"unknown backend {name!r}; use xla, jaxcnn or both")
    return choices[name]


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator:
    """A rich spinner whose text follows the profiler's progress messages."""
    if not enabled:
        yield None
        return
    try:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    except ImportError:
        yield lambda message: print(f"... {message}", file=sys.stderr)
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  transient=True) as progress:
        task = progress.add_task("starting", total=None)
        yield lambda message: progress.update(task, description=str(message))


def cmd_profile(args) -> int:
    from jaxcnn.profile.profiler import profile_model, summarize

    with _progress(not args.quiet) as progress:
        profile = profile_model(
            _model_name(args.model), batch=args.batch, dtype=_dtype(args.dtype),
            backends=_backends(args.backend), iters=args.iters, warmup=args.warmup,
            sparsity=not args.no_sparsity, store=args.db, note=args.note or "", progress=progress,
        )
    print("\n".join(summarize(profile)))
    print(f"run {profile.run_ids.get('store')} recorded in {args.db}")
    return 0


def cmd_layers(args) -> int:
    import pandas as pd

    from jaxcnn.models import get_model, layer_rows

    layers = get_model(_model_name(args.model)).layers(args.batch, _dtype(args.dtype))
    table = pd.DataFrame(layer_rows(layers))
    table["gflop"] = table["flops"] / 1e9
    table["mib"] = table["bytes"] / 2**20
    if args.csv:
        table.to_csv(args.csv, index=False)
        print(f"wrote {len(table)} layers to {args.csv}")
        return 0
    columns = ["index", "name", "op", "input_shapes", "weight_shape", "output_shape", "gflop", "mib"]
    with pd.option_context("display.max_rows", None, "display.width", 200):
        print(table[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"total: {table['gflop'].sum():.3f} GFLOP, {table['mib'].sum():.1f} MiB of layer traffic")
    return 0


def cmd_plan(args) -> int:
    from jaxcnn.planner.report import plan_model, store_plan, summary

    plan = plan_model(_model_name(args.model), args.batch, train=args.train, dtype=_dtype(args.dtype),
                      backend=args.backend, sources=(args.source,))
    print(summary(plan, args.source))
    if plan.xla:
        print("XLA memory_analysis: " + ", ".join(
            f"{k.replace('_in_bytes', '')} {v / 2**20:.2f} MiB" for k, v in plan.xla.items()
            if k.endswith("_in_bytes")))
    if args.db:
        from jaxcnn.store import Store

        with Store(args.db) as store:
            runs = store_plan(store, plan)
        print(f"run {runs[args.source]} (kind 'plan') recorded in {args.db}")
    return 0


def cmd_maxbatch(args) -> int:
    import json

    from jaxcnn.planner.batch import max_batch, parse_bytes
    from jaxcnn.planner.training import OPTIMIZERS

    model, dtype = _model_name(args.model), _dtype(args.dtype)
    try:
        budget = parse_bytes(args.budget)
        probes = tuple(int(p) for p in args.probes.split(","))
    except ValueError as err:
        raise CliError(f"--budget/--probes: {err}") from None
    if args.optimizer not in OPTIMIZERS:
        raise CliError(f"unknown optimizer {args.optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    kwargs = dict(train=args.train, dtype=dtype, backend=args.backend)
    if args.train:
        kwargs.update(optimizer=args.optimizer, donate=not args.no_donate)
    try:
        result = max_batch(model, budget, probe_batches=probes, limit=args.limit, **kwargs)
    except ValueError as err:
        raise CliError(str(err)) from None
    what = f"training step ({args.optimizer}{', undonated' if args.no_donate else ''})" if args.train else "inference"
    print(f"{model} {what} {dtype} backend={args.backend}")
    print(result.explain())
    if args.curve:
        for batch, footprint in result.curve():
            print(f"  batch {batch:6d}: {footprint / 2**20:12.2f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=model, **kwargs, **result.as_dict()), f, indent=1)
        print(f"wrote {args.json}")
    if args.db:
        from jaxcnn.planner.records import record_max_batch
        from jaxcnn.store import Store

        with Store(args.db) as store:
            run_id = record_max_batch(store, result, model=model, dtype=dtype, train=args.train,
                                      backend=args.backend, optimizer=args.optimizer)
        print(f"run {run_id} recorded in {args.db}")
    return 0


def cmd_layouts(args) -> int:
    import json

    from jaxcnn import layouts

    costs = "measured" if args.autotune else "model" if args.model_only else "auto"
    try:
        plan = layouts.plan_model_layouts(
            _model_name(args.model), batch=args.batch, dtype=_dtype(args.dtype), costs=costs,
            cache=args.cache if args.cache else None, iters=args.iters,
            split_blocks=args.split_blocks,
        )
    except RuntimeError as err:  # --autotune without the CUDA kernels
        raise CliError(str(err)) from None
    if args.json:
        with open(args.json, "w") as f:
            json.dump(plan.to_dict(), f, indent=1)
        print(f"wrote the plan to {args.json}")
    print(plan.explain())
    return 0


def cmd_fuse(args) -> int:
    import json

    from jaxcnn import fusion

    costs = "measured" if args.autotune else "model" if args.model_only else "auto"
    try:
        plan = fusion.plan_fusion(_model_name(args.model), batch=args.batch, dtype=_dtype(args.dtype),
                                  costs=costs, cache=args.cache if args.cache else None,
                                  iters=args.iters)
    except RuntimeError as err:  # --autotune without the CUDA kernels
        raise CliError(str(err)) from None
    if args.json:
        with open(args.json, "w") as f:
            json.dump(plan.to_dict(), f, indent=1)
        print(f"wrote the plan to {args.json}")
    print(plan.explain())
    return 0


def cmd_compare(args) -> int:
    import pandas as pd

    from jaxcnn.store import Store

    with Store(args.db) as store:
        table = store.compare(args.run_a, args.run_b, metric=args.metric)
        if table.empty and args.metric == "device_time_ms":  # CPU runs record host wall time
            table = store.compare(args.run_a, args.run_b, metric="wall_time_ms")
    if table.empty:
        raise CliError(f"runs {args.run_a} and {args.run_b} share no measured layers in {args.db}")
    with pd.option_context("display.max_rows", None, "display.width", 200):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


def cmd_dashboard(args) -> int:
    if not DASHBOARD_APP.exists():
        raise CliError(f"the dashboard app is not installed ({DASHBOARD_APP} is missing)")
    import importlib.util

    missing = [m for m in ("streamlit", "altair") if importlib.util.find_spec(m) is None]
    if missing:
        raise CliError(f"the dashboard needs {' and '.join(missing)}: pip install 'jaxcnn[dashboard]'")
    env = dict(os.environ, JAXCNN_DB=str(Path(args.db).resolve()))
    command = [sys.executable, "-m", "streamlit", "run", str(DASHBOARD_APP),
               "--server.address", args.address, "--server.port", str(args.port)]
    if os.name == "posix":
        # Become the server, so Ctrl-C / SIGTERM reach it directly: a child would outlive a
        # terminated `jaxcnn dashboard` and keep the port.
        os.execve(sys.executable, command, env)
    return subprocess.call(command, env=env)


def build_parser() -> argparse.ArgumentParser:
    from jaxcnn.store import DEFAULT_FILENAME

    default_db = os.environ.get("JAXCNN_DB", DEFAULT_FILENAME)
    parser = argparse.ArgumentParser(prog="jaxcnn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p, batch=1, dtype="bf16"):
        p.add_argument("model", help="zoo model name (see `jaxcnn layers --help`)")
        p.add_argument("--batch", type=int, default=batch)
        p.add_argument("--dtype", default=dtype, help="bf16, fp16 or fp32")

    def autotune_args(p, autotune_help, model_only_help):
        """The measured-or-model options `layouts` and `fuse` share (jaxcnn.layouts' cache)."""
        p.add_argument("--autotune", action="store_true", help=autotune_help)
        p.add_argument("--model-only", action="store_true", help=model_only_help)
        p.add_argument("--cache", help="autotune cache file (default $JAXCNN_AUTOTUNE_CACHE or "
                                       "~/.cache/jaxcnn/autotune.json)")
        p.add_argument("--iters", type=int, default=20, help="timed calls per candidate")

    p = sub.add_parser("profile", help="time every layer and the whole model on each backend into the store")
    model_args(p)
    p.add_argument("--backend", default="both", help="xla, jaxcnn or both")
    p.add_argument("--db", default=default_db)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-sparsity", action="store_true", help="skip the activation sparsity pass")
    p.add_argument("--note", default="")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(run=cmd_profile)

    p = sub.add_parser("layers", help="the model's layer table: shapes, FLOPs, bytes")
    model_args(p)
    p.add_argument("--csv", help="write the table to this CSV file instead of printing it")
    p.set_defaults(run=cmd_layers)

    p = sub.add_parser("plan", help="memory of the model: every packing algorithm vs the lower bound and XLA")
    model_args(p)
    p.add_argument("--backend", default="xla", choices=("xla", "jaxcnn"))
    p.add_argument("--train", action="store_true", help="plan a training step (SGD) instead of inference")
    p.add_argument("--source", default="hlo", choices=("jaxpr", "hlo"),
                   help="buffers of the traced jaxpr or of XLA's compiled HLO (default)")
    p.add_argument("--db", default=None, help="record the plans (kind 'plan') in this store")
    p.set_defaults(run=cmd_plan)

    p = sub.add_parser("maxbatch", help="largest batch whose compiled program fits a memory budget")
    p.add_argument("model", help="zoo model name (see `jaxcnn layers --help`)")
    p.add_argument("--budget", required=True, help="memory budget, e.g. 8GiB, 512MiB, 16GB")
    p.add_argument("--train", action="store_true", help="one optimizer step instead of inference")
    p.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32")
    p.add_argument("--backend", default="xla", choices=("xla", "jaxcnn"))
    p.add_argument("--optimizer", default="sgd_momentum", help="with --train: sgd_momentum or adam")
    p.add_argument("--no-donate", action="store_true", help="with --train: keep params/optimizer state undonated")
    p.add_argument("--probes", default="1,2,4", help="batches compiled for the affine fit")
    p.add_argument("--limit", type=int, default=1 << 16, help="largest batch considered")
    p.add_argument("--curve", action="store_true", help="print the footprint of every compiled batch")
    p.add_argument("--json", help="also write the result as JSON to this file")
    p.add_argument("--db", help="record the result (and its curve) in this store")
    p.set_defaults(run=cmd_maxbatch)

    p = sub.add_parser("layouts", help="choose the activation layout (and kernel) of every layer")
    model_args(p)
    autotune_args(p, "measure every candidate on the GPU (cached); default: measured where the "
                     "CUDA kernels run, else model estimates", "model estimates even on a GPU")
    p.add_argument("--split-blocks", action="store_true",
                   help="let each layer of a block pick its own layout (linear approximation)")
    p.add_argument("--json", help="also write the plan as JSON to this file")
    p.set_defaults(run=cmd_layouts)

    p = sub.add_parser("fuse", help="choose which blocks (fire, inception, conv->pool, "
                                       "expand->depthwise) run fused")
    model_args(p)
    autotune_args(p, "time fused vs unfused on the GPU (cached); default: measured where the "
                     "CUDA kernels run, else the cost model", "cost model even on a GPU")
    p.add_argument("--json", help="also write the plan as JSON to this file")
    p.set_defaults(run=cmd_fuse)

    p = sub.add_parser("compare", help="per-layer device time of two stored runs")
    p.add_argument("run_a", type=int)
    p.add_argument("run_b", type=int)
    p.add_argument("--db", default=default_db)
    p.add_argument("--metric", default="device_time_ms")
    p.set_defaults(run=cmd_compare)

    p = sub.add_parser("dashboard", help="start the Streamlit dashboard on the store")
    p.add_argument("--db", default=default_db)
    p.add_argument("--address", default="127.0.0.1", help="bind address (localhost by default)")
    p.add_argument("--port", type=int, default=8501)
    p.set_defaults(run=cmd_dashboard)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "batch", 1) is not None and getattr(args, "batch", 1) < 1:
        parser.error("--batch must be >= 1")
    try:
        return args.run(args)
    except CliError as err:
        print(f"jaxcnn: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
