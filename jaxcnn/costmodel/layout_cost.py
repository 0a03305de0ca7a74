"""Model time of one layer in each activation layout (NHWC, NCHW, CHWN) and of a layout
transform, for jaxcnn.tuning's layout choice on a machine where nothing can be measured.

Activations move in 32-byte DRAM sectors: a layout whose innermost dim gives short contiguous
runs wastes the rest of each sector. The tensor-core and direct conv families and XLA's conv
are estimated by the implicit-GEMM model (costmodel.predict); the depthwise family and pools
by roofline bounds (sector bytes / DRAM bandwidth, FLOPs / fp32 FMA peak).
"""

from __future__ import annotations

import math
from typing import Protocol, Sequence

import numpy as np

from jaxcnn.costmodel.conv_layer import ConvLayer
from jaxcnn.costmodel.model import predict
from jaxcnn.costmodel.roofline import fp32_fma_ms, memory_ms
from jaxcnn.costmodel.traffic import SECTOR_BYTES
from jaxcnn.profile.gpu_specs import GpuSpec

# The tensor-core family (cuda_ops/conv_tc) runs groups == 1 with K a multiple of 8 (16-byte TMA
# rows of the output; fp32 needs 4, 8 covers both); any C (it zero-pads C to the row width).
TENSOR_CORE_CHANNEL_MULTIPLE = 8
# 3xTF32 (fp32-accurate tensor-core math) issues three TF32 MMAs per product.
TF32X3_FACTOR = 3.0

Shape = tuple[int, ...]


class LayerShapes(Protocol):
    """What the estimates read of a layer (jaxcnn.tuning.layer.Layer is one): logical NHWC
    activations, HWIO weights (None but for conv2d), a window (pools only)."""

    op: str
    name: str
    x_shape: Shape
    y_shape: Shape
    inputs: tuple[Shape, ...]
    w_shape: Shape | None
    window: tuple[int, int] | None
    stride: tuple[int, int]
    padding: tuple[tuple[int, int], tuple[int, int]]
    dilation: tuple[int, int]
    groups: int
    dtype: str
    precision: str
    is_depthwise: bool


def sector_waste(layout: str, shape: Sequence[int], itemsize: int, stride_w: int = 1,
                 reach_w: int = 1) -> float:
    """Bytes fetched per useful byte of a logical NHWC activation read/written along `layout`'s
    innermost dim: runs shorter than a sector waste the rest of it, and in NCHW rows a W stride
    larger than the window's width (reach_w) skips elements that are fetched anyway."""
    dims = dict(zip("NHWC", shape))
    run = dims[layout[-1]] * itemsize
    waste = max(1.0, SECTOR_BYTES / run)
    if layout == "NCHW" and stride_w > reach_w:
        waste *= min(stride_w / reach_w, SECTOR_BYTES / itemsize)
    return waste


def activation_bytes(layer: LayerShapes, layout: str) -> float:
    """DRAM bytes of a layer's activations in `layout` at sector granularity (+ weights and
    bias, moved once)."""
    item = np.dtype(layer.dtype).itemsize
    if layer.w_shape is not None:
        reach = (layer.w_shape[1] - 1) * layer.dilation[1] + 1
    else:
        reach = layer.window[1] if layer.window is not None else layer.stride[1]
    total = sum(math.prod(s) * item * sector_waste(layout, s, item, layer.stride[1], reach)
                for s in layer.inputs)
    total += math.prod(layer.y_shape) * item * sector_waste(layout, layer.y_shape, item)
    if layer.w_shape is not None:
        total += (math.prod(layer.w_shape) + layer.w_shape[3]) * item
    return total


def relayout_ms(shape: Sequence[int], itemsize: int, spec: GpuSpec) -> float:
    """A layout transform of an activation of `shape`: read + write of its bytes."""
    return memory_ms(2 * math.prod(shape) * itemsize, spec)


def conv_flops(layer: LayerShapes) -> float:
    n, p, q, k = layer.y_shape
    r, s, cg, _ = layer.w_shape
    return 2.0 * n * p * q * k * r * s * cg


def conv_candidate_ms(layer: LayerShapes, layout: str, algorithm: str,
                      spec: GpuSpec) -> tuple[float | None, str]:
    """(estimate in ms, or None when the family cannot run the layer; how it was estimated)
    of conv `layer` run by `algorithm` ("tensor_core", "direct", "auto", "depthwise", "xla")
    with activations in `layout`."""
    memory = memory_ms(activation_bytes(layer, layout), spec)
    if algorithm == "xla":
        if layout != "NHWC":
            return None, "XLA's conv is modelled in NHWC only"
        return xla_conv_ms(layer, spec)
    if algorithm == "depthwise":
        if not layer.is_depthwise:
            return None, "cannot run: depthwise needs groups == C"
        compute = fp32_fma_ms(conv_flops(layer), spec)
        return max(memory, compute), "max(sector bytes / DRAM bw, FLOPs / fp32 FMA peak)"
    try:
        return _gemm_candidate_ms(layer, layout, algorithm, spec, memory)
    except (KeyError, ValueError, ZeroDivisionError) as err:  # a shape the cost model cannot tile
        compute = fp32_fma_ms(conv_flops(layer), spec)
        return max(memory, compute), f"cost model failed ({err}): max(bytes / bw, FLOPs / fp32 peak)"


def _gemm_candidate_ms(layer: LayerShapes, layout: str, algorithm: str, spec: GpuSpec,
                       memory: float) -> tuple[float | None, str]:
    if algorithm == "tensor_core":
        if layout != "NHWC":
            return None, "modelled in NHWC only (GEMM-K contiguous)"
        g = layer.groups
        if g != 1 or layer.w_shape[3] % TENSOR_CORE_CHANNEL_MULTIPLE:
            return None, f"cannot run: needs groups == 1 and K a multiple of {TENSOR_CORE_CHANNEL_MULTIPLE}"
        pred = predict(_conv_layer(layer), spec, impl="xla", precision="default")
        time = pred.time_ms
        how = f"cost model implicit GEMM ({pred.tiling.name})"
        if layer.dtype == "float32" and layer.precision == "highest":
            time *= TF32X3_FACTOR
            how += f" x{TF32X3_FACTOR:g} (3xTF32)"
        return max(time, memory), how
    if algorithm in ("direct", "auto"):
        pred = predict(_conv_layer(layer), spec, impl="jaxcnn_direct")
        # The cost model describes the NHWC kernel; other layouts differ in how their gathers
        # coalesce, i.e. in sector traffic: swap the NHWC activation bytes for this layout's.
        extra = memory_ms(activation_bytes(layer, layout), spec) - memory_ms(activation_bytes(layer, "NHWC"), spec)
        time = max(pred.time_ms + extra, memory)
        return time, f"cost model direct ({pred.tiling.name}), sector traffic of {layout}"
    return None, f"no model for algorithm {algorithm!r}"


def xla_conv_ms(layer: LayerShapes, spec: GpuSpec) -> tuple[float, str]:
    """(estimate in ms, how) of XLA's own conv (cuDNN) of `layer` in NHWC."""
    memory = memory_ms(activation_bytes(layer, "NHWC"), spec)
    if layer.groups > 1 and layer.x_shape[3] // layer.groups < TENSOR_CORE_CHANNEL_MULTIPLE:
        # cuDNN runs (near-)depthwise convs with its own CUDA-core kernels, not a GEMM tiling.
        return max(memory, fp32_fma_ms(conv_flops(layer), spec)), "bytes / DRAM bw (depthwise)"
    try:
        pred = predict(_conv_layer(layer), spec, impl="xla", precision=layer.precision)
    except (KeyError, ValueError, ZeroDivisionError) as err:
        return max(memory, fp32_fma_ms(conv_flops(layer), spec)), f"cost model failed ({err})"
    return max(pred.time_ms, memory), f"cost model ({pred.tiling.name})"


def _conv_layer(layer: LayerShapes) -> ConvLayer:
    n, h, w, c = layer.x_shape
    r, s, _, k = layer.w_shape
    return ConvLayer(n, h, w, c, k, r, s, stride=layer.stride, padding=layer.padding,
                     dilation=layer.dilation, groups=layer.groups, dtype=layer.dtype, name=layer.name)
