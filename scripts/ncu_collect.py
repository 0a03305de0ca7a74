#!/usr/bin/env python3
"""Runs `ncu` on bench layers (scripts/ncu_layer.py: one call inside a profiler range) and
writes one tidy CSV: layer, dtype, variant, kernel, metric, unit, value.

  python scripts/ncu_collect.py --out ncu.csv vgg_c3_1:bf16:jaxcnn vgg_c3_1:bf16:xla_default
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
from pathlib import Path

METRICS = ("dram__bytes.sum", "lts__t_bytes.sum", "l1tex__t_bytes.sum", "gpu__time_duration.sum")
SCRIPT = Path(__file__).resolve().parent / "ncu_layer.py"


def ncu_rows(layer: str, dtype: str, variant: str) -> list[dict[str, str]]:
    command = ["ncu", "--profile-from-start", "off", "--clock-control", "none", "--csv",
               "--metrics", ",".join(METRICS), sys.executable, str(SCRIPT), layer, dtype, variant]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"ncu failed for {layer} {dtype} {variant}: {done.stderr[-2000:]}")
    # ncu prints its own "==PROF==" lines and the program's output around the CSV.
    table = "\n".join(line for line in done.stdout.splitlines() if line.startswith('"'))
    return [
        dict(layer=layer, dtype=dtype, variant=variant, kernel=row["Kernel Name"],
             metric=row["Metric Name"], unit=row["Metric Unit"], value=row["Metric Value"].replace(",", ""))
        for row in csv.DictReader(io.StringIO(table))
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("cases", nargs="+", help="layer:dtype:variant")
    args = parser.parse_args()
    rows, failed = [], 0
    for case in args.cases:
        try:
            case_rows = ncu_rows(*case.split(":"))
        except (RuntimeError, subprocess.TimeoutExpired) as err:
            print(err, file=sys.stderr)
            failed += 1
            continue
        rows += case_rows
        print(f"{case}: {len(case_rows)} metric rows", flush=True)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["layer", "dtype", "variant", "kernel", "metric", "unit", "value"])
        writer.writeheader()
        writer.writerows(rows)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
