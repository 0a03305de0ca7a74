"""Argument validation, shape rules and the fused-kernel rules of the straight conv chains
(`jaxcnn.conv3x3_conv1x1`, `jaxcnn.conv1x1_depthwise`).

Runs at trace time on static shapes: bad input fails before any kernel runs, with an error
that names the argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from jaxcnn.ops.epilogue import ACTIVATION_CODES
from jaxcnn.ops.operand_checks import INT32_LIMIT, check_int32_shape

SUPPORTED_DTYPES = (np.dtype("float32"), np.dtype("bfloat16"), np.dtype("float16"))
# Per-stage activation: the conv epilogue's (jaxcnn.ops.epilogue, whose codes the handlers'
# act1/act2 take) but leaky_relu, which would need its slope.
ACTIVATIONS = tuple(a for a in ACTIVATION_CODES if a != "leaky_relu")
# The fused 3x3 -> 1x1 kernel's activations (clamps); other ones run XLA's unfused convs.
CLAMP_ACTIVATIONS = (None, "relu", "relu6")
STRIDES = (1, 2)
# conv1x1_depthwise: the depthwise conv's zero padding per side, at most this (3x3 window).
MAX_DEPTHWISE_PAD = 2
SAME_PADDING = ((1, 1), (1, 1))
# Operand order of each primitive and its custom call.
CONV3X3_CONV1X1_OPERANDS = ("x", "w3", "b3", "w1", "b1")
CONV1X1_DEPTHWISE_OPERANDS = ("x", "w1", "b1", "wd", "bd")

# The fused kernels' limits (cuda_ops/chain/chain.h): bf16/fp16, channel counts multiples of 8,
# the resident intermediate (3x3 -> 1x1) or input halo tile (1x1 -> depthwise) bounded, int32
# indexing of whole tensors (INT32_LIMIT). Anything else runs XLA's unfused convs.
FUSED_DTYPES = (np.dtype("bfloat16"), np.dtype("float16"))
CHANNEL_MULTIPLE = 8
CONV3X3_CONV1X1_MAX_MID = 384
CONV1X1_DEPTHWISE_MAX_IN = 256

# conv3x3_conv1x1's kernel choice (a static param of its primitive): "fused" runs the fused
# kernel where it applies (else XLA's unfused convs), "xla" always runs XLA's unfused convs,
# "auto" picks per shape: see conv3x3_conv1x1_runs_fused.
ALGORITHMS = ("auto", "fused", "xla")


@dataclass(frozen=True)
class ChainConfig:
    """Static parameters of one chain (shapes live in the operands)."""

    act1: str | None = "relu"
    act2: str | None = "relu"
    stride: int = 1  # of the depthwise conv; always 1 for conv3x3_conv1x1
    algorithm: str = "auto"  # one of ALGORITHMS; conv3x3_conv1x1 only (conv1x1_depthwise ignores it)
    # conv1x1_depthwise: the depthwise conv's ((top, bottom), (left, right)) zero padding
    padding: tuple = SAME_PADDING


def activation_code(activation: str | None) -> np.int64:
    """The act1/act2 attribute of a chain's custom call."""
    return np.int64(ACTIVATION_CODES[activation])


def _check_padding(padding: Any) -> tuple:
    """An int (every side) or ((top, bottom), (left, right)), each 0..MAX_DEPTHWISE_PAD."""
    if isinstance(padding, (int, np.integer)) and not isinstance(padding, bool):
        padding = ((int(padding),) * 2,) * 2
    try:
        pads = tuple((int(lo), int(hi)) for lo, hi in padding)
    except (TypeError, ValueError):
        pads = ()
    if len(pads) != 2 or any(isinstance(v, bool) for pair in padding for v in pair):
        raise TypeError(f"padding must be an int or ((top, bottom), (left, right)), got {padding!r}")
    if any(not 0 <= v <= MAX_DEPTHWISE_PAD for pair in pads for v in pair):
        raise ValueError(f"padding must be 0..{MAX_DEPTHWISE_PAD} on each side, got {padding!r}")
    return pads


def depthwise_out_size(size: int, pads: tuple[int, int], stride: int) -> int:
    """The 3x3 depthwise conv's output rows (columns) for `size` input rows (columns)."""
    return (size + pads[0] + pads[1] - 3) // stride + 1 if size + sum(pads) >= 3 else 0


def make_chain_config(activations: Any = ("relu", "relu"), stride: Any = 1,
                      algorithm: Any = "auto", padding: Any = 1) -> ChainConfig:
    if (not isinstance(activations, (tuple, list)) or len(activations) != 2
            or any(a not in ACTIVATIONS for a in activations)):
        raise ValueError(f"activations must be a pair of {ACTIVATIONS} (one per conv), "
                         f"got {activations!r}")
    if not isinstance(stride, (int, np.integer)) or isinstance(stride, bool):
        raise TypeError(f"stride must be an int (1 or 2), got {stride!r}")
    if int(stride) not in STRIDES:
        raise ValueError(f"stride must be 1 or 2, got {stride}")
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    return ChainConfig(activations[0], activations[1], int(stride), algorithm, _check_padding(padding))


def _check_dtypes(names: Sequence[str], dtypes: Sequence[Any]) -> np.dtype:
    x_dtype = np.dtype(dtypes[0])
    if x_dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x dtype must be float32, bfloat16 or float16, got {x_dtype.name}")
    for name, dtype in zip(names[1:], dtypes[1:]):
        if np.dtype(dtype) != x_dtype:
            raise TypeError(f"{name} dtype {np.dtype(dtype).name} must equal x dtype {x_dtype.name}")
    return x_dtype


def _check_x(shape: tuple) -> tuple[int, int, int, int]:
    if len(shape) != 4:
        raise ValueError(f"x must be rank 4 [N, H, W, C] (NHWC), got shape {shape}")
    if min(shape[1:]) < 1:
        raise ValueError(f"x must have H, W and C >= 1, got shape {shape}")
    return shape


def _check_weight(name: str, shape: tuple, window: int, cin: int, what: str) -> int:
    """Checks a [window, window, cin, out] HWIO weight; returns out."""
    if len(shape) != 4 or shape[:2] != (window, window):
        raise ValueError(f"{name} must be rank 4 HWIO [{window}, {window}, in, out], got shape {shape}")
    if shape[3] < 1:
        raise ValueError(f"{name} must have >= 1 output channels, got shape {shape}")
    if shape[2] != cin:
        raise ValueError(f"{name} must have shape {(window, window, cin, shape[3])} ({what}), "
                         f"got {shape}")
    return shape[3]


def _check_bias(name: str, shape: tuple, k: int) -> None:
    if shape != (k,):
        raise ValueError(f"{name} must have shape ({k},) (one per output channel of its conv), "
                         f"got {shape}")


def _check_int32(names: Sequence[str], shapes: Sequence[tuple], out: tuple, out_channels: str) -> None:
    """Per-image int32 limits of x, the weights (names[0], names[1], names[3]) and the result,
    whose size grows with `out_channels`' output channels. Larger batches (N * H * W * C past
    int32) are valid: the fused kernels leave those to XLA's convs."""
    check_int32_shape(names[0], shapes[0])
    check_int32_shape(names[1], shapes[1], batch_axis=None)
    check_int32_shape(names[3], shapes[2], batch_axis=None)
    check_int32_shape(out_channels, out,
                      what=f"{out_channels}'s {out[3]} output channels make the result")


def _check_count(names: Sequence[str], shapes: Sequence, want: int, op: str) -> list[tuple]:
    if len(shapes) != want:
        raise ValueError(f"{op} takes {want} operands {tuple(names)}, got {len(shapes)}")
    return [tuple(s) for s in shapes]


def conv3x3_conv1x1_output_shape(shapes: Sequence[Sequence[int]], dtypes: Sequence[Any]) -> tuple:
    """[N, H, W, K] for (x, w3, b3, w1, b1); raises on bad input."""
    names = CONV3X3_CONV1X1_OPERANDS
    x_shape, w3_shape, b3_shape, w1_shape, b1_shape = _check_count(names, shapes, 5, "conv3x3_conv1x1")
    _check_dtypes(names, dtypes)
    n, h, w, c = _check_x(x_shape)
    m = _check_weight("w3", w3_shape, 3, c, f"input channels of x = {c}")
    k = _check_weight("w1", w1_shape, 1, m, f"output channels of w3 = {m}")
    _check_bias("b3", b3_shape, m)
    _check_bias("b1", b1_shape, k)
    out = (n, h, w, k)
    _check_int32(names, (x_shape, w3_shape, w1_shape), out, "w1")
    return out


def conv1x1_depthwise_output_shape(shapes: Sequence[Sequence[int]], dtypes: Sequence[Any],
                                   stride: int, padding: tuple = SAME_PADDING) -> tuple:
    """[N, P, Q, M] for (x, w1, b1, wd, bd): P = (H + top + bottom - 3) // stride + 1 (at
    padding 1, (H - 1) // stride + 1), Q likewise."""
    names = CONV1X1_DEPTHWISE_OPERANDS
    x_shape, w1_shape, b1_shape, wd_shape, bd_shape = _check_count(names, shapes, 5, "conv1x1_depthwise")
    _check_dtypes(names, dtypes)
    n, h, w, c = _check_x(x_shape)
    m = _check_weight("w1", w1_shape, 1, c, f"input channels of x = {c}")
    if wd_shape != (3, 3, 1, m):
        raise ValueError(f"wd must have shape (3, 3, 1, {m}) (depthwise HWIO over the {m} "
                         f"channels of w1), got {wd_shape}")
    _check_bias("b1", b1_shape, m)
    _check_bias("bd", bd_shape, m)
    out = (n, depthwise_out_size(h, padding[0], stride), depthwise_out_size(w, padding[1], stride), m)
    if min(out[1:3]) < 1:
        raise ValueError(f"x's H, W {(h, w)} with padding {padding} leave no 3x3 window")
    _check_int32(names, (x_shape, w1_shape, wd_shape), out, "w1")
    return out


def _fits(*shapes: Sequence[int]) -> bool:
    return all(int(np.prod(s, dtype=np.int64)) < INT32_LIMIT for s in shapes)


def conv3x3_conv1x1_fused(x_shape: Sequence[int], m: int, k: int, dtype: Any,
                          activations: Sequence = ("relu", "relu")) -> bool:
    """True when the fused CUDA kernel applies to this chain (whether it runs:
    conv3x3_conv1x1_runs_fused)."""
    n, h, w, c = x_shape
    return (np.dtype(dtype) in FUSED_DTYPES
            and all(a in CLAMP_ACTIVATIONS for a in activations)
            and all(v % CHANNEL_MULTIPLE == 0 for v in (c, m, k))
            and m <= CONV3X3_CONV1X1_MAX_MID
            # The intermediate too: the kernel indexes pixels of it in int32.
            and _fits(x_shape, (n, h, w, m), (n, h, w, k), (3, 3, c, m)))


def conv3x3_conv1x1_runs_fused(x_shape: Sequence[int], m: int, k: int, dtype: Any,
                               algorithm: str, activations: Sequence = ("relu", "relu")) -> bool:
    """The one rule for conv3x3_conv1x1's kernel choice: True when its CUDA lowering runs the
    fused kernel, False when it runs XLA's unfused convs (the reference lowering).

    "auto" is "xla" on every shape for now. Measured on an H100 (bf16, device time), the fused
    kernel ran at 0.2-0.8x of XLA's plain layers (cuDNN wgmma convs) on every shape tried:
    ResNet-50 conv2 -> conv3 56x56 64->64->256 190 us vs 95 us (N = 64), 13.8 vs 11.3 us
    (N = 1); 28x28 128->128->512 174 vs 57 us; 14x14 256->256->1024 223 vs 48 us;
    28x28 128->128->128 113 vs 44 us (N = 64). The kernel's mma.sync mainloop reaches ~110
    TFLOP/s while cuDNN's wgmma convs reach several times that, and fusing saves only t's
    DRAM round trip, which is small next to these layers' FLOPs. A faster kernel changes this
    function (and only this one).
    """
    if algorithm == "xla" or algorithm == "auto":
        return False
    if algorithm == "fused":
        return conv3x3_conv1x1_fused(x_shape, m, k, dtype, activations)
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


def conv1x1_depthwise_fused(x_shape: Sequence[int], m: int, stride: int, dtype: Any,
                            padding: tuple = SAME_PADDING) -> bool:
    """True when the fused CUDA kernel runs this chain (else XLA's unfused convs do)."""
    n, h, w, c = x_shape
    p, q = depthwise_out_size(h, padding[0], stride), depthwise_out_size(w, padding[1], stride)
    return (np.dtype(dtype) in FUSED_DTYPES
            and c % CHANNEL_MULTIPLE == 0 and m % CHANNEL_MULTIPLE == 0
            and c <= CONV1X1_DEPTHWISE_MAX_IN
            and _fits(x_shape, (n, h, w, m), (n, p, q, m), (1, 1, c, m)))
