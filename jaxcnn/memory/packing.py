"""Static arena planning: give every buffer a byte offset in one arena so that buffers alive
at the same step never share bytes.

A buffer is a rectangle of lifetime [start, end] (inclusive steps) x size; a plan stacks the
rectangles along the memory axis. live_bytes_lower_bound (the peak of live bytes over time) is
what no plan can beat; the algorithms here are the usual greedy heuristics plus pack_2d, a
multi-ordering rectangle packer in the spirit of profile-guided memory optimization (Sekiyama
et al.), which keeps the best of several orderings and of the baselines.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from jaxcnn.memory.lifetimes import Buffer, live_bytes_lower_bound

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


def lower_bound(buffers: Sequence[Buffer], alignment: int | None = None) -> int:
    """Peak live bytes over time: no plan's arena can be smaller. With `alignment`, of the sizes
    rounded up to it (the bound for plans with that alignment)."""
    buffers = list(buffers)
    if alignment is not None:
        buffers = [Buffer(b.name, _align(b.size_bytes, alignment), b.start, b.end) for b in buffers]
    return live_bytes_lower_bound(buffers)


def naive(buffers: Sequence[Buffer], alignment: int = DEFAULT_ALIGNMENT) -> Plan:
    """No reuse: every buffer gets its own aligned slot, one after another."""
    buffers = _checked(buffers, alignment)
    offsets, top = {}, 0
    for b in buffers:
        offsets[b.name] = top
        top += _align(b.size_bytes, alignment)
    return Plan("naive", offsets, top, alignment)


def _checked(buffers: Iterable[Buffer], alignment: int) -> list[Buffer]:
    """The buffers as a list; ValueError/TypeError naming the argument when they cannot be
    planned (plans key offsets by name, lifetimes are inclusive step ranges)."""
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"alignment must be a positive int, got {alignment!r}")
    buffers = list(buffers)
    names = set()
    for b in buffers:
        if not isinstance(b, Buffer):
            raise TypeError(f"buffers must hold Buffer objects, got {type(b).__name__}")
        if b.size_bytes < 0 or b.start < 0 or b.end < b.start:
            raise ValueError(f"buffers: {b!r} needs size_bytes >= 0 and 0 <= start <= end")
        if b.name in names:
            raise ValueError(f"buffers: duplicate name {b.name!r}")
        names.add(b.name)
    return buffers


def _aligned_sizes(buffers: Sequence[Buffer], alignment: int) -> list[int]:
    return [_align(b.size_bytes, alignment) for b in buffers]


class _Timeline:
    """Buffers sorted by start, shared by every placement pass: the buffers that may overlap
    buffer i in time are a prefix of that order (those starting by i's end), so one pass costs
    O(n) numpy calls over prefixes (O(n^2) element operations in C), whatever the overlap."""

    def __init__(self, buffers: Sequence[Buffer]):
        n = len(buffers)
        starts = np.fromiter((b.start for b in buffers), np.int64, n)
        ends = np.fromiter((b.end for b in buffers), np.int64, n)
        by_start = np.argsort(starts, kind="stable")
        position = np.empty(n, np.int64)
        position[by_start] = np.arange(n)
        self.n = n
        self.starts = starts.tolist()
        self.ends = ends.tolist()
        self.position = position.tolist()
        self.prefix = np.searchsorted(starts[by_start], ends, side="right").tolist()


# Up to this many time-overlapping placed buffers, gaps are found in Python, beyond it in numpy.
SMALL_GAP_SCAN = 48


def _place_indices(
    order: Sequence[int], sizes: Sequence[int], timeline: _Timeline, best_fit: bool
) -> tuple[list[int], int]:
    """Place buffers (by index) one by one in `order`: each goes into a free gap between the
    already-placed buffers whose lifetimes overlap its own (the others may share its bytes),
    the smallest adequate gap (best fit, ties lowest) or the lowest one (first fit), else on
    top of them. Returns the offsets by index and the arena size."""
    n = timeline.n
    # By start position: last step of placed buffers (-1: not placed, never overlaps), and
    # their byte ranges [lo, hi) as the two columns of one array (one gather per query).
    end_at = np.full(n, -1, np.int64)
    range_at = np.zeros((n, 2), np.int64)
    offsets = [-1] * n
    arena = 0
    starts, ends, position, prefix = timeline.starts, timeline.ends, timeline.position, timeline.prefix
    flatnonzero, argsort, accumulate = np.flatnonzero, np.argsort, np.maximum.accumulate
    for i in order:
        size = sizes[i]
        if size == 0:
            offsets[i] = 0  # occupies no bytes, conflicts with nothing
            continue
        near = range_at[flatnonzero(end_at[:prefix[i]] >= starts[i])]
        off = 0
        if len(near) <= SMALL_GAP_SCAN:  # a Python scan beats numpy's per-call cost here
            top, chosen, chosen_gap = 0, -1, 0
            for lo, hi in sorted(near.tolist()):
                gap = lo - top
                if gap >= size and (chosen < 0 or (best_fit and gap < chosen_gap)):
                    chosen, chosen_gap = top, gap
                    if not best_fit or gap == size:
                        break
                if hi > top:
                    top = hi
            off = chosen if chosen >= 0 else top
        else:
            near = near[argsort(near[:, 0])]  # ties (equal lo) give the same gaps in any order
            top = accumulate(near[:, 1])
            gap = near[:, 0].copy()
            gap[1:] -= top[:-1]  # free bytes below each busy range, above all lower ones
            fits = flatnonzero(gap >= size)
            if len(fits):
                k = int(fits[gap[fits].argmin()]) if best_fit else int(fits[0])
                off = int(top[k - 1]) if k else 0
            else:
                off = int(top[-1])
        offsets[i] = off
        p = position[i]
        end_at[p] = ends[i]
        range_at[p] = (off, off + size)
        if off + size > arena:
            arena = off + size
    return offsets, arena


def _plan(name: str, buffers: Sequence[Buffer], offsets: Sequence[int], arena: int,
          alignment: int, detail: str = "") -> Plan:
    return Plan(name, {b.name: off for b, off in zip(buffers, offsets)}, arena, alignment, detail)


def _greedy_order(buffers: Sequence[Buffer], key) -> list[int]:
    return sorted(range(len(buffers)), key=lambda i: key(buffers[i]))


def _tflite_key(b: Buffer):
    return (-b.size_bytes, b.start)


def _xla_key(b: Buffer):
    return (-b.size_bytes, -(b.end - b.start), b.name)


def greedy_by_size(buffers: Sequence[Buffer], alignment: int = DEFAULT_ALIGNMENT) -> Plan:
    """TFLite's GreedyBySize: largest first (ties: earlier first use), each into the smallest
    gap between time-overlapping placed buffers that fits, else on top of them."""
    buffers = _checked(buffers, alignment)
    offsets, arena = _place_indices(_greedy_order(buffers, _tflite_key),
                                    _aligned_sizes(buffers, alignment), _Timeline(buffers), True)
    return _plan("greedy_by_size", buffers, offsets, arena, alignment)


def best_fit_decreasing(buffers: Sequence[Buffer], alignment: int = DEFAULT_ALIGNMENT) -> Plan:
    """XLA's GlobalDecreasingSizeBestFitHeap (spatial order): decreasing size, ties broken by
    longer lifetime then name, each into the free chunk that wastes least, ties lowest offset.

    The placement rule is the same best fit as greedy_by_size (with aligned sizes every gap is
    aligned, so "smallest adequate gap" and "least waste" coincide); what differs is the order
    among equal sizes. XLA places long-lived buffers first, since they constrain the most steps,
    whereas TFLite goes by first use. The two often agree, and diverge on same-size tensors,
    common in CNNs (conv output, bias add, relu of one shape)."""
    buffers = _checked(buffers, alignment)
    offsets, arena = _place_indices(_greedy_order(buffers, _xla_key),
                                    _aligned_sizes(buffers, alignment), _Timeline(buffers), True)
    return _plan("best_fit_decreasing", buffers, offsets, arena, alignment)


def _breadth_order(buffers: Sequence[Buffer]) -> list[int]:
    """TFLite's greedy-by-breadth order: steps by decreasing live bytes; buffers by the busiest
    step they are alive at, then decreasing size. The buffers that must stack at the peak go
    first, so a big buffer just before the peak cannot push them up."""
    n = len(buffers)
    if n == 0:
        return []
    starts = np.fromiter((b.start for b in buffers), np.int64, n)
    ends = np.fromiter((b.end for b in buffers), np.int64, n)
    sizes = np.fromiter((b.size_bytes for b in buffers), np.int64, n)
    steps = int(ends.max()) + 2
    delta = np.zeros(steps, np.int64)
    np.add.at(delta, starts, sizes)
    np.add.at(delta, ends + 1, -sizes)
    rank = np.empty(steps, np.int64)
    rank[np.argsort(-np.cumsum(delta), kind="stable")] = np.arange(steps)
    # Min rank over each lifetime [start, end]: reduceat over (start, end + 1) index pairs.
    pairs = np.stack([starts, ends + 1], axis=1).ravel()
    busiest = np.minimum.reduceat(rank, pairs)[::2]
    return sorted(range(n), key=lambda i: (busiest[i], -buffers[i].size_bytes, buffers[i].start))


def _orderings(buffers: Sequence[Buffer], seeds: int) -> Iterator[tuple[str, list[int]]]:
    """Candidate orders, lazily (big inputs only use the first few), most distinct from the
    baselines' size order first."""
    length = lambda b: b.end - b.start + 1  # noqa: E731
    keys = {
        "area desc": lambda b: (-b.size_bytes * length(b), -b.size_bytes, b.start),
        "lifetime desc": lambda b: (-length(b), -b.size_bytes, b.start),
        "start asc": lambda b: (b.start, -b.size_bytes, -b.end),
        "end desc": lambda b: (-b.end, -b.size_bytes, b.start),
        "size desc": lambda b: (-b.size_bytes, -length(b), b.start),
    }
    yield "breadth", _breadth_order(buffers)
    for name, key in keys.items():
        yield name, _greedy_order(buffers, key)
    for seed in range(seeds):
        # Seeded, so a plan is reproducible; random orders escape the sorts' shared blind spots.
        shuffled = list(range(len(buffers)))
        random.Random(seed).shuffle(shuffled)
        yield f"random {seed}", shuffled


# Placement passes pack_2d may spend (candidates plus improvement rounds). A pass scans, per
# buffer, the buffers starting before it ends: ~n^2/2 element operations, so the count is a
# budget of those, between MIN_PASSES (10,000 buffers stay under a second) and MAX_PASSES.
WORK_BUDGET = 60_000_000
MIN_PASSES, MAX_PASSES = 3, 64


def _squeaky_wheel(
    order: list[int], best_fit: bool, sizes: list[int], timeline: _Timeline, target: int,
    offsets: list[int], arena: int, rounds: int,
) -> tuple[list[int], int, int]:
    """Local improvement (squeaky-wheel optimization): the buffers that end up above the
    lower bound (`target`) are the ones the order placed badly; move them to the front (keeping
    their relative order) and place again. Keeps the best plan; returns it and the rounds used."""
    best = (offsets, arena)
    for used in range(1, rounds + 1):
        if best[1] <= target:
            return best[0], best[1], used - 1
        high = [i for i in order if offsets[i] + sizes[i] > target]
        high_set = set(high)
        order = high + [i for i in order if i not in high_set]
        offsets, arena = _place_indices(order, sizes, timeline, best_fit)
        if arena < best[1]:
            best = (offsets, arena)
    return best[0], best[1], rounds


def pack_2d(
    buffers: Sequence[Buffer], alignment: int = DEFAULT_ALIGNMENT, random_seeds: int = 2
) -> Plan:
    """2-D rectangle packing of lifetime x size (seed 004: pack the rectangles into the lowest
    strip with a fast heuristic, several orderings, keep the best). Candidates: greedy_by_size
    and best_fit_decreasing (so never worse than either), then orderings by breadth (busiest
    step first), area, lifetime, start, end, size and seeded random, each placed best fit and
    first fit (bottom-left); then squeaky-wheel rounds on the best few: buffers that land above
    the lower bound move to the front of the order, which is placed again. Stops as soon as a
    plan meets the (aligned) lower bound; the passes are budgeted by n^2 (WORK_BUDGET), so big
    inputs get the baselines, the breadth order and few rounds. `detail` names the winner."""
    buffers = _checked(buffers, alignment)
    if isinstance(random_seeds, bool) or not isinstance(random_seeds, int) or random_seeds < 0:
        raise ValueError(f"random_seeds must be an int >= 0, got {random_seeds!r}")
    n = len(buffers)
    sizes = _aligned_sizes(buffers, alignment)
    timeline = _Timeline(buffers)
    target = lower_bound(buffers, alignment)
    candidates = [  # (arena, offsets, label, order, best_fit)
        (*_place_indices(o, sizes, timeline, True)[::-1], label, o, True)
        for label, o in (("greedy_by_size", _greedy_order(buffers, _tflite_key)),
                         ("best_fit_decreasing", _greedy_order(buffers, _xla_key)))
    ]
    passes = min(max(WORK_BUDGET // max(n * n, 1), MIN_PASSES), MAX_PASSES)
    # Half the passes for fresh orderings, half for improvement; none once one meets the bound.
    tries = ((label, order, best_fit) for label, order in _orderings(buffers, random_seeds)
             for best_fit in (True, False))
    for label, order, best_fit in itertools.islice(tries, max(passes // 2 - len(candidates), 1)):
        if min(c[0] for c in candidates) <= target:
            break
        offsets, arena = _place_indices(order, sizes, timeline, best_fit)
        rule = "best fit" if best_fit else "first fit"
        candidates.append((arena, offsets, f"{label}, {rule}", order, best_fit))
    candidates.sort(key=lambda c: c[0])  # stable: baselines win ties
    arena, offsets, label = candidates[0][:3]
    # Improvement rounds go to the best few candidates, the winner first.
    rounds_left = passes - len(candidates)
    for c_arena, c_offsets, c_label, c_order, c_best_fit in candidates[:3]:
        if arena <= target or rounds_left <= 0:
            break
        rounds = max(rounds_left // 2, 1)
        new_offsets, new_arena, used = _squeaky_wheel(
            list(c_order), c_best_fit, sizes, timeline, target, c_offsets, c_arena, rounds)
        rounds_left -= used
        if new_arena < arena:
            arena, offsets, label = new_arena, new_offsets, f"{c_label} + squeaky wheel"
    return _plan("pack_2d", buffers, offsets, arena, alignment, label)


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
