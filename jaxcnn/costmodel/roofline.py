"""Roofline terms every estimate of jaxcnn shares: the shortest time a kernel shows, the time to
move bytes through DRAM and the time of FLOPs at the fp32 FMA peak (CUDA-core kernels).

Used by the layout cost model (costmodel.layout_cost) and the fusion cost model
(jaxcnn.costmodel.fusion_cost); peaks and bandwidth come from jaxcnn.profile.gpu_specs.
"""

from __future__ import annotations

from jaxcnn.profile.gpu_specs import GpuSpec

# Shortest device time a kernel launch shows (ramp-up and tail of even a tiny grid, ~2 us on
# H100/H200 traces): estimates never go below it, so no kernel (a layout transform included)
# is ever free.
KERNEL_FLOOR_MS = 0.002


def memory_ms(nbytes: float, spec: GpuSpec) -> float:
    """Time to move `nbytes` through DRAM at the GPU's bandwidth, at least KERNEL_FLOOR_MS."""
    return max(KERNEL_FLOOR_MS, nbytes / spec.memory.per_s * 1e3)


def fp32_fma_ms(flops: float, spec: GpuSpec) -> float:
    """Time of `flops` at the GPU's fp32 FMA peak (what a CUDA-core kernel issues)."""
    return flops / spec.fp32_fma_peak.per_s * 1e3
