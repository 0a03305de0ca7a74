"""Fit the model's efficiency factors to measured kernel times; store them per GPU.

calibrate() minimises the squared log error of predicted vs measured time over: the achieved
fraction of each compute ceiling used ("<impl>:<math>"), of DRAM, L2 and L1 bandwidth, and the
per-wave and per-launch latency of each impl. A weak pull towards the starting factors keeps
a factor that no measurement constrains (e.g. DRAM, when every layer is compute-bound) where
it started. The fitted factors live in calibration/factors.json keyed by GPU name; predict()
loads them by default.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jaxcnn.costmodel.conv_layer import ConvLayer
from jaxcnn.costmodel.factors import Factors
from jaxcnn.costmodel.model import KernelSetup, kernel_setup
from jaxcnn.costmodel.streaming import StreamFactors, fit_stream, is_stream_family, predict_stream
from jaxcnn.costmodel.tiling import Tiling
from jaxcnn.costmodel.timing import kernel_time
from jaxcnn.profile.gpu_specs import GpuSpec
_LATENCY_START_US = 1.0
# Physical ranges of the fitted factors. Compute: a measured ceiling (H200: 708 of 989 bf16
# TFLOP/s) can be beaten somewhat, never by 1.5x. DRAM: at most the datasheet over a measured
# copy (4.8 / 3.97 on the H200). L2: its ceiling is derived from A100's per-clock figure, so
# allow 2x. L1: 128 B/clk/SM is a hard limit.
_FRACTION_BOUNDS = dict(compute=(0.01, 1.5), dram=(0.05, 1.1), l2=(0.05, 2.0), l1=(0.05, 1.0))
_LATENCY_BOUNDS_US = (1e-3, 1e3)
# Latency-hiding warps (Factors.hiding_warps): a few warps to several SMs' worth (64 max).
_HIDING_START_WARPS = 16.0
_HIDING_BOUNDS_WARPS = (0.5, 256.0)


@dataclass(frozen=True)
class Sample:
    """One measured kernel: the layer, how it ran, its device time."""

    layer: ConvLayer
    time_ms: float
    impl: str = "xla"
    precision: str = "default"
    tiling: str | Tiling = "auto"


@dataclass(frozen=True)
class Calibration:
    factors: Factors
    n: int
    median_abs_rel_error: float
    max_abs_rel_error: float
    info: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- fitting


@dataclass(frozen=True)
class _Prepared:
    """A sample with what does not depend on the factors worked out once."""

    setup: KernelSetup
    log_time: float


def _prepare(spec: GpuSpec, sample: Sample | tuple) -> _Prepared:
    if not isinstance(sample, Sample):
        sample = Sample(*sample)
    setup = kernel_setup(sample.layer, spec, sample.tiling, sample.impl, sample.precision)
    return _Prepared(setup, math.log(sample.time_ms * 1e-3))


@dataclass(frozen=True)
class _Layout:
    """Which entry of the parameter vector (logs of the factors) is which factor."""

    compute_keys: tuple[str, ...]
    latency_keys: tuple[str, ...]

    @property
    def names(self) -> list[str]:
        return (
            [f"compute:{k}" for k in self.compute_keys]
            + ["dram", "l2", "l1"]
            + [f"wave:{k}" for k in self.latency_keys]
            + [f"launch:{k}" for k in self.latency_keys]
            + ["hiding_warps"]
        )

    def to_vector(self, factors: Factors) -> np.ndarray:
        values = (
            [factors.compute_fraction(k) for k in self.compute_keys]
            + [factors.dram, factors.l2, factors.l1]
            + [factors.wave_latency_us.get(k, _LATENCY_START_US) for k in self.latency_keys]
            + [factors.launch_us.get(k, _LATENCY_START_US) for k in self.latency_keys]
            + [factors.hiding_warps or _HIDING_START_WARPS]
        )
        return np.log(np.maximum(values, 1e-3))

    def to_factors(self, vector: np.ndarray, base: Factors) -> Factors:
        values = np.exp(vector)
        nk, ni = len(self.compute_keys), len(self.latency_keys)
        compute = dict(base.compute) | dict(zip(self.compute_keys, values[:nk]))
        dram, l2, l1 = values[nk : nk + 3]
        waves = values[nk + 3 : nk + 3 + ni]
        launches = values[nk + 3 + ni : nk + 3 + 2 * ni]
        return Factors(
            compute={k: float(v) for k, v in compute.items()},
            dram=float(dram),
            l2=float(l2),
            l1=float(l1),
            wave_latency_us=dict(base.wave_latency_us) | _floats(self.latency_keys, waves),
            launch_us=dict(base.launch_us) | _floats(self.latency_keys, launches),
            hiding_warps=float(values[-1]),
            streaming=dict(base.streaming),
        )

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        kinds = ["compute"] * len(self.compute_keys) + ["dram", "l2", "l1"]
        ranges = [_FRACTION_BOUNDS[kind] for kind in kinds]
        ranges += [_LATENCY_BOUNDS_US] * (2 * len(self.latency_keys))
        ranges += [_HIDING_BOUNDS_WARPS]
        low, high = zip(*ranges)
        return np.log(low), np.log(high)


def _floats(keys: Sequence[str], values: np.ndarray) -> dict[str, float]:
    return {key: float(value) for key, value in zip(keys, values)}


def _log_errors(
    spec: GpuSpec, prepared: Sequence[_Prepared], factors: Factors, smooth_p: float | None = None
) -> np.ndarray:
    predicted = [
        kernel_time(p.setup.traffic, spec, p.setup.keys, factors, smooth_p).time_s for p in prepared
    ]
    return np.log(predicted) - np.array([p.log_time for p in prepared])


def calibrate(
    spec: GpuSpec,
    measurements: Sequence[Sample | tuple],
    initial: Factors | None = None,
    prior_weight: float = 0.05,
    loss: str = "soft_l1",
    loss_scale: float = 0.1,
) -> Calibration:
    """Least squares on log(predicted / measured) over the factors `measurements` exercise.

    measurements: Samples, or (layer, time_ms[, impl, precision, tiling]) tuples.
    loss: scipy's least_squares loss on the log errors. The default "soft_l1" counts errors
    beyond about loss_scale (10%) linearly rather than squared, so the few kernels the model
    cannot explain do not drag every factor; "linear" is plain least squares.
    """
    from scipy.optimize import least_squares  # kept here: slow to import, and only calibrating needs it

    if not measurements:
        raise ValueError("calibrate needs at least one measurement")
    samples = [s if isinstance(s, Sample) else Sample(*s) for s in measurements]
    streams = [s for s in samples if is_stream_family(s.impl)]
    base = _with_streams(initial or Factors(), spec, streams)
    samples = [s for s in samples if not is_stream_family(s.impl)]
    if not samples:
        return _stream_only(spec, base, streams)
    prepared = [_prepare(spec, sample) for sample in samples]
    layout = _Layout(
        compute_keys=tuple(sorted({p.setup.keys.efficiency for p in prepared})),
        latency_keys=tuple(sorted({p.setup.keys.latency for p in prepared})),
    )
    start = layout.to_vector(base)
    low, high = layout.bounds()
    start = np.clip(start, low + 1e-9, high - 1e-9)

    def residuals(vector: np.ndarray, smooth_p: float | None) -> np.ndarray:
        errors = _log_errors(spec, prepared, layout.to_factors(vector, base), smooth_p)
        return np.concatenate([errors, prior_weight * (vector - start)])

    def fit(vector: np.ndarray, smooth_p: float | None):
        return least_squares(
            residuals, vector, bounds=(low, high), diff_step=1e-4, loss=loss, f_scale=loss_scale,
            args=(smooth_p,),
        )

    # With max() a ceiling that binds nowhere has zero gradient, and the cost is piecewise
    # smooth: fit with the bounds combined as a p-norm first, then polish with max().
    best = None
    for shift in (0.0, -1.0):
        smoothed = fit(np.clip(start + shift, low + 1e-9, high - 1e-9), smooth_p=8.0)
        polished = fit(smoothed.x, smooth_p=None)
        if best is None or polished.cost < best.cost:
            best = polished
    factors = layout.to_factors(best.x, base)
    abs_rel = np.abs(np.expm1(_log_errors(spec, prepared, factors)))
    return Calibration(
        factors=factors,
        n=len(prepared),
        median_abs_rel_error=float(np.median(abs_rel)),
        max_abs_rel_error=float(np.max(abs_rel)),
        info=dict(parameters=layout.names),
    )


def _with_streams(base: Factors, spec: GpuSpec, streams: Sequence[Sample]) -> Factors:
    """base with each stream family among `streams` fitted on its samples (fit_stream)."""
    fitted = dict(base.streaming)
    for family in sorted({s.impl for s in streams}):
        mine = [s for s in streams if s.impl == family]
        fitted[family] = fit_stream([s.layer for s in mine], [s.time_ms for s in mine], spec).to_dict()
    return dataclasses.replace(base, streaming=fitted)


def _stream_only(spec: GpuSpec, factors: Factors, streams: Sequence[Sample]) -> Calibration:
    """The Calibration of samples that are all of stream families."""
    abs_rel = [abs(predict_stream(s.layer, s.impl, spec, StreamFactors.from_dict(factors.streaming[s.impl])).time_ms
                   / s.time_ms - 1) for s in streams]
    return Calibration(factors=factors, n=len(streams), median_abs_rel_error=float(np.median(abs_rel)),
                       max_abs_rel_error=float(np.max(abs_rel)), info=dict(parameters=[]))
