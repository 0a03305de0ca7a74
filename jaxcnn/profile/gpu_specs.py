"""GPU ceilings (memory bandwidth, FLOP/s per precision) for roofline floors.

Every ceiling says where it comes from: "measured" (on our H200, see
/work/shared/baseline/README.md: device-to-device copy, bf16 GEMM and fp32 HIGHEST GEMM) or
"datasheet" (NVIDIA's dense, non-sparse numbers at boost clock). Datasheet ceilings are not
reached in practice (the H200 measured 708 of 989 bf16 TFLOP/s and 3.97 of 4.8 TB/s), so
floors from a datasheet entry are optimistic: compare percentages of floor only across runs
on the same GPU entry.

Precision classes used as keys: "bf16", "fp16" (tensor cores), "tf32" (tensor cores, what
XLA's DEFAULT precision uses for float32 convolutions), "fp32" (true float32 on CUDA cores,
what Precision.HIGHEST gives).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FP32_LANES_PER_SM = 128  # Hopper: 128 FP32 FMA units per SM


@dataclass(frozen=True)
class Ceiling:
    """A throughput ceiling: FLOP/s or bytes/s."""

    per_s: float
    source: str  # "measured" | "datasheet"
    note: str = ""


@dataclass(frozen=True)
class GpuSpec:
    name: str
    kind_pattern: str  # regex searched (case-insensitive) in jax device_kind
    sm_count: int
    boost_clock_hz: float
    memory: Ceiling  # bytes/s, reads + writes
    compute: dict[str, Ceiling] = field(default_factory=dict)  # by precision class

    @property
    def fp32_fma_peak(self) -> Ceiling:
        """CUDA-core float32 FMA peak: SMs * 128 lanes * 2 FLOP * boost clock."""
        flops = self.sm_count * FP32_LANES_PER_SM * 2 * self.boost_clock_hz
        return Ceiling(flops, "datasheet", "SMs*128*2*boost clock")


def _datasheet(per_s: float, note: str = "") -> Ceiling:
    return Ceiling(per_s, "datasheet", note)


def _measured(per_s: float, note: str) -> Ceiling:
    return Ceiling(per_s, "measured", note)


# Ordered: the first entry whose pattern matches wins, so the H100 variants come before the
# generic H100 (SXM). Word boundaries keep "GH200" from matching "H200".
GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec(
        name="H200",
        kind_pattern=r"\bH200\b",
        sm_count=132,
        boost_clock_hz=1.98e9,
        memory=_measured(3.97e12, "device-to-device copy, read+write; datasheet 4.8 TB/s"),
        compute={
            "bf16": _measured(708e12, "bf16 GEMM; datasheet 989 dense"),
            "fp16": _measured(708e12, "bf16 GEMM number; fp16 tensor rate equals bf16"),
            "tf32": _datasheet(494.7e12, "dense"),
            "fp32": _measured(51e12, "fp32 GEMM at Precision.HIGHEST; CUDA-core peak 66.9"),
        },
    ),
    GpuSpec(
        name="H100 PCIe",
        kind_pattern=r"\bH100\b.*PCIe",
        sm_count=114,
        boost_clock_hz=1.755e9,
        memory=_datasheet(2.0e12, "HBM2e"),
        compute={
            "bf16": _datasheet(756e12, "dense"),
            "fp16": _datasheet(756e12, "dense"),
            "tf32": _datasheet(378e12, "dense"),
            "fp32": _datasheet(51e12, "non-tensor"),
        },
    ),
    GpuSpec(
        name="H100 NVL",
        kind_pattern=r"\bH100\b.*NVL",
        sm_count=132,
        boost_clock_hz=1.785e9,
        memory=_datasheet(3.9e12, "HBM3"),
        compute={
            "bf16": _datasheet(835e12, "dense"),
            "fp16": _datasheet(835e12, "dense"),
            "tf32": _datasheet(417.5e12, "dense"),
            "fp32": _datasheet(60e12, "non-tensor"),
        },
    ),
    GpuSpec(
        name="H100 SXM",
        kind_pattern=r"\bH100\b",
        sm_count=132,
        boost_clock_hz=1.98e9,
        memory=_datasheet(3.35e12, "HBM3"),
        compute={
            "bf16": _datasheet(989.4e12, "dense"),
            "fp16": _datasheet(989.4e12, "dense"),
            "tf32": _datasheet(494.7e12, "dense"),
            "fp32": _datasheet(67e12, "non-tensor"),
        },
    ),
)

_PRECISION_ALIASES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "tf32": "tf32",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
}


def precision_class(dtype: Any) -> str:
    """ "bf16" | "fp16" | "tf32" | "fp32" for a name ("bf16", "float32", ...) or a dtype."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    try:
        return _PRECISION_ALIASES[name.lower()]
    except KeyError:
        raise ValueError(
            f"no ceiling for dtype {dtype!r}; known: {sorted(_PRECISION_ALIASES)}"
        ) from None


def lookup_gpu_spec(device_kind: str | None = None) -> GpuSpec | None:
    """The spec whose pattern matches device_kind (default: jax.devices()[0]); None if unknown."""
    if device_kind is None:
        import jax  # only here, so the table can be read without initialising a backend

        device_kind = jax.devices()[0].device_kind
    for spec in GPU_SPECS:
        if re.search(spec.kind_pattern, device_kind, flags=re.IGNORECASE):
            return spec
    return None


def floor_ms(flops: float, bytes: float, spec: GpuSpec, dtype: Any) -> dict[str, Any]:  # noqa: A002
    """Roofline floor: the larger of compute time at the dtype's ceiling and memory time."""
    compute_ms = flops / spec.compute[precision_class(dtype)].per_s * 1e3
    memory_ms = bytes / spec.memory.per_s * 1e3
    return dict(
        compute_ms=compute_ms,
        memory_ms=memory_ms,
        floor_ms=max(compute_ms, memory_ms),
        bound="compute" if compute_ms >= memory_ms else "memory",
    )
