"""Automatic activation-layout (and conv kernel) choice: a rule, on-device autotuning with a
disk cache, and an exact dynamic program over chains of layers.

    import jaxcnn.layouts as L
    L.rule_conv((64, 56, 56, 64), (3, 3, 64, 128), "bfloat16")        # prior, with a reason
    choice = L.autotune_conv((64, 56, 56, 64), (3, 3, 64, 128), "bfloat16", padding="SAME")
    print(choice.explain())                                            # every candidate vs XLA
    plan = L.plan_model_layouts("squeezenet1_1", batch=64, dtype="bfloat16")
    print(plan.explain())
    y = jax.jit(lambda p, x: L.apply_plan(plan, p, x))(params, x)      # run the plan

Layouts are "NHWC", "NCHW" and "CHWN" (jaxcnn.ops.layouts); shapes given to this module are
always *logical* NHWC activations and HWIO weights, whatever layout a candidate runs in.

Costs come from one of three sources, always labelled:
  "measured": device time of the kernel (jaxcnn.profile.device_times, profiler kernel events)
      on the GPU this process sees, cached on disk per GPU kind;
  "model":    estimates on a machine without the CUDA kernels: jaxcnn.perfmodel predictions for
      the implicit-GEMM families, else bytes (at 32-byte sector granularity) / DRAM bandwidth of
      the GPU spec, plus a per-kernel floor;
  "given":    costs handed to choose_chain by the caller.

Cache: JSON at $JAXCNN_AUTOTUNE_CACHE, else ~/.cache/jaxcnn/autotune.json; entries keyed by GPU
device_kind, op, shapes, dtype and parameters. Writes merge under a file lock and replace the
file atomically; an unreadable file is ignored with a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from jaxcnn.ops.conv_args import (
    ALGORITHMS,
    SUPPORTED_DTYPES,
    conv2d_output_shape,
    make_config,
    normalize_precision,
)
from jaxcnn.ops.layouts import LAYOUTS, check_layout, convert_shape, permutation
from jaxcnn.profile.gpu_specs import GpuSpec, lookup_gpu_spec, spec_by_name
from jaxcnn.tuning import cache_file
from jaxcnn.tuning.measure import device_kind as _device_kind
from jaxcnn.tuning.measure import outside_traces
from jaxcnn.tuning.measure import should_measure as _should_measure
from jaxcnn.tuning.measure import try_run as _try_run

__all__ = [
    "LAYOUTS", "AutotuneCache", "Block", "CandidateResult", "ChainPlan", "ChainStep",
    "ConvChoice", "Layer", "LayerCost", "PoolChoice", "RuleChoice", "Transform",
    "apply_plan", "autotune_conv", "autotune_pool", "autotune_transforms", "choose_chain",
    "conv_layer", "default_cache_path", "explain", "layer_cost", "model_chain",
    "plan_model_layouts", "pool_layer", "rule_conv", "rule_for", "rule_pool", "transform_ms",
]

Shape = tuple[int, ...]

# --------------------------------------------------------------------------- constants

# The tensor-core family (cuda_ops/conv_tc) runs groups == 1 with K a multiple of 8 (16-byte TMA
# rows of the output; fp32 needs 4, 8 covers both); any C (it zero-pads C to the row width).
TENSOR_CORE_CHANNEL_MULTIPLE = 8
# Depthwise NHWC loads 4 channels per vector; CHWN vectorizes over the batch when a warp's worth
# of images is there.
DEPTHWISE_VECTOR_CHANNELS = 4
DEPTHWISE_CHWN_MIN_N = 32
# Li et al. (SC'16) layout thresholds for CUDA-core convolutions: CHWN when N >= Nt and C < Ct,
# else NCHW (measured there on Kepler/Maxwell; they apply to our CUDA-core direct kernel, and
# autotuning is what settles each layer on Hopper).
SEED_CHWN_MIN_N = 128
SEED_CHWN_MAX_C = 32
# DRAM moves 32-byte sectors: a contiguous run shorter than this wastes the rest of the sector.
SECTOR_BYTES = 32
# Shortest device time a kernel launch shows (ramp-up and tail of even a tiny grid, ~2 us on
# H100/H200 traces): model estimates never go below it, so transforms are never free.
KERNEL_FLOOR_MS = 0.002
# 3xTF32 (fp32-accurate tensor-core math) issues three TF32 MMAs per product.
TF32X3_FACTOR = 3.0

# Inputs held at once while timing transforms (see autotune_transforms).
TRANSFORM_BATCH_BYTES = 4 << 30

CACHE_ENV = "JAXCNN_AUTOTUNE_CACHE"
CACHE_VERSION = 1
POOL_OPS = ("maxpool", "avgpool")
# Layout-agnostic ops of the zoo: same bytes in every layout.
ELEMENTWISE_OPS = ("relu6", "add", "concat")
SOURCES = ("measured", "model", "given")


# --------------------------------------------------------------------------- helpers


def _dtype_name(dtype: Any, arg: str = "dtype") -> str:
    try:
        dt = np.dtype(dtype) if not isinstance(dtype, str) else np.dtype(_DTYPE_ALIASES.get(dtype, dtype))
    except TypeError:
        raise TypeError(f"{arg} must be a dtype (float32, bfloat16, float16), got {dtype!r}") from None
    if dt not in SUPPORTED_DTYPES:
        raise TypeError(f"{arg} must be one of float32, bfloat16, float16, got {dt.name}")
    return dt.name


_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _shape4(shape: Any, arg: str) -> Shape:
    if not isinstance(shape, Sequence) or isinstance(shape, str):
        raise TypeError(f"{arg} must be a sequence of 4 ints, got {shape!r}")
    if len(shape) != 4 or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape):
        raise ValueError(f"{arg} must have 4 int dims, got {tuple(shape)!r}")
    if min(shape) < 1:
        raise ValueError(f"{arg} must have dims >= 1, got {tuple(shape)}")
    return tuple(int(d) for d in shape)


def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def _prod(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def _fmt_ms(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.4f}" if value < 1 else f"{value:.3f}"


def _shape_text(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _resolve_spec(gpu: str | GpuSpec | None, measured: bool) -> tuple[GpuSpec, str]:
    """The GPU spec to model with, and a note on how it was picked."""
    if isinstance(gpu, GpuSpec):
        return gpu, ""
    if gpu is not None:
        if not isinstance(gpu, str):
            raise TypeError(f"gpu must be a GPU name, a GpuSpec or None, got {gpu!r}")
        try:
            return spec_by_name(gpu), ""
        except KeyError as err:
            raise ValueError(f"gpu: {err.args[0]}") from None
    if measured:
        spec = lookup_gpu_spec()
        if spec is not None:
            return spec, ""
        return spec_by_name("H200"), f"no spec for {_device_kind()!r}: H200 ceilings assumed"
    import jax

    if jax.default_backend() == "gpu":
        spec = lookup_gpu_spec()
        if spec is not None:
            return spec, ""
    return spec_by_name("H200"), "no GPU here: H200 ceilings assumed"


# --------------------------------------------------------------------------- layers


@dataclass(frozen=True)
class Layer:
    """One layer of a chain, by its logical NHWC shapes (what it costs does not depend on how
    it was built). op: "conv2d", "maxpool", "avgpool", "relu6", "add" or "concat"."""

    op: str
    x_shape: Shape
    y_shape: Shape
    dtype: str
    name: str = ""
    w_shape: Shape | None = None  # HWIO, conv2d only
    window: tuple[int, int] | None = None  # pools only
    stride: tuple[int, int] = (1, 1)
    padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    activation: str | None = None
    precision: str = "default"
    bias: bool = True
    input_shapes: tuple[Shape, ...] = ()  # every input (add, concat); () means (x_shape,)

    def __post_init__(self) -> None:
        if self.op not in ("conv2d", *POOL_OPS, *ELEMENTWISE_OPS):
            raise ValueError(f"op must be conv2d, {', '.join(POOL_OPS + ELEMENTWISE_OPS)}; got {self.op!r}")
        if self.op == "conv2d" and self.w_shape is None:
            raise ValueError(f"layer {self.name!r}: conv2d needs w_shape")
        if self.op in POOL_OPS and self.window is None:
            raise ValueError(f"layer {self.name!r}: {self.op} needs window")

    @property
    def inputs(self) -> tuple[Shape, ...]:
        return self.input_shapes or (self.x_shape,)

    @property
    def bytes(self) -> int:
        """Inputs, weights and output moved once each."""
        elements = sum(_prod(s) for s in self.inputs) + _prod(self.y_shape)
        if self.w_shape is not None:
            elements += _prod(self.w_shape) + (self.w_shape[3] if self.bias else 0)
        return elements * _itemsize(self.dtype)

    @property
    def is_depthwise(self) -> bool:
        if self.op != "conv2d":
            return False
        c, k = self.x_shape[3], self.w_shape[3]
        return self.groups == c and c > 1 and k % c == 0

    def conv_kwargs(self) -> dict[str, Any]:
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation,
                    groups=self.groups, activation=self.activation, precision=self.precision)

    def describe(self) -> str:
        if self.op == "conv2d":
            return (f"conv2d x {_shape_text(self.x_shape)} w {_shape_text(self.w_shape)} {self.dtype} "
                    f"stride {self.stride} pad {self.padding} dil {self.dilation} g{self.groups}"
                    f"{' relu' if self.activation else ''}")
        if self.op in POOL_OPS:
            return (f"{self.op} x {_shape_text(self.x_shape)} {self.dtype} window {self.window} "
                    f"stride {self.stride} pad {self.padding}")
        ins = ", ".join(_shape_text(s) for s in self.inputs)
        return f"{self.op} {ins} -> {_shape_text(self.y_shape)} {self.dtype}"

    @classmethod
    def from_layer_info(cls, info: Any, precision: Any = None) -> "Layer":
        """From a jaxcnn.models LayerInfo (4-D NHWC input and output)."""
        if len(info.input_shapes[0]) != 4 or len(info.output_shape) != 4:
            raise ValueError(f"layer {info.name!r} ({info.op}) is not 4-D: no activation layout")
        common = dict(name=info.name, x_shape=tuple(info.input_shapes[0]),
                      y_shape=tuple(info.output_shape), dtype=_dtype_name(info.dtype),
                      input_shapes=tuple(tuple(s) for s in info.input_shapes))
        if info.op == "conv2d":
            return cls("conv2d", w_shape=tuple(info.weight_shape), stride=tuple(info.stride),
                       padding=tuple(map(tuple, info.padding)), dilation=tuple(info.dilation),
                       groups=int(info.groups), activation=info.activation,
                       precision=normalize_precision(precision),
                       bias=info.bias_shape is not None, **common)
        if info.op in POOL_OPS:
            return cls(info.op, window=tuple(info.window), stride=tuple(info.stride),
                       padding=tuple(map(tuple, info.padding)), **common)
        if info.op in ELEMENTWISE_OPS:
            return cls(info.op, activation=info.activation, **common)
        raise ValueError(f"layer {info.name!r}: op {info.op!r} has no layout choice")


def conv_layer(x_shape, w_shape, dtype="bfloat16", *, stride=1, padding="SAME", dilation=1,
               groups=1, activation=None, precision=None, bias=True, name="") -> Layer:
    """A conv2d Layer from conv2d's arguments (x logical NHWC, w HWIO); validates them."""
    x_shape, w_shape = _shape4(x_shape, "x_shape"), _shape4(w_shape, "w_shape")
    dtype = _dtype_name(dtype)
    cfg = make_config(x_shape, w_shape, stride=stride, padding=padding, dilation=dilation,
                      groups=groups, activation=activation, precision=precision)
    y_shape = conv2d_output_shape(x_shape, dtype, w_shape, dtype, (w_shape[3],) if bias else None,
                                  dtype, cfg)
    return Layer("conv2d", x_shape, tuple(y_shape), dtype, name=name, w_shape=w_shape,
                 stride=cfg.stride, padding=cfg.padding, dilation=cfg.dilation, groups=cfg.groups,
                 activation=cfg.activation, precision=cfg.precision, bias=bool(bias))


def pool_layer(x_shape, dtype="bfloat16", *, op="maxpool", window=2, stride=None, padding=0,
               name="") -> Layer:
    """A maxpool/avgpool Layer (x logical NHWC); stride defaults to the window."""
    if op not in POOL_OPS:
        raise ValueError(f"op must be one of {POOL_OPS}, got {op!r}")
    x_shape, dtype = _shape4(x_shape, "x_shape"), _dtype_name(dtype)
    cfg = make_config(x_shape, (*_pair(window, "window"), 1, 1),
                      stride=_pair(window, "window") if stride is None else stride, padding=padding)
    (pt, pb), (pl, pr) = cfg.padding
    (wh, ww), (sh, sw) = _pair(window, "window"), cfg.stride
    p = (x_shape[1] + pt + pb - wh) // sh + 1
    q = (x_shape[2] + pl + pr - ww) // sw + 1
    if p < 1 or q < 1:
        raise ValueError(f"window {window} does not fit the padded input of {x_shape}")
    return Layer(op, x_shape, (x_shape[0], p, q, x_shape[3]), dtype, name=name,
                 window=_pair(window, "window"), stride=cfg.stride, padding=cfg.padding)


def _pair(value: Any, arg: str) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value), int(value))
    if isinstance(value, Sequence) and len(value) == 2 and all(isinstance(v, (int, np.integer)) for v in value):
        return (int(value[0]), int(value[1]))
    raise TypeError(f"{arg} must be an int or a pair of ints, got {value!r}")


@dataclass(frozen=True)
class Block:
    """Layers that run in one layout (a fire module, a residual block: branches whose inputs
    and outputs must agree). Its input is the first layer's input, its output the last's."""

    name: str
    layers: tuple[Layer, ...]

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError(f"block {self.name!r} has no layers")
        if not all(isinstance(layer, Layer) for layer in self.layers):
            raise TypeError(f"block {self.name!r}: layers must be Layer objects")

    @property
    def x_shape(self) -> Shape:
        return self.layers[0].x_shape

    @property
    def y_shape(self) -> Shape:
        return self.layers[-1].y_shape

    @property
    def dtype(self) -> str:
        return self.layers[0].dtype


# --------------------------------------------------------------------------- the rule


@dataclass(frozen=True)
class RuleChoice:
    """The rule's preferred (layout, algorithm) for one layer, and why."""

    layout: str
    algorithm: str
    reason: str
    layer: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def explain(self) -> str:
        head = f"{self.layer}: " if self.layer else ""
        return f"{head}rule -> {self.layout}/{self.algorithm}: {self.reason}"


def rule_conv(x_shape, w_shape, dtype="bfloat16", *, stride=1, padding="SAME", dilation=1,
              groups=1, activation=None, precision=None, name="") -> RuleChoice:
    """The preferred (layout, algorithm) of a conv on Hopper, before any measurement.

    * depthwise (groups == C, K = C * multiplier): memory-bound. NHWC when C % 4 == 0 (4-channel
      vectors); else CHWN when N >= 32 (vectors over the batch); else NHWC (no layout vectorizes,
      and NHWC is what the neighbours use).
    * dense with C/groups and K/groups multiples of 8: NHWC tensor cores (channels contiguous =
      GEMM K contiguous, what TMA/ldmatrix tiles want).
    * otherwise the CUDA-core direct kernel with the seed's thresholds (Li et al.): CHWN when
      N >= 128 and C < 32 (coalesced over the batch), else NCHW.
    """
    layer = conv_layer(x_shape, w_shape, dtype, stride=stride, padding=padding, dilation=dilation,
                       groups=groups, activation=activation, precision=precision, name=name)
    return _rule_conv_layer(layer)


def _rule_conv_layer(layer: Layer) -> RuleChoice:
    n, _, _, c = layer.x_shape
    k, g = layer.w_shape[3], layer.groups
    if layer.is_depthwise:
        if c % DEPTHWISE_VECTOR_CHANNELS == 0:
            return RuleChoice("NHWC", "depthwise", f"depthwise, memory-bound: C={c} is a multiple of "
                              f"{DEPTHWISE_VECTOR_CHANNELS}, so NHWC loads channel vectors", layer.name)
        if n >= DEPTHWISE_CHWN_MIN_N:
            return RuleChoice("CHWN", "depthwise", f"depthwise, memory-bound: C={c} does not vectorize "
                              f"but N={n} >= {DEPTHWISE_CHWN_MIN_N}, so CHWN loads batch vectors", layer.name)
        return RuleChoice("NHWC", "depthwise", f"depthwise, memory-bound: neither C={c} nor N={n} "
                          "vectorizes; NHWC avoids transforms", layer.name)
    m = TENSOR_CORE_CHANNEL_MULTIPLE
    if g == 1 and k % m == 0:
        return RuleChoice("NHWC", "tensor_core", f"groups=1 and K={k} a multiple of {m}: "
                          "tensor-core implicit GEMM with GEMM-K (channels) contiguous in NHWC",
                          layer.name)
    if n >= SEED_CHWN_MIN_N and c < SEED_CHWN_MAX_C:
        return RuleChoice("CHWN", "direct", f"grouped or K not a multiple of {m}: CUDA-core direct; seed "
                          f"rule N={n} >= {SEED_CHWN_MIN_N} and C={c} < {SEED_CHWN_MAX_C}: CHWN "
                          "coalesces over the batch", layer.name)
    return RuleChoice("NCHW", "direct", f"grouped or K not a multiple of {m}: CUDA-core direct; seed rule "
                      f"(N={n} < {SEED_CHWN_MIN_N} or C={c} >= {SEED_CHWN_MAX_C}): NCHW", layer.name)


def rule_pool(x_shape, dtype="bfloat16", *, neighbour_layout: str | None = None, name="") -> RuleChoice:
    """Pools are memory-bound in every layout (same bytes, all coalesced): keep the
    neighbours' layout, since a transform alone moves as many bytes as the pool."""
    _shape4(x_shape, "x_shape")
    _dtype_name(dtype)
    layout = check_layout(neighbour_layout, "neighbour_layout") if neighbour_layout else "NHWC"
    why = "the neighbours' layout" if neighbour_layout else "NHWC (no neighbour given)"
    return RuleChoice(layout, "xla", f"pooling is memory-bound in every layout: {why}", name)


def rule_for(layer: Layer, neighbour_layout: str | None = None) -> RuleChoice:
    """The rule's choice for any Layer (elementwise ops behave like pools)."""
    if not isinstance(layer, Layer):
        raise TypeError(f"layer must be a Layer, got {type(layer).__name__}")
    if layer.op == "conv2d":
        return _rule_conv_layer(layer)
    return rule_pool(layer.x_shape, layer.dtype, neighbour_layout=neighbour_layout, name=layer.name)


# --------------------------------------------------------------------------- candidates


def default_conv_candidates(layer: Layer) -> list[tuple[str, str]]:
    """(layout, algorithm) pairs worth timing for a conv: tensor cores in NHWC, the direct kernel
    in every layout, the depthwise kernel in every layout where it applies, and XLA's own conv
    in NHWC (so a plan is never slower than XLA on a layer where cuDNN wins)."""
    if layer.is_depthwise:
        return [(lay, "depthwise") for lay in LAYOUTS] + [("NHWC", "direct"), ("NHWC", "xla")]
    return [("NHWC", "tensor_core")] + [(lay, "direct") for lay in LAYOUTS] + [("NHWC", "xla")]


def _check_candidates(candidates: Any) -> list[tuple[str, str]]:
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Iterable):
        raise TypeError(f"candidates must be a list of (layout, algorithm) pairs, got {candidates!r}")
    out = []
    for item in candidates:
        if not isinstance(item, Sequence) or isinstance(item, str) or len(item) != 2:
            raise TypeError(f"candidates must hold (layout, algorithm) pairs, got {item!r}")
        layout, algorithm = item
        check_layout(layout, "candidate layout")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"candidate algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        if (layout, algorithm) not in out:
            out.append((layout, algorithm))
    if not out:
        raise ValueError("candidates must not be empty")
    return out


# --------------------------------------------------------------------------- model estimates


def _run_bytes(layout: str, shape: Shape, itemsize: int, stride_w: int = 1, reach_w: int = 1) -> float:
    """Bytes fetched per useful byte of an activation read/written along `layout`'s innermost
    dim: runs shorter than a sector waste the rest of it, and in NCHW rows a W stride larger
    than the window's width (reach_w) skips elements that are fetched anyway."""
    dims = dict(zip("NHWC", shape))
    run = dims[layout[-1]] * itemsize
    waste = max(1.0, SECTOR_BYTES / run)
    if layout == "NCHW" and stride_w > reach_w:
        waste *= min(stride_w / reach_w, SECTOR_BYTES / itemsize)
    return waste


def _activation_bytes(layer: Layer, layout: str) -> float:
    """DRAM bytes of a layer's activations in `layout` at sector granularity (+ weights)."""
    item = _itemsize(layer.dtype)
    if layer.w_shape is not None:
        reach = (layer.w_shape[1] - 1) * layer.dilation[1] + 1
    else:
        reach = layer.window[1] if layer.window is not None else layer.stride[1]
    total = sum(_prod(s) * item * _run_bytes(layout, s, item, layer.stride[1], reach) for s in layer.inputs)
    total += _prod(layer.y_shape) * item * _run_bytes(layout, layer.y_shape, item)
    if layer.w_shape is not None:
        total += (_prod(layer.w_shape) + layer.w_shape[3]) * item
    return total


def _memory_ms(nbytes: float, spec: GpuSpec) -> float:
    return max(KERNEL_FLOOR_MS, nbytes / spec.memory.per_s * 1e3)


def transform_ms(shape: Sequence[int], dtype: Any, src: str, dst: str,
                 gpu: str | GpuSpec | None = None) -> float:
    """Model time of to_layout(src -> dst) of a logical NHWC `shape`: read + write of its
    bytes at the GPU's copy bandwidth (0 when src == dst)."""
    shape, dtype = _shape4(shape, "shape"), _dtype_name(dtype)
    if check_layout(src, "src") == check_layout(dst, "dst"):
        return 0.0
    spec, _ = _resolve_spec(gpu, measured=False)
    return _memory_ms(2 * _prod(shape) * _itemsize(dtype), spec)


def _perf_layer(layer: Layer):
    from jaxcnn.perfmodel import ConvLayer

    n, h, w, c = layer.x_shape
    r, s, _, k = layer.w_shape
    return ConvLayer(n, h, w, c, k, r, s, stride=layer.stride, padding=layer.padding,
                     dilation=layer.dilation, groups=layer.groups, dtype=layer.dtype, name=layer.name)


def _fp32_fma_ms(flops: float, spec: GpuSpec) -> float:
    return flops / spec.fp32_fma_peak.per_s * 1e3


def _conv_flops(layer: Layer) -> float:
    n, p, q, k = layer.y_shape
    r, s, cg, _ = layer.w_shape
    return 2.0 * n * p * q * k * r * s * cg


def _model_conv_candidate(layer: Layer, layout: str, algorithm: str, spec: GpuSpec) -> tuple[float | None, str]:
    """(estimate in ms or None when the family cannot run, how it was estimated)."""
    memory = _memory_ms(_activation_bytes(layer, layout), spec)
    if algorithm == "xla":
        if layout != "NHWC":
            return None, "XLA's conv is modelled in NHWC only"
        return _model_xla_conv(layer, spec)
    if algorithm == "depthwise":
        if not layer.is_depthwise:
            return None, "cannot run: depthwise needs groups == C"
        compute = _fp32_fma_ms(_conv_flops(layer), spec)
        return max(memory, compute), "max(sector bytes / DRAM bw, FLOPs / fp32 FMA peak)"
    try:
        return _model_gemm_candidate(layer, layout, algorithm, spec, memory)
    except (KeyError, ValueError, ZeroDivisionError) as err:  # a shape the perfmodel cannot tile
        compute = _fp32_fma_ms(_conv_flops(layer), spec)
        return max(memory, compute), f"perfmodel failed ({err}): max(bytes / bw, FLOPs / fp32 peak)"


def _model_gemm_candidate(layer: Layer, layout: str, algorithm: str, spec: GpuSpec,
                          memory: float) -> tuple[float | None, str]:
    from jaxcnn.perfmodel import predict

    if algorithm == "tensor_core":
        if layout != "NHWC":
            return None, "modelled in NHWC only (GEMM-K contiguous)"
        g = layer.groups
        if g != 1 or layer.w_shape[3] % TENSOR_CORE_CHANNEL_MULTIPLE:
            return None, f"cannot run: needs groups == 1 and K a multiple of {TENSOR_CORE_CHANNEL_MULTIPLE}"
        pred = predict(_perf_layer(layer), spec, impl="xla", precision="default")
        time = pred.time_ms
        how = f"perfmodel implicit GEMM ({pred.tiling.name})"
        if layer.dtype == "float32" and layer.precision == "highest":
            time *= TF32X3_FACTOR
            how += f" x{TF32X3_FACTOR:g} (3xTF32)"
        return max(time, memory), how
    if algorithm in ("direct", "auto"):
        pred = predict(_perf_layer(layer), spec, impl="jaxcnn_direct")
        # The perfmodel describes the NHWC kernel; other layouts differ in how their gathers
        # coalesce, i.e. in sector traffic: swap the NHWC activation bytes for this layout's.
        extra = _memory_ms(_activation_bytes(layer, layout), spec) - _memory_ms(_activation_bytes(layer, "NHWC"), spec)
        time = max(pred.time_ms + extra, memory)
        return time, f"perfmodel direct ({pred.tiling.name}), sector traffic of {layout}"
    return None, f"no model for algorithm {algorithm!r}"


def _model_xla_conv(layer: Layer, spec: GpuSpec) -> tuple[float, str]:
    from jaxcnn.perfmodel import predict

    memory = _memory_ms(_activation_bytes(layer, "NHWC"), spec)
    if layer.groups > 1 and layer.x_shape[3] // layer.groups < TENSOR_CORE_CHANNEL_MULTIPLE:
        # cuDNN runs (near-)depthwise convs with its own CUDA-core kernels, not a GEMM tiling.
        return max(memory, _fp32_fma_ms(_conv_flops(layer), spec)), "bytes / DRAM bw (depthwise)"
    try:
        pred = predict(_perf_layer(layer), spec, impl="xla", precision=layer.precision)
    except (KeyError, ValueError, ZeroDivisionError) as err:
        return max(memory, _fp32_fma_ms(_conv_flops(layer), spec)), f"perfmodel failed ({err})"
    return max(pred.time_ms, memory), f"perfmodel ({pred.tiling.name})"


# --------------------------------------------------------------------------- the cache


def default_cache_path() -> Path:
    """$JAXCNN_AUTOTUNE_CACHE, else ~/.cache/jaxcnn/autotune.json."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "jaxcnn" / "autotune.json"


class AutotuneCache:
    """Measured results on disk as JSON: {"version": 1, "entries": {key: record}}.

    `put` re-reads the file under an exclusive lock, merges and replaces it atomically
    (temporary file + os.replace), so concurrent writers never lose each other's entries and
    readers never see a half-written file. A file that is not cache JSON (any bytes), and every
    entry that `entry_problem(key, record)` finds malformed, is ignored with one warning
    (jaxcnn.tuning.cache_file) and left out of the next write.
    """

    _thread_lock = threading.Lock()

    def __init__(self, path: str | os.PathLike | None = None, *, what: str = "autotune cache",
                 entry_problem: Callable[[str, Any], str | None] | None = None):
        self.path = Path(path).expanduser() if path is not None else default_cache_path()
        self.what = what  # how warnings name the file
        self.entry_problem = entry_problem or _autotune_entry_problem

    @staticmethod
    def key(**fields: Any) -> str:
        """A stable string key from JSON-able fields (sorted)."""
        return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=list)

    def load(self) -> dict[str, Any]:
        """The well-formed entries; {} when the file is missing or unusable (warned once)."""
        data = cache_file.read_json(self.path, self.what, _cache_file_problem)
        if data is None:
            return {}
        entries, problems = cache_file.valid_entries(data["entries"], self.entry_problem)
        if problems:
            cache_file.report_once(
                self.path, self.what, f"{len(problems)} malformed entr{'y' if len(problems) == 1 else 'ies'}"
                f" ignored, first {problems[0]}", json.dumps(data, sort_keys=True).encode(),
                action="the next store rewrites it without them")
        return entries

    def get(self, key: str) -> dict[str, Any] | None:
        return self.load().get(key)

    def put(self, key: str, record: dict[str, Any]) -> None:
        self.put_many({key: record})

    def put_many(self, records: Mapping[str, dict[str, Any]]) -> None:
        if not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked():
            entries = self.load()  # an unusable file or entry is reported (once) and dropped here
            entries.update(records)
            payload = json.dumps({"version": CACHE_VERSION, "entries": entries}, indent=1, sort_keys=True)
            cache_file.write_text_atomic(self.path, payload)

    @contextlib.contextmanager
    def _locked(self):
        """Exclusive lock on a side file (flock where available) plus an in-process lock."""
        with self._thread_lock:
            lock_path = self.path.with_name(self.path.name + ".lock")
            with open(lock_path, "a") as handle:
                try:
                    import fcntl
                except ImportError:  # not POSIX: atomic replace still keeps the file whole
                    yield
                    return
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# What the cache's readers rely on: the file and each kind of record (the "op" of its key).
_cache_file_problem = cache_file.fields({"version": cache_file.equal_to(CACHE_VERSION),
                                         "entries": cache_file.dict_of(cache_file.anything)})
_OPTIONAL_MS = cache_file.optional(cache_file.number)
_TIMING = dict(time_ms=_OPTIONAL_MS, source=cache_file.text, note=cache_file.text, error=cache_file.text,
               kernels=cache_file.list_of(cache_file.text), measured=cache_file.flag)
_CANDIDATES = cache_file.list_of(cache_file.fields(dict(layout=cache_file.text, algorithm=cache_file.text),
                                                   _TIMING))
_RECORD_CHECKS = {
    "to_layout": cache_file.fields({}, _TIMING),
    "conv2d": cache_file.fields(dict(candidates=_CANDIDATES), dict(
        xla=cache_file.optional(cache_file.fields({}, _TIMING)),
        transforms=cache_file.dict_of(cache_file.fields({}, dict(in_ms=_OPTIONAL_MS, out_ms=_OPTIONAL_MS))),
        created=cache_file.text)),
    "maxpool": cache_file.fields(dict(candidates=_CANDIDATES), dict(created=cache_file.text)),
    "avgpool": cache_file.fields(dict(candidates=_CANDIDATES), dict(created=cache_file.text)),
    "fusion_group": cache_file.fields(dict(candidates=cache_file.dict_of(cache_file.fields({}, _TIMING))),
                                      dict(created=cache_file.text)),
}


def _autotune_entry_problem(key: str, record: Any) -> str | None:
    """What is wrong with one autotune cache entry (None: usable). Records are JSON objects;
    those of a known op (from the key, see AutotuneCache.key) have the fields their readers use."""
    if not isinstance(record, dict):
        return f"expected an object, got {type(record).__name__}"
    try:
        fields = json.loads(key)
    except (ValueError, RecursionError):
        return None  # not a key AutotuneCache.key makes: no reader here looks it up
    op = fields.get("op") if isinstance(fields, dict) else None
    check = _RECORD_CHECKS.get(op) if isinstance(op, str) else None
    return check(record) if check else None


def as_cache(cache: Any) -> AutotuneCache | None:
    """cache=None: the default file; False: no cache; a path or an AutotuneCache."""
    if cache is False:
        return None
    if cache is None:
        return AutotuneCache()
    if isinstance(cache, AutotuneCache):
        return cache
    if isinstance(cache, (str, os.PathLike)):
        return AutotuneCache(cache)
    raise TypeError(f"cache must be None, False, a path or an AutotuneCache, got {cache!r}")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- choices


@dataclass(frozen=True)
class CandidateResult:
    """One (layout, algorithm) of a layer: its time, or why it cannot run."""

    layout: str
    algorithm: str
    time_ms: float | None
    source: str  # "measured" | "model"
    error: str = ""
    note: str = ""  # how it was estimated, or the timing's method/caveats
    kernels: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.time_ms is not None and math.isfinite(self.time_ms)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["kernels"] = list(self.kernels)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CandidateResult":
        return cls(d["layout"], d["algorithm"], d.get("time_ms"), d.get("source", "measured"),
                   d.get("error", ""), d.get("note", ""), tuple(d.get("kernels", ())))


def _transform_key(device: str, shape: Shape, dtype: str, src: str, dst: str) -> str:
    return AutotuneCache.key(device=device, op="to_layout", shape=list(shape), dtype=dtype, src=src, dst=dst)


@dataclass(frozen=True)
class _Choice:
    """What conv and pool choices share: candidates, XLA's time, transforms, the rule."""

    layer: Layer
    candidates: tuple[CandidateResult, ...]
    xla_ms: float | None
    transforms: Mapping[str, Mapping[str, float]]  # layout -> {"in_ms", "out_ms"} vs NHWC
    rule: RuleChoice
    source: str  # "measured" | "model"
    device: str
    cached: bool = False
    note: str = ""
    xla_note: str = ""

    @property
    def best(self) -> CandidateResult | None:
        ok = [c for c in self.candidates if c.ok]
        return min(ok, key=lambda c: c.time_ms) if ok else None

    @property
    def layout(self) -> str | None:
        return None if self.best is None else self.best.layout

    @property
    def algorithm(self) -> str | None:
        return None if self.best is None else self.best.algorithm

    @property
    def time_ms(self) -> float | None:
        return None if self.best is None else self.best.time_ms

    def best_in(self, layout: str) -> CandidateResult | None:
        ok = [c for c in self.candidates if c.ok and c.layout == layout]
        return min(ok, key=lambda c: c.time_ms) if ok else None

    def times_by_layout(self) -> dict[str, float]:
        return {lay: c.time_ms for lay in LAYOUTS if (c := self.best_in(lay)) is not None}

    @property
    def xla_ratio(self) -> float | None:
        """XLA time / winner time: > 1 means jaxcnn's pick beats XLA."""
        if self.xla_ms is None or self.time_ms is None or self.time_ms <= 0:
            return None
        return self.xla_ms / self.time_ms

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return dict(
            op=self.layer.op, layer=dataclasses.asdict(self.layer), source=self.source,
            device=self.device, cached=self.cached, note=self.note,
            candidates=[c.to_dict() for c in self.candidates],
            winner=None if best is None else best.to_dict(),
            xla_ms=self.xla_ms, xla_note=self.xla_note, xla_ratio=self.xla_ratio,
            transforms={k: dict(v) for k, v in self.transforms.items()},
            rule=self.rule.to_dict(),
        )

    def explain(self) -> str:
        best = self.best
        head = f"{self.layer.name + ': ' if self.layer.name else ''}{self.layer.describe()}"
        where = f"{self.source}{' (cache)' if self.cached else ''} on {self.device}"
        rows = []
        for c in sorted(self.candidates, key=lambda c: (not c.ok, c.time_ms or 0.0)):
            vs = f"{self.xla_ms / c.time_ms:.2f}x" if c.ok and self.xla_ms else "-"
            mark = "<- winner" if c is best else ""
            why = c.error or c.note
            rows.append([c.layout, c.algorithm, _fmt_ms(c.time_ms), vs, mark, why[:90]])
        rows.append(["NHWC", "xla", _fmt_ms(self.xla_ms), "1.00x" if self.xla_ms else "-", "reference",
                     self.xla_note[:90]])
        lines = [head, f"times: {where}" + (f"; {self.note}" if self.note else ""),
                 _table(["layout", "algorithm", "ms", "XLA/this", "", "note"], rows)]
        if self.transforms:
            trows = [[lay, _fmt_ms(t.get("in_ms")), _fmt_ms(t.get("out_ms"))]
                     for lay, t in sorted(self.transforms.items())]
            lines += ["transforms from/to NHWC:", _table(["layout", "in ms", "out ms"], trows)]
        if best is None:
            lines.append("winner: none (no candidate can run)")
        else:
            ratio = self.xla_ratio
            lines.append(f"winner: {best.layout}/{best.algorithm} {_fmt_ms(best.time_ms)} ms"
                         + (f"; XLA {_fmt_ms(self.xla_ms)} ms, XLA/winner = {ratio:.2f}" if ratio else ""))
        agree = best is not None and (best.layout, best.algorithm) == (self.rule.layout, self.rule.algorithm)
        lines.append(f"rule: {self.rule.layout}/{self.rule.algorithm} ({'agrees' if agree else 'differs'}): "
                     f"{self.rule.reason}")
        return "\n".join(lines)


@dataclass(frozen=True)
class ConvChoice(_Choice):
    """autotune_conv's answer: every candidate's time, XLA's, transforms, winner and rule."""


@dataclass(frozen=True)
class PoolChoice(_Choice):
    """autotune_pool's answer (lax.reduce_window in each layout)."""


# --------------------------------------------------------------------------- measuring


def _random(key_index: int, shape: Shape, dtype: str):
    import jax
    import jax.numpy as jnp

    key = jax.random.fold_in(jax.random.PRNGKey(0), key_index)
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def _timing_entry(timing: Any) -> dict[str, Any]:
    note = timing.method + (f"; {timing.note}" if timing.note else "")
    return dict(time_ms=float(timing.median_ms), measured=bool(timing.is_device_time), note=note,
                kernels=[k.name for k in timing.kernels][:3])


def _transform_fn(src: str, dst: str) -> Callable:
    from jaxcnn.ops import to_layout

    return lambda x: to_layout(x, src, dst)


def _measure(cases: list[tuple[Any, Callable, tuple]], iters: int, warmup: int) -> dict[Any, dict[str, Any]]:
    from jaxcnn.profile.device_time import device_times

    if not cases:
        return {}
    return {key: _timing_entry(t) for key, t in device_times(cases, iters=iters, warmup=warmup).items()}


def _check_iters(iters: Any, warmup: Any) -> None:
    for name, value, low in (("iters", iters, 1), ("warmup", warmup, 0)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")


def autotune_transforms(shapes: Iterable[Sequence[int]], dtype: Any, *,
                        pairs: Iterable[tuple[str, str]] | None = None, cache: Any = None,
                        iters: int = 20, warmup: int = 3, measure: bool | None = None,
                        gpu: str | GpuSpec | None = None) -> dict[tuple[Shape, str, str], tuple[float, str]]:
    """Time of to_layout for each logical NHWC shape and (src, dst) pair (default: every
    ordered pair of distinct layouts) -> {(shape, src, dst): (ms, source)}. Measured (one trace
    for all, cached) where the CUDA kernels run, else modelled."""
    _check_iters(iters, warmup)
    dtype = _dtype_name(dtype)
    shapes = list(dict.fromkeys(_shape4(s, "shape") for s in shapes))
    pairs = list(pairs) if pairs is not None else [(a, b) for a in LAYOUTS for b in LAYOUTS if a != b]
    for src, dst in pairs:
        check_layout(src, "src")
        check_layout(dst, "dst")
    store = _check_cache_and_gpu(cache, gpu)
    wanted = [(s, a, b) for s in shapes for a, b in pairs if a != b]
    out: dict[tuple[Shape, str, str], tuple[float, str]] = {(s, a, a): (0.0, "model") for s in shapes for a in LAYOUTS}
    if not _should_measure(measure):
        spec, _ = _resolve_spec(gpu, measured=False)
        out.update({(s, a, b): (transform_ms(s, dtype, a, b, spec), "model") for s, a, b in wanted})
        return out
    out.update(_measured_transforms(wanted, dtype, store, iters, warmup))
    return out


@outside_traces
def _measured_transforms(wanted, dtype, store, iters, warmup) -> dict[tuple[Shape, str, str], tuple[float, str]]:
    """autotune_transforms' measured (or cached) times of `wanted` (shape, src, dst)s."""
    out: dict[tuple[Shape, str, str], tuple[float, str]] = {}
    device = _device_kind()
    entries = store.load() if store else {}
    missing = []
    for s, a, b in wanted:
        hit = entries.get(_transform_key(device, s, dtype, a, b))
        if hit is not None and hit.get("time_ms") is not None:
            out[(s, a, b)] = (float(hit["time_ms"]), "measured")
        else:
            missing.append((s, a, b))
    # A batch of traces of up to TRANSFORM_BATCH_BYTES of inputs each: one trace for small
    # chains, bounded memory for big activations (a VGG N=64 chain holds tens of GB of them).
    measured: dict[Any, dict[str, Any]] = {}
    batch: list[tuple[Any, Callable, tuple]] = []
    inputs: dict[tuple[Shape, str], Any] = {}
    held = 0
    for i, (s, a, b) in enumerate(missing):
        if (s, a) not in inputs:
            size = _prod(s) * _itemsize(dtype)
            if batch and held + size > TRANSFORM_BATCH_BYTES:
                measured.update(_measure(batch, iters, warmup))
                batch, inputs, held = [], {}, 0
            inputs[(s, a)] = _random(i, convert_shape(s, "NHWC", a), dtype)
            held += size
        batch.append(((s, a, b), _transform_fn(a, b), (inputs[(s, a)],)))
    if batch:
        measured.update(_measure(batch, iters, warmup))
    del batch, inputs
    records = {}
    for (s, a, b), entry in measured.items():
        out[(s, a, b)] = (entry["time_ms"], "measured" if entry["measured"] else "wall")
        records[_transform_key(device, s, dtype, a, b)] = dict(entry, created=_now(), iters=iters)
    if store:
        store.put_many(records)
    return out


def autotune_conv(x_shape, w_shape, dtype="bfloat16", *, stride=1, padding="SAME", dilation=1,
                  groups=1, activation=None, precision=None, bias=True, candidates=None,
                  cache: Any = None, iters: int = 20, warmup: int = 3, measure: bool | None = None,
                  refresh: bool = False, gpu: str | GpuSpec | None = None, name: str = "") -> ConvChoice:
    """Time every candidate (layout, algorithm) of one conv, XLA's own conv and the layout
    transforms around it; return them with the winner.

    x_shape is the logical NHWC input, w_shape HWIO; the conv keywords are conv2d's.
    candidates: (layout, algorithm) pairs, default `default_conv_candidates`. A candidate that
    cannot run (ValueError "cannot run" at lowering) is recorded with its error and skipped.
    Where the CUDA kernels run (or measure=True) times are device times of `iters` calls in one
    profiler trace (source="measured"), read from / written to `cache` (None: the default file,
    False: none; refresh=True re-measures). Elsewhere they are model estimates (source="model").
    """
    _check_iters(iters, warmup)
    layer = conv_layer(x_shape, w_shape, dtype, stride=stride, padding=padding, dilation=dilation,
                       groups=groups, activation=activation, precision=precision, bias=bias, name=name)
    cands = _check_candidates(candidates) if candidates is not None else default_conv_candidates(layer)
    rule = _rule_conv_layer(layer)
    store = _check_cache_and_gpu(cache, gpu)
    if not _should_measure(measure):
        return _model_conv_choice(layer, cands, rule, gpu)
    return _measured_conv_choice(layer, cands, rule, store, iters, warmup, refresh)


def cached_conv_choice(x_shape, w_shape, dtype="bfloat16", *, stride=1, padding="SAME", dilation=1,
                       groups=1, activation=None, precision=None, bias=True, candidates=None,
                       cache: Any = None) -> ConvChoice | None:
    """autotune_conv's measured choice when the cache already holds it for this GPU, else None.
    Never measures, and None off the GPU (where nothing was measured for the kernels)."""
    if not _should_measure(None):
        return None
    layer = conv_layer(x_shape, w_shape, dtype, stride=stride, padding=padding, dilation=dilation,
                       groups=groups, activation=activation, precision=precision, bias=bias)
    cands = _check_candidates(candidates) if candidates is not None else default_conv_candidates(layer)
    store = as_cache(cache)
    if store is None:
        return None
    device = _device_kind()
    hit = store.get(_conv_key(device, layer))
    if hit is None or not all(c in {(r["layout"], r["algorithm"]) for r in hit.get("candidates", ())}
                              for c in cands):
        return None
    return _conv_choice_from_record(layer, hit, cands, _rule_conv_layer(layer), device)


def _check_cache_and_gpu(cache: Any, gpu: Any) -> "AutotuneCache | None":
    """Validate both up front, so a bad argument fails the same way with or without a GPU."""
    store = as_cache(cache)
    if gpu is not None:
        _resolve_spec(gpu, measured=False)
    return store


def _model_conv_choice(layer: Layer, cands, rule: RuleChoice, gpu) -> ConvChoice:
    spec, spec_note = _resolve_spec(gpu, measured=False)
    results = []
    for layout, algorithm in cands:
        time, how = _model_conv_candidate(layer, layout, algorithm, spec)
        error = how if time is None else ""
        results.append(CandidateResult(layout, algorithm, time, "model", error, "" if error else how))
    xla, xla_note = _model_xla_conv(layer, spec)
    transforms = {lay: dict(in_ms=transform_ms(layer.x_shape, layer.dtype, "NHWC", lay, spec),
                            out_ms=transform_ms(layer.y_shape, layer.dtype, lay, "NHWC", spec))
                  for lay in LAYOUTS if lay != "NHWC"}
    note = spec_note
    return ConvChoice(layer, tuple(results), xla, transforms, rule, "model", spec.name, False, note, xla_note)


def _conv_key(device: str, layer: Layer) -> str:
    return AutotuneCache.key(device=device, op="conv2d", x=list(layer.x_shape), w=list(layer.w_shape),
                             dtype=layer.dtype, stride=list(layer.stride),
                             padding=[list(p) for p in layer.padding], dilation=list(layer.dilation),
                             groups=layer.groups, activation=layer.activation,
                             precision=layer.precision, bias=layer.bias)


@outside_traces
def _measured_conv_choice(layer: Layer, cands, rule, store, iters, warmup, refresh) -> ConvChoice:
    import jax.numpy as jnp

    from jaxcnn.ops import conv2d

    device = _device_kind()
    key = _conv_key(device, layer)
    if store and not refresh:
        hit = store.get(key)
        if hit is not None:
            have = {(c["layout"], c["algorithm"]) for c in hit.get("candidates", ())}
            if all(c in have for c in cands):
                return _conv_choice_from_record(layer, hit, cands, rule, device)

    x_nhwc = _random(1, layer.x_shape, layer.dtype)
    w = _random(2, layer.w_shape, layer.dtype) * (1.0 / math.sqrt(_prod(layer.w_shape[:3])))
    w = w.astype(layer.dtype)
    b = _random(3, (layer.w_shape[3],), layer.dtype) if layer.bias else None
    xs = {lay: jnp.transpose(x_nhwc, permutation("NHWC", lay)) for lay in LAYOUTS}
    kwargs = layer.conv_kwargs()

    def candidate_fn(layout, algorithm):
        return lambda x, w, b: conv2d(x, w, b, layout=layout, algorithm=algorithm, **kwargs)

    cases, errors = [], {}
    for layout, algorithm in cands:
        fn, args = candidate_fn(layout, algorithm), (xs[layout], w, b)
        error = _try_run(fn, args)
        if error:
            errors[(layout, algorithm)] = error
        else:
            cases.append((("cand", layout, algorithm), fn, args))

    # XLA's reference time: the same formulation as the ("NHWC", "xla") candidate.
    cases.append((("xla",), candidate_fn("NHWC", "xla"), (x_nhwc, w, b)))
    y_nhwc = jnp.zeros(layer.y_shape, layer.dtype) + 1
    for lay in LAYOUTS:
        if lay == "NHWC":
            continue
        y_lay = jnp.transpose(y_nhwc, permutation("NHWC", lay))
        cases.append((("in", lay), _transform_fn("NHWC", lay), (x_nhwc,)))
        cases.append((("out", lay), _transform_fn(lay, "NHWC"), (y_lay,)))
    measured = _measure(cases, iters, warmup)

    candidates = []
    for layout, algorithm in cands:
        if (layout, algorithm) in errors:
            candidates.append(dict(layout=layout, algorithm=algorithm, time_ms=None, source="measured",
                                   error=errors[(layout, algorithm)]))
            continue
        e = measured[("cand", layout, algorithm)]
        candidates.append(dict(layout=layout, algorithm=algorithm, time_ms=e["time_ms"],
                               source="measured" if e["measured"] else "wall", note=e["note"],
                               kernels=e["kernels"]))
    transforms = {lay: dict(in_ms=measured[("in", lay)]["time_ms"], out_ms=measured[("out", lay)]["time_ms"])
                  for lay in LAYOUTS if lay != "NHWC"}
    record = dict(op="conv2d", device=device, created=_now(), iters=iters, candidates=candidates,
                  xla=measured[("xla",)], transforms=transforms)
    if store:
        extra = {}
        for lay in transforms:  # also as standalone transform entries, for choose_chain
            extra[_transform_key(device, layer.x_shape, layer.dtype, "NHWC", lay)] = dict(
                time_ms=transforms[lay]["in_ms"], measured=True, created=record["created"], iters=iters)
            extra[_transform_key(device, layer.y_shape, layer.dtype, lay, "NHWC")] = dict(
                time_ms=transforms[lay]["out_ms"], measured=True, created=record["created"], iters=iters)
        store.put_many({key: record, **extra})
    return _conv_choice_from_record(layer, record, cands, rule, device, cached=False)


def _conv_choice_from_record(layer, record, cands, rule, device, cached=True) -> ConvChoice:
    by_pair = {(c["layout"], c["algorithm"]): CandidateResult.from_dict(c) for c in record["candidates"]}
    results = tuple(by_pair[c] for c in cands)
    xla = record.get("xla") or {}
    any_wall = any(r.source == "wall" for r in results) or xla.get("measured") is False
    note = "some times are host wall time (no device trace)" if any_wall else ""
    if cached:
        note = (note + "; " if note else "") + f"cached {record.get('created', '')}"
    return ConvChoice(layer, results, xla.get("time_ms"), record.get("transforms", {}), rule,
                      "measured", device, cached, note, xla.get("note", ""))


# pools ----------------------------------------------------------------------------------


POOL_ALGORITHMS = ("jaxcnn", "xla")  # our pooling kernel, lax.reduce_window


def _pool_fn(layer: Layer, layout: str, algorithm: str = "xla") -> Callable:
    """The pool in `layout`: jaxcnn's kernel ("jaxcnn") or lax.reduce_window ("xla")."""
    import jax.numpy as jnp
    from jax import lax

    if algorithm == "jaxcnn":
        from jaxcnn.ops import avg_pool2d, max_pool2d

        pool = max_pool2d if layer.op == "maxpool" else avg_pool2d
        return lambda x: pool(x, layer.window, layer.stride, layer.padding, layout=layout)
    if algorithm != "xla":
        raise ValueError(f"pool algorithm must be one of {POOL_ALGORITHMS}, got {algorithm!r}")
    dims = {"N": (1, 1, (0, 0)), "C": (1, 1, (0, 0)),
            "H": (layer.window[0], layer.stride[0], layer.padding[0]),
            "W": (layer.window[1], layer.stride[1], layer.padding[1])}
    window = tuple(dims[d][0] for d in layout)
    strides = tuple(dims[d][1] for d in layout)
    pads = tuple(tuple(dims[d][2]) for d in layout)
    if layer.op == "maxpool":
        return lambda x: lax.reduce_window(x, -jnp.inf, lax.max, window, strides, pads)
    count = layer.window[0] * layer.window[1]

    def avg(x):  # padding counts as zeros, summed in float32: as the zoo's avg_pool
        total = lax.reduce_window(x.astype(jnp.float32), 0.0, lax.add, window, strides, pads)
        return (total / count).astype(x.dtype)

    return avg


def _model_uniform(layer: Layer, spec: GpuSpec, algorithm: str) -> list[CandidateResult]:
    return [CandidateResult(lay, algorithm, _memory_ms(_activation_bytes(layer, lay), spec), "model",
                            note="sector bytes / DRAM bw") for lay in LAYOUTS]


def autotune_pool(x_shape, dtype="bfloat16", *, op="maxpool", window=2, stride=None, padding=0,
                  cache: Any = None, iters: int = 20, warmup: int = 3, measure: bool | None = None,
                  refresh: bool = False, gpu: str | GpuSpec | None = None, name: str = "",
                  neighbour_layout: str | None = None) -> PoolChoice:
    """Time a max/avg pool (lax.reduce_window) in every layout, like autotune_conv; XLA's
    reference is the NHWC one."""
    _check_iters(iters, warmup)
    layer = pool_layer(x_shape, dtype, op=op, window=window, stride=stride, padding=padding, name=name)
    return _pool_choice(layer, cache, iters, warmup, measure, refresh, gpu, neighbour_layout)


@outside_traces
def _pool_choice(layer, cache, iters, warmup, measure, refresh, gpu, neighbour_layout=None) -> PoolChoice:
    rule = rule_pool(layer.x_shape, layer.dtype, neighbour_layout=neighbour_layout, name=layer.name)
    store = _check_cache_and_gpu(cache, gpu)
    if not _should_measure(measure):
        spec, spec_note = _resolve_spec(gpu, measured=False)
        results = _model_uniform(layer, spec, "xla")
        transforms = {lay: dict(in_ms=transform_ms(layer.x_shape, layer.dtype, "NHWC", lay, spec),
                                out_ms=transform_ms(layer.y_shape, layer.dtype, lay, "NHWC", spec))
                      for lay in LAYOUTS if lay != "NHWC"}
        note = spec_note
        return PoolChoice(layer, tuple(results), results[0].time_ms, transforms, rule, "model",
                          spec.name, False, note, "sector bytes / DRAM bw")
    device = _device_kind()
    key = AutotuneCache.key(device=device, op=layer.op, x=list(layer.x_shape), dtype=layer.dtype,
                            window=list(layer.window), stride=list(layer.stride),
                            padding=[list(p) for p in layer.padding])
    record = None if (store is None or refresh) else store.get(key)
    pairs = [(lay, alg) for lay in LAYOUTS for alg in POOL_ALGORITHMS]
    if record is not None:  # records from before the pooling kernels timed only "xla"
        have = {(c["layout"], c["algorithm"]) for c in record.get("candidates", ())}
        record = record if all(p in have for p in pairs) else None
    cached = record is not None
    if record is None:
        import jax.numpy as jnp

        x_nhwc = _random(4, layer.x_shape, layer.dtype)
        xs = {lay: jnp.transpose(x_nhwc, permutation("NHWC", lay)) for lay in LAYOUTS}
        cases = [(p, _pool_fn(layer, *p), (xs[p[0]],)) for p in pairs]
        measured = _measure(cases, iters, warmup)
        record = dict(op=layer.op, device=device, created=_now(), iters=iters,
                      candidates=[dict(layout=lay, algorithm=alg, time_ms=measured[(lay, alg)]["time_ms"],
                                       source="measured" if measured[(lay, alg)]["measured"] else "wall",
                                       note=measured[(lay, alg)]["note"], kernels=measured[(lay, alg)]["kernels"])
                                  for lay, alg in pairs])
        if store:
            store.put(key, record)
    results = tuple(CandidateResult.from_dict(c) for c in record["candidates"])
    xla_nhwc = next(r.time_ms for r in results if (r.layout, r.algorithm) == ("NHWC", "xla"))
    note = f"cached {record.get('created', '')}" if cached else ""
    return PoolChoice(layer, results, xla_nhwc, {}, rule, "measured", device, cached, note,
                      "lax.reduce_window in NHWC")


# --------------------------------------------------------------------------- costs of layers


@dataclass(frozen=True)
class LayerCost:
    """What choose_chain needs of one chain node: its time in each layout it can run in (with
    the algorithm, per member for a block), its activation shapes, and XLA's time if known."""

    name: str
    x_shape: Shape
    y_shape: Shape
    dtype: str
    times: Mapping[str, float]  # layout -> ms; a missing layout cannot run
    algorithms: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # per member
    members: tuple[str, ...] = ()  # layer names (one for a plain layer)
    source: str = "given"
    xla_ms: float | None = None
    op: str = ""
    # The same time in every layout (elementwise ops): it cannot sway the choice, so its
    # source does not count toward the plan's.
    layout_independent: bool = False

    def __post_init__(self) -> None:
        _shape4(self.x_shape, f"{self.name or 'layer'} x_shape")
        _shape4(self.y_shape, f"{self.name or 'layer'} y_shape")
        if not isinstance(self.times, Mapping) or not self.times:
            raise ValueError(f"layer {self.name!r}: times must be a non-empty {{layout: ms}} mapping")
        for lay, t in self.times.items():
            check_layout(lay, f"layer {self.name!r} times key")
            if not isinstance(t, (int, float, np.floating, np.integer)) or not t >= 0 or not math.isfinite(t):
                raise ValueError(f"layer {self.name!r}: time in {lay} must be a finite ms >= 0, got {t!r}")


def layer_cost(item: Any, *, costs: str = "auto", cache: Any = None, iters: int = 20, warmup: int = 3,
               gpu: str | GpuSpec | None = None) -> LayerCost:
    """LayerCost of a Layer, Block, jaxcnn.models LayerInfo, ConvChoice/PoolChoice or LayerCost.

    costs: "auto" (measured where the CUDA kernels run, else model), "measured" or "model"."""
    if costs not in ("auto", "measured", "model"):
        raise ValueError(f"costs must be 'auto', 'measured', 'model', a callable or a list of "
                         f"LayerCost; got {costs!r}")
    measure = {"auto": None, "measured": True, "model": False}[costs]
    if isinstance(item, LayerCost):
        return item
    if isinstance(item, _Choice):
        return _cost_from_choice(item)
    if isinstance(item, Block):
        parts = [layer_cost(layer, costs=costs, cache=cache, iters=iters, warmup=warmup, gpu=gpu)
                 for layer in item.layers]
        layouts = [lay for lay in LAYOUTS if all(lay in p.times for p in parts)]
        if not layouts:
            raise ValueError(f"block {item.name!r}: no layout in which every layer can run")
        xla = sum(p.xla_ms for p in parts) if all(p.xla_ms is not None for p in parts) else None
        sources = {p.source for p in parts if not p.layout_independent} or {parts[0].source}
        return LayerCost(item.name, item.x_shape, item.y_shape, item.dtype,
                         {lay: float(sum(p.times[lay] for p in parts)) for lay in layouts},
                         {lay: tuple(a for p in parts for a in p.algorithms[lay]) for lay in layouts},
                         tuple(m for p in parts for m in p.members),
                         sources.pop() if len(sources) == 1 else "mixed", xla, "block",
                         all(p.layout_independent for p in parts))
    if not isinstance(item, Layer):
        if hasattr(item, "input_shapes") and hasattr(item, "op"):
            item = Layer.from_layer_info(item)
        else:
            raise TypeError(f"a chain item must be a Layer, Block, LayerInfo, ConvChoice or LayerCost; "
                            f"got {type(item).__name__}")
    if item.op == "conv2d":
        choice = autotune_conv(item.x_shape, item.w_shape, item.dtype, stride=item.stride,
                               padding=item.padding, dilation=item.dilation, groups=item.groups,
                               activation=item.activation, precision=item.precision, bias=item.bias,
                               cache=cache, iters=iters, warmup=warmup, measure=measure, gpu=gpu,
                               name=item.name)
        return _cost_from_choice(choice)
    if item.op in POOL_OPS:
        return _cost_from_choice(_pool_choice(item, cache, iters, warmup, measure, False, gpu))
    # Elementwise/concat: same bytes in every layout, so a constant that cannot sway the
    # choice; modelled even when measuring.
    spec, _ = _resolve_spec(gpu, measured=False)
    t = _memory_ms(item.bytes, spec)
    return LayerCost(item.name, item.x_shape, item.y_shape, item.dtype, {lay: t for lay in LAYOUTS},
                     {lay: ("xla",) for lay in LAYOUTS}, (item.name,), "model", t, item.op, True)


def _cost_from_choice(choice: _Choice) -> LayerCost:
    times = choice.times_by_layout()
    if not times:
        raise ValueError(f"layer {choice.layer.name!r}: no candidate can run "
                         f"({'; '.join(c.error for c in choice.candidates)})")
    return LayerCost(choice.layer.name, choice.layer.x_shape, choice.layer.y_shape, choice.layer.dtype,
                     times, {lay: (choice.best_in(lay).algorithm,) for lay in times},
                     (choice.layer.name,), choice.source, choice.xla_ms, choice.layer.op)


# --------------------------------------------------------------------------- the chain DP


@dataclass(frozen=True)
class Transform:
    """A layout transform of the activation entering chain node `before` (len(steps): the
    chain's output)."""

    before: int
    shape: Shape  # logical NHWC
    src: str
    dst: str
    time_ms: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ChainStep:
    name: str
    op: str
    layout: str
    algorithms: tuple[str, ...]  # per member layer
    members: tuple[str, ...]
    time_ms: float
    nhwc_ms: float | None  # the node's time in NHWC, for comparison
    xla_ms: float | None
    source: str

    @property
    def algorithm(self) -> str:
        """The member layers' algorithms, e.g. "tensor_core" or "tensor_core x3, xla"."""
        counts = dict.fromkeys(self.algorithms, 0)
        for a in self.algorithms:
            counts[a] += 1
        if len(counts) == 1:
            return self.algorithms[0]
        return ", ".join(a if n == 1 else f"{a} x{n}" for a, n in counts.items())

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["algorithm"] = self.algorithm
        return out


@dataclass(frozen=True)
class ChainPlan:
    """choose_chain's answer: a layout per node, the transforms between them, the totals."""

    steps: tuple[ChainStep, ...]
    transforms: tuple[Transform, ...]
    total_ms: float
    all_nhwc_ms: float | None  # every node in NHWC (inf -> None when some node cannot)
    xla_ms: float | None  # sum of XLA's per-layer times, when every node has one
    input_layout: str
    output_layout: str
    source: str
    model: str | None = None
    batch: int | None = None
    dtype: str | None = None
    note: str = ""

    @property
    def layer_ms(self) -> float:
        return float(sum(s.time_ms for s in self.steps))

    @property
    def transform_ms(self) -> float:
        return float(sum(t.time_ms for t in self.transforms))

    @property
    def layouts(self) -> tuple[str, ...]:
        return tuple(s.layout for s in self.steps)

    @property
    def speedup_vs_nhwc(self) -> float | None:
        if self.all_nhwc_ms is None or self.total_ms <= 0:
            return None
        return self.all_nhwc_ms / self.total_ms

    def assignments(self) -> dict[str, tuple[str, str]]:
        """{layer name: (layout, algorithm)} for every member layer of every node."""
        return {m: (s.layout, a) for s in self.steps for m, a in zip(s.members, s.algorithms)}

    def to_dict(self) -> dict[str, Any]:
        return dict(
            model=self.model, batch=self.batch, dtype=self.dtype, source=self.source, note=self.note,
            input_layout=self.input_layout, output_layout=self.output_layout,
            total_ms=self.total_ms, layer_ms=self.layer_ms, transform_ms=self.transform_ms,
            all_nhwc_ms=self.all_nhwc_ms, speedup_vs_nhwc=self.speedup_vs_nhwc, xla_ms=self.xla_ms,
            steps=[s.to_dict() for s in self.steps], transforms=[t.to_dict() for t in self.transforms],
        )

    def explain(self) -> str:
        title = f"{self.model} batch={self.batch} {self.dtype}: " if self.model else ""
        lines = [f"{title}layout plan ({self.source} costs){'; ' + self.note if self.note else ''}"]
        by_before = {t.before: t for t in self.transforms}
        rows = []
        for i, s in enumerate(self.steps):
            t = by_before.get(i)
            if t is not None:
                rows.append(["", f"  to_layout {t.src}->{t.dst}", "", "", _fmt_ms(t.time_ms), "", ""])
            rows.append([str(i), s.name, s.layout, s.algorithm[:40], _fmt_ms(s.time_ms),
                         _fmt_ms(s.nhwc_ms), _fmt_ms(s.xla_ms)])
        t = by_before.get(len(self.steps))
        if t is not None:
            rows.append(["", f"  to_layout {t.src}->{t.dst}", "", "", _fmt_ms(t.time_ms), "", ""])
        lines.append(_table(["#", "layer", "layout", "algorithm", "ms", "NHWC ms", "XLA ms"], rows))
        lines.append(f"total {_fmt_ms(self.total_ms)} ms = layers {_fmt_ms(self.layer_ms)} + "
                     f"{len(self.transforms)} transforms {_fmt_ms(self.transform_ms)}")
        if self.all_nhwc_ms is not None:
            lines.append(f"all-NHWC {_fmt_ms(self.all_nhwc_ms)} ms: speedup {self.speedup_vs_nhwc:.3f}x")
        if self.xla_ms is not None:
            lines.append(f"XLA (sum of per-layer times) {_fmt_ms(self.xla_ms)} ms: "
                         f"XLA/plan = {self.xla_ms / self.total_ms:.3f}")
        counts = {lay: sum(1 for s in self.steps if s.layout == lay) for lay in LAYOUTS}
        lines.append("layers per layout: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        return "\n".join(lines)


TransformCost = Callable[[Shape, str, str, str], float]


def _transform_cost_fn(transform_costs: Any, costs_mode: str, nodes: Sequence[LayerCost], layouts,
                       cache, iters, warmup, gpu, input_layout, output_layout) -> tuple[TransformCost, str]:
    if callable(transform_costs):
        return transform_costs, "given"
    if transform_costs not in (None, "auto", "measured", "model"):
        raise ValueError(f"transform_costs must be None, 'auto', 'measured', 'model' or a callable "
                         f"(shape, dtype, src, dst) -> ms; got {transform_costs!r}")
    mode = transform_costs or costs_mode
    measure = {"auto": None, "measured": True, "model": False, "given": False}[mode]
    dtypes = {n.dtype for n in nodes}
    table: dict[tuple[Shape, str, str, str], float] = {}
    sources = set()
    for dtype in dtypes:
        shapes = [nodes[0].x_shape] + [n.y_shape for n in nodes]
        shapes = [s for s, n in zip(shapes, [nodes[0], *nodes]) if n.dtype == dtype]
        every = set(layouts) | {input_layout, output_layout}
        pairs = [(a, b) for a in every for b in every if a != b]
        found = autotune_transforms(shapes, dtype, pairs=pairs, cache=cache, iters=iters,
                                    warmup=warmup, measure=measure, gpu=gpu)
        for (s, a, b), (ms, src) in found.items():
            table[(s, dtype, a, b)] = ms
            if a != b:
                sources.add(src)
    return (lambda shape, dtype, a, b: table[(tuple(shape), dtype, a, b)]), (
        sources.pop() if len(sources) == 1 else "mixed" if sources else "model")


def choose_chain(layers: Sequence[Any], *, input_layout: str = "NHWC", output_layout: str = "NHWC",
                 costs: Any = "auto", transform_costs: Any = None, layouts: Sequence[str] = LAYOUTS,
                 cache: Any = None, iters: int = 20, warmup: int = 3,
                 gpu: str | GpuSpec | None = None) -> ChainPlan:
    """The cheapest layout for every node of a chain, by exact dynamic programming.

    layers: Layer / Block / LayerInfo / ConvChoice / LayerCost items; node i's input is node
      i-1's output (their shapes must agree).
    costs: "auto" | "measured" | "model" (see layer_cost), or a callable item -> LayerCost or
      {layout: ms}; LayerCost items are used as they are.
    transform_costs: None (same source as costs; "given" costs use the model), "auto",
      "measured", "model", or a callable (nhwc_shape, dtype, src, dst) -> ms.
    layouts: the layouts a node may use.

    The state is the layout of the activation between nodes; total = sum of node times + a
    transform wherever consecutive layouts differ (and from input_layout / to output_layout).
    O(L * |layouts|^2); ties keep the earlier layout in `layouts`.
    """
    input_layout = check_layout(input_layout, "input_layout")
    output_layout = check_layout(output_layout, "output_layout")
    if isinstance(layouts, str) or not isinstance(layouts, Sequence) or not layouts:
        raise TypeError(f"layouts must be a non-empty sequence of layout strings, got {layouts!r}")
    layouts = tuple(dict.fromkeys(check_layout(lay, "layouts item") for lay in layouts))
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or not layers:
        raise ValueError("layers must be a non-empty sequence")
    _check_iters(iters, warmup)

    costs_mode = "given"
    if callable(costs):
        nodes = [_call_cost(costs, item, i) for i, item in enumerate(layers)]
    else:
        if costs not in ("auto", "measured", "model"):
            raise ValueError(f"costs must be 'auto', 'measured', 'model' or a callable, got {costs!r}")
        costs_mode = costs
        nodes = [layer_cost(item, costs=costs, cache=cache, iters=iters, warmup=warmup, gpu=gpu)
                 for item in layers]
    for i in range(1, len(nodes)):
        if tuple(nodes[i - 1].y_shape) != tuple(nodes[i].x_shape):
            raise ValueError(f"layers[{i}] ({nodes[i].name!r}) takes {nodes[i].x_shape} but "
                             f"layers[{i - 1}] ({nodes[i - 1].name!r}) gives {nodes[i - 1].y_shape}")
    if all(n.source == "given" for n in nodes) and transform_costs is None:
        transform_costs = "model"
    tcost, tsource = _transform_cost_fn(transform_costs, costs_mode, nodes, layouts, cache, iters,
                                        warmup, gpu, input_layout, output_layout)

    def trans(shape, dtype, a, b) -> float:
        if a == b:
            return 0.0
        t = float(tcost(tuple(shape), dtype, a, b))
        if not t >= 0 or not math.isfinite(t):
            raise ValueError(f"transform cost {a}->{b} of {shape} must be a finite ms >= 0, got {t!r}")
        return t

    best, back = _dp(nodes, layouts, input_layout, output_layout, trans)
    if best is None:
        raise ValueError(f"no assignment of layouts {layouts} lets every layer run")
    total, assignment = best
    steps, transforms = [], []
    prev = input_layout
    for i, (node, lay) in enumerate(zip(nodes, assignment)):
        if lay != prev:
            transforms.append(Transform(i, tuple(node.x_shape), prev, lay, trans(node.x_shape, node.dtype, prev, lay)))
        steps.append(ChainStep(node.name, node.op, lay, tuple(node.algorithms.get(lay, ("?",))),
                               node.members or (node.name,), float(node.times[lay]),
                               node.times.get("NHWC"), node.xla_ms, node.source))
        prev = lay
    if prev != output_layout:
        last = nodes[-1]
        transforms.append(Transform(len(nodes), tuple(last.y_shape), prev, output_layout,
                                    trans(last.y_shape, last.dtype, prev, output_layout)))
    all_nhwc = None
    if all("NHWC" in n.times for n in nodes):
        all_nhwc = (trans(nodes[0].x_shape, nodes[0].dtype, input_layout, "NHWC")
                    + sum(float(n.times["NHWC"]) for n in nodes)
                    + trans(nodes[-1].y_shape, nodes[-1].dtype, "NHWC", output_layout))
    xla = float(sum(n.xla_ms for n in nodes)) if all(n.xla_ms is not None for n in nodes) else None
    sources = {n.source for n in nodes if not n.layout_independent} or {nodes[0].source}
    sources |= {tsource}
    return ChainPlan(tuple(steps), tuple(transforms), float(total), all_nhwc, xla, input_layout,
                     output_layout, sources.pop() if len(sources) == 1 else "mixed")


def _call_cost(fn: Callable, item: Any, index: int) -> LayerCost:
    if isinstance(item, LayerCost):
        return item
    out = fn(item)
    if isinstance(out, LayerCost):
        return out
    if isinstance(out, Mapping):
        if isinstance(item, Block):
            x_shape, y_shape, dtype, name = item.x_shape, item.y_shape, item.dtype, item.name
            members = tuple(layer.name for layer in item.layers)
        elif isinstance(item, Layer):
            x_shape, y_shape, dtype, name, members = item.x_shape, item.y_shape, item.dtype, item.name, (item.name,)
        else:
            raise TypeError(f"layers[{index}]: a {{layout: ms}} cost needs a Layer or Block item, "
                            f"got {type(item).__name__}")
        times = {lay: (v[0] if isinstance(v, tuple) else v) for lay, v in out.items()}
        algos = {lay: ((v[1],) * len(members) if isinstance(v, tuple) else ("auto",) * len(members))
                 for lay, v in out.items()}
        return LayerCost(name, x_shape, y_shape, dtype, times, algos, members, "given", None,
                         "block" if isinstance(item, Block) else item.op)
    raise TypeError(f"costs callable must return a LayerCost or a {{layout: ms}} mapping for "
                    f"layers[{index}], got {type(out).__name__}")


def _dp(nodes: Sequence[LayerCost], layouts: tuple[str, ...], input_layout: str, output_layout: str,
        trans: Callable) -> tuple[tuple[float, list[str]] | None, Any]:
    """Exact DP: best[l] = cheapest cost of nodes 0..i with node i in layout l."""
    inf = math.inf
    first = nodes[0]
    best = {lay: (trans(first.x_shape, first.dtype, input_layout, lay) + first.times[lay]
                  if lay in first.times else inf) for lay in layouts}
    back: list[dict[str, str]] = []
    for i in range(1, len(nodes)):
        prev_node, node = nodes[i - 1], nodes[i]
        new, arg = {}, {}
        for lay in layouts:
            if lay not in node.times:
                new[lay], arg[lay] = inf, layouts[0]
                continue
            cand_cost, cand_prev = inf, layouts[0]
            for p in layouts:  # strict < : ties keep the earlier layout
                if best[p] == inf:
                    continue
                c = best[p] + trans(prev_node.y_shape, prev_node.dtype, p, lay)
                if c < cand_cost:
                    cand_cost, cand_prev = c, p
            new[lay], arg[lay] = cand_cost + node.times[lay], cand_prev
        best = new
        back.append(arg)
    last = nodes[-1]
    final_cost, final = inf, None
    for lay in layouts:
        if best[lay] == inf:
            continue
        c = best[lay] + trans(last.y_shape, last.dtype, lay, output_layout)
        if c < final_cost:
            final_cost, final = c, lay
    if final is None:
        return None, None
    assignment = [final]
    for arg in reversed(back):
        assignment.append(arg[assignment[-1]])
    assignment.reverse()
    return (final_cost, assignment), back


# --------------------------------------------------------------------------- zoo models


def model_chain(model_name: str, batch: int = 1, dtype: Any = "bfloat16", *,
                precision: Any = None, split_blocks: bool = False) -> list[Layer | Block]:
    """The 4-D part of a zoo model's layer table as a chain: consecutive layers of one block
    (fire, inception, residual: branches that meet again) become one Block that runs in one
    layout; the chain stops where activations become 2-D (dense, softmax), whose flatten needs
    NHWC order. split_blocks=True keeps every layer its own node (a linear-chain approximation:
    it treats branch layers as if they fed each other)."""
    from jaxcnn.models import get_model

    if not isinstance(batch, (int, np.integer)) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    dtype = _dtype_name(dtype)
    table = get_model(model_name).layers(int(batch), dtype)
    chain: list[Layer | Block] = []
    group: list[Layer] = []
    group_name = None

    def flush():
        nonlocal group, group_name
        if group:
            chain.append(Block(group_name, tuple(group)) if group_name is not None else group[0])
        group, group_name = [], None

    for info in table:
        if len(info.input_shapes[0]) != 4 or len(info.output_shape) != 4:
            break
        layer = Layer.from_layer_info(info, precision)
        block = None if split_blocks else info.block
        if block is None or block != group_name:
            flush()
        if block is None:
            chain.append(layer)
        else:
            group_name = block
            group.append(layer)
    flush()
    return chain


def plan_model_layouts(model_name: str, batch: int = 1, dtype: Any = "bfloat16", *,
                       costs: Any = "auto", layouts: Sequence[str] = LAYOUTS, cache: Any = None,
                       iters: int = 20, warmup: int = 3, gpu: str | GpuSpec | None = None,
                       precision: Any = None, split_blocks: bool = False) -> ChainPlan:
    """choose_chain over a zoo model's chain (model_chain), NHWC in and out."""
    chain = model_chain(model_name, batch, dtype, precision=precision, split_blocks=split_blocks)
    plan = choose_chain(chain, costs=costs, layouts=layouts, cache=cache, iters=iters,
                        warmup=warmup, gpu=gpu)
    note = ("blocks run in one layout" if not split_blocks else "blocks split (approximation)")
    note += "; relu6/add/concat modelled (same bytes in every layout)"
    return dataclasses.replace(plan, model=model_name, batch=int(batch), dtype=_dtype_name(dtype),
                               note=note)


# --------------------------------------------------------------------------- running a plan


def apply_plan(plan: ChainPlan, params: Mapping[str, Any], x: Any, *, model: str | None = None,
               softmax: bool = False):
    """Run zoo model `plan.model` (or `model`) on NHWC images `x` with each layer in the plan's
    layout and algorithm (layers the plan does not name run as in backend "jaxcnn").

    Each op gets its input in its own layout: a to_layout runs only where the layout of the
    producer differs. The NHWC views the model body sees in between are dead code that XLA
    removes, except where the body itself needs NHWC (the flatten before the classifier).
    """
    from jaxcnn.models import get_model
    from jaxcnn.models.backends import JAXCNN_OPS
    from jaxcnn.models.layers import Net

    name = model or plan.model
    if name is None:
        raise ValueError("plan has no model name: pass model=")
    spec = get_model(name)
    table = spec.layers(x.shape[0], x.dtype)
    assignments = plan.assignments()
    ops = _LayoutOps(table, assignments, JAXCNN_OPS)
    net = Net(ops.table(), params)
    logits = spec.body(net, x)
    return net.softmax("softmax", logits) if softmax else logits


class _LayoutOps:
    """An op table that runs the k-th call as the k-th layer of the table in its planned layout.

    Every 4-D result is handed back to the body as its NHWC view, and the physical array is
    remembered by the view's id, so the next op reads the physical one (transforming only when
    its layout differs)."""

    def __init__(self, table, assignments, base_ops):
        self.layers = list(table)
        self.assign = assignments
        self.base = base_ops
        self.index = 0
        self.physical: dict[int, tuple[Any, Any, str]] = {}  # id(view) -> (view, array, layout)

    def table(self) -> dict[str, Callable]:
        return {op: self._wrap(op) for op in self.base}

    def _in(self, x, layout: str):
        from jaxcnn.ops import to_layout

        hit = self.physical.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1] if hit[2] == layout else to_layout(hit[1], hit[2], layout)
        return to_layout(x, "NHWC", layout)

    def _out(self, y, layout: str):
        from jaxcnn.ops import to_layout

        view = y if layout == "NHWC" else to_layout(y, layout, "NHWC")
        self.physical[id(view)] = (view, y, layout)
        return view

    def _wrap(self, op: str) -> Callable:
        def run(*args, **kwargs):
            if self.index >= len(self.layers):
                raise RuntimeError("the model ran more layers than its layer table lists")
            info = self.layers[self.index]
            self.index += 1
            if info.op != op:
                raise RuntimeError(f"layer {self.index - 1} is {info.op!r} in the table, the body ran {op!r}")
            if info.name not in self.assign:
                # Activations are the first argument of conv2d/dense, every argument otherwise
                # (a conv weight is 4-D too and must not be taken for an activation).
                n_act = 1 if op in ("conv2d", "dense") else len(args)
                inputs = [self._in(a, "NHWC") if i < n_act and getattr(a, "ndim", 0) == 4 else a
                          for i, a in enumerate(args)]
                return self.base[op](*inputs, **kwargs)
            layout, algorithm = self.assign[info.name]
            return self._out(self._run(op, layout, algorithm, args, kwargs), layout)

        return run

    def _run(self, op, layout, algorithm, args, kwargs):
        import jax.numpy as jnp

        from jaxcnn.ops import conv2d

        c_axis = layout.index("C")
        if op == "conv2d":
            x, w, b = args
            return conv2d(self._in(x, layout), w, b, layout=layout,
                          algorithm=algorithm if algorithm in ALGORITHMS else "auto", **kwargs)
        if op in POOL_OPS:
            proxy = Layer(op, (1, 1, 1, 1), (1, 1, 1, 1), "float32", window=tuple(kwargs["window"]),
                          stride=tuple(kwargs["stride"]), padding=tuple(map(tuple, kwargs["padding"])))
            return _pool_fn(proxy, layout, algorithm)(self._in(args[0], layout))
        if op == "concat":
            return jnp.concatenate([self._in(a, layout) for a in args], axis=c_axis)
        if op == "add":
            a, b = (self._in(v, layout) for v in args)
            y = a + b
            return jnp.maximum(y, 0) if kwargs.get("activation") == "relu" else y
        if op == "relu6":
            return self.base[op](self._in(args[0], layout))
        raise RuntimeError(f"op {op!r} has no layout-aware version")


# --------------------------------------------------------------------------- explain


def explain(obj: Any = None, *args: Any, **kwargs: Any) -> str:
    """A readable table for a choice or a plan: `explain(choice)`, `explain(plan)`, or the
    arguments of autotune_conv (`explain(x_shape, w_shape, dtype, ...)`), or a zoo model name
    with plan_model_layouts' arguments (`explain("vgg16", batch=8)`)."""
    if hasattr(obj, "explain") and callable(obj.explain):
        if args or kwargs:
            raise TypeError("explain(choice_or_plan) takes no further arguments")
        return obj.explain()
    if isinstance(obj, str):
        return plan_model_layouts(obj, *args, **kwargs).explain()
    if isinstance(obj, Sequence):
        return autotune_conv(obj, *args, **kwargs).explain()
    raise TypeError(f"explain takes a choice, a plan, conv shapes or a model name; got {type(obj).__name__}")
