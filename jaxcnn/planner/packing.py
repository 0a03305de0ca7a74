"""Static arena planning: give every buffer a byte offset in one arena so that buffers alive
at the same step never share bytes.

A buffer is a rectangle of lifetime [start, end] (inclusive steps) x size; a plan stacks the
rectangles along the memory axis. live_bytes_lower_bound (the peak of live bytes over time) is
what no plan can beat; the algorithms here are the usual greedy heuristics plus pack_2d, a
multi-ordering rectangle packer in the spirit of profile-guided memory optimization (Sekiyama
et al.), which keeps the best of several orderings and of the baselines.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from jaxcnn.planner.lifetimes import Buffer, live_bytes_lower_bound

DEFAULT_ALIGNMENT = 256
MIB = 1 << 20


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


@dataclass
class Plan:
    algorithm: str
    offsets: dict[str, int]
    arena_bytes: int
    alignment: int = DEFAULT_ALIGNMENT
    # Which candidate won, for pack_2d (empty for the single-pass algorithms).
    detail: str = field(default="", compare=False)

    def validate(self, buffers: Iterable[Buffer]) -> None:
        """Raise ValueError if a buffer is missing, misaligned, outside the arena, or shares
        bytes with a buffer alive at an overlapping step."""
        buffers = list(buffers)
        for b in buffers:
            if b.name not in self.offsets:
                raise ValueError(f"{self.algorithm}: buffer {b.name!r} has no offset")
            off = self.offsets[b.name]
            if off < 0 or off % self.alignment:
                raise ValueError(
                    f"{self.algorithm}: buffer {b.name!r} offset {off} is not a non-negative "
                    f"multiple of {self.alignment}"
                )
            if off + b.size_bytes > self.arena_bytes:
                raise ValueError(
                    f"{self.algorithm}: buffer {b.name!r} [{off}, {off + b.size_bytes}) exceeds "
                    f"the arena of {self.arena_bytes} bytes"
                )
        # Sweep in start order: once a later buffer starts after a.end, none after it overlaps a.
        live = sorted((b for b in buffers if b.size_bytes > 0), key=lambda b: b.start)
        for i, a in enumerate(live):
            a_lo = self.offsets[a.name]
            a_hi = a_lo + a.size_bytes
            for b in live[i + 1 :]:
                if b.start > a.end:
                    break
                b_lo = self.offsets[b.name]
                if b_lo < a_hi and a_lo < b_lo + b.size_bytes:
                    raise ValueError(
                        f"{self.algorithm}: buffers {a.name!r} [{a_lo}, {a_hi}) steps "
                        f"[{a.start}, {a.end}] and {b.name!r} [{b_lo}, {b_lo + b.size_bytes}) "
                        f"steps [{b.start}, {b.end}] overlap in time and memory"
                    )


def lower_bound(buffers: Sequence[Buffer]) -> int:
    """Peak live bytes over time: no plan's arena can be smaller."""
    return live_bytes_lower_bound(list(buffers))


def naive(buffers: Sequence[Buffer], alignment: int = DEFAULT_ALIGNMENT) -> Plan:
    """No reuse: every buffer gets its own aligned slot, one after another."""
    offsets, top = {}, 0
    for b in buffers:
        offsets[b.name] = top
        top += _align(b.size_bytes, alignment)
    return Plan("naive", offsets, top, alignment)


# A placement rule picks an offset from the free gaps (start, size) below `top`, the first
# byte above every time-overlapping placed buffer; None means "put it at top".
Chooser = Callable[[list[tuple[int, int]], int], "int | None"]


def _first_fit(gaps: list[tuple[int, int]], size: int) -> int | None:
    return next((start for start, gap in gaps if gap >= size), None)


def _best_fit(gaps: list[tuple[int, int]], size: int) -> int | None:
    # Smallest adequate gap (least waste); min() keeps the first, i.e. lowest offset, on ties.
    fits = [(gap, start) for start, gap in gaps if gap >= size]
    return min(fits, key=lambda f: f[0])[1] if fits else None


def _place(
    order: Sequence[Buffer], alignment: int, choose: Chooser, name: str, detail: str = ""
) -> Plan:
    """Place buffers one by one in `order`; each sees only the already-placed buffers whose
    lifetimes overlap its own (the others may share its bytes)."""
    offsets: dict[str, int] = {}
    placed: list[tuple[int, int, int, int]] = []  # (start, end, lo, hi) of non-empty buffers
    arena = 0
    for b in order:
        size = _align(b.size_bytes, alignment)
        if size == 0:
            offsets[b.name] = 0  # occupies no bytes, conflicts with nothing
            continue
        busy = sorted((lo, hi) for s, e, lo, hi in placed if s <= b.end and b.start <= e)
        gaps, top = [], 0
        for lo, hi in busy:
            if lo > top:
                gaps.append((top, lo - top))
            top = max(top, hi)
        off = choose(gaps, size)
        if off is None:
            off = top
        offsets[b.name] = off
        placed.append((b.start, b.end, off, off + size))
        arena = max(arena, off + size)
    return Plan(name, offsets, arena, alignment, detail)


def greedy_by_size(buffers: Sequence[Buffer], alignment: int = DEFAULT_ALIGNMENT) -> Plan:
    """TFLite's GreedyBySize: largest first (ties: earlier first use), each into the smallest
    gap between time-overlapping placed buffers that fits, else on top of them."""
    order = sorted(buffers, key=lambda b: (-b.size_bytes, b.start))
    return _place(order, alignment, _best_fit, "greedy_by_size")


def best_fit_decreasing(buffers: Sequence[Buffer], alignment: int = DEFAULT_ALIGNMENT) -> Plan:
    """XLA's GlobalDecreasingSizeBestFitHeap (spatial order): decreasing size, ties broken by
    longer lifetime then name, each into the free chunk that wastes least, ties lowest offset.

    The placement rule is the same best fit as greedy_by_size (with aligned sizes every gap is
    aligned, so "smallest adequate gap" and "least waste" coincide); what differs is the order
    among equal sizes. XLA places long-lived buffers first, since they constrain the most steps,
    whereas TFLite goes by first use. The two often agree, and diverge on same-size tensors,
    common in CNNs (conv output, bias add, relu of one shape)."""
    order = sorted(buffers, key=lambda b: (-b.size_bytes, -(b.end - b.start), b.name))
    return _place(order, alignment, _best_fit, "best_fit_decreasing")


def _orderings(buffers: Sequence[Buffer], seeds: int) -> list[tuple[str, list[Buffer]]]:
    length = lambda b: b.end - b.start + 1  # noqa: E731
    keys = {
        "size desc": lambda b: (-b.size_bytes, -length(b), b.start),
        "lifetime desc": lambda b: (-length(b), -b.size_bytes, b.start),
        "area desc": lambda b: (-b.size_bytes * length(b), -b.size_bytes, b.start),
        "start asc": lambda b: (b.start, -b.size_bytes, -b.end),
        "end desc": lambda b: (-b.end, -b.size_bytes, b.start),
    }
    out = [(name, sorted(buffers, key=key)) for name, key in keys.items()]
    for seed in range(seeds):
        # Seeded, so a plan is reproducible; random orders escape the sorts' shared blind spots.
        shuffled = list(buffers)
        random.Random(seed).shuffle(shuffled)
        out.append((f"random {seed}", shuffled))
    return out


def pack_2d(
    buffers: Sequence[Buffer], alignment: int = DEFAULT_ALIGNMENT, random_seeds: int = 4
) -> Plan:
    """Rectangle packing over several orderings (size, lifetime, area, start, end, seeded
    random), each placed lowest-feasible-offset (first fit) and best fit; the smallest arena
    wins. greedy_by_size and best_fit_decreasing are candidates too, so pack_2d is never worse
    than either."""
    candidates = [greedy_by_size(buffers, alignment), best_fit_decreasing(buffers, alignment)]
    for label, order in _orderings(buffers, random_seeds):
        candidates.append(_place(order, alignment, _first_fit, "pack_2d", f"{label}, first fit"))
        candidates.append(_place(order, alignment, _best_fit, "pack_2d", f"{label}, best fit"))
    best = min(candidates, key=lambda p: p.arena_bytes)  # first minimum: baselines win ties
    detail = best.detail or best.algorithm
    return Plan("pack_2d", best.offsets, best.arena_bytes, alignment, detail)


ALGORITHMS: dict[str, Callable[..., Plan]] = {
    "naive": naive,
    "greedy_by_size": greedy_by_size,
    "best_fit_decreasing": best_fit_decreasing,
    "pack_2d": pack_2d,
}


def plan_all(
    buffers: Sequence[Buffer], alignment: int = DEFAULT_ALIGNMENT
) -> tuple[dict[str, Plan], int]:
    """Every algorithm's plan (validated) and the live-bytes lower bound."""
    buffers = list(buffers)
    plans = {name: fn(buffers, alignment=alignment) for name, fn in ALGORITHMS.items()}
    for plan in plans.values():
        plan.validate(buffers)
    return plans, lower_bound(buffers)


def summary_table(plans: dict[str, Plan], bound: int) -> str:
    """Markdown table of arena sizes in MiB and their excess over the lower bound."""
    rows = [
        "| algorithm | arena (MiB) | over bound |",
        "|---|---:|---:|",
        f"| lower bound | {bound / MIB:.3f} | - |",
    ]
    for name, plan in plans.items():
        over = f"{100 * (plan.arena_bytes - bound) / bound:.1f}%" if bound else "-"
        rows.append(f"| {name} | {plan.arena_bytes / MIB:.3f} | {over} |")
    return "\n".join(rows)
