"""The model's fitted parameters (achieved fractions of the ceilings, fixed latencies) and
their store: calibration/factors.json, one entry per GPU spec name."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FACTORS_PATH = Path(__file__).resolve().parent / "calibration" / "factors.json"


@dataclass(frozen=True)
class Factors:
    """Achieved fractions of the spec's ceilings and fixed latencies (defaults: ideal)."""

    compute: dict[str, float] = field(default_factory=dict)  # efficiency_key -> fraction
    dram: float = 1.0
    l2: float = 1.0
    l1: float = 1.0
    wave_latency_us: dict[str, float] = field(default_factory=dict)  # latency_key -> us/wave
    launch_us: dict[str, float] = field(default_factory=dict)  # latency_key -> us per kernel
    # Warps of latency an SM hides (rate n/(n+h) with n resident warps): prices a partial last
    # wave (traffic.Grid.quantization_with). None: the saturating-CTA rule.
    hiding_warps: float | None = None
    # Stream families (costmodel.streaming): family -> {"launch_us", "dram", "compute"}.
    streaming: dict[str, dict[str, float]] = field(default_factory=dict)

    def compute_fraction(self, key: str) -> float:
        """The fitted fraction; fp16 falls back to bf16's (same width and tensor rate), an
        unfitted key to 1."""
        if key not in self.compute and "fp16" in key:
            key = key.replace("fp16", "bf16")
        if key not in self.compute and "/" in key:  # a kernel family unfitted: its impl's
            return self.compute_fraction(key.split("/")[0])
        return self.compute.get(key, 1.0)

    def to_dict(self) -> dict[str, Any]:
        return dict(
            compute=dict(self.compute),
            dram=self.dram,
            l2=self.l2,
            l1=self.l1,
            wave_latency_us=dict(self.wave_latency_us),
            launch_us=dict(self.launch_us),
        ) | ({} if self.hiding_warps is None else dict(hiding_warps=self.hiding_warps)) | (
            dict(streaming={k: dict(v) for k, v in self.streaming.items()}) if self.streaming else {})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Factors:
        keys = ("compute", "dram", "l2", "l1", "wave_latency_us", "launch_us", "hiding_warps", "streaming")
        return cls(**{key: data[key] for key in keys if key in data})


def _significant(value: Any, digits: int = 4) -> Any:
    """Floats to `digits` significant digits (a fit is not more precise than that)."""
    if isinstance(value, dict):
        return {key: _significant(v, digits) for key, v in value.items()}
    return float(f"{value:.{digits}g}") if isinstance(value, float) else value


def read_factors_file(path: Path | str = FACTORS_PATH) -> dict[str, Any]:
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else {}


def load_factors(gpu: str, path: Path | str = FACTORS_PATH) -> Factors:
    """The stored factors of `gpu` (a GpuSpec name), else ideal ones: fraction 1 of every
    ceiling and no latency, which makes predictions on an uncalibrated GPU lower bounds."""
    entry = read_factors_file(path).get(gpu)
    return Factors.from_dict(entry) if entry else Factors()


def save_factors(
    gpu: str, factors: Factors, info: dict[str, Any] | None = None, path: Path | str = FACTORS_PATH
) -> None:
    """Replace `gpu`'s entry, keep the other GPUs'."""
    data = read_factors_file(path)
    data[gpu] = _significant(factors.to_dict()) | ({"fit": info} if info else {})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
