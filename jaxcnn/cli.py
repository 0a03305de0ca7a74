"""`jaxcnn` command line: profile zoo models or your own jitted function into the store, show
layer tables, memory bounds, layout and fusion plans, compare runs, start the dashboard.

Errors are one line on stderr: exit status 2 for a usage error (a bad option or argument, or an
option this installation cannot serve), 1 for anything else (a bad store, a missing run, a failed
step); --debug adds the traceback."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import pandas as pd
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from jaxcnn.dashboard.data import compare_refusal, reference_path_run
from jaxcnn.store import DEFAULT_FILENAME, Store, StoreError

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "fp32": "float32", "float32": "float32"}
DASHBOARD_APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"


class CliError(Exception):
    """An error the user can act on: printed as one line without a traceback, exit status 1."""

    status = 1


class UsageError(CliError):
    """A bad option or argument value found after parsing, or an option this installation cannot
    serve (--autotune without the CUDA kernels, the dashboard without streamlit): exit status 2,
    as argparse's own."""

    status = 2


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (no usage dump), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _model_name(name: str) -> str:
    from jaxcnn.models import list_models

    if name not in list_models():
        raise argparse.ArgumentTypeError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
    return name


def _dtype(name: str) -> str:
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {name!r}; use one of {', '.join(sorted(DTYPES))}")
    return DTYPES[name]


BACKEND_CHOICES = {"both": ("xla", "jaxcnn"), "xla": ("xla",), "jaxcnn": ("jaxcnn",)}


def _backends(name: str) -> tuple[str, ...]:
    if name not in BACKEND_CHOICES:
        raise argparse.ArgumentTypeError(f"unknown backend {name!r}; use xla, jaxcnn or both")
    return BACKEND_CHOICES[name]


def _int_at_least(least: int):
    """An argparse type: an integer >= `least`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, got {value}")
        return value

    return parse


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator:
    """A rich spinner whose text follows the profiler's progress messages."""
    if not enabled:
        yield None
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  transient=True) as progress:
        task = progress.add_task("starting", total=None)
        yield lambda message: progress.update(task, description=str(message))


PROFILE_DEFAULTS = {"batch": 1, "dtype": "bfloat16"}  # a zoo model's, where --batch / --dtype are not given

PROFILE_EPILOG = """\
what to profile: a zoo model (MODEL), or your own function (--fn MODULE:CALLABLE):

  MODULE:CALLABLE  a module importable from the current directory (or a .py file's path) and a
                   callable in it, e.g. my_models:small_cnn or models/cnn.py:build
  CALLABLE(...)    must return (fn, example_args): fn the function to profile (jittable), and
                   example_args the tuple of its positional arguments, e.g. (params, images).
                   --batch N and --dtype D are passed to it as batch=N and dtype=NAME when given
                   (so it should take them, to build that batch), and left out otherwise.

  With --fn, the layers are the conv sites jaxcnn.optimize finds in fn (each conv with its bias or
  BatchNorm, residual add and activation), each timed alone on the inputs fn computes for it:
  "xla" as traced, "jaxcnn" as jaxcnn.conv2d; end to end, fn against jaxcnn.optimize(fn).

  Without a GPU both backends run the lax reference path (host wall time): the times are
  recorded, and no XLA/jaxcnn ratio is shown. Examples:

  jaxcnn profile squeezenet1_1 --batch 64 --dtype bf16
  jaxcnn profile --fn my_models:small_cnn --batch 64 --name small_cnn
"""


def cmd_profile(args) -> int:
    from jaxcnn.profile.profiler import profile_model, summarize

    if (args.model is None) == (args.fn is None):
        raise UsageError("give a zoo MODEL or --fn MODULE:CALLABLE (one of them)")
    # Both open the store (and check it) before they profile anything.
    with _progress(not args.quiet) as progress:
        if args.fn is not None:
            profile = _profile_fn(args, progress)
        else:
            if args.name is not None:
                raise UsageError("--name names a --fn profile; a zoo model is stored under its own name")
            given = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in PROFILE_DEFAULTS.items()}
            profile = profile_model(
                args.model, **given, backends=args.backend, iters=args.iters, warmup=args.warmup,
                sparsity=not args.no_sparsity, store=args.db, note=args.note or "", progress=progress,
            )
    print("\n".join(summarize(profile)))
    print(f"run {profile.run_ids.get('store')} recorded in {args.db}")
    return 0


def _profile_fn(args, progress):
    from jaxcnn.profile.function_profile import profile_function
    from jaxcnn.profile.user_model import build_user_model
    # The store first: a bad one fails before the user's model is built.
    with Store(args.db, read_only=False) as store:
        model = build_user_model(args.fn, batch=args.batch, dtype=args.dtype)
        return profile_function(
            model.fn, model.example_args, name=args.name or model.name, batch=args.batch, backends=args.backend,
            iters=args.iters, warmup=args.warmup, sparsity=not args.no_sparsity, store=store,
            note=args.note or "", extra={"fn": model.spec}, progress=progress,
        )


def cmd_layers(args) -> int:
    from jaxcnn.models import get_model, layer_rows

    layers = get_model(args.model).layers(args.batch, args.dtype)
    table = pd.DataFrame(layer_rows(layers))
    # Layers without weights (pools, concat, softmax) have no weight shape: "-", not NaN.
    table["weight_shape"] = [shape if isinstance(shape, str) else "-" for shape in table["weight_shape"]]
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


@contextlib.contextmanager
def _store_for_writing(path: str | None) -> Iterator:
    """The store at `path` opened (schema checked, write access required) before the command's
    work, so a bad store fails at once; None without --db."""
    if path is None:
        yield None
        return
    with Store(path, read_only=False) as store:
        yield store


def cmd_plan(args) -> int:
    from jaxcnn.memory.report import plan_model, store_plan, summary

    with _store_for_writing(args.db) as store:
        plan = plan_model(args.model, args.batch, train=args.train, dtype=args.dtype,
                          backend=args.backend, sources=(args.source,))
        print(summary(plan, args.source))
        if plan.xla:
            print("XLA memory_analysis: " + ", ".join(
                f"{k.replace('_in_bytes', '')} {v / 2**20:.2f} MiB" for k, v in plan.xla.items()
                if k.endswith("_in_bytes")))
        if store is not None:
            with store.transaction():
                runs = store_plan(store, plan)
            print(f"run {runs[args.source]} (kind 'plan') recorded in {args.db}")
    return 0


def cmd_maxbatch(args) -> int:
    from jaxcnn.memory.batch import max_batch, parse_bytes
    from jaxcnn.memory.training import OPTIMIZERS

    model, dtype = args.model, args.dtype
    try:
        budget = parse_bytes(args.budget)
    except ValueError as err:
        raise UsageError(f"--budget: {err}") from None
    try:
        probes = tuple(int(p) for p in args.probes.split(","))
    except ValueError:
        raise UsageError(f"--probes: expected comma-separated batch sizes like 1,2,4, got {args.probes!r}") from None
    if args.optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {args.optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    kwargs = dict(train=args.train, dtype=dtype, backend=args.backend)
    if args.train:
        kwargs.update(optimizer=args.optimizer, donate=not args.no_donate)
    with _store_for_writing(args.db) as store:
        result = max_batch(model, budget, probe_batches=probes, limit=args.limit, **kwargs)
        _report_max_batch(args, result, kwargs, store)
    return 0


def _report_max_batch(args, result, kwargs, store) -> None:
    model, dtype = args.model, args.dtype
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
    if store is not None:
        from jaxcnn.memory.records import record_max_batch

        with store.transaction():
            run_id = record_max_batch(store, result, model=model, dtype=dtype, train=args.train,
                                      backend=args.backend, optimizer=args.optimizer)
        print(f"run {run_id} recorded in {args.db}")


def _print_plan(args, plan_with_costs) -> int:
    """A planner subcommand: plan_with_costs(costs=, cache=) with the costs --autotune /
    --model-only ask for, the plan written to --json if given, and its explanation printed."""
    costs = "measured" if args.autotune else "model" if args.model_only else "auto"
    try:
        plan = plan_with_costs(costs=costs, cache=args.cache if args.cache else None)
    except RuntimeError as err:  # --autotune without the CUDA kernels
        raise UsageError(str(err)) from None
    if args.json:
        with open(args.json, "w") as f:
            json.dump(plan.to_dict(), f, indent=1)
        print(f"wrote the plan to {args.json}")
    print(plan.explain())
    return 0


def cmd_layouts(args) -> int:
    from jaxcnn import layouts

    return _print_plan(args, functools.partial(
        layouts.plan_model_layouts, args.model, batch=args.batch, dtype=args.dtype, iters=args.iters,
        split_blocks=args.split_blocks,
    ))


def cmd_fuse(args) -> int:
    from jaxcnn import fusion

    return _print_plan(args, functools.partial(
        fusion.plan_fusion, args.model, batch=args.batch, dtype=args.dtype, iters=args.iters
    ))


def cmd_compare(args) -> int:
    run_ids = (args.run_a, args.run_b)
    with Store(args.db, read_only=True) as store:  # a reader: never creates or changes the file
        runs = store.runs().set_index("id")
        for run_id in run_ids:
            if run_id not in runs.index:
                known = f"runs {runs.index.min()}-{runs.index.max()}" if len(runs) else "no runs"
                raise CliError(f"{args.db}: no run with id {run_id} (the store holds {known})")
        kinds = {run_id: runs.loc[run_id, "kind"] for run_id in run_ids}
        chosen = [dict(runs.loc[run_id], id=run_id) for run_id in run_ids]
        on_cpu = [reference_path_run(run) for run in chosen]
        for run_id, other in (run_ids, run_ids[::-1]):  # a run without layers (a plan) first
            if not _has_layer_metric(store, run_id, None):
                raise CliError(
                    f"{args.db}: run {run_id} ({kinds[run_id]!r}) has no per-layer measurements, so "
                    f"it cannot be compared with run {other} ({kinds[other]!r})"
                )
        if any(on_cpu) and not all(on_cpu):
            raise CliError(f"{args.db}: {compare_refusal(*chosen)}")
        metric = args.metric
        if metric == "device_time_ms" and not all(_has_layer_metric(store, r, metric) for r in run_ids):
            metric = "wall_time_ms"  # CPU runs record host wall time
        for run_id, other in (run_ids, run_ids[::-1]):
            if not _has_layer_metric(store, run_id, metric):
                raise CliError(
                    f"{args.db}: run {run_id} ({kinds[run_id]!r}) has no per-layer {metric} measurements, "
                    f"so it cannot be compared with run {other} ({kinds[other]!r})"
                )
        table = store.compare(*run_ids, metric=metric)
    if table[["median_a", "median_b"]].dropna().empty:
        raise CliError(f"{args.db}: runs {args.run_a} and {args.run_b} share no layer measured on one backend "
                       f"with {metric}")
    if metric != args.metric:
        print(f"(not both runs have per-layer {args.metric}: comparing {metric})")
    if all(on_cpu):
        # Both timed the lax reference path: their times, but no ratio (it says nothing about the kernels).
        table = table.drop(columns=["ratio"])
        print("(both runs were timed on a CPU, the lax reference path: times only, no ratio)")
    with pd.option_context("display.max_rows", None, "display.width", 200):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


def _has_layer_metric(store, run_id: int, metric: str | None) -> bool:
    """Whether the run measured any layer alone in `metric` (None: in any metric)."""
    return bool(store.measurements(run_id, metric=metric)["layer_id"].notna().any())


def cmd_dashboard(args) -> int:
    if not DASHBOARD_APP.exists():
        raise UsageError(f"the dashboard app is not installed ({DASHBOARD_APP} is missing)")
    missing = [m for m in ("streamlit", "altair") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"the dashboard needs {' and '.join(missing)}: pip install 'jaxcnn[dashboard]'")
    env = dict(os.environ, JAXCNN_DB=str(Path(args.db).resolve()))
    command = [sys.executable, "-m", "streamlit", "run", str(DASHBOARD_APP),
               "--server.address", args.address, "--server.port", str(args.port)]
    if os.name == "posix":
        # Become the server, so Ctrl-C / SIGTERM reach it directly: a child would outlive a
        # terminated `jaxcnn dashboard` and keep the port.
        os.execve(sys.executable, command, env)
    return subprocess.call(command, env=env)


def build_parser() -> argparse.ArgumentParser:
    from jaxcnn.models import list_models

    default_db = os.environ.get("JAXCNN_DB", DEFAULT_FILENAME)
    db_help = f"profile store file (default $JAXCNN_DB or ./{DEFAULT_FILENAME}; now {default_db})"
    model_help = f"zoo model: {', '.join(list_models())}"
    positive = _int_at_least(1)
    parser = _OneLineParser(prog="jaxcnn", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, description: str | None = None, epilog: str | None = None):
        p = sub.add_parser(name, help=help, description=description or help, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter if epilog else argparse.HelpFormatter)
        # Also accepted after the command; SUPPRESS keeps the top-level value when absent here.
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback of an error")
        return p

    def model_args(p, batch=1, dtype="bf16"):
        p.add_argument("model", type=_model_name, help=model_help)
        p.add_argument("--batch", type=positive, default=batch, help=f"images per batch (default {batch})")
        p.add_argument("--dtype", type=_dtype, default=dtype, help=f"bf16, fp16 or fp32 (default {dtype})")

    def planner_args(p, autotune_help, model_only_help):
        """The options of the planner commands `layouts` and `fuse` (_print_plan reads them): the
        model, measured or model costs (jaxcnn.layouts' cache), --json."""
        model_args(p)
        p.add_argument("--autotune", action="store_true", help=autotune_help)
        p.add_argument("--model-only", action="store_true", help=model_only_help)
        p.add_argument("--cache", help="autotune cache file (default $JAXCNN_AUTOTUNE_CACHE or "
                                       "~/.cache/jaxcnn/autotune.json)")
        p.add_argument("--iters", type=positive, default=20, help="timed calls per candidate (default 20)")
        p.add_argument("--json", help="also write the plan as JSON to this file")

    p = command("profile", "time every layer (or conv site of your function) and the whole model on each backend "
                           "into the store",
                description="Time every layer of a zoo model, or every conv site of your own function (--fn), and "
                            "the whole model on each backend, into the profile store.", epilog=PROFILE_EPILOG)
    p.add_argument("model", nargs="?", type=_model_name, help=model_help)
    p.add_argument("--fn", metavar="MODULE:CALLABLE",
                   help="profile your function instead of a zoo model: CALLABLE returns (fn, example_args) (below)")
    p.add_argument("--name", help="with --fn: the model's name in the store (default MODULE:CALLABLE's last parts)")
    p.add_argument("--batch", type=positive, default=None,
                   help="images per batch (zoo default 1; with --fn passed to CALLABLE as batch=N)")
    p.add_argument("--dtype", type=_dtype, default=None,
                   help="bf16, fp16 or fp32 (zoo default bf16; with --fn passed to CALLABLE as dtype=NAME)")
    p.add_argument("--backend", type=_backends, default="both", help="xla, jaxcnn or both (default both)")
    p.add_argument("--db", default=default_db, help=db_help)
    p.add_argument("--iters", type=positive, default=20, help="timed calls per layer and model (>= 1, default 20)")
    p.add_argument("--warmup", type=_int_at_least(0), default=3,
                   help="untimed calls before timing (>= 0, default 3)")
    p.add_argument("--no-sparsity", action="store_true", help="skip the activation sparsity pass")
    p.add_argument("--note", default="", help="free text stored with the run")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(run=cmd_profile)

    p = command("layers", "the model's layer table: shapes, FLOPs, bytes")
    model_args(p)
    p.add_argument("--csv", help="write the table to this CSV file instead of printing it")
    p.set_defaults(run=cmd_layers)

    p = command("plan", "memory of the model: every packing algorithm vs the lower bound and XLA")
    model_args(p)
    p.add_argument("--backend", default="xla", choices=("xla", "jaxcnn"), help="backend of the planned program")
    p.add_argument("--train", action="store_true", help="plan a training step (SGD) instead of inference")
    p.add_argument("--source", default="hlo", choices=("jaxpr", "hlo"),
                   help="buffers of the traced jaxpr or of XLA's compiled HLO (default)")
    p.add_argument("--db", default=None, help="record the plans (kind 'plan') in this store")
    p.set_defaults(run=cmd_plan)

    p = command("maxbatch", "largest batch whose compiled program fits a memory budget")
    p.add_argument("model", type=_model_name, help=model_help)
    p.add_argument("--budget", required=True, help="memory budget, e.g. 8GiB, 512MiB, 16GB")
    p.add_argument("--train", action="store_true", help="one optimizer step instead of inference")
    p.add_argument("--dtype", type=_dtype, default="bf16", help="bf16, fp16 or fp32 (default bf16)")
    p.add_argument("--backend", default="xla", choices=("xla", "jaxcnn"), help="backend of the compiled program")
    p.add_argument("--optimizer", default="sgd_momentum", help="with --train: sgd_momentum or adam")
    p.add_argument("--no-donate", action="store_true", help="with --train: keep params/optimizer state undonated")
    p.add_argument("--probes", default="1,2,4", help="batches compiled for the affine fit")
    p.add_argument("--limit", type=positive, default=1 << 16, help="largest batch considered")
    p.add_argument("--curve", action="store_true", help="print the footprint of every compiled batch")
    p.add_argument("--json", help="also write the result as JSON to this file")
    p.add_argument("--db", help="record the result (and its curve) in this store")
    p.set_defaults(run=cmd_maxbatch)

    p = command("layouts", "choose the activation layout (and kernel) of every layer")
    planner_args(p, "measure every candidate on the GPU (cached); default: measured where the "
                    "CUDA kernels run, else model estimates", "model estimates even on a GPU")
    p.add_argument("--split-blocks", action="store_true",
                   help="let each layer of a block pick its own layout (linear approximation)")
    p.set_defaults(run=cmd_layouts)

    p = command("fuse", "choose which blocks (fire, inception, conv->pool, expand->depthwise) run fused")
    planner_args(p, "time fused vs unfused on the GPU (cached); default: measured where the "
                    "CUDA kernels run, else the cost model", "cost model even on a GPU")
    p.set_defaults(run=cmd_fuse)

    p = command("compare", "per-layer device time of two stored runs")
    p.add_argument("run_a", type=int, help="id of the first run (the baseline)")
    p.add_argument("run_b", type=int, help="id of the second run (ratio = b / a)")
    p.add_argument("--db", default=default_db, help=db_help + "; opened read-only")
    p.add_argument("--metric", default="device_time_ms",
                   help="measurement to compare (default device_time_ms; falls back to wall_time_ms "
                        "where the runs have no device time)")
    p.set_defaults(run=cmd_compare)

    p = command("dashboard", "start the Streamlit dashboard on the store")
    p.add_argument("--db", default=default_db, help=db_help)
    p.add_argument("--address", default="127.0.0.1", help="bind address (localhost by default)")
    p.add_argument("--port", type=positive, default=8501, help="port to serve on (default 8501)")
    p.set_defaults(run=cmd_dashboard)
    return parser


def _one_line(err: BaseException) -> str:
    """The error as one line: its first line, and the exception type where the message alone
    would not say what went wrong."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[0] if lines else type(err).__name__
    if not isinstance(err, (CliError, StoreError, ValueError, TypeError, OSError)):
        text = f"{type(err).__name__}: {text}"
    if len(lines) > 1:
        text += " (more with --debug)"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help (0) or a usage error, already reported in one line (2)
        return done.code if isinstance(done.code, int) else 2
    debug = getattr(args, "debug", False)
    try:
        return args.run(args)
    except BrokenPipeError:  # stdout closed early (`jaxcnn layers ... | head`): nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 1
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("jaxcnn: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - every error reaches the user as one line
        if debug:
            traceback.print_exc()
        print(f"jaxcnn {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return err.status if isinstance(err, CliError) else 1


if __name__ == "__main__":
    raise SystemExit(main())
