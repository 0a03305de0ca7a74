#!/usr/bin/env python3
"""Recompute the traffic model's per-layer predictions of profile runs in store JSON exports.

A profile records, beside its measurements, the roofline floor and the traffic model's
prediction of every conv layer (jaxcnn.profile.record). The predictions are the model's, not
the GPU's: when the model gains a family (e.g. the depthwise stream families) or its factors are
refitted, the exports made on a GPU can show today's model without a new GPU run. This rewrites,
in each profile run, the rows of the traffic model (costmodel.model.model_rows of each conv
layer, for the run's GPU) and leaves everything else as it was: runs, layers, measurements,
roofline floors, counters, plans. Each file is replaced atomically (store.write_export).

    python scripts/refresh_predictions.py dashboard/shipped/h200-2026-11-29-zoo.json \\
        dashboard/shipped/h200-2026-11-29-thirdparty.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
try:
    import jaxcnn  # noqa: F401
except ImportError:  # run from a checkout that is not pip-installed
    sys.path.append(str(REPO_ROOT))  # noqa

from jaxcnn.costmodel.model import MODEL_NAME, model_rows, stored_layer_info  # noqa: E402
from jaxcnn.store import read_export, write_export  # noqa: E402


def exported_row(row: dict, layer: str) -> dict:
    """A predictions row as export_json writes one: the layer's name first, then the table's
    columns, `extra` with its keys sorted (the store keeps JSON columns so)."""
    out = {"layer": layer, **{k: v for k, v in row.items() if k != "extra"}}
    if "extra" in row:
        out["extra"] = json.loads(json.dumps(row["extra"], sort_keys=True, default=str))
    return out


def refreshed_run(run: dict) -> tuple[dict, Counter]:
    """`run` (one run of an export) with its traffic-model predictions recomputed, and how many
    rows of each model family it now has. Runs without a GPU name or layers are returned as is."""
    gpu = ((run.get("environment") or {}).get("gpu_name")) or ""
    if run.get("kind") != "profile" or not gpu:
        return run, Counter()
    kept = [row for row in run.get("predictions", []) if row.get("model") != MODEL_NAME]
    fresh, families = [], Counter()
    for layer in run.get("layers", []):
        if layer.get("op") != "conv2d":
            continue
        for row in model_rows(stored_layer_info(layer), gpu):
            fresh.append(exported_row(row, layer["name"]))
            families[row["extra"]["impl"]] += 1
    return dict(run, predictions=kept + fresh), families


def refresh_file(path: Path) -> Counter:
    """Rewrites the export at `path` (store.write_export: the file is whole or not there)."""
    export = read_export(path)
    families: Counter = Counter()
    runs = []
    for run in export.runs:
        run, counted = refreshed_run(run)
        runs.append(run)
        families += counted
    write_export(path, runs, export.schema_version)
    return families


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exports", nargs="+", type=Path, help="store JSON exports (Store.export_json)")
    args = parser.parse_args(argv)
    for path in args.exports:
        if not path.is_file():
            parser.error(f"{path}: no such file")
    for path in args.exports:
        families = refresh_file(path)
        print(f"{path}: traffic-model rows per family {dict(sorted(families.items()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
