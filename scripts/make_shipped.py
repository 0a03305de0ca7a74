#!/usr/bin/env python3
"""Regenerates the dashboard's shipped data (dashboard/shipped/) from the current code, on a GPU.

    python scripts/make_shipped.py --out dashboard/shipped                      # every part
    python scripts/make_shipped.py --out DIR --parts zoo --models vgg16,resnet50  # some of it

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
their history). So --out never holds half a part, nor two dates of one. A model that fails is reported, the part
goes on with the others and is not published (its older export stays); the exit status is 1.
"""

from __future__ import annotations

import argparse
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

PARTS = ("zoo", "optimized", "thirdparty", "plans", "memory")
DTYPES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


def zoo_part(store: Store, models, batches, dtype, iters, say) -> list[str]:
    failures = []
    for model in models:
        for batch in batches:
            failures += _attempt(f"{model} N={batch}", say, lambda: profile_model(
                model, batch=batch, dtype=dtype, iters=iters, store=store))
    return failures


def zoo_forward(model: str, batch: int, dtype: str, seed: int = 0):
    """(fn, (params, x)) of zoo model `model` as plain JAX (its XLA backend): what a user's
    jitted model is before jaxcnn.optimize."""
    spec = get_model(model)
    params = spec.init(seed, jax.numpy.dtype(dtype))
    x = sample_input(spec, batch, jax.numpy.dtype(dtype), seed)
    return (lambda p, xs: spec.apply(p, xs, backend="xla")), (params, x)


def optimized_part(store: Store, models, batches, dtype, iters, say) -> list[str]:
    failures = []
    for model in models:
        for batch in batches:
            def run(model=model, batch=batch):
                fn, args = zoo_forward(model, batch, dtype)
                return profile_function(fn, args, name=model, batch=batch, iters=iters, store=store,
                                        note="optimize(fn) defaults", extra={"source": "zoo"})
            failures += _attempt(f"{model} optimize(fn) N={batch}", say, run)
    return failures


def thirdparty_part(store: Store, models, batches, dtype, iters, say) -> list[str]:
    failures = []
    for model in models:
        for batch in batches:
            def run(model=model, batch=batch):
                m = tm.build(model, batch=batch, dtype=jax.numpy.dtype(dtype))
                return profile_function(m.apply, (m.params, m.x), name=model, batch=batch, iters=iters, store=store,
                                        note="optimize(fn) defaults",
                                        extra={"source": "third-party", "library": tm.MODELS[model][0]})
            failures += _attempt(f"{model} N={batch}", say, run)
    return failures


def plans_part(store_path: Path, models, batches, work: Path, say) -> list[str]:
    say(f"plans: {', '.join(models)} N={batches}")
    rc = plan_zoo.main(["--out", str(work), "--label", "plans", "--models", ",".join(models),
                        "--batches", ",".join(map(str, batches)), "--db", str(store_path)])
    return [] if rc == 0 else [f"plan_zoo exited {rc} (its report in the work directory lists the failures)"]


def memory_part(store_path: Path, models, batches, work: Path, say) -> list[str]:
    say(f"memory: donation, max batch, remat of {', '.join(models)}")
    rc = bench_memory_planning.main(["--out", str(work), "--label", "memory", "--models", ",".join(models),
                                     "--batches", ",".join(map(str, batches)), "--db", str(store_path)])
    return [] if rc == 0 else [f"bench_memory_planning exited {rc}"]


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


def publish(store_path: Path, out: Path, part: str) -> Path:
    """Export every run of the part's store to out/<gpu>-<date>-<part>.json (export_json writes
    beside it and renames), then remove out's older exports of the same part."""
    final = out / f"{dated_stem(part)}.json"
    with Store(store_path) as store:
        store.export_json(final)
    for old in out.glob(f"*-{part}.json"):
        if old != final:
            old.unlink()
    return final


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "dashboard" / "shipped", help="where the exports go")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list among {PARTS}")
    p.add_argument("--models", help="zoo models of zoo/optimized/plans/memory (default: every zoo model)")
    p.add_argument("--thirdparty-models", help=f"models of the thirdparty part (default {THIRDPARTY_MODELS})")
    p.add_argument("--batches", default="1,64", help="batches of the profiling parts")
    p.add_argument("--plan-batches", default="64", help="batches of the plans part")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES), help="dtype of the profiling parts")
    p.add_argument("--iters", type=int, default=20, help="timed calls per measurement")
    args = p.parse_args(argv)
    args.parts = [s for s in args.parts.split(",") if s]
    bad = [s for s in args.parts if s not in PARTS]
    if bad or not args.parts:
        p.error(f"--parts: unknown {bad}, choose among {PARTS}")
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
            work = Path(work)
            store_path = work / f"{part}.sqlite"
            if part in ("plans", "memory"):
                run = plans_part if part == "plans" else memory_part
                batches = args.plan_batches if part == "plans" else args.batches
                failed = run(store_path, args.models, batches, work, say)
            else:
                run = {"zoo": zoo_part, "optimized": optimized_part, "thirdparty": thirdparty_part}[part]
                models = args.thirdparty_models if part == "thirdparty" else args.models
                with Store(store_path) as store:
                    failed = run(store, models, args.batches, args.dtype, args.iters, say)
            failures += failed
            if failed:  # the shipped export of this part stays as it was: never a part with holes
                say(f"== {part}: not published, {len(failed)} failed (rerun them with --parts/--models)")
            else:
                path = publish(store_path, args.out, part)
                say(f"== {part}: {path} ({time.perf_counter() - started:.0f} s)")
    for failure in failures:
        print("FAILED", failure.splitlines()[0], file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
