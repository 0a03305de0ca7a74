"""Typed forms of the library's plan lines: what a handler will launch for given shapes.

The library answers a plan query with one line of text (cuda_ops/conv_pool/conv_pool_ffi.cu's
jaxcnn_conv_pool_plan, cuda_ops/fusion/fire_ffi.cu's jaxcnn_fire_plan,
cuda_ops/sparse/sparse_ffi.cu's jaxcnn_sparse_conv_plan), e.g.
"kernel=tensor_core block=8x16 pooled=4x8 block_k=64 grid=25088 smem=59392 recompute=1.00
flat_k=0". This module is the one place that reads those lines: each plan keeps the line as
`text` (for explain output and reports) and its `key=value` tokens as typed fields, None where
the line has no such token. A line that does not start with "kernel=" is the library's reason
nothing can run the shapes: `kernel` is None and `text` holds the reason.
tests/native/test_native_contract.py checks the fields against the keys the C++ writers print.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jaxcnn.profile.gpu_specs import GpuSpec


def _dims(value: str) -> tuple[int, ...]:
    return tuple(int(part) for part in value.split("x"))


def _flag(value: str) -> bool:
    return value == "1"


# A field's annotation -> how its token's value is read.
_READERS = {
    "str | None": str,
    "int | None": int,
    "float | None": float,
    "bool | None": _flag,
    "tuple[int, ...] | None": _dims,
}
# The parenthesised reason a line may carry ("kernel=direct (why) grid=...").
_WHY = re.compile(r"\((.*)\)")


def _parse(cls, text: str):
    """An instance of plan class `cls` read from the library's line `text`."""
    if not text.startswith("kernel="):
        return cls(text)
    why = _WHY.search(text)
    tokens = dict(token.split("=", 1) for token in _WHY.sub("", text).split() if "=" in token)
    values = {f.name: _READERS[f.type](tokens[f.name])
              for f in dataclasses.fields(cls) if f.name in tokens}
    return cls(text, why=why.group(1) if why else None, **values)


@dataclass(frozen=True)
class ConvPoolPlan:
    """The fused conv+pool kernel's configuration (jaxcnn_conv_pool_plan)."""

    text: str
    kernel: str | None = None  # "tensor_core", "stem", "wgmma" or "direct"
    why: str | None = None  # the direct kernel's reason
    block: tuple[int, ...] | None = None  # conv output tile (rows, columns)
    pooled: tuple[int, ...] | None = None  # pooled output tile
    block_k: int | None = None
    grid: int | None = None
    smem: int | None = None
    recompute: float | None = None  # conv outputs computed per output needed (1.00: none twice)
    flat_k: bool | None = None
    tma: bool | None = None  # the stem kernel's


@dataclass(frozen=True)
class FirePlan:
    """The fire module's kernel configuration (jaxcnn_fire_plan)."""

    text: str
    kernel: str | None = None  # "tensor_core", "fma", "wgmma" or "two_phase"
    why: str | None = None
    tile: tuple[int, ...] | None = None
    split: int | None = None
    block: int | None = None
    grid: int | None = None
    ctas_per_sm: int | None = None
    smem: int | None = None
    sq_resident: bool | None = None
    expand_chunk: int | None = None
    squeeze_items: int | None = None
    expand_items: int | None = None
    launches: int | None = None  # wgmma: 1 (all fused), 2 or 3
    squeeze: str | None = None  # wgmma: "fused", "wgmma" or "conv_tc"
    workspace: int | None = None


@dataclass(frozen=True)
class DeviceLimits:
    """The GPU attributes a plan reads (cuda_ops/common/device_attribute.h DeviceLimits), for a
    plan query about a described GPU instead of the current device (jaxcnn_fire_plan_for_device):
    the cost model plans for the GPU it is asked about, on a machine without it."""

    sm_count: int
    smem_optin: int  # bytes of shared memory one block may opt in to
    smem_per_sm: int  # bytes of shared memory per SM
    major: int  # compute capability major
    cooperative: bool = True  # cooperative (grid-barrier) launches

    @classmethod
    def from_spec(cls, spec: GpuSpec) -> DeviceLimits:
        """The limits of a jaxcnn.profile.gpu_specs entry."""
        return cls(spec.sm_count, spec.smem_per_block_optin_bytes, spec.smem_per_sm_bytes,
                   spec.compute_capability_major, spec.cooperative_launch)


@dataclass(frozen=True)
class SparsePlan:
    """The zero-skipping conv's plan (jaxcnn_sparse_conv_plan)."""

    text: str
    kernel: str | None = None  # "tile" or "walk"
    why: str | None = None
    tile: tuple[int, ...] | None = None
    k_per_lane: int | None = None
    warps: tuple[int, ...] | None = None
    region: tuple[int, ...] | None = None
    chunk: int | None = None
    splits: int | None = None
    pixels_per_warp: int | None = None
    taps_per_stage: int | None = None
    grid: tuple[int, ...] | None = None
    smem: int | None = None
    scratch: int | None = None


def parse_conv_pool_plan(text: str) -> ConvPoolPlan:
    return _parse(ConvPoolPlan, text)


def parse_fire_plan(text: str) -> FirePlan:
    return _parse(FirePlan, text)


def parse_sparse_plan(text: str) -> SparsePlan:
    return _parse(SparsePlan, text)


def plan_text(plan) -> str | None:
    """A plan query's answer as the library's line (None stays None), for reports."""
    return None if plan is None else plan.text
