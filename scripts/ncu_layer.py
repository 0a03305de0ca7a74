#!/usr/bin/env python3
"""Runs bench layer variants for `ncu --profile-from-start off` (scripts/ncu_collect.py).

Each case (layer:dtype:variant) is compiled and warmed up first, then called ONCE inside a
CUDA profiler range, so XLA's compile-time autotuning kernels stay out of the counters.
With --count it instead prints, per case, how many GPU kernels one call launches (from a
jax.profiler trace; run it without ncu, both use CUPTI), so the profiled kernels can be
attributed to cases in order.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_layers import EXTRA_VARIANTS, LAYERS_BY_NAME, make_inputs, variants  # noqa: E402

from jaxcnn._native import library  # noqa: E402
from jaxcnn.profile import device_time  # noqa: E402


def prepared(case: str):
    layer_name, dtype, variant = case.split(":")
    layer = LAYERS_BY_NAME[layer_name]
    fn = jax.jit(variants(layer, dtype, EXTRA_VARIANTS)[variant])
    inputs = make_inputs(layer, dtype, seed=0)
    for _ in range(2):
        jax.block_until_ready(fn(*inputs))
    return fn, inputs


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--count":
        counts = {}
        for case in argv[1:]:
            fn, inputs = prepared(case)
            counts[case] = device_time(fn, *inputs, iters=3).kernels_per_call

        print(json.dumps(counts))
        return 0
    cases = [prepared(case) for case in argv]
    lib = ctypes.CDLL(library.library_state().path)
    for fn, inputs in cases:
        if lib.jaxcnn_cuda_profiler_start() != 0:
            raise RuntimeError("cudaProfilerStart failed")
        jax.block_until_ready(fn(*inputs))
        lib.jaxcnn_cuda_profiler_stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
