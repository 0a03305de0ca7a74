"""Every integer code Python sends the CUDA library, in one place: the ops validate their
arguments against these tables and lower them as these codes, and the library's queries pass
them too. tests/native/test_native_contract.py and tests/ops/test_epilogue_codes.py check them
against the C++ source.
"""

from __future__ import annotations

import jax.numpy as jnp

# Codes of the dtype argument of the library's queries (cuda_ops/conv/conv2d_ffi.cu) by numpy
# dtype name.
DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
# Activation layouts; code = index (TensorLayout in cuda_ops/common/conv2d_params.h).
LAYOUTS: tuple[str, ...] = ("NHWC", "NCHW", "CHWN")
LAYOUT_CODES: dict[str, int] = {name: code for code, name in enumerate(LAYOUTS)}
# conv2d's fp32 math; code = index (MathPrecision): "default" may use TF32 tensor cores (as
# XLA's DEFAULT does on GPUs), "highest" is fp32-accurate.
CONV2D_PRECISIONS = ("default", "highest")
# conv2d's kernel family; code = index (Conv2dAlgorithm). "auto" lets the CUDA handler pick;
# "xla" (4) never reaches the handler: it runs XLA's own convolution.
CONV2D_ALGORITHMS = ("auto", "direct", "tensor_core", "depthwise", "xla", "wgmma", "stem")
# The fire module's and conv + pool's kernel choices; code = index (FireAlgorithm in
# cuda_ops/fusion/fire.h, ConvPoolAlgorithm in cuda_ops/conv_pool/conv_pool.h).
FIRE_ALGORITHMS = ("auto", "tensor_core", "fma", "wgmma", "two_phase")
CONV_POOL_ALGORITHMS = ("auto", "tensor_core", "direct", "stem", "wgmma")
# Epilogue activation -> code (Activation in cuda_ops/common/epilogue.cuh).
ACTIVATION_CODES = {
    None: 0,
    "relu": 1,
    "relu6": 2,
    "silu": 3,
    "hard_swish": 4,
    "gelu_tanh": 5,
    "gelu_erf": 6,
    "sigmoid": 7,
    "leaky_relu": 8,
}


def dtype_code(dtype) -> int:
    """The library's code for `dtype` (anything jnp.dtype takes)."""
    return DTYPE_CODES[jnp.dtype(dtype).name]
