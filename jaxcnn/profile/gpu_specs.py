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

The memory-hierarchy fields (L2 size and bandwidth, L1/shared size and bandwidth, occupancy
limits) feed the analytical traffic/time model in jaxcnn.costmodel. Their ceilings may also be
"derived": computed from other datasheet numbers by the formula in the note. GPU_SPECS are the
entries lookup_gpu_spec() matches against a device; MODEL_ONLY_SPECS (A100, V100) are there for
the cost model's what-if predictions only (spec_by_name), since no bench floor was checked there.
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
    source: str  # "measured" | "datasheet" | "derived" (formula in note)
    note: str = ""


@dataclass(frozen=True)
class GpuSpec:
    name: str
    kind_pattern: str  # regex searched (case-insensitive) in jax device_kind
    sm_count: int
    boost_clock_hz: float
    memory: Ceiling  # bytes/s, reads + writes
    compute: dict[str, Ceiling] = field(default_factory=dict)  # by precision class
    # Memory hierarchy, for jaxcnn.costmodel (0 / None: unknown).
    memory_datasheet: Ceiling | None = None  # DRAM peak, where `memory` is a measured number
    l2_bytes: int = 0
    l2_bandwidth: Ceiling | None = None  # bytes/s the SMs can move through L2
    l1_smem_per_sm_bytes: int = 0  # unified L1 + shared memory per SM
    smem_per_sm_bytes: int = 0  # the most of it that can be shared memory
    smem_per_block_optin_bytes: int = 0  # the most one CTA may opt in to (the rest: reserved)
    compute_capability_major: int = 0  # 9 Hopper, 8 Ampere, 7 Volta
    cooperative_launch: bool = True  # grid-wide barriers (every part since Pascal)
    l1_bandwidth: Ceiling | None = None  # bytes/s, all SMs: 128 B/clk/SM * SMs * clock
    fp32_lanes_per_sm: int = FP32_LANES_PER_SM
    max_threads_per_sm: int = 2048
    max_ctas_per_sm: int = 32
    registers_per_sm: int = 65536

    @property
    def fp32_fma_peak(self) -> Ceiling:
        """CUDA-core float32 FMA peak: SMs * FP32 lanes * 2 FLOP * boost clock."""
        flops = self.sm_count * self.fp32_lanes_per_sm * 2 * self.boost_clock_hz
        return Ceiling(flops, "datasheet", f"SMs*{self.fp32_lanes_per_sm}*2*boost clock")

    def ceilings(self) -> dict[str, Ceiling]:
        """Every ceiling of the entry by name, e.g. for a table of sources."""
        named = {"dram": self.memory, "fp32_fma": self.fp32_fma_peak}
        named |= {f"compute_{cls}": c for cls, c in self.compute.items()}
        optional = dict(
            dram_datasheet=self.memory_datasheet, l2=self.l2_bandwidth, l1=self.l1_bandwidth
        )
        return named | {k: c for k, c in optional.items() if c is not None}


def _datasheet(per_s: float, note: str = "") -> Ceiling:
    return Ceiling(per_s, "datasheet", note)


def _measured(per_s: float, note: str) -> Ceiling:
    return Ceiling(per_s, "measured", note)


def _l1_bandwidth(sm_count: int, clock_hz: float) -> Ceiling:
    """L1/shared data path: 128 B/clk per SM (Volta through Hopper)."""
    return Ceiling(128 * sm_count * clock_hz, "derived", "128 B/clk/SM * SMs * boost clock")


def _l2_bandwidth(bytes_per_clk: int, clock_hz: float, note: str) -> Ceiling:
    formula = f"{bytes_per_clk} B/clk * boost clock; {note}"
    return Ceiling(bytes_per_clk * clock_hz, "derived", formula)


KIB, MIB = 1024, 1024 * 1024


@dataclass(frozen=True)
class _Die:
    """What every product built on one GPU die shares: L2, L1/shared memory, FP32 lanes."""

    l2_bytes: int
    l2_bytes_per_clk: int  # L2 bandwidth per clock; times a product's boost clock
    l2_note: str  # where the per-clock L2 figure comes from
    l1_smem_per_sm_bytes: int
    smem_per_sm_bytes: int
    smem_per_block_optin_bytes: int
    compute_capability_major: int
    fp32_lanes_per_sm: int


# 50 MB L2 on every H100/H200 product. NVIDIA publishes no Hopper L2 bandwidth: assume A100's
# 5120 B/clk (A100 whitepaper) per clock. Opt-in shared memory per block: the CUDA programming
# guide's table of compute capabilities (what cudaDevAttrMaxSharedMemoryPerBlockOptin reports).
_GH100 = _Die(
    50 * MIB, 5120, "A100's per-clock figure, assumed for Hopper", 256 * KIB, 228 * KIB,
    227 * KIB, 9, 128
)
_GA100 = _Die(40 * MIB, 5120, "A100 whitepaper L2 read bandwidth", 192 * KIB, 164 * KIB,
              163 * KIB, 8, 64)
_GV100 = _Die(6 * MIB, 2048, "A100 whitepaper's V100 figure", 128 * KIB, 96 * KIB, 96 * KIB, 7,
              64)


def _dense_compute(tensor_per_s: float, fp32_per_s: float) -> dict[str, Ceiling]:
    """Datasheet compute ceilings of an Ampere/Hopper part: bf16 and fp16 tensor cores run at
    the same dense rate and TF32 at half of it; fp32 is the non-tensor (CUDA-core) rate."""
    return {
        "bf16": _datasheet(tensor_per_s, "dense"),
        "fp16": _datasheet(tensor_per_s, "dense"),
        "tf32": _datasheet(tensor_per_s / 2, "dense"),
        "fp32": _datasheet(fp32_per_s, "non-tensor"),
    }


def _gpu(
    die: _Die,
    name: str,
    kind_pattern: str,
    sm_count: int,
    boost_clock_hz: float,
    dram: Ceiling,
    compute: dict[str, Ceiling],
    measured_dram: Ceiling | None = None,
) -> GpuSpec:
    """One table entry. `dram` is the datasheet DRAM peak; floors use `measured_dram` where
    there is one, else the datasheet peak."""
    return GpuSpec(
        name=name,
        kind_pattern=kind_pattern,
        sm_count=sm_count,
        boost_clock_hz=boost_clock_hz,
        memory=dram if measured_dram is None else measured_dram,
        compute=compute,
        memory_datasheet=dram,
        l2_bytes=die.l2_bytes,
        l2_bandwidth=_l2_bandwidth(die.l2_bytes_per_clk, boost_clock_hz, die.l2_note),
        l1_smem_per_sm_bytes=die.l1_smem_per_sm_bytes,
        smem_per_sm_bytes=die.smem_per_sm_bytes,
        smem_per_block_optin_bytes=die.smem_per_block_optin_bytes,
        compute_capability_major=die.compute_capability_major,
        l1_bandwidth=_l1_bandwidth(sm_count, boost_clock_hz),
        fp32_lanes_per_sm=die.fp32_lanes_per_sm,
    )


_H200_COMPUTE = {
    "bf16": _measured(708e12, "bf16 GEMM; datasheet 989 dense"),
    "fp16": _measured(708e12, "bf16 GEMM number; fp16 tensor rate equals bf16"),
    "tf32": _datasheet(494.7e12, "dense"),
    "fp32": _measured(51e12, "fp32 GEMM at Precision.HIGHEST; CUDA-core peak 66.9"),
}
_H200_MEASURED_DRAM = _measured(3.97e12, "device-to-device copy, read+write; datasheet 4.8 TB/s")

# Ordered: the first entry whose pattern matches wins, so the H100 variants come before the
# generic H100 (SXM). Word boundaries keep "GH200" from matching "H200".
# Columns: die, name, device-kind pattern, SMs, boost clock, datasheet DRAM, compute.
GPU_SPECS: tuple[GpuSpec, ...] = (
    _gpu(_GH100, "H200", r"\bH200\b", 132, 1.98e9, _datasheet(4.8e12, "HBM3e"), _H200_COMPUTE,
         measured_dram=_H200_MEASURED_DRAM),
    _gpu(_GH100, "H100 PCIe", r"\bH100\b.*PCIe", 114, 1.755e9, _datasheet(2.0e12, "HBM2e"),
         _dense_compute(756e12, 51e12)),
    _gpu(_GH100, "H100 NVL", r"\bH100\b.*NVL", 132, 1.785e9, _datasheet(3.9e12, "HBM3"),
         _dense_compute(835e12, 60e12)),
    _gpu(_GH100, "H100 SXM", r"\bH100\b", 132, 1.98e9, _datasheet(3.35e12, "HBM3"),
         _dense_compute(989.4e12, 67e12)),
)

# Not matched by lookup_gpu_spec (see the module docstring); reach them with spec_by_name.
MODEL_ONLY_SPECS: tuple[GpuSpec, ...] = (
    _gpu(_GA100, "A100 SXM 80GB", r"\bA100\b.*80GB", 108, 1.41e9,
         _datasheet(2.039e12, "HBM2e"), _dense_compute(312e12, 19.5e12)),
    _gpu(_GV100, "V100 SXM2", r"\bV100\b", 80, 1.53e9, _datasheet(900e9, "HBM2"),
         {  # no bf16 and no TF32 on Volta
             "fp16": _datasheet(125e12, "tensor"),
             "fp32": _datasheet(15.7e12, "non-tensor"),
         }),
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


def spec_by_name(name: str) -> GpuSpec:
    """The entry (detectable or model-only) whose name or device-kind pattern matches `name`."""
    specs = GPU_SPECS + MODEL_ONLY_SPECS
    for spec in specs:
        if spec.name.lower() == name.lower():
            return spec
    for spec in specs:
        if re.search(spec.kind_pattern, name, flags=re.IGNORECASE):
            return spec
    raise KeyError(f"no GPU spec for {name!r}; known: {[s.name for s in specs]}")


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
