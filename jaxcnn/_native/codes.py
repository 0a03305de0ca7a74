"""Integer codes Python sends the CUDA library that no jaxcnn.ops table holds.

The op tables whose index is the code (conv2d's LAYOUTS, PRECISIONS and ALGORITHMS, the fire
and conv+pool ALGORITHMS, the epilogue's ACTIVATION_CODES) stay with their ops, which validate
arguments against them; tests/native/test_native_contract.py and tests/ops/test_epilogue_codes.py check
them against the C++ source.
"""

from __future__ import annotations

import jax.numpy as jnp

# Codes of the dtype argument of the library's queries (cuda_ops/conv/conv2d_ffi.cu) by numpy
# dtype name.
DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}


def dtype_code(dtype) -> int:
    """The library's code for `dtype` (anything jnp.dtype takes)."""
    return DTYPE_CODES[jnp.dtype(dtype).name]
