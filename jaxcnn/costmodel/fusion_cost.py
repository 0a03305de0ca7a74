"""Analytical cost of a fusion group, fused and unfused: per-kernel roofline times
(max(FLOPs / peak, DRAM bytes / bandwidth, a kernel floor)) plus a launch cost per kernel.

What fusion saves is explicit: the DRAM bytes of intermediates that stay on chip (written
once and read by each consumer) and of the concatenate copy (the branch outputs read again and
the output written again), and the launches of the kernels that disappear. Peaks and bandwidth
come from jaxcnn.profile.gpu_specs (H200 when no GPU is visible, as the layout choice does); the
kernel floor and DRAM time are jaxcnn.costmodel.roofline's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxcnn.tuning.fusion_groups import FusionGroup, bytes_of
from jaxcnn.ops.chain.config import conv1x1_depthwise_fused
from jaxcnn.costmodel.roofline import memory_ms
from jaxcnn.profile.gpu_specs import GpuSpec

# Cost of one more kernel in a program beyond its own run time: launch and the gap between
# kernels (~2-5 us per op on H100/H200 timelines of small batches). An assumption, labelled
# as such in explain(); measurements replace it on a GPU.
LAUNCH_MS = 0.003
# The fused fire kernel's spatial output tile (the library's plan line "tile=8x16"): the
# squeeze is recomputed on the 1-pixel halo of each tile for the 3x3 expand.
FIRE_TILE = (8, 16)
# The fused fire kernel's tensor-core path (cuda_ops/fusion): bf16/fp16, every channel count a
# multiple of 8, at most this many squeeze channels (the squeeze tile lives in shared memory).
FIRE_TC_MAX_SQUEEZE = 64
FIRE_TC_CHANNEL_MULTIPLE = 8
# jaxcnn.fire's "auto" runs three wgmma convs instead (Hopper only; cuda_ops/fusion/fire.cu
# kWgmmaMinPixels) from this many output pixels on, or above FIRE_TC_MAX_SPLITLESS squeeze
# channels (where the fused kernel would split the expands and recompute the squeeze).
FIRE_WGMMA_MIN_PIXELS = 8192
FIRE_TC_MAX_SPLITLESS = 32
# ... except up to this many squeeze channels when the fused kernel's two-CTAs-per-SM layout
# fits unsplit (fire.cu kFusedMaxSqueezeAtScale; FIRE_TC_* below mirror its TcLayout).
FIRE_FUSED_MAX_SQUEEZE_AT_SCALE = 16
FIRE_TC_SMEM_PER_SM = 233472  # Hopper: 228 KiB per SM, 1 KiB of it reserved per CTA
FIRE_TC_IN_CHUNK = 64
FIRE_TC_EXPAND_BLOCK = 64
FIRE_TC_MAX_EXPAND_CHUNK = 128
# ... and up to this many output pixels (N*H*W) the two-phase kernel (fire.cu
# kTwoPhaseMaxPixels; sm_80+): one cooperative launch, s through a workspace in L2.
FIRE_TWO_PHASE_MAX_PIXELS = 1024
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

    @property
    def time_ms(self) -> float:
        return self.kernel_ms + self.launch_ms

    @property
    def launches(self) -> int:
        return len(self.kernels)

    def to_dict(self) -> dict[str, Any]:
        return dict(name=self.name, time_ms=self.time_ms, kernel_ms=self.kernel_ms,
                    launch_ms=self.launch_ms, dram_bytes=self.dram_bytes, launches=self.launches,
                    kernels=[k.what for k in self.kernels])


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


def _version(name: str, kernels, spec: GpuSpec, dtype: str) -> VersionCost:
    kernels = tuple(kernels)
    return VersionCost(name, kernels, float(sum(k.ms(spec, dtype) for k in kernels)),
                       LAUNCH_MS * len(kernels), float(sum(k.bytes for k in kernels)))


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


def fire_uses_tensor_cores(group: FusionGroup) -> bool:
    """Whether jaxcnn.fire's "auto" picks its tensor-core kernel for these shapes."""
    c = group.x_shape[3]
    s, e1, e3 = (group.attrs[k] for k in ("squeeze", "expand1x1", "expand3x3"))
    return (group.dtype in ("bfloat16", "float16") and s <= FIRE_TC_MAX_SQUEEZE
            and all(v % FIRE_TC_CHANNEL_MULTIPLE == 0 for v in (c, s, e1, e3)))


def _padded_stride(cols: int) -> int:
    """fire_kernels.cuh PaddedStride: 16-byte rows, an odd number of 16-byte vectors."""
    vecs = -(-cols // 8)
    return (vecs + 2 if vecs % 2 else vecs + 1) * 8


def fire_fits_two_ctas_unsplit(n: int, h: int, w: int, c: int, s: int, e1: int, e3: int,
                               sm_count: int = 132) -> bool:
    """Whether the fused fire kernel's shared memory (fire.cu TcLayout, no expand-channel
    split) fits two CTAs per Hopper SM."""
    tile_h = 4 if n * -(-h // 8) * -(-w // FIRE_TILE[1]) < sm_count else 8
    halo_rows = -(-((tile_h + 2) * (FIRE_TILE[1] + 2)) // 16) * 16
    sk = -(-s // 16) * 16
    sq_stride = _padded_stride(sk)
    e1r, e3r = -(-e1 // 8) * 8, -(-e3 // 8) * 8
    ex_chunk = min(FIRE_TC_MAX_EXPAND_CHUNK, -(-max(e1r, e3r) // 16) * 16)
    ex_stride = _padded_stride(ex_chunk)
    weights = (-(-e1r // ex_chunk) + 9 * -(-e3r // ex_chunk)) * sk * ex_stride
    fixed = (2 * halo_rows * _padded_stride(FIRE_TC_IN_CHUNK) + halo_rows * sq_stride + weights
             + 8 * FIRE_TILE[1] * _padded_stride(FIRE_TC_EXPAND_BLOCK))
    limit = FIRE_TC_SMEM_PER_SM // 2 - 1024
    in_chunks = -(-c // FIRE_TC_IN_CHUNK)
    bias = 2 * (s + e1 + e3)
    return any(2 * (-(-(fixed + chunks * FIRE_TC_IN_CHUNK * sq_stride) // 8) * 8 + bias) <= limit
               for chunks in (in_chunks, 2))  # squeeze weights resident, else streamed


def fire_uses_two_phase(group: FusionGroup) -> bool:
    """Whether jaxcnn.fire's "auto" runs its two-phase kernel (squeeze over the whole grid into
    a workspace, grid barrier, expands): small problems on the tensor-core constraints."""
    n, h, w, _ = group.x_shape
    return (fire_uses_tensor_cores(group) and group.attrs["squeeze"] >= 8
            and n * h * w <= FIRE_TWO_PHASE_MAX_PIXELS)


def fire_uses_wgmma(group: FusionGroup, spec: GpuSpec) -> bool:
    """Whether jaxcnn.fire's "auto" runs its wgmma path (the whole module as one launch where
    fire_runs_one_launch, else the squeeze into a workspace and the expands into their channel
    slices of the output: one launch, or one each) on this GPU: big problems and wide
    squeezes, except narrow squeezes whose fused kernel runs two CTAs per SM unsplit."""
    n, h, w, c = group.x_shape
    s, e1, e3 = (group.attrs[k] for k in ("squeeze", "expand1x1", "expand3x3"))
    hopper = spec.name.startswith(("H100", "H200"))
    if not (hopper and group.dtype in ("bfloat16", "float16")
            and all(v % FIRE_TC_CHANNEL_MULTIPLE == 0 for v in (c, s, e1, e3))):
        return False
    if fire_uses_two_phase(group):
        return False
    if s > FIRE_TC_MAX_SPLITLESS:
        return True
    if n * h * w < FIRE_WGMMA_MIN_PIXELS:
        return False
    return not (s <= FIRE_FUSED_MAX_SQUEEZE_AT_SCALE
                and fire_fits_two_ctas_unsplit(n, h, w, c, s, e1, e3, spec.sm_count or 132))


# The wgmma path runs both expands as one launch of the wgmma conv kernel (s read once per
# tile, each 64-channel block stored into its slice of y) where S is a multiple of this ...
FIRE_MERGED_SQUEEZE_MULTIPLE = 32
# ... and E1 and E3 of this (cuda_ops/conv_pool/conv_pool_wgmma.h, LaunchFireExpand).
FIRE_MERGED_EXPAND_MULTIPLE = 64


# The whole module as one wgmma launch (cuda_ops/fusion/fire_fused_wgmma.h): 32 squeeze
# channels, C a multiple of 32, E1 and E3 of 64 whose weights (one 64-channel block: 4 KB a
# tap, 1 tap for the 1x1, 9 for the 3x3) and fp32 biases fit in the shared memory the kernel's
# tiles and two pipeline stages leave.
FIRE_ONE_LAUNCH_SQUEEZE = 32
FIRE_ONE_LAUNCH_SMEM_LEFT = 90880


def fire_one_launch_applies(c: int, s: int, e1: int, e3: int) -> bool:
    """Whether a fire of these channel counts runs as one wgmma launch (bf16/fp16, Hopper)."""
    resident = (e1 // 64 + 9 * (e3 // 64)) * 4096 + 4 * (e1 + e3)
    return (s == FIRE_ONE_LAUNCH_SQUEEZE and c % 32 == 0 and e1 > 0 and e3 > 0
            and e1 % 64 == 0 and e3 % 64 == 0 and resident <= FIRE_ONE_LAUNCH_SMEM_LEFT)


def fire_runs_one_launch(group: FusionGroup) -> bool:
    """Whether jaxcnn.fire's wgmma path runs the whole module as one launch (s on chip)."""
    s, e1, e3 = (group.attrs[k] for k in ("squeeze", "expand1x1", "expand3x3"))
    return fire_one_launch_applies(group.x_shape[3], s, e1, e3)


def fire_merges_expands(group: FusionGroup) -> bool:
    """Whether jaxcnn.fire's wgmma path runs its two expands as one launch."""
    s, e1, e3 = (group.attrs[k] for k in ("squeeze", "expand1x1", "expand3x3"))
    return (s % FIRE_MERGED_SQUEEZE_MULTIPLE == 0 and e1 > 0 and e3 > 0
            and e1 % FIRE_MERGED_EXPAND_MULTIPLE == 0 and e3 % FIRE_MERGED_EXPAND_MULTIPLE == 0)


def conv_pool_uses_tensor_cores(group: FusionGroup) -> bool:
    """Whether jaxcnn.conv2d_pool's "auto" picks its tensor-core kernel: output channels K in
    16-byte vectors (a multiple of 8 in bf16/fp16, of 4 in fp32, which runs TF32 at the default
    precision), any input channel count C (one below 16 or off that multiple, e.g. a C=3 stem
    conv, runs its flat-K mode); any other K runs its CUDA-core fp32 kernel."""
    conv = group.members[0]
    vec = 16 // np.dtype(group.dtype).itemsize
    return conv.weight_shape[3] % vec == 0


def fused_cost(group: FusionGroup, spec: GpuSpec) -> VersionCost:
    """The fused version's kernels (see each kind's docstring in jaxcnn.ops)."""
    dtype, item = group.dtype, np.dtype(group.dtype).itemsize
    weights = sum(math.prod(m.weight_shape) + m.weight_shape[-1] for m in group.members
                  if m.weight_shape is not None) * item
    if group.kind == "fire" and fire_uses_wgmma(group, spec):
        # Tensor-core convs: s makes one round trip, the concatenate is gone; merged expands
        # read s once; with 32 squeeze channels one launch keeps s on chip.
        n, h, w, _ = group.x_shape
        s_bytes = bytes_of((n, h, w, group.attrs["squeeze"]), dtype)
        kernels = []
        for role in ("squeeze1x1", "expand1x1", "expand3x3"):
            m = group.role(role)
            w_bytes = (math.prod(m.weight_shape) + m.weight_shape[-1]) * item
            inp = bytes_of(group.x_shape, dtype) if role == "squeeze1x1" else s_bytes
            out = s_bytes if role == "squeeze1x1" else bytes_of(m.output_shape, dtype)
            kernels.append(Kernel(f"jaxcnn_fire/{role}", m.flops, inp + out + w_bytes, "tensor"))
        if fire_runs_one_launch(group):
            # s never leaves shared memory; the squeeze is recomputed on each 28x8 tile's halo.
            halo = (30 * 10) / (28 * 8)
            flops = sum(k.flops for k in kernels) + kernels[0].flops * (halo - 1)
            moved = sum(k.bytes for k in kernels) - 3 * s_bytes
            kernels = [Kernel("jaxcnn_fire/one_launch", flops, moved, "tensor")]
        elif fire_merges_expands(group):
            e1, e3 = kernels[1:]
            kernels[1:] = [Kernel("jaxcnn_fire/expands", e1.flops + e3.flops,
                                  e1.bytes + e3.bytes - s_bytes, "tensor")]
        return _version("fused", kernels, spec, dtype)
    if group.kind == "fire" and fire_uses_two_phase(group):
        # One launch: s written to the workspace once and read by both expands (the same
        # traffic as XLA's s), the concatenate gone, no squeeze recompute.
        s_bytes = bytes_of((*group.x_shape[:3], group.attrs["squeeze"]), dtype)
        flops = sum(m.flops for m in group.members if m.op == "conv2d")
        moved = bytes_of(group.x_shape, dtype) + bytes_of(group.y_shape, dtype) + 3 * s_bytes + weights
        return _version("fused", [Kernel("jaxcnn_fire/two_phase", flops, moved, "tensor")], spec, dtype)
    if group.kind == "fire":
        n, h, w, _ = group.x_shape
        sq = group.role("squeeze1x1")
        th, tw = FIRE_TILE
        halo = ((th + 2) * (tw + 2)) / (th * tw)  # squeeze recomputed on each tile's halo
        flops = sum(m.flops for m in group.members if m.op == "conv2d") + sq.flops * (halo - 1)
        math_kind = "tensor" if fire_uses_tensor_cores(group) else "fma"
        moved = bytes_of(group.x_shape, dtype) + bytes_of(group.y_shape, dtype) + weights
        return _version("fused", [Kernel("jaxcnn_fire", flops, moved, math_kind)], spec, dtype)
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

