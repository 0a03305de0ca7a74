#!/usr/bin/env python3
"""Runs `ncu` once over many bench layer cases and writes one tidy CSV:
layer, dtype, variant, kernel, metric, unit, value.

A first plain run counts the kernels each case's call launches; the ncu run then profiles one
call per case (scripts/ncu_layer.py), and its kernels are attributed to cases in launch order.

  python scripts/ncu_collect.py --out ncu.csv vgg_c3_1:bf16:jaxcnn vgg_c3_1:bf16:xla_default
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import tempfile
import sys
from pathlib import Path

METRICS = ("dram__bytes.sum", "lts__t_bytes.sum", "l1tex__t_bytes.sum", "gpu__time_duration.sum")
SCRIPT = Path(__file__).resolve().parent / "ncu_layer.py"
FIELDS = ["layer", "dtype", "variant", "kernel", "metric", "unit", "value"]


def _with_xla_flags(*flags: str) -> dict[str, str]:
    return dict(os.environ, XLA_FLAGS=" ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip())


def kernel_counts(cases: list[str], autotune_file: Path) -> dict[str, int]:
    """Kernels per call of each case, from a plain run that also saves XLA's autotuning
    choices, so the ncu run compiles the same kernels without autotuning under ncu (slow,
    and with autotuning off XLA picks far slower convolutions)."""
    env = _with_xla_flags(f"--xla_gpu_dump_autotune_results_to={autotune_file}")
    done = subprocess.run([sys.executable, str(SCRIPT), "--count", *cases],
                          capture_output=True, text=True, timeout=900, check=True, env=env)
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    return {case: int(round(counts[case])) for case in cases}


def ncu_kernel_rows(cases: list[str], autotune_file: Path) -> list[list[dict[str, str]]]:
    """Metric rows grouped per profiled kernel, in launch order."""
    command = ["ncu", "--profile-from-start", "off", "--clock-control", "none", "--csv",
               "--metrics", ",".join(METRICS), sys.executable, str(SCRIPT), *cases]
    # ncu's kernel replay saves and restores the device memory a kernel can reach: with XLA's
    # default arena (75% of the GPU preallocated) that is ~100 GB per replayed kernel.
    env = dict(_with_xla_flags(f"--xla_gpu_load_autotune_results_from={autotune_file}"),
               XLA_PYTHON_CLIENT_PREALLOCATE="false", XLA_PYTHON_CLIENT_ALLOCATOR="platform")
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"ncu failed: {done.stderr[-3000:]}")
    # ncu prints its own "==PROF==" lines and the program's output around the CSV.
    table = "\n".join(line for line in done.stdout.splitlines() if line.startswith('"'))
    kernels: dict[str, list[dict[str, str]]] = {}
    for row in csv.DictReader(io.StringIO(table)):
        kernels.setdefault(row["ID"], []).append(row)
    return [kernels[k] for k in sorted(kernels, key=int)]


def collect(cases: list[str]) -> list[dict[str, str]]:
    """Tidy rows for `cases`, profiled in one ncu process."""
    with tempfile.TemporaryDirectory() as tmp:
        autotune_file = Path(tmp) / "autotune.textproto"
        counts = kernel_counts(cases, autotune_file)
        kernels = ncu_kernel_rows(cases, autotune_file)
    if len(cases) == 1:
        # Alone in its process, every profiled kernel is the case's (ncu can see fewer launches
        # than the profiler trace counts, e.g. a memset node of XLA's command buffer).
        counts = {cases[0]: len(kernels)}
    if len(kernels) != sum(counts.values()):
        raise RuntimeError(f"ncu profiled {len(kernels)} kernels, expected {sum(counts.values())} {counts}")
    out_rows, position = [], 0
    for case in cases:
        layer, dtype, variant = case.split(":")
        for kernel in kernels[position : position + counts[case]]:
            out_rows += [dict(layer=layer, dtype=dtype, variant=variant, kernel=row["Kernel Name"],
                              metric=row["Metric Name"], unit=row["Metric Unit"],
                              value=row["Metric Value"].replace(",", "")) for row in kernel]
        position += counts[case]
        print(f"{case}: {counts[case]} kernel(s)", flush=True)
    return out_rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per-layer", action="store_true",
                        help="one ncu process per layer:dtype, the CSV rewritten after each, so a "
                             "timeout keeps the layers already done")
    parser.add_argument("--per-case", action="store_true",
                        help="one ncu process per case: no attribution by kernel counts")
    parser.add_argument("cases", nargs="+", help="layer:dtype:variant")
    args = parser.parse_args()
    groups: dict[str, list[str]] = {}
    for case in args.cases:
        key = case if args.per_case else case.rsplit(":", 1)[0] if args.per_layer else ""
        groups.setdefault(key, []).append(case)
    out_rows: list[dict[str, str]] = []
    failed = 0
    for cases in groups.values():
        try:
            out_rows += collect(cases)
        except (RuntimeError, subprocess.SubprocessError) as e:
            failed += 1
            print(f"{cases}: {e}", file=sys.stderr, flush=True)
        with args.out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(out_rows)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
