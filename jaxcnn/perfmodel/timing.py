"""Predicted time of one convolution kernel from its traffic and the GPU's ceilings.

time = max(work / compute, (L1 + shared reads) / L1 bw, L2 / L2 bw, DRAM / DRAM bw)
       * wave quantization + waves * wave latency + launch latency

Each ceiling is the GPU spec's number times an achieved fraction (factors.Factors, fitted per
GPU by calibration.calibrate). The wave quantization ceil(CTAs/(SMs*c)) / (CTAs/(SMs*c))
charges the idle SMs of the last wave, c being the co-resident CTAs it takes to saturate an SM
(the occupancy for our kernel and for cuDNN's one-CTA-per-SM Hopper kernels; fewer than the
occupancy for cuDNN's small FFMA CTAs, which share an SM's throughput). The per-wave latency is
the part of a CTA's life that overlaps nothing (first loads before the pipeline fills, the
epilogue), over waves = ceil(CTAs / (SMs * occupancy)); the launch latency is paid once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jaxcnn.perfmodel.factors import Factors
from jaxcnn.perfmodel.traffic import Traffic
from jaxcnn.perfmodel.tiling import Tiling
from jaxcnn.profile.gpu_specs import GpuSpec

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
    return Keys(ceiling, efficiency_key(impl, dtype, ceiling), latency_key(impl, tiling))


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
    bounds = dict(compute=compute_s, l1=l1_s, l2=l2_s, dram=dram_s)
    bound = max(bounds, key=bounds.__getitem__)
    slowest_s = bounds[bound]
    if smooth_p:
        slowest_s *= sum((t / slowest_s) ** smooth_p for t in bounds.values()) ** (1 / smooth_p)
    grid = traffic.grid
    latency_s = 1e-6 * (
        grid.waves * factors.wave_latency_us.get(keys.latency, 0.0)
        + factors.launch_us.get(keys.latency, 0.0)
    )
    throughput_s = slowest_s * grid.quantization
    return TimeBreakdown(
        compute_s=compute_s,
        l1_s=l1_s,
        l2_s=l2_s,
        dram_s=dram_s,
        quantization=grid.quantization,
        latency_s=latency_s,
        time_s=throughput_s + latency_s,
        bound=bound if throughput_s >= latency_s else "latency",
    )
