"""Bytes at each memory level (L1/shared, L2, DRAM) for one implicit-GEMM convolution (DeLTA).

Following Lym et al., "DeLTA: GPU Performance Model for Deep Learning Applications with In-Depth
Memory System Traffic Analysis" (ISPASS 2019): count what every CTA requests, then take away
the reuse the hardware finds at each level: L1 serves the overlap of a CTA's im2col rows (when
the kernel loads through L1), L2 serves what the CTAs resident in one wave share and what stays
cached across waves, DRAM sees the rest. Loads and stores move whole 32-byte sectors.

Symbols: M = N*P*Q, Ng = K/groups, Kg = R*S*C/groups (layer.py); mt x nt x kt the CTA tile;
e bytes per element; G groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from jaxcnn.costmodel.conv_layer import ConvLayer
from jaxcnn.costmodel.tiling import Tiling
from jaxcnn.profile.gpu_specs import GpuSpec

SECTOR_BYTES = 32
SMEM_WAVEFRONT_BYTES = 128  # shared memory serves 128 B per clock per SM
# Share of L2 that still holds the output's dirty lines when a kernel ends: ncu counts DRAM
# bytes within the kernel, and writes that fit stay in L2 (written back during later kernels).
# Fitted on H200 ncu counts of cuDNN kernels (vgg_c3_1, fire squeeze/expand, batch-1 layers).
L2_DIRTY_RESIDENT_SHARE = 0.5


@dataclass(frozen=True)
class Grid:
    """The CTAs of the launch and how they fill the GPU."""

    tiles_m: int
    tiles_n: int  # N tiles per group block
    group_blocks: int  # ceil(G / groups_per_cta)
    ctas: int
    k_iters: int  # main-loop iterations of one CTA
    occupancy: int  # co-resident CTAs per SM
    wave_ctas: int  # SMs x occupancy
    waves: int  # ceil(CTAs / wave_ctas)
    saturating_wave_ctas: int  # SMs x the co-resident CTAs that keep an SM busy
    sm_count: int = 0  # 0: unknown (quantization_with falls back to `quantization`)
    warps_per_cta: int = 1

    @property
    def quantization(self) -> float:
        """ceil(w) / w for w = CTAs / saturating_wave_ctas: the idle share of the last wave.

        Co-resident CTAs beyond what saturates an SM share its throughput, so a wave counts
        only those (with fewer warps per CTA than saturate an SM this is SMs * occupancy).
        """
        waves = self.ctas / self.saturating_wave_ctas
        return math.ceil(waves) / waves

    def quantization_with(self, hiding_warps: float | None) -> float:
        """The last wave's cost when an SM with n resident warps runs at a rate n / (n + h)
        (Little's law: h warps' worth of latency to hide; h = hiding_warps, fitted per GPU).

        full = CTAs // (SMs * occupancy) whole waves; the busiest SM of the partial last wave
        holds k = ceil(rest / SMs) CTAs and takes (k w + h) / (occ w + h) of a whole wave's time
        (w warps per CTA). Time / ideal = (full + that) / (CTAs / (SMs * occupancy)). With
        occupancy 1 (cuDNN's Hopper kernels) this is ceil(waves) / waves; it charges a
        one-CTA-per-SM launch of our 2-CTA kernel less than a whole wave, since a lone CTA
        runs faster than half of two. None: `quantization` (the saturating-CTA rule).
        """
        if hiding_warps is None or not self.sm_count:
            return self.quantization
        per_wave = self.sm_count * self.occupancy
        full, rest = divmod(self.ctas, per_wave)
        last = 0.0
        if rest:
            k = math.ceil(rest / self.sm_count)
            w = self.warps_per_cta
            last = (k * w + hiding_warps) / (self.occupancy * w + hiding_warps)
        return (full + last) / (self.ctas / per_wave)


@dataclass(frozen=True)
class Traffic:
    l1_bytes: float  # global loads + stores at L1/TEX, im2col duplicates included, in sectors
    l2_bytes: float  # what reaches L2: L1 misses (all requests when staging bypasses L1) + stores
    dram_bytes: float
    smem_read_bytes: float  # main loop's shared-memory operand reads (L1/shared data path)
    work_flops: float  # tile-padded multiply-adds x 2 that the math units execute
    grid: Grid
    by_operand: dict[str, dict[str, float]] = field(default_factory=dict)  # level -> a/b/c
    # What ncu's counters see during the kernel (l1tex__t_bytes, lts__t_bytes, dram__bytes):
    # no L1TEX traffic for TMA kernels, and no write-back of the output part L2 still holds.
    ncu_bytes: dict[str, float] = field(default_factory=dict)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def make_grid(layer: ConvLayer, tiling: Tiling, spec: GpuSpec) -> Grid:
    """CTAs = ceil(M/mt) * ceil(Ng*groups_per_cta/nt) * ceil(G/groups_per_cta); k iterations
    flattened (ceil(Kg/kt)) or per tap (R*S*ceil(C/G*groups_per_cta/kt))."""
    groups_per_cta = min(tiling.groups_per_cta, layer.groups)
    tiles_m = ceil_div(layer.gemm_m, tiling.mt)
    tiles_n = ceil_div(layer.gemm_n * groups_per_cta, tiling.nt)
    group_blocks = ceil_div(layer.groups, groups_per_cta)
    ctas = tiles_m * tiles_n * group_blocks
    occupancy = tiling.occupancy(spec, layer.elem_bytes)
    wave_ctas = spec.sm_count * occupancy
    if tiling.k_per_tap:
        k_iters = layer.r * layer.s * ceil_div(layer.c_per_group * groups_per_cta, tiling.kt)
    else:
        k_iters = ceil_div(layer.gemm_k, tiling.kt)
    return Grid(
        tiles_m=tiles_m,
        tiles_n=tiles_n,
        group_blocks=group_blocks,
        ctas=ctas,
        k_iters=k_iters,
        occupancy=occupancy,
        wave_ctas=wave_ctas,
        waves=ceil_div(ctas, wave_ctas),
        saturating_wave_ctas=spec.sm_count * tiling.saturating_ctas(occupancy),
        sm_count=spec.sm_count,
        warps_per_cta=tiling.warps,
    )


# ---------------------------------------------------------------- sectors and windows


def sector_bytes(run_bytes: float, elem_bytes: int, aligned: bool) -> float:
    """Bytes of the 32 B sectors one contiguous run touches: exact for sector-aligned runs,
    else the mean over starts at any element (one sector more per 32 B crossed)."""
    if aligned:
        return math.ceil(run_bytes / SECTOR_BYTES) * SECTOR_BYTES
    return SECTOR_BYTES + max(run_bytes - elem_bytes, 0)


def channel_slice_bytes(channels: int, layer: ConvLayer) -> float:
    """Sector bytes of `channels` consecutive channels of one pixel (a group's slice)."""
    e = layer.elem_bytes
    aligned = (channels * e) % SECTOR_BYTES == 0 and (layer.c * e) % SECTOR_BYTES == 0
    return sector_bytes(channels * e, e, aligned)


def _amplification(run_elems: float, layer: ConvLayer, row_elems: int) -> float:
    """Sector bytes / useful bytes for runs of run_elems inside rows of row_elems elements."""
    e = layer.elem_bytes
    run = run_elems * e
    aligned = (row_elems * e) % SECTOR_BYTES == 0 and run % SECTOR_BYTES == 0
    return sector_bytes(run, e, aligned) / run


def unique_extent(outputs: float, stride: int, taps: int, dilation: int) -> float:
    """Input positions along one axis under the windows of `outputs` consecutive outputs:
    overlapping windows merge into one span, disjoint ones (stride > window) add up."""
    return min(outputs * taps, (outputs - 1) * stride + (taps - 1) * dilation + 1)


def touched_pixels_per_image(layer: ConvLayer) -> float:
    """Input pixels any filter window reads (strided 1x1 convs skip some)."""
    (sh, sw), (dh, dw) = layer.stride, layer.dilation
    rows = min(layer.h, unique_extent(layer.p, sh, layer.r, dh))
    cols = min(layer.w, unique_extent(layer.q, sw, layer.s, dw))
    return rows * cols


def cta_window_pixels(layer: ConvLayer, mt: int) -> float:
    """Unique input pixels under the filter windows of one CTA's mt output pixels.

    The CTA's rows of M are consecutive (n, p, q) in row-major order: a segment of one output
    row when mt <= Q, else a band of mt/Q output rows of full width (mt/(P*Q) whole images
    once it passes an image). Padding is not loaded, so the window is clipped to the image.
    """
    pq = layer.p * layer.q
    if mt >= pq:
        return mt / pq * touched_pixels_per_image(layer)
    rows_out, cols_out = (1.0, mt) if mt <= layer.q else (mt / layer.q, layer.q)
    (sh, sw), (dh, dw) = layer.stride, layer.dilation
    rows_in = min(layer.h, unique_extent(rows_out, sh, layer.r, dh))
    cols_in = min(layer.w, unique_extent(cols_out, sw, layer.s, dw))
    return rows_in * cols_in


def a_run_elems(layer: ConvLayer, tiling: Tiling) -> int:
    """Elements one A row (im2col row) reads contiguously per k-stage.

    GEMM-K runs (r, s, c) with c fastest, so a k-stage reads kt consecutive channels of one
    pixel; with one group and no horizontal dilation the next tap's channels follow in memory
    (pixel iw+1), so up to S*C elements are contiguous (e.g. a 7x7 stem on 3 channels).
    """
    if layer.groups == 1 and layer.dilation[1] == 1:
        return min(tiling.kt, layer.s * layer.c)
    return min(tiling.kt, layer.c_per_group)


# ---------------------------------------------------------------- the three levels


def l1_requests(layer: ConvLayer, tiling: Tiling, grid: Grid) -> dict[str, float]:
    """Bytes every CTA asks of L1/TEX (or of L2 directly, for TMA), sector-rounded.

    A: each of the tiles_n CTA columns of a group reads all M im2col rows of Kg elements, the
    R*S-fold im2col duplication included. B: each of the tiles_m CTA rows reads all weights.
    C: y once, times the store pattern's partial-sector factor.
    """
    e = layer.elem_bytes
    cta_cols = min(tiling.nt, layer.gemm_n * min(tiling.groups_per_cta, layer.groups))
    a = grid.tiles_n * layer.groups * layer.gemm_m * layer.gemm_k * e
    a *= _amplification(a_run_elems(layer, tiling), layer, layer.c)
    b = grid.tiles_m * layer.k * layer.gemm_k * e
    if tiling.weights_k_contiguous:  # KRSC rows: kt channels of one tap
        b *= _amplification(min(tiling.kt, layer.c_per_group), layer, layer.c_per_group)
    else:  # HWIO rows: the CTA's output-channel columns
        b *= _amplification(cta_cols, layer, layer.k)
    # A thread tile of w columns stored one scalar at a time repeats the row's sectors w times.
    repeats = min(tiling.store_amplification, max(1.0, layer.gemm_n))
    c = layer.y_bytes * repeats * _amplification(cta_cols, layer, layer.k)
    return {"a": a, "b": b, "c": c}


def l1_capacity(layer: ConvLayer, tiling: Tiling, spec: GpuSpec, occupancy: int) -> float:
    """L1 left beside the shared memory of the co-resident CTAs (max L1 carveout)."""
    return max(spec.l1_smem_per_sm_bytes - occupancy * tiling.smem_bytes(layer.elem_bytes), 0)


def l2_requests(
    layer: ConvLayer, tiling: Tiling, spec: GpuSpec, grid: Grid, l1: dict[str, float]
) -> dict[str, float]:
    """L1 misses plus stores.

    "smem" staging (TMA, cp.async.cg) bypasses L1: L2 sees every request. "l1" staging: a
    CTA's A rows for neighbouring output pixels and filter taps overlap, so L1 turns its
    mt*Kg requested elements into the window's unique pixels (x the group's channels, in
    sectors) when the windows of the co-resident CTAs fit in L1; beyond that the extra is hit
    in proportion. Co-resident CTAs of an m-fastest raster work on the same N column at the
    same pace, so they share B in L1 when a B column fits.
    """
    if tiling.staging == "smem":
        return dict(l1)
    e = layer.elem_bytes
    capacity = l1_capacity(layer, tiling, spec, grid.occupancy)
    # One full CTA: what it requests and the unique window L1 can reduce that to.
    amplification = _amplification(a_run_elems(layer, tiling), layer, layer.c)
    requested = tiling.mt * layer.gemm_k * e * amplification
    window = cta_window_pixels(layer, tiling.mt) * channel_slice_bytes(layer.c_per_group, layer)
    window = min(window, requested)
    hit = min(1.0, capacity / (grid.occupancy * window)) if window else 1.0
    a = l1["a"] * (window + (requested - window) * (1.0 - hit)) / requested
    b_column = tiling.nt * layer.gemm_k * e
    shares_b = tiling.raster == "m_fastest" and grid.tiles_m >= grid.wave_ctas
    b_sharing = grid.occupancy if (shares_b and grid.occupancy * b_column <= capacity) else 1
    return {"a": a, "b": l1["b"] / b_sharing, "c": l1["c"]}


def _streamed_operand_dram(
    unique: float,
    group_pass: float,
    groups: int,
    passes: int,
    passes_per_wave: int,
    l2_bytes: float,
) -> float:
    """DRAM bytes of the operand the raster walks fastest, which each of `passes` CTA columns
    (per group) reads again: once if it stays in L2 across passes; once per group if one
    group's slice does (slices sharing sectors still refetch them); else once per column of
    CTAs, except columns resident in the same wave share it."""
    if unique <= l2_bytes:
        return unique
    if group_pass <= l2_bytes:
        return groups * group_pass
    return groups * group_pass * ceil_div(passes, passes_per_wave)


def dram_traffic(layer: ConvLayer, tiling: Tiling, spec: GpuSpec, grid: Grid) -> dict[str, float]:
    """x, w, y once, plus re-fetches DeLTA's wave analysis predicts.

    The raster walks one GEMM axis fastest. The operand indexed by the slow axis (B for
    "m_fastest") is shared by consecutive CTAs: one DRAM fetch, unless one wave's working set
    overflows L2, then once per wave. The operand indexed by the fast axis (A for "m_fastest")
    is re-read by every CTA column (_streamed_operand_dram). Stores merge in L2: y once, or
    once per group when partial-sector slices of different groups are written passes apart.
    """
    l2 = spec.l2_bytes
    pixels = layer.n * touched_pixels_per_image(layer)
    x_unique = pixels * layer.c * layer.elem_bytes
    # One pass over one group's slice fetches its channels in whole sectors.
    x_group_pass = pixels * channel_slice_bytes(layer.c_per_group, layer)
    y_group_pass = layer.gemm_m * channel_slice_bytes(layer.gemm_n, layer)
    w = layer.w_bytes
    m_fastest = tiling.raster == "m_fastest"
    fast_tiles = grid.tiles_m if m_fastest else grid.tiles_n * grid.group_blocks
    columns_per_wave = max(1, grid.wave_ctas // fast_tiles)
    # Working set of one wave: its share of x and w, and its output tiles.
    wave_fraction = min(1.0, grid.wave_ctas / grid.ctas)
    c_tiles = grid.wave_ctas * tiling.mt * tiling.nt * layer.elem_bytes
    working_set = wave_fraction * (x_unique + w) + c_tiles
    slow_refetch = max(1.0, fast_tiles / grid.wave_ctas) if working_set > l2 else 1.0
    if m_fastest:
        a = _streamed_operand_dram(
            x_unique, x_group_pass, layer.groups, grid.tiles_n, columns_per_wave, l2
        )
        b = w * slow_refetch
    else:
        a = x_unique * slow_refetch
        b = _streamed_operand_dram(w, w / layer.groups, 1, grid.tiles_m, columns_per_wave, l2)
    c = layer.y_bytes if (layer.y_bytes <= l2 or not m_fastest) else layer.groups * y_group_pass
    return {"a": a, "b": b, "c": c}


def smem_operand_reads(tiling: Tiling, layer: ConvLayer, grid: Grid) -> float:
    """Shared-memory reads of the main loop's MMA operands. Per k, each math group reads its
    tile's A rows and B columns once: FFMA one k at a time, in 128 B wavefronts (broadcasts
    free); mma.sync as k-chunked fragments; a wgmma warpgroup reads B again for every 64-row
    slice of A it multiplies."""
    if tiling.mma_tile is None:
        return 0.0
    es = tiling.smem_elem_bytes or layer.elem_bytes
    rows, cols = tiling.mma_tile
    if tiling.wgmma:
        per_group_k = (rows + math.ceil(rows / 64) * cols) * es
    elif tiling.unit == "fma":
        per_group_k = sum(
            math.ceil(n * es / SMEM_WAVEFRONT_BYTES) * SMEM_WAVEFRONT_BYTES for n in (rows, cols)
        )
    else:
        per_group_k = (rows + cols) * es
    return grid.ctas * grid.k_iters * tiling.kt * tiling.mma_groups * per_group_k


def padded_work_flops(tiling: Tiling, grid: Grid) -> float:
    """Every CTA runs full mt x nt x (k_iters*kt) tiles: waste at the edges, in channel chunks
    of per-tap kernels and between the groups a packed CTA holds included."""
    return 2.0 * grid.ctas * tiling.mt * tiling.nt * grid.k_iters * tiling.kt


def traffic(layer: ConvLayer, tiling: Tiling, spec: GpuSpec) -> Traffic:
    """The L1, L2 and DRAM traffic of `layer` run with `tiling` on `spec`'s GPU: its grid, the
    requests each cache level sees and the DRAM bytes."""
    grid = make_grid(layer, tiling, spec)
    l1 = l1_requests(layer, tiling, grid)
    l2 = l2_requests(layer, tiling, spec, grid, l1)
    dram = dram_traffic(layer, tiling, spec, grid)
    # sm90 kernels (wgmma) move operands and the epilogue's tiles with TMA, past L1TEX.
    l1tex = 0.0 if tiling.wgmma else sum(l1.values())
    resident = min(dram["c"], L2_DIRTY_RESIDENT_SHARE * spec.l2_bytes)
    return Traffic(
        l1_bytes=sum(l1.values()),
        l2_bytes=sum(l2.values()),
        dram_bytes=sum(dram.values()),
        smem_read_bytes=smem_operand_reads(tiling, layer, grid),
        work_flops=padded_work_flops(tiling, grid),
        grid=grid,
        by_operand={"l1": l1, "l2": l2, "dram": dram},
        ncu_bytes={"l1": l1tex, "l2": sum(l2.values()), "dram": sum(dram.values()) - resident},
    )
