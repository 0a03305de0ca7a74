#!/usr/bin/env python3
"""Hold jaxcnn.costmodel (DeLTA-style traffic/time model) against measured kernels.

Reads bench_layers.json rows (scripts/bench_layers.py; the foundation report's `bench_rows`
work too), optionally the XLA baseline of /work/shared/baseline and an ncu CSV
(`ncu --csv --metrics dram__bytes.sum,lts__t_bytes.sum,l1tex__t_bytes.sum ...`, or the tidy CSV
of scripts/ncu_collect.py), predicts every
(layer, dtype, impl) - XLA rows with the tiling parsed from the cuDNN kernel name - and writes
perfmodel_validation.{json,md} into --out (per row predicted vs measured time and error,
predicted vs ncu bytes per level, median / max abs error), printing the markdown last.

  python scripts/validate_perfmodel.py --bench out/bench_layers.json --out out/
  python scripts/validate_perfmodel.py --bench benchmarks/results/h200-2026-11-21-foundation.json \\
      --baseline /work/shared/baseline/h200-xla-device-time-2026-11-21.json \\
      --fit --save-factors --cross-validate --out /tmp/perfmodel
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
try:
    import jaxcnn  # noqa: F401
except ImportError:  # run from a checkout that is not pip-installed
    sys.path.append(str(REPO_ROOT))  # noqa

# Submodules, not the package: an editable install made before perfmodel/__init__.py existed
# maps jaxcnn.costmodel as a namespace package.
from jaxcnn.costmodel.calibration import calibrate  # noqa: E402
from jaxcnn.costmodel.factors import load_factors, read_factors_file, save_factors  # noqa: E402
from jaxcnn.costmodel.streaming import is_stream_family  # noqa: E402
from jaxcnn.costmodel.validation import (  # noqa: E402
    attach_counters,
    cross_validated_by_group,
    cross_validated_ms,
    deduplicated_samples,
    measurements_from_baseline,
    measurements_from_bench,
    measurements_from_store,
    prediction_rows,
    model_group,
    read_ncu_csv,
    store_run_models,
    to_markdown,
    validate,
)
from jaxcnn.profile.gpu_specs import lookup_gpu_spec, spec_by_name  # noqa: E402

JSON_NAME = "perfmodel_validation.json"
MD_NAME = "perfmodel_validation.md"


def bench_rows(data: dict) -> list[dict]:
    return data.get("rows") or data.get("bench_rows") or []


def stored_fit_info(gpu: str) -> dict:
    """The stored factors' record of how they were fitted (kept when only the streams are refitted)."""
    return dict(read_factors_file().get(gpu, {}).get("fit") or {})


def gpu_of(data: dict, override: str | None) -> str:
    """--gpu, else the bench environment's device kind, else H200."""
    if override:
        return spec_by_name(override).name
    kind = (data.get("environment") or {}).get("device_kind") or ""
    spec = lookup_gpu_spec(kind) if kind else None
    return spec.name if spec else "H200"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", required=True, help="bench_layers.json")
    parser.add_argument("--baseline", help="XLA baseline JSON (shapes taken from --bench rows)")
    parser.add_argument("--ncu", help="ncu --csv output with dram/lts/l1tex byte metrics")
    parser.add_argument("--store", help="profile store (scripts/profile_zoo.py): its conv2d layers")
    parser.add_argument("--out", required=True, help="directory for perfmodel_validation.*")
    parser.add_argument("--gpu", help="GPU spec name (default: from the bench environment)")
    parser.add_argument("--fit", action="store_true", help="calibrate the factors on these rows")
    parser.add_argument("--fit-streams", action="store_true",
                        help="calibrate only the stream families (costmodel.streaming) on these rows, keeping the "
                             "stored implicit-GEMM factors")
    parser.add_argument("--save-factors", action="store_true", help="with --fit or --fit-streams: store them")
    parser.add_argument(
        "--cross-validate", action="store_true", help="also leave-one-layer-out errors"
    )
    parser.add_argument(
        "--cross-validate-by",
        choices=["model"],
        help="model: leave-one-zoo-model-out errors (bench rows are one group; needs --store)",
    )
    args = parser.parse_args(argv)

    data = json.loads(Path(args.bench).read_text())
    rows = bench_rows(data)
    gpu = gpu_of(data, args.gpu)
    measurements = measurements_from_bench(rows)
    if args.baseline:
        configs = {row["layer"]: row["config"] for row in rows}
        baseline = json.loads(Path(args.baseline).read_text())
        measurements += measurements_from_baseline(baseline, configs)
    if args.store:
        measurements += measurements_from_store(args.store)
    if args.ncu:
        measurements = attach_counters(measurements, read_ncu_csv(args.ncu))

    factors, factors_source = load_factors(gpu), "stored (jaxcnn/costmodel/calibration)"
    fit_info = None
    if args.fit:
        in_scope = deduplicated_samples(measurements)
        fitted = calibrate(spec_by_name(gpu), in_scope)
        factors, factors_source = fitted.factors, f"fitted here on {fitted.n} measurements"
        fit_info = dict(
            n=fitted.n,
            median_abs_rel_error=fitted.median_abs_rel_error,
            max_abs_rel_error=fitted.max_abs_rel_error,
            sources=[str(Path(p).name) for p in (args.bench, args.baseline, args.store) if p],
            date=datetime.date.today().isoformat(),
        )

    if args.fit_streams and not args.fit:
        streams = [m for m in deduplicated_samples(measurements) if is_stream_family(m.impl)]
        if not streams:
            parser.error("--fit-streams: no in-scope measurement of a stream family")
        fitted = calibrate(spec_by_name(gpu), streams, initial=factors)
        factors = fitted.factors
        factors_source += f"; stream families fitted here on {fitted.n} measurements"
        fit_info = dict(stored_fit_info(gpu), streaming=dict(
            n=fitted.n, median_abs_rel_error=fitted.median_abs_rel_error,
            sources=[str(Path(p).name) for p in (args.bench, args.baseline, args.store) if p],
            date=datetime.date.today().isoformat()))

    report = validate(prediction_rows(measurements, gpu, factors))
    report.update(gpu=gpu, factors=factors.to_dict(), factors_source=factors_source, fit=fit_info)
    if args.cross_validate:
        held_out = cross_validated_ms(measurements, gpu)
        cv_rows = [
            dict(row, predicted_ms=held_out[row["label"]])
            for row in report["rows"]
            if row["label"] in held_out
        ]
        report["cross_validation"] = validate(cv_rows)["summary"]
        for row in report["rows"]:
            row["held_out_predicted_ms"] = held_out.get(row["label"])
        if args.fit:
            fit_info["leave_one_layer_out"] = {
                key: report["cross_validation"][key]
                for key in ("n", "median_abs_rel_error", "max_abs_rel_error")
            }
    if args.cross_validate_by == "model":
        run_models = store_run_models(args.store) if args.store else {}
        groups = {m.label: model_group(m, run_models) for m in measurements}
        held_out = cross_validated_by_group(measurements, groups, gpu)
        cv_rows = [
            dict(row, predicted_ms=held_out[row["label"]], group=groups[row["label"]])
            for row in report["rows"]
            if row["label"] in held_out
        ]
        cv = validate(cv_rows)
        by_group = defaultdict(list)
        for row in cv["rows"]:
            by_group[row["group"]].append(row["abs_rel_error"])
        cv["summary"]["by_group"] = {
            group: dict(n=len(e), median_abs_rel_error=statistics.median(e), max_abs_rel_error=max(e))
            for group, e in sorted(by_group.items())
        }
        report["cross_validation_by_model"] = cv["summary"]
        for row in report["rows"]:
            row["held_out_by_model_predicted_ms"] = held_out.get(row["label"])
        if args.fit:
            fit_info["leave_one_model_out"] = {
                impl: {key: s[key] for key in ("n", "median_abs_rel_error", "max_abs_rel_error")}
                for impl, s in cv["summary"]["by_impl"].items()
            }
    if (args.fit or args.fit_streams) and args.save_factors:
        save_factors(gpu, factors, fit_info)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / JSON_NAME).write_text(json.dumps(report, indent=1, default=str) + "\n")
    markdown = to_markdown(report, title=f"DeLTA model vs measurements ({gpu})")
    (out / MD_NAME).write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
