"""Analytical cost of a fusion group, fused and unfused: per-kernel roofline times
(max(FLOPs / peak, DRAM bytes / bandwidth, a kernel floor)) plus a launch cost per kernel.

What fusion saves is explicit: the DRAM bytes of intermediates that stay on chip (written
once and read by each consumer) and of the concatenate copy (the branch outputs read again and
the output written again), and the launches of the kernels that disappear. Peaks and bandwidth
come from jaxcnn.profile.gpu_specs (H200 when no GPU is visible, as the layout choice does); the
kernel floor and DRAM time are jaxcnn.costmodel.roofline's.

Which fused fire kernel runs, and its tile, channel split and launches, is the library's answer
for the GPU asked about (jaxcnn._native.queries.fire_plan with that spec's DeviceLimits: the
launcher's own decisions, not a copy). Without the library (a CPU-only install) one documented
estimate stands in, labelled as such (FALLBACK_FIRE_TILE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxcnn._native import queries
from jaxcnn._native.plans import DeviceLimits, FirePlan
from jaxcnn.tuning.fusion_groups import FusionGroup, bytes_of
from jaxcnn.ops.chain.config import conv1x1_depthwise_fused
from jaxcnn.costmodel.roofline import memory_ms
from jaxcnn.profile.gpu_specs import GpuSpec, spec_by_name

# Cost of one more kernel in a program beyond its own run time: launch and the gap between
# kernels (~2-5 us per op on H100/H200 timelines of small batches). An assumption, labelled
# as such in explain(); measurements replace it on a GPU.
LAUNCH_MS = 0.003
# Without the library no plan can be asked: the fused fire version is then estimated as the
# single fused kernel with this output tile (the squeeze recomputed on each tile's 1-pixel halo
# for the 3x3 expand), no channel split, tensor cores for bf16/fp16 and CUDA-core FMA for
# float32. The CUDA-core kernel's plan line names no tile: its halo is estimated with this one.
FALLBACK_FIRE_TILE = (8, 16)
FALLBACK_FIRE_NOTE = "fallback estimate (library not loaded): fused kernel, 8x16 tile"
# jaxcnn.conv1x1_depthwise's fused kernel (cuda_ops/chain/chain.cu launch_conv1x1_depthwise):
# the output tile with the least halo over the grid among those whose shared memory fits;
# each tile recomputes the 1x1 over its input halo (pixels rounded up to 16 rows).
CONV1X1_DW_TILES = ((8, 16), (8, 8), (4, 8), (4, 4))
CONV1X1_DW_BLOCK_N = 64
CONV1X1_DW_SMEM = 232448  # Hopper's opt-in shared memory per block (227 KiB)


@dataclass(frozen=True)
class Kernel:
    """One kernel of a version of a group: what it computes and moves."""

    what: str
    flops: float
    bytes: float
    math: str  # "tensor" (bf16/fp16/tf32 tensor cores), "fp32" (3xTF32 or FMA), "fma", "memory"

    def ms(self, spec: GpuSpec, dtype: str) -> float:
        return max(memory_ms(self.bytes, spec),
                   self.flops / _peak(spec, dtype, self.math) * 1e3 if self.flops else 0.0)


@dataclass(frozen=True)
class VersionCost:
    """A version of a group (fused or XLA's unfused) under the model."""

    name: str
    kernels: tuple[Kernel, ...]
    kernel_ms: float  # sum of roofline times
    launch_ms: float  # kernels x LAUNCH_MS
    dram_bytes: float
    config: str = ""  # where the kernels' configuration came from (a plan line, the fallback)

    @property
    def time_ms(self) -> float:
        return self.kernel_ms + self.launch_ms

    @property
    def launches(self) -> int:
        return len(self.kernels)

    def to_dict(self) -> dict[str, Any]:
        return dict(name=self.name, time_ms=self.time_ms, kernel_ms=self.kernel_ms,
                    launch_ms=self.launch_ms, dram_bytes=self.dram_bytes, launches=self.launches,
                    kernels=[k.what for k in self.kernels], config=self.config)


def _peak(spec: GpuSpec, dtype: str, math_kind: str) -> float:
    if math_kind == "fma":
        return spec.fp32_fma_peak.per_s
    if math_kind == "fp32":
        return spec.compute["fp32"].per_s
    key = {"bfloat16": "bf16", "float16": "fp16", "float32": "tf32"}[dtype]
    return spec.compute[key].per_s


def _conv_kernel(info, dtype: str, what: str | None = None, math_kind: str = "tensor") -> Kernel:
    return Kernel(what or info.name.rsplit("/", 1)[-1], float(info.flops), float(info.bytes), math_kind)


def _layer_kernel(info, dtype: str) -> Kernel:
    if info.op == "conv2d":
        return _conv_kernel(info, dtype)
    return Kernel(info.name.rsplit("/", 1)[-1], 0.0, float(info.bytes), "memory")


def _version(name: str, kernels, spec: GpuSpec, dtype: str, config: str = "") -> VersionCost:
    kernels = tuple(kernels)
    return VersionCost(name, kernels, float(sum(k.ms(spec, dtype) for k in kernels)),
                       LAUNCH_MS * len(kernels), float(sum(k.bytes for k in kernels)), config)


def unfused_cost(group: FusionGroup, spec: GpuSpec) -> VersionCost:
    """XLA's version: one kernel per layer (conv with its bias and ReLU fused by XLA, the pool,
    the concatenate copy, a ReLU6 clamp: H100's XLA runs MobileNetV2's expand as cuDNN
    conv+bias+ReLU, then a clamp kernel), each moving its inputs, weights and output once."""
    return _version("xla", (_layer_kernel(m, group.dtype) for m in group.members), spec, group.dtype)


def expand_depthwise_fused(group: FusionGroup) -> bool:
    """Whether jaxcnn.conv1x1_depthwise runs its fused kernel here (else XLA's two convs)."""
    return conv1x1_depthwise_fused(group.x_shape, group.attrs["hidden"], group.attrs["stride"], group.dtype)


def _odd_vec_stride(cols: int) -> int:
    """chain_common.cuh OddVecStride: 16-byte rows, an odd number of 16-byte vectors."""
    vecs = -(-cols // 8)
    return (vecs if vecs % 2 else vecs + 1) * 8


def expand_depthwise_recompute(group: FusionGroup) -> float:
    """The fused kernel's 1x1 pixels (every tile's halo) over the expand's N*H*W."""
    n, h, w, c = group.x_shape
    _, p, q, _ = group.y_shape
    s, cp = group.attrs["stride"], -(-c // 16) * 16
    pixels = []
    for th, tw in CONV1X1_DW_TILES:
        halo = ((th - 1) * s + 3) * ((tw - 1) * s + 3)
        rows = -(-halo // 16) * 16
        smem = rows * _odd_vec_stride(cp) * 2 + 2 * cp * _odd_vec_stride(CONV1X1_DW_BLOCK_N) * 2 \
            + rows * (CONV1X1_DW_BLOCK_N + 4) * 4
        if smem <= CONV1X1_DW_SMEM:
            pixels.append(n * -(-p // th) * -(-q // tw) * rows)
    return min(pixels, default=n * h * w) / (n * h * w)


def fire_plan(group: FusionGroup, spec: GpuSpec) -> FirePlan | None:
    """The library's plan for a fire group on `spec`'s GPU: the kernel jaxcnn.fire's "auto"
    runs there ("tensor_core", "two_phase", "wgmma" or "fma"), its tile, expand-channel split,
    CTAs per SM and launches. None when the library is not loaded (or predates the query)."""
    s, e1, e3 = (group.attrs[k] for k in ("squeeze", "expand1x1", "expand3x3"))
    return queries.fire_plan(group.x_shape, s, e1, e3, group.dtype, "auto",
                             device=DeviceLimits.from_spec(spec))


def fire_uses_tensor_cores(group: FusionGroup, spec: GpuSpec | None = None) -> bool:
    """Whether jaxcnn.fire's "auto" runs a tensor-core kernel for this group on `spec`'s GPU
    (default H200, as the layout choice off GPU), per the library's plan; without the library,
    the fallback estimate's rule (bf16/fp16)."""
    plan = fire_plan(group, spec or spec_by_name("H200"))
    if plan is None or plan.kernel is None:
        return group.dtype in ("bfloat16", "float16")
    return plan.kernel != "fma"


def conv_pool_uses_tensor_cores(group: FusionGroup) -> bool:
    """Whether jaxcnn.conv2d_pool's "auto" picks its tensor-core kernel: output channels K in
    16-byte vectors (a multiple of 8 in bf16/fp16, of 4 in fp32, which runs TF32 at the default
    precision), any input channel count C (one below 16 or off that multiple, e.g. a C=3 stem
    conv, runs its flat-K mode); any other K runs its CUDA-core fp32 kernel."""
    conv = group.members[0]
    vec = 16 // np.dtype(group.dtype).itemsize
    return conv.weight_shape[3] % vec == 0


def _fire_fused_cost(group: FusionGroup, spec: GpuSpec, weights: float) -> VersionCost:
    """The fused fire version as the library plans it on `spec`'s GPU (fire_plan), or the
    fallback estimate (FALLBACK_FIRE_TILE) without the library."""
    dtype = group.dtype
    plan = fire_plan(group, spec)
    kernel = None if plan is None else plan.kernel
    if plan is None:
        config = FALLBACK_FIRE_NOTE
    elif kernel is None:  # the library plans no kernel for these shapes: estimated the same way
        config = f"fallback estimate (the library plans no kernel: {plan.text})"
    else:
        config = f"library plan: {plan.text}"
    n, h, w, _ = group.x_shape
    s_bytes = bytes_of((n, h, w, group.attrs["squeeze"]), dtype)
    if kernel == "wgmma":
        # Tensor-core convs: s makes one round trip, the concatenate is gone; merged expands
        # (2 launches) read s once; one launch keeps s on chip.
        item = np.dtype(dtype).itemsize
        kernels = []
        for role in ("squeeze1x1", "expand1x1", "expand3x3"):
            m = group.role(role)
            w_bytes = (math.prod(m.weight_shape) + m.weight_shape[-1]) * item
            inp = bytes_of(group.x_shape, dtype) if role == "squeeze1x1" else s_bytes
            out = s_bytes if role == "squeeze1x1" else bytes_of(m.output_shape, dtype)
            kernels.append(Kernel(f"jaxcnn_fire/{role}", m.flops, inp + out + w_bytes, "tensor"))
        if plan.launches == 1:
            # s never leaves shared memory; the squeeze is recomputed on each 28x8 tile's halo.
            halo = (30 * 10) / (28 * 8)
            flops = sum(k.flops for k in kernels) + kernels[0].flops * (halo - 1)
            moved = sum(k.bytes for k in kernels) - 3 * s_bytes
            kernels = [Kernel("jaxcnn_fire/one_launch", flops, moved, "tensor")]
        elif plan.launches == 2:
            e1, e3 = kernels[1:]
            kernels[1:] = [Kernel("jaxcnn_fire/expands", e1.flops + e3.flops,
                                  e1.bytes + e3.bytes - s_bytes, "tensor")]
        return _version("fused", kernels, spec, dtype, config)
    flops = sum(m.flops for m in group.members if m.op == "conv2d")
    moved = bytes_of(group.x_shape, dtype) + bytes_of(group.y_shape, dtype) + weights
    if kernel == "two_phase":
        # One launch: s written to the workspace once and read by both expands (the same
        # traffic as XLA's s), the concatenate gone, no squeeze recompute.
        return _version("fused", [Kernel("jaxcnn_fire/two_phase", flops, moved + 3 * s_bytes, "tensor")],
                        spec, dtype, config)
    # The single fused kernel: each CTA recomputes its tile's squeeze on the 1-pixel halo, once
    # per expand-channel slice (split); x and the weights move once (re-reads hit L2).
    th, tw = plan.tile if kernel == "tensor_core" and plan.tile else FALLBACK_FIRE_TILE
    split = plan.split if kernel == "tensor_core" and plan.split else 1
    halo = ((th + 2) * (tw + 2)) / (th * tw)
    flops += group.role("squeeze1x1").flops * (halo * split - 1)
    if kernel is None:
        math_kind = "tensor" if dtype in ("bfloat16", "float16") else "fma"
        what = f"jaxcnn_fire ({config})"
    else:
        math_kind = "tensor" if kernel == "tensor_core" else "fma"
        what = "jaxcnn_fire"
    return _version("fused", [Kernel(what, flops, moved, math_kind)], spec, dtype, config)


def fused_cost(group: FusionGroup, spec: GpuSpec) -> VersionCost:
    """The fused version's kernels (see each kind's docstring in jaxcnn.ops)."""
    dtype, item = group.dtype, np.dtype(group.dtype).itemsize
    weights = sum(math.prod(m.weight_shape) + m.weight_shape[-1] for m in group.members
                  if m.weight_shape is not None) * item
    if group.kind == "fire":
        return _fire_fused_cost(group, spec, weights)
    if group.kind == "inception":
        r = {m.name.rsplit("/", 1)[-1]: m for m in group.members}
        n, h, w, c = group.x_shape
        k1, r3, r5 = (r[k].weight_shape[3] for k in ("1x1", "3x3_reduce", "5x5_reduce"))
        split_out = (n, h, w, k1 + r3 + r5)
        split_w = (c + 1) * (k1 + r3 + r5) * item  # weights and biases
        x_bytes = bytes_of(group.x_shape, dtype)
        kernels = [
            Kernel("split 1x1 (x read once)", float(r["1x1"].flops + r["3x3_reduce"].flops + r["5x5_reduce"].flops),
                   x_bytes + split_w + bytes_of(split_out, dtype), "tensor"),
            # The branch convs take dense operands: XLA copies the reduce slices out.
            Kernel("slice copy 3x3_reduce", 0.0, 2 * bytes_of((n, h, w, r3), dtype), "memory"),
            Kernel("slice copy 5x5_reduce", 0.0, 2 * bytes_of((n, h, w, r5), dtype), "memory"),
            _conv_kernel(r["3x3"], dtype), _conv_kernel(r["5x5"], dtype),
            _layer_kernel(r["pool"], dtype), _conv_kernel(r["pool_proj"], dtype),
            _layer_kernel(r["concat"], dtype),
        ]
        return _version("fused", kernels, spec, dtype)
    if group.kind == "conv_pool":
        conv, pool = group.members
        moved = bytes_of(conv.input_shape, dtype) + weights + bytes_of(pool.output_shape, dtype)
        math_kind = "tensor" if conv_pool_uses_tensor_cores(group) else "fma"
        return _version("fused", [Kernel("jaxcnn_conv2d_pool", float(conv.flops), moved, math_kind)],
                        spec, dtype)
    if group.kind == "expand_depthwise":
        if not expand_depthwise_fused(group):  # the op runs XLA's convs (its reference): no saving
            return _version("fused", unfused_cost(group, spec).kernels, spec, dtype)
        # One kernel: x, y and the weights move once, t stays on chip. A roofline: on H100 at
        # N=64 the kernel measured 4-8x above it (yet 1.1-2.0x faster than XLA's four kernels).
        ex, _, dw, _ = group.members
        flops = ex.flops * expand_depthwise_recompute(group) + dw.flops
        moved = bytes_of(group.x_shape, dtype) + bytes_of(group.y_shape, dtype) + weights
        return _version("fused", [Kernel("jaxcnn_conv1x1_depthwise", flops, moved, "tensor")], spec, dtype)
    raise ValueError(f"no cost model for group kind {group.kind!r}")

