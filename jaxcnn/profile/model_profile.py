"""What profiling gives: per layer and backend timings, sparsity and roofline floor
(LayerProfile), and the whole model's or function's (ModelProfile), as the profilers make them
and record.py stores them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jaxcnn.models.layers import LayerInfo
from jaxcnn.profile.device_time import TimingStats


@dataclass
class LayerProfile:
    info: LayerInfo
    times: dict[str, TimingStats]  # backend -> timing of the layer alone
    input_zero_fraction: float | None = None
    output_zero_fraction: float | None = None
    floor: dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)  # recorded with the layer's own (JSON-ready)


@dataclass
class ModelProfile:
    model: str
    batch: int
    dtype: str
    backends: tuple[str, ...]
    is_device_time: bool
    layers: list[LayerProfile]
    end_to_end: dict[str, TimingStats]
    wall: dict[str, TimingStats]
    memory: dict[str, dict[str, int]]
    environment: dict[str, Any]
    note: str = ""
    run_ids: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # the run's extra column (JSON-ready)

    def layer_rows(self) -> list[dict[str, Any]]:
        """One row per layer and backend, for pandas."""
        rows = []
        for index, layer in enumerate(self.layers):
            for backend, timing in layer.times.items():
                rows.append(dict(
                    index=index, name=layer.info.name, op=layer.info.op, backend=backend,
                    median_ms=timing.median_ms, p10_ms=timing.p10_ms, p90_ms=timing.p90_ms,
                    gflop=layer.info.flops / 1e9, mbytes=layer.info.bytes / 2**20,
                    pct_of_floor=_pct_of_floor(layer.floor, timing.median_ms),
                    input_zero_fraction=layer.input_zero_fraction,
                ))
        return rows


def _pct_of_floor(floor: dict | None, median_ms: float) -> float | None:
    if not floor or not median_ms:
        return None
    return 100.0 * floor["floor_ms"] / median_ms
