#!/usr/bin/env python3
"""Regenerates the dashboard's shipped data (dashboard/shipped/) from the current code, on a GPU.

    python scripts/make_shipped.py --out dashboard/shipped                      # every part
    python scripts/make_shipped.py --out DIR --parts zoo --models vgg16,resnet50  # some of it

Run from a copy of a commit's tree (e.g. `git archive` on a GPU machine), set
JAXCNN_GIT_COMMIT=<that commit>: the runs then record it instead of whatever git finds around
the copy.

Parts, each written as one store export <gpu>-<date>-<part>.json that records every run's commit
and environment (the dashboard shows them as "made from"):
  zoo         every zoo model at each batch, per layer and end to end: XLA vs the zoo's jaxcnn
              backend (jaxcnn.profile.profile_model)
  optimized   every zoo model's XLA forward run as `jaxcnn.optimize(fn)` with its defaults (which
              run the fusion planner), per conv site and end to end (profile_function)
  thirdparty  the third-party models of scripts/bench_thirdparty.py (Keras applications, Flax
              linen / nnx, Equinox), the same way as `optimized`
  plans       the buffer planner on every zoo model (scripts/plan_zoo.py --db): every buffer's
              lifetime and offset per packing algorithm, and XLA's own assignment
  memory      donation, max batch and rematerialization (scripts/bench_memory_planning.py --db)

A part is profiled into its own fresh store and exported (written beside its final name, then
renamed into place); only then are older exports of the same part in --out removed (git keeps
their history). With --add the export also keeps the previous export's runs of the models not
profiled now, so a part can be made a few models at a time:
    python scripts/make_shipped.py --out dashboard/shipped --parts thirdparty --thirdparty-models keras_vgg16 --add So --out never holds half a part, nor two dates of one. A model that fails is
reported, the part goes on with the others and is not published (its older export stays); the
exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks.thirdparty_models
sys.path.insert(0, str(ROOT / "scripts"))

import bench_memory_planning  # noqa: E402
from bench_common import dated_stem  # noqa: E402
import plan_zoo  # noqa: E402
from bench_thirdparty import DEFAULT_MODELS as THIRDPARTY_MODELS  # noqa: E402

from benchmarks import thirdparty_models as tm  # noqa: E402
from jaxcnn.models import get_model, list_models  # noqa: E402
from jaxcnn.profile.function_profile import profile_function  # noqa: E402
from jaxcnn.profile.profiler import profile_model, sample_input, summarize  # noqa: E402
from jaxcnn.store import Store  # noqa: E402


def zoo_forward(model: str, batch: int, dtype: str, seed: int = 0):
    """(fn, (params, x)) of zoo model `model` as plain JAX (its XLA backend): what a user's
    jitted model is before jaxcnn.optimize."""
    spec = get_model(model)
    params = spec.init(seed, jax.numpy.dtype(dtype))
    x = sample_input(spec, batch, jax.numpy.dtype(dtype), seed)
    return (lambda p, xs: spec.apply(p, xs, backend="xla")), (params, x)


def profile_zoo_model(model, batch, args, store):
    return profile_model(model, batch=batch, dtype=args.dtype, iters=args.iters, store=store)


def profile_zoo_optimized(model, batch, args, store):
    fn, example = zoo_forward(model, batch, args.dtype)
    return profile_function(fn, example, name=model, batch=batch, iters=args.iters, store=store,
                            note="optimize(fn) defaults", extra={"source": "zoo"})


def profile_thirdparty(model, batch, args, store):
    m = tm.build(model, batch=batch, dtype=jax.numpy.dtype(args.dtype))
    return profile_function(m.apply, (m.params, m.x), name=model, batch=batch, iters=args.iters, store=store,
                            note="optimize(fn) defaults",
                            extra={"source": "third-party", "library": tm.MODELS[model][0]})


def profiled_part(profile, models_of):
    """A part that profiles each of its models at each --batches into the part's store."""
    def run(args, store_path: Path, work: Path, say) -> list[str]:
        failures = []
        with Store(store_path) as store:
            for model in models_of(args):
                for batch in args.batches:
                    failures += _attempt(f"{model} N={batch}", say, lambda: profile(model, batch, args, store))
        return failures
    return run


def plans_part(args, store_path: Path, work: Path, say) -> list[str]:
    say(f"plans: {', '.join(args.models)} N={args.plan_batches}")
    rc = plan_zoo.main(["--out", str(work), "--label", "plans", "--models", ",".join(args.models),
                        "--batches", ",".join(map(str, args.plan_batches)), "--db", str(store_path)])
    return [] if rc == 0 else [f"plan_zoo exited {rc} (its report in the work directory lists the failures)"]


def memory_part(args, store_path: Path, work: Path, say) -> list[str]:
    say(f"memory: donation, max batch, remat of {', '.join(args.models)}")
    rc = bench_memory_planning.main(["--out", str(work), "--label", "memory", "--models", ",".join(args.models),
                                     "--batches", ",".join(map(str, args.batches)), "--db", str(store_path)])
    return [] if rc == 0 else [f"bench_memory_planning exited {rc}"]


# part -> run(args, store path, work directory, say) -> failures
PARTS = {
    "zoo": profiled_part(profile_zoo_model, lambda args: args.models),
    "optimized": profiled_part(profile_zoo_optimized, lambda args: args.models),
    "thirdparty": profiled_part(profile_thirdparty, lambda args: args.thirdparty_models),
    "plans": plans_part,
    "memory": memory_part,
}
DTYPES = ("bfloat16", "float16", "float32")


def _attempt(what: str, say, run) -> list[str]:
    started = time.perf_counter()
    try:
        profile = run()
    except Exception:  # keep going: the failure is reported with the others
        failure = f"{what}: {traceback.format_exc(limit=4)}"
        print(failure, file=sys.stderr, flush=True)
        return [failure]
    say("\n".join(summarize(profile)) + f" ({time.perf_counter() - started:.0f} s)")
    return []


def publish(store_path: Path, out: Path, part: str, work: Path, add_to_models: list[str] | None = None) -> Path:
    """Export every run of the part's store to out/<gpu>-<date>-<part>.json (export_json writes
    beside it and renames), then remove out's older exports of the same part.

    add_to_models: the models just profiled, to add to the part's latest export in `out`: its
    runs of other models come first, unchanged; its runs of these models are replaced."""
    final = out / f"{dated_stem(part)}.json"
    source = store_path
    previous = sorted(out.glob(f"*-{part}.json"), key=lambda p: p.name.split("-", 1)[1])
    if add_to_models is not None and previous:
        document = json.loads(previous[-1].read_text())
        document["runs"] = [r for r in document["runs"] if r.get("model") not in add_to_models]
        (work / "kept.json").write_text(json.dumps(document))
        with Store(store_path) as store:
            store.export_json(work / "new.json")
        source = work / "merged.sqlite"
        with Store(source) as merged:
            merged.import_json(work / "kept.json")
            merged.import_json(work / "new.json")
    with Store(source) as store:
        store.export_json(final)
    for old in out.glob(f"*-{part}.json"):
        if old != final:
            old.unlink()
    return final


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "dashboard" / "shipped", help="where the exports go")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list among {tuple(PARTS)}")
    p.add_argument("--models", help="zoo models of zoo/optimized/plans/memory (default: every zoo model)")
    p.add_argument("--thirdparty-models", help=f"models of the thirdparty part (default {THIRDPARTY_MODELS})")
    p.add_argument("--batches", default="1,64", help="batches of the profiling parts")
    p.add_argument("--plan-batches", default="64", help="batches of the plans part")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="dtype of the profiling parts")
    p.add_argument("--iters", type=int, default=20, help="timed calls per measurement")
    p.add_argument("--add", action="store_true",
                   help="add the models profiled now to each part's latest export in --out (its runs of other "
                        "models kept, of these replaced) instead of replacing the export: a part made over "
                        "several sessions or machines")
    args = p.parse_args(argv)
    args.parts = [s for s in args.parts.split(",") if s]
    bad = [s for s in args.parts if s not in PARTS]
    if bad or not args.parts:
        p.error(f"--parts: unknown {bad}, choose among {tuple(PARTS)}")
    args.models = args.models.split(",") if args.models else list_models()
    args.thirdparty_models = args.thirdparty_models.split(",") if args.thirdparty_models else list(THIRDPARTY_MODELS)
    unknown = [m for m in args.models if m not in list_models()] + \
              [m for m in args.thirdparty_models if m not in tm.MODELS]
    if unknown:
        p.error(f"unknown models {unknown}: zoo {list_models()}, third-party {sorted(tm.MODELS)}")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.plan_batches = [int(b) for b in args.plan_batches.split(",")]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    def say(message: str) -> None:
        print(message, flush=True)

    failures = []
    for part in args.parts:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"shipped-{part}-") as work:
            store_path = Path(work) / f"{part}.sqlite"
            failed = PARTS[part](args, store_path, Path(work), say)
            failures += failed
            if failed:  # the shipped export of this part stays as it was: never a part with holes
                say(f"== {part}: not published, {len(failed)} failed (rerun them with --parts/--models)")
            else:
                added = (args.thirdparty_models if part == "thirdparty" else args.models) if args.add else None
                path = publish(store_path, args.out, part, Path(work), added)
                say(f"== {part}: {path} ({time.perf_counter() - started:.0f} s)")
    for failure in failures:
        print("FAILED", failure.splitlines()[0], file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
