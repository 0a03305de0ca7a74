"""Timing many candidates at once for the autotune cache's clients (layout choice, fusion
planner): device times of (key, fn, args) cases in one profiler trace, as the timing fields of
a cache record."""

from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence

from jaxcnn.profile.device_time import device_times


def timing_record(timing: Any) -> dict[str, Any]:
    """A DeviceTiming/WallTiming as a record's timing fields: time_ms (median), measured
    (device time, not host wall time), note (method and caveats), kernels (the first 3)."""
    note = timing.method + (f"; {timing.note}" if timing.note else "")
    return dict(time_ms=float(timing.median_ms), measured=bool(timing.is_device_time), note=note,
                kernels=[k.name for k in timing.kernels][:3])


def time_cases(cases: Sequence[tuple[Hashable, Callable, tuple]], iters: int,
               warmup: int) -> dict[Hashable, dict[str, Any]]:
    """{key: timing_record} of every (key, fn, args) case, timed in one trace."""
    if not cases:
        return {}
    return {key: timing_record(t) for key, t in device_times(cases, iters=iters, warmup=warmup).items()}
