"""Kernel families the implicit-GEMM model does not describe, priced as streams.

A depthwise conv (cuDNN's conv2d_c1_k1 engines; jaxcnn's depthwise kernels, a family of their
own) reads each input and writes each output about once and does a few FMAs per element on
CUDA cores: no GEMM tile describes it. It is priced from the bytes it must move and the work it
must do, as phases that do not overlap (the sum of the two fits cuDNN's kernels better than
their max: docs/results.md, "Traffic/time model"):

    time = launch + unique bytes / (dram * DRAM bandwidth) + FLOPs / (compute * FMA peak)

unique bytes = x + w + y once each (ConvLayer.unique_bytes), FLOPs = the useful ones. The three
factors are fitted per family and GPU (fit_stream: a grid search of the squared log error,
robust and fast for a few hundred layers) and stored with the GEMM factors (Factors.streaming).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxcnn.costmodel.conv_layer import ConvLayer
from jaxcnn.profile.gpu_specs import GpuSpec

STREAM_FAMILIES = ("depthwise", "jaxcnn_depthwise")
# The grid fit_stream searches: launch latency (us), achieved fractions of DRAM and math.
_LAUNCH_GRID_US = np.concatenate([[0.0], np.geomspace(0.5, 30.0, 60)])
_FRACTION_GRID = np.geomspace(0.02, 1.2, 80)


@dataclass(frozen=True)
class StreamFactors:
    """A stream family's fitted launch latency and achieved fractions (defaults: ideal)."""

    launch_us: float = 0.0
    dram: float = 1.0
    compute: float = 1.0

    def to_dict(self) -> dict[str, float]:
        return dict(launch_us=self.launch_us, dram=self.dram, compute=self.compute)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StreamFactors:
        return cls(**{k: float(data[k]) for k in ("launch_us", "dram", "compute") if k in data})


@dataclass(frozen=True)
class StreamPrediction:
    """Time of one layer run by a stream family, and which term is the larger."""

    family: str
    dram_bytes: float
    work_flops: float
    memory_ms: float
    compute_ms: float
    launch_ms: float

    @property
    def time_ms(self) -> float:
        return self.launch_ms + self.memory_ms + self.compute_ms

    @property
    def bound(self) -> str:
        return "dram" if self.memory_ms >= self.compute_ms else "compute"

    @property
    def bound_ms(self) -> dict[str, float]:
        """Each term's time, as the GEMM model's rows name theirs."""
        return dict(dram=self.memory_ms, compute=self.compute_ms)


def is_stream_family(impl: str) -> bool:
    """Whether `impl` (a kernel family of the model) is priced here rather than as a GEMM."""
    return impl in STREAM_FAMILIES


def is_depthwise(layer: ConvLayer) -> bool:
    """One input channel per group: the layers the depthwise family runs."""
    return layer.groups > 1 and layer.c_per_group == 1


def predict_stream(layer: ConvLayer, family: str, spec: GpuSpec, factors: StreamFactors) -> StreamPrediction:
    """The time of `layer` run by stream family `family` on `spec`'s GPU with `factors`."""
    if family not in STREAM_FAMILIES:
        raise ValueError(f"family must be one of {STREAM_FAMILIES}, not {family!r}")
    dram_bytes = float(layer.unique_bytes)
    return StreamPrediction(
        family, dram_bytes, layer.flops,
        memory_ms=dram_bytes / (factors.dram * spec.memory.per_s) * 1e3,
        compute_ms=layer.flops / (factors.compute * spec.fp32_fma_peak.per_s) * 1e3,
        launch_ms=factors.launch_us * 1e-3,
    )


def fit_stream(layers: Sequence[ConvLayer], times_ms: Sequence[float], spec: GpuSpec) -> StreamFactors:
    """The factors minimising the squared log error of predicted vs measured times of one
    family's layers."""
    if not layers:
        raise ValueError("fit_stream needs at least one measurement")
    memory = np.array([layer.unique_bytes / spec.memory.per_s for layer in layers])  # s at fraction 1
    compute = np.array([layer.flops / spec.fp32_fma_peak.per_s for layer in layers])
    log_t = np.log(np.asarray(times_ms, float) * 1e-3)
    launch_s = _LAUNCH_GRID_US[:, None] * 1e-6
    best = (np.inf, StreamFactors())
    for dram in _FRACTION_GRID:
        for fraction in _FRACTION_GRID:
            bound = memory / dram + compute / fraction
            cost = np.sum((np.log(launch_s + bound[None, :]) - log_t[None, :]) ** 2, axis=1)
            i = int(np.argmin(cost))
            if cost[i] < best[0]:
                best = (cost[i], StreamFactors(float(_LAUNCH_GRID_US[i]), float(dram), float(fraction)))
    return best[1]
