#!/usr/bin/env python3
"""Runs ONE bench layer variant once inside a CUDA profiler range, for
`ncu --profile-from-start off` to read its memory counters (scripts/gpu_check.sh, section ncu).

Compiling and warming up happen before the range, so XLA's autotuning kernels stay out.
  ncu --profile-from-start off --clock-control none --csv \
      --metrics dram__bytes.sum,lts__t_bytes.sum,l1tex__t_bytes.sum \
      python scripts/ncu_layer.py vgg_c3_1 bf16 jaxcnn
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_layers import LAYERS_BY_NAME, make_inputs, variants  # noqa: E402

from jaxcnn import _ffi  # noqa: E402


def main(layer_name: str, dtype: str, variant: str) -> int:
    layer = LAYERS_BY_NAME[layer_name]
    fn = jax.jit(variants(layer, dtype)[variant])
    inputs = make_inputs(layer, dtype, seed=0)
    jax.block_until_ready(fn(*inputs))
    jax.block_until_ready(fn(*inputs))
    lib = ctypes.CDLL(_ffi.library_state().path)
    if lib.jaxcnn_cuda_profiler_start() != 0:
        raise RuntimeError("cudaProfilerStart failed")
    jax.block_until_ready(fn(*inputs))
    lib.jaxcnn_cuda_profiler_stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:4]))
