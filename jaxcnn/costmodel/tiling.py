"""How a kernel tiles the implicit GEMM: CTA tile, pipeline, operand staging, occupancy.

Named presets: cuDNN-like Hopper tensor-core tilings (what XLA's cuDNN picks, see the kernel
names in benchmarks/results), cuDNN's sm80 FFMA tilings (float32 at Precision.HIGHEST) and
JAXCNN_DIRECT_64x64x16 (cuda_ops/conv/conv2d_direct_kernel.cuh). auto_tiling() picks one per
layer; parse_kernel_tiling() reads one from a cuDNN / cuBLAS kernel name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from jaxcnn.costmodel.conv_layer import ConvLayer
from jaxcnn.profile.gpu_specs import GpuSpec


# Warps per SM that hide the latency of the main loop (4 per scheduler): a CTA with fewer
# warps needs co-resident neighbours to reach the SM's throughput.
SATURATING_WARPS_PER_SM = 16


@dataclass(frozen=True)
class Tiling:
    name: str
    mt: int  # CTA tile along GEMM M (output pixels)
    nt: int  # along GEMM N (output channels of the CTA's groups)
    kt: int  # GEMM-K per pipeline stage
    threads: int
    # Pipeline stages in shared memory; None: a warp-specialized TMA kernel that sizes its
    # pipeline to fill shared memory (so one CTA per SM).
    stages: int | None
    # "smem": global -> shared bypassing L1 (TMA, cp.async.cg): every request reaches L2.
    # "l1": plain loads through L1 (then registers -> shared): L1 can serve repeated addresses.
    staging: str = "smem"
    unit: str = "tensor"  # "tensor" | "fma" (CUDA-core FFMA)
    smem_elem_bytes: int | None = None  # element size in shared memory; None: as in global
    # Launch order of CTAs: "m_fastest" (blockIdx.x walks M, one N column after another) or
    # "n_fastest" (all N tiles of an M row, then the next row; cuDNN's swizzles are close).
    raster: str = "n_fastest"
    groups_per_cta: int = 1  # cuDNN's grouped kernels (_g8, _g16) pack groups into one N tile
    # cuDNN's implicit GEMM steps GEMM-K tap by tap, kt channels at a time (a stage never
    # straddles two taps): R*S*ceil(C/groups/kt) iterations. False: K flattened, ceil(Kg/kt).
    k_per_tap: bool = False
    weights_k_contiguous: bool = True  # KRSC filter (cuDNN); False: HWIO, N contiguous
    # (rows, cols) of the output tile one math group computes: a warp (FFMA, mma.sync) or, with
    # wgmma, a warpgroup. Sets how often operands are re-read from shared memory.
    mma_tile: tuple[int, int] | None = None
    wgmma: bool = False  # sm90 warpgroup MMA: B is re-read for every 64 rows of A
    store_amplification: float = 1.0  # store sectors / stored bytes (partial-sector writes)
    regs_per_thread: int | None = None
    ctas_per_sm: int | None = None  # explicit occupancy; None: from the resource limits
    kernel: str = ""  # kernel name it was parsed from, if any

    def __post_init__(self) -> None:
        if self.staging not in ("smem", "l1"):
            raise ValueError(f"staging must be 'smem' or 'l1', not {self.staging!r}")
        if self.unit not in ("tensor", "fma"):
            raise ValueError(f"unit must be 'tensor' or 'fma', not {self.unit!r}")
        if self.raster not in ("m_fastest", "n_fastest"):
            raise ValueError(f"raster must be 'm_fastest' or 'n_fastest', not {self.raster!r}")

    @property
    def warps(self) -> int:
        return max(1, self.threads // 32)

    @property
    def mma_groups(self) -> int:
        """Math groups (warps or warpgroups) sharing the CTA tile."""
        rows, cols = self.mma_tile or (self.mt, self.nt)
        return max(1, (self.mt // rows) * (self.nt // cols))

    def smem_bytes(self, elem_bytes: int) -> int:
        """Shared memory of the A and B pipeline stages (None stages: one stage's worth)."""
        es = self.smem_elem_bytes or elem_bytes
        return (self.stages or 1) * (self.mt + self.nt) * self.kt * es

    def saturating_ctas(self, resident: int) -> int:
        """Co-resident CTAs it takes to keep an SM busy (SATURATING_WARPS_PER_SM), at most
        `resident`:
        one big warp-specialized CTA suffices, 2-warp FFMA CTAs need several."""
        return max(1, min(resident, math.ceil(SATURATING_WARPS_PER_SM / self.warps)))

    @property
    def registers(self) -> int:
        """Registers per thread: the known count, else an estimate from the fp32 accumulators
        each thread holds (mt*nt/threads, plus a quarter and 32 for addresses and operands)."""
        if self.regs_per_thread:
            return self.regs_per_thread
        accumulators = self.mt * self.nt / self.threads
        return min(255, math.ceil(1.25 * accumulators + 32))

    def occupancy(self, spec: GpuSpec, elem_bytes: int) -> int:
        """Co-resident CTAs per SM: the tightest of threads, shared memory, registers."""
        if self.ctas_per_sm:
            return self.ctas_per_sm
        if self.stages is None:
            return 1
        allocated = math.ceil(self.registers / 8) * 8  # per-thread allocation unit
        limits = [
            spec.max_ctas_per_sm,
            spec.max_threads_per_sm // self.threads,
            spec.registers_per_sm // (allocated * self.threads),
        ]
        if spec.smem_per_sm_bytes:
            limits.append(spec.smem_per_sm_bytes // self.smem_bytes(elem_bytes))
        return max(1, min(limits))


def _hopper_tc(mt: int, nt: int, kt: int, consumer_warpgroups: int = 1) -> Tiling:
    """sm90 cuDNN implicit GEMM: TMA (im2col) loads, one producer warpgroup, wgmma consumer
    warpgroups splitting M."""
    return Tiling(
        name=f"HOPPER_TC_{mt}x{nt}x{kt}",
        mt=mt,
        nt=nt,
        kt=kt,
        threads=128 * (consumer_warpgroups + 1),
        stages=None,
        k_per_tap=True,
        mma_tile=(mt // consumer_warpgroups, nt),
        wgmma=True,
    )


def _sm80_ffma(mt: int, nt: int, kt: int, warps_m: int, warps_n: int) -> Tiling:
    """cuDNN's sm80 float32 FFMA implicit GEMM (Precision.HIGHEST), 3 cp.async stages."""
    warps = warps_m * warps_n
    return Tiling(
        name=f"SM80_FFMA_{mt}x{nt}x{kt}",
        mt=mt,
        nt=nt,
        kt=kt,
        threads=32 * warps,
        stages=3,
        unit="fma",
        k_per_tap=True,
        mma_tile=(mt // warps_m, nt // warps_n),
    )


# Our kernel: 256 threads each computing 4x4 outputs, A gathered through L1 (im2col on the
# fly), both operands staged as float32 in two shared-memory buffers. One warp covers 2 thread
# rows x 16 thread columns = 8 x 64 outputs. Each thread stores its 4 columns one element at a
# time, so a warp's store instruction touches every sector of its 64-column row: 4 x the bytes.
# 95 registers (ptxas -v, sm_90, CUDA 13.0) -> 2 CTAs per SM.
JAXCNN_DIRECT_64x64x16 = Tiling(
    name="JAXCNN_DIRECT_64x64x16",
    mt=64,
    nt=64,
    kt=16,
    threads=256,
    stages=2,
    staging="l1",
    unit="fma",
    smem_elem_bytes=4,
    raster="m_fastest",
    weights_k_contiguous=False,
    mma_tile=(8, 64),
    store_amplification=4.0,
    regs_per_thread=95,
)

PRESETS: dict[str, Tiling] = {
    t.name: t
    for t in (
        _hopper_tc(128, 128, 64),
        _hopper_tc(128, 256, 64, consumer_warpgroups=2),
        _hopper_tc(256, 128, 64, consumer_warpgroups=2),
        _hopper_tc(64, 128, 64),
        _hopper_tc(256, 64, 64),
        _hopper_tc(128, 128, 32),
        _hopper_tc(256, 64, 32),
        _hopper_tc(64, 128, 32),
        _hopper_tc(128, 64, 32),
        _hopper_tc(128, 32, 32),
        _hopper_tc(128, 32, 64),
        _sm80_ffma(256, 64, 8, 2, 2),
        _sm80_ffma(128, 32, 8, 2, 2),
        _sm80_ffma(32, 32, 8, 1, 2),
        JAXCNN_DIRECT_64x64x16,
    )
}


def get_tiling(name: str) -> Tiling:
    """The preset tiling named `name` (a key of PRESETS); KeyError naming the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"no tiling preset {name!r}; known: {sorted(PRESETS)}") from None


# ---------------------------------------------------------------- choosing one per layer


def auto_tiling(layer: ConvLayer, impl: str, math_precision: str, sm_count: int = 132) -> Tiling:
    """A cuDNN-like choice (impl "xla") or our kernel's only tiling (impl "jaxcnn_direct").

    Tensor cores (bf16/fp16/tf32), read off XLA's picks on the H200 suite:
      kt = 128 bytes of K (64 bf16, 32 tf32), halved (down to 64 bytes) while it does not
        divide C/groups;
      nt = the smallest of 32/64/128 that covers K/groups (128 at most);
      mt = 256 for nt <= 64, else 128; 64 when that leaves fewer CTAs than SMs.
    float32 at HIGHEST (FFMA): 256x64x8, 128x32x8 for K/groups <= 32, 32x32x8 when
    256x64 tiles leave fewer CTAs than SMs.
    """
    if impl == "jaxcnn_direct":
        return JAXCNN_DIRECT_64x64x16
    if impl != "xla":
        raise ValueError(f"impl must be 'xla' or 'jaxcnn_direct', not {impl!r}")

    def ctas(mt: int, nt: int) -> int:
        return math.ceil(layer.gemm_m / mt) * math.ceil(layer.gemm_n / nt) * layer.groups

    if math_precision == "fp32":
        if layer.gemm_n <= 32:
            return PRESETS["SM80_FFMA_128x32x8"]
        if ctas(256, 64) < sm_count:
            return PRESETS["SM80_FFMA_32x32x8"]
        return PRESETS["SM80_FFMA_256x64x8"]
    kt = 128 // layer.elem_bytes
    while kt * layer.elem_bytes > 64 and layer.c_per_group % kt:
        kt //= 2
    nt = next(size for size in (32, 64, 128) if size >= layer.gemm_n or size == 128)
    mt = 256 if nt <= 64 else 128
    if ctas(mt, nt) < sm_count:
        mt = 64
    name = f"HOPPER_TC_{mt}x{nt}x{kt}"
    return PRESETS.get(name) or _hopper_tc(mt, nt, kt)


# ---------------------------------------------------------------- reading kernel names

_TILESIZE = re.compile(r"tilesize(\d+)x(\d+)x(\d+)")
_NVJET = re.compile(r"nvjet_sm\d+_\w+?_(\d+)x(\d+)_(\d+)x(\d+)")


def _int_triple(pattern: str, name: str) -> tuple[int, int, int] | None:
    found = re.search(pattern + r"(\d+)x(\d+)x(\d+)", name)
    return tuple(int(v) for v in found.groups()) if found else None  # type: ignore[return-value]


def parse_kernel_tiling(kernel_name: str) -> Tiling | None:
    """The tiling a cuDNN (`..._tilesizeMxNxK_...`) or cuBLAS nvjet kernel name spells out.

    sm90 names carry `warpgroupsizeAxBx1` (wgmma consumer warpgroups; one producer warpgroup
    more) and use TMA; sm80 names carry `stageS` and `warpsizeAxBx1` and use cp.async (both
    "smem" staging); `_wo_smem` kernels load operands through L1; `ffma` ones run on CUDA
    cores; `_gG_` packs G groups per CTA. nvjet names are `nvjet_smXX_<kind>_<N>x<M>_<K>x<stages>
    ...`: cuBLAS is column-major, so XLA's y = x w runs as y^T = w^T x^T and the first tile
    size is along the output channels. None when the name carries no tile size.
    """
    found = _TILESIZE.search(kernel_name)
    if found:
        mt, nt, kt = (int(v) for v in found.groups())
        stage = re.search(r"_stage(\d+)", kernel_name)
        groups = re.search(r"_g(\d+)_", kernel_name)
        warpgroups = _int_triple("warpgroupsize", kernel_name)
        warps = _int_triple("warpsize", kernel_name)
        groups_mn = warpgroups or warps
        if warpgroups:
            threads = 128 * (warpgroups[0] * warpgroups[1] + 1)
        elif warps:
            threads = 32 * warps[0] * warps[1] * warps[2]
        else:
            threads = 128
        mma_tile = (mt // groups_mn[0], nt // groups_mn[1]) if groups_mn else None
        return Tiling(
            name=f"cudnn_{mt}x{nt}x{kt}",
            mt=mt,
            nt=nt,
            kt=kt,
            threads=threads,
            stages=int(stage.group(1)) if stage else None,
            staging="l1" if "wo_smem" in kernel_name else "smem",
            unit="fma" if "ffma" in kernel_name else "tensor",
            groups_per_cta=int(groups.group(1)) if groups else 1,
            k_per_tap="implicit_gemm" in kernel_name,
            mma_tile=mma_tile,
            wgmma=bool(warpgroups),
            kernel=kernel_name,
        )
    found = _NVJET.search(kernel_name)
    if found:
        nt, mt, kt, stages = (int(v) for v in found.groups())
        return Tiling(
            name=f"nvjet_{mt}x{nt}x{kt}",
            mt=mt,
            nt=nt,
            kt=kt,
            threads=384,
            stages=stages,
            mma_tile=(mt, nt),
            wgmma=True,
            kernel=kernel_name,
        )
    return None


def resolve_tiling(
    tiling: str | Tiling, layer: ConvLayer, impl: str, math_precision: str, sm_count: int
) -> Tiling:
    """ "auto", a preset name, a kernel name with a tile size, or a Tiling."""
    if isinstance(tiling, Tiling):
        return tiling
    if tiling == "auto":
        return auto_tiling(layer, impl, math_precision, sm_count)
    if tiling in PRESETS:
        return PRESETS[tiling]
    parsed = parse_kernel_tiling(tiling)
    if parsed is None:
        raise KeyError(f"{tiling!r} is neither a preset ({sorted(PRESETS)}) nor a kernel name")
    return parsed
