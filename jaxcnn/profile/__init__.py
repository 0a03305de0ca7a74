"""Timing helpers: per-call GPU device time from profiler traces, host wall time, GPU ceilings.

Profiles into the store: profiler.profile_model (a zoo model), function_profile.profile_function
(any function, per conv site; `jaxcnn profile --fn` builds it with user_model.build_user_model).
"""

from jaxcnn.profile.device_time import (
    DeviceTiming,
    KernelEvent,
    KernelStat,
    TimingStats,
    WallTiming,
    call_annotation_starts,
    device_time,
    device_times,
    gpu_kernel_events,
    split_into_calls,
    timing_from_events,
    wall_time,
)

__all__ = [
    "DeviceTiming",
    "KernelEvent",
    "KernelStat",
    "TimingStats",
    "WallTiming",
    "call_annotation_starts",
    "device_time",
    "device_times",
    "gpu_kernel_events",
    "split_into_calls",
    "timing_from_events",
    "wall_time",
]
