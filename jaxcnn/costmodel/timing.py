"""Predicted time of one convolution kernel from its traffic and the GPU's ceilings.

time = max(work / compute * q, (L1 + shared reads) / L1 bw * q,
           L2 / L2 bw (or, with q > 1, L2 bytes * q / the SMs' L2 ports), likewise DRAM)
       + waves * wave latency + launch latency

Each ceiling is the GPU spec's number times an achieved fraction (factors.Factors, fitted per
GPU by calibration.calibrate). q, the wave quantization, charges the idle SMs of a partial last
wave: with Factors.hiding_warps set, traffic.Grid.quantization_with (an SM with n resident warps
runs at n / (n + h), so a lone CTA of our 2-CTA kernel runs faster than half of a full SM);
else ceil(CTAs/(SMs*c)) / (CTAs/(SMs*c)), c the co-resident CTAs that saturate an SM. Math and
L1 are per SM, so they scale by q; L2 and DRAM are shared, and the busy SMs may take more than
their share, up to their L2 ports (64 B/clk each). cuDNN's `implicit_gemm_indexed` kernels (few
input channels) have a compute fraction of their own ("<impl>:<dtype>/indexed"). The per-wave
latency is the part of a CTA's life that overlaps nothing (first loads before the pipeline
fills, the epilogue), over waves = ceil(CTAs / (SMs * occupancy)); the launch latency is paid
once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jaxcnn.costmodel.factors import Factors
from jaxcnn.costmodel.traffic import Traffic
from jaxcnn.costmodel.tiling import Tiling
from jaxcnn.profile.gpu_specs import GpuSpec

INDEXED_SUFFIX = "/indexed"
# Bytes per clock one SM's L1 can take from L2 (Hopper / Ampere: 64).
L2_PORT_BYTES_PER_CLK = 64


def math_precision(dtype: str, impl: str, precision: str = "default") -> str:
    """What the math runs in: our direct kernel always FMAs in float32; XLA runs float32 at
    DEFAULT precision as TF32 on tensor cores, at HIGHEST as float32 on CUDA cores."""
    if impl == "jaxcnn_direct":
        return "fp32"
    if dtype == "fp32":
        return "fp32" if precision == "highest" else "tf32"
    return dtype


def ceiling_key(tiling: Tiling, math: str) -> str:
    """The spec.compute entry a tiling runs at: FFMA kernels at "fp32", tensor ones at `math`."""
    if tiling.unit == "fma":
        return "fp32"
    return "tf32" if math == "fp32" else math


def efficiency_key(impl: str, dtype: str, compute_key: str) -> str:
    """Which fitted compute fraction applies: per impl and operand dtype, and the math when it
    differs ("jaxcnn_direct:bf16>fp32": bf16 operands converted for float32 FMAs)."""
    return f"{impl}:{dtype}" if dtype == compute_key else f"{impl}:{dtype}>{compute_key}"


def latency_key(impl: str, tiling: Tiling) -> str:
    """Fixed latencies are per impl and unit: cuDNN's tensor-core and FFMA kernels differ."""
    return f"{impl}:{tiling.unit}"


@dataclass(frozen=True)
class TimeBreakdown:
    compute_s: float
    l1_s: float
    l2_s: float
    dram_s: float
    quantization: float
    latency_s: float  # waves * wave latency + launch
    time_s: float
    bound: str  # "compute" | "l1" | "l2" | "dram", or "latency" when the fixed part outweighs it

    def bound_times(self) -> dict[str, float]:
        return dict(compute=self.compute_s, l1=self.l1_s, l2=self.l2_s, dram=self.dram_s)


def _per_s(ceiling: Any, name: str) -> float:
    if ceiling is None:
        raise ValueError(f"the GPU spec has no {name} ceiling")
    return ceiling.per_s


@dataclass(frozen=True)
class Keys:
    """Where a kernel's ceiling and factors come from (see the *_key functions)."""

    ceiling: str  # spec.compute entry
    efficiency: str  # Factors.compute entry
    latency: str  # Factors.wave_latency_us / launch_us entry


def kernel_keys(tiling: Tiling, dtype: str, impl: str, precision: str) -> Keys:
    ceiling = ceiling_key(tiling, math_precision(dtype, impl, precision))
    efficiency = efficiency_key(impl, dtype, ceiling)
    if "implicit_gemm_indexed" in tiling.kernel:
        # cuDNN's indexed implicit GEMM (what it picks for few input channels, e.g. C=3 stems)
        # gathers A through a per-pixel offset table with sub-sector channel runs: it reaches a
        # smaller share of the math ceiling than the TMA / dense kernels (a family, not a layer).
        efficiency += INDEXED_SUFFIX
    return Keys(ceiling, efficiency, latency_key(impl, tiling))


def kernel_time(
    traffic: Traffic, spec: GpuSpec, keys: Keys, factors: Factors, smooth_p: float | None = None
) -> TimeBreakdown:
    """smooth_p: combine the bounds as a p-norm instead of max (calibration's first pass, so
    a bound that does not bind yet still feels its factor); None: max."""
    if keys.ceiling not in spec.compute:
        raise ValueError(f"{spec.name} has no {keys.ceiling} math (has {sorted(spec.compute)})")
    compute_s = traffic.work_flops / (
        spec.compute[keys.ceiling].per_s * factors.compute_fraction(keys.efficiency)
    )
    l1_s = (traffic.l1_bytes + traffic.smem_read_bytes) / (
        _per_s(spec.l1_bandwidth, "L1") * factors.l1
    )
    l2_s = traffic.l2_bytes / (_per_s(spec.l2_bandwidth, "L2") * factors.l2)
    dram_s = traffic.dram_bytes / (spec.memory.per_s * factors.dram)
    grid = traffic.grid
    quantization = grid.quantization_with(factors.hiding_warps)
    # Math and L1 are per SM: idle SMs of a partial wave scale them by the quantization. L2 and
    # DRAM are shared: the busy SMs can draw more than their share of them, up to what their
    # L2 ports carry (L2_PORT_BYTES_PER_CLK each), so a launch of few CTAs is not charged
    # 132/CTAs times the bandwidth time.
    ports_per_s = L2_PORT_BYTES_PER_CLK * spec.sm_count * spec.boost_clock_hz
    port_s = dict(l2=traffic.l2_bytes, dram=traffic.dram_bytes)
    bounds = dict(
        compute=compute_s * quantization,
        l1=l1_s * quantization,
        l2=max(l2_s, port_s["l2"] * quantization / ports_per_s) if quantization > 1 else l2_s,
        dram=max(dram_s, port_s["dram"] * quantization / ports_per_s) if quantization > 1 else dram_s,
    )
    bound = max(bounds, key=bounds.__getitem__)
    throughput_s = bounds[bound]
    if smooth_p:
        throughput_s *= sum((t / throughput_s) ** smooth_p for t in bounds.values()) ** (
            1 / smooth_p
        )
    latency_s = 1e-6 * (
        grid.waves * factors.wave_latency_us.get(keys.latency, 0.0)
        + factors.launch_us.get(keys.latency, 0.0)
    )
    return TimeBreakdown(
        compute_s=compute_s,
        l1_s=l1_s,
        l2_s=l2_s,
        dram_s=dram_s,
        quantization=quantization,
        latency_s=latency_s,
        time_s=throughput_s + latency_s,
        bound=bound if throughput_s >= latency_s else "latency",
    )
