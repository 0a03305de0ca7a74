#!/usr/bin/env python3
"""Profiles zoo models at several batch sizes into one store and exports the runs as JSON
(the portable file the dashboard ships, in dashboard/shipped/).

  python scripts/profile_zoo.py --db OUT/zoo.sqlite --export OUT/h200-zoo.json --batches 1,64
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

from jaxcnn.models import list_models
from jaxcnn.profile.profiler import profile_model, summarize
from jaxcnn.store import Store


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True)
    parser.add_argument("--export", help="write all runs of this invocation as store JSON")
    parser.add_argument("--models", default=",".join(list_models()))
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    failures, run_ids = [], []
    with Store(args.db) as store:
        for model in args.models.split(","):
            for batch in map(int, args.batches.split(",")):
                t0 = time.perf_counter()
                try:
                    profile = profile_model(model, batch=batch, dtype=args.dtype, iters=args.iters, store=store)
                except Exception:  # keep profiling the others; the failure is reported below
                    failures.append(f"{model} batch={batch}: {traceback.format_exc(limit=3)}")
                    print(failures[-1], file=sys.stderr, flush=True)
                    continue
                run_ids.append(profile.run_ids["store"])
                print("\n".join(summarize(profile)), f"({time.perf_counter() - t0:.0f} s)", flush=True)
                if args.export:  # after every model: a run cut short still leaves its data
                    store.export_json(args.export, run_ids=run_ids)
        if args.export:
            print(f"exported {len(run_ids)} runs to {args.export}")
    for failure in failures:
        print("FAILED", failure.splitlines()[0], file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
