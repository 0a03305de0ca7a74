"""Timing helpers (jaxcnn.profile), GPU ceilings and a CPU smoke run of scripts/bench_layers.py."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from jaxcnn.profile import (
    DeviceTiming,
    KernelEvent,
    WallTiming,
    call_annotation_starts,
    device_time,
    gpu_kernel_events,
    split_into_calls,
    timing_from_events,
    wall_time,
)
from jaxcnn.profile.device_time import CALL_ANNOTATION, _split_at_call_starts, _split_periodic
from jaxcnn.profile.gpu_specs import GPU_SPECS, floor_ms, lookup_gpu_spec, precision_class

REPO_ROOT = Path(__file__).resolve().parents[2]
ON_GPU = jax.default_backend() == "gpu"


def _matmul(a):
    return jnp.tanh(a) @ a


def _assert_sane_stats(timing, n: int) -> None:
    assert timing.n == n == len(timing.samples_ms)
    assert all(s > 0 for s in timing.samples_ms)
    assert timing.min_ms <= timing.p10_ms <= timing.median_ms <= timing.p90_ms <= timing.max_ms
    assert timing.min_ms <= timing.mean_ms <= timing.max_ms


# ---------------------------------------------------------------- device_time / wall_time on CPU


@pytest.mark.skipif(ON_GPU, reason="checks the CPU fallback")
def test_device_time_falls_back_to_wall_time_on_cpu():
    timing = device_time(_matmul, jnp.ones((64, 64)), iters=5, warmup=1)
    assert isinstance(timing, DeviceTiming)
    _assert_sane_stats(timing, 5)
    assert timing.device == "cpu"
    assert timing.is_device_time is False and timing.method == "wall"
    assert "no device trace" in timing.note
    assert timing.kernels == () and timing.kernels_per_call is None


def test_wall_time_is_positive():
    timing = wall_time(_matmul, jnp.ones((64, 64)), iters=4, warmup=1)
    assert isinstance(timing, WallTiming)
    _assert_sane_stats(timing, 4)
    assert timing.device == jax.devices()[0].device_kind


def test_device_time_removes_its_trace_directory(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    device_time(_matmul, jnp.ones((16, 16)), iters=2, warmup=1)
    assert list(scratch.iterdir()) == []


def test_device_time_keeps_trace_when_asked(tmp_path):
    device_time(_matmul, jnp.ones((16, 16)), iters=2, warmup=1, trace_dir=str(tmp_path))
    assert list(tmp_path.rglob("*.xplane.pb"))


def test_device_time_rejects_zero_iters():
    with pytest.raises(ValueError):
        device_time(_matmul, jnp.ones((4, 4)), iters=0)


def test_timing_to_dict_is_json_serialisable():
    timing = device_time(_matmul, jnp.ones((16, 16)), iters=2, warmup=1)
    assert json.loads(json.dumps(timing.to_dict()))["n"] == 2


# ---------------------------------------------------------------- splitting a trace into calls


def _calls(pattern: list[list[tuple[str, float]]], gap_ns: float = 30_000.0) -> list[KernelEvent]:
    """Back-to-back kernels per call, calls separated by gap_ns of idle device."""
    events, now = [], 0.0
    for call in pattern:
        for name, duration in call:
            events.append(KernelEvent(now, now + duration, name))
            now += duration + 500.0  # launch gap inside a call
        now += gap_ns
    return events


def test_split_periodic_when_every_call_launches_the_same_kernels():
    events = _calls([[("gemm", 10_000.0), ("bias", 1_000.0)]] * 4)
    calls, method, note = split_into_calls(events, 4)
    assert method == "trace/periodic" and note == ""
    assert [len(c) for c in calls] == [2, 2, 2, 2]


def test_split_at_gaps_when_kernel_counts_differ():
    events = _calls([[("a", 5_000.0)], [("a", 5_000.0), ("b", 1_000.0)], [("a", 5_000.0)]])
    calls, method, note = split_into_calls(events, 3)
    assert method == "trace/gaps"
    assert [[ev.name for ev in c] for c in calls] == [["a"], ["a", "b"], ["a"]]
    assert "different kernel counts" in note


# Call 1 has a 40 us hole between its kernels, wider than the 20 us between calls: cutting at
# the widest gaps goes wrong, the call annotations do not.
_UNEVEN = [
    KernelEvent(10_000.0, 15_000.0, "a"),
    KernelEvent(35_000.0, 40_000.0, "a"),
    KernelEvent(80_000.0, 81_000.0, "b"),
    KernelEvent(101_000.0, 106_000.0, "a"),
]
_UNEVEN_CALL_STARTS = [0.0, 30_000.0, 95_000.0]


def test_split_at_call_annotations_beats_gaps():
    calls, method, note = split_into_calls(_UNEVEN, 3, _UNEVEN_CALL_STARTS)
    assert method == "trace/annotations"
    assert [[ev.name for ev in c] for c in calls] == [["a"], ["a", "b"], ["a"]]
    assert "different kernel counts" in note
    wrong, _, _ = split_into_calls(_UNEVEN, 3)  # no annotations: falls back to gaps
    assert [len(c) for c in wrong] == [1, 1, 2]


@pytest.mark.parametrize(
    "call_starts",
    [[0.0, 30_000.0], [20_000.0, 30_000.0, 95_000.0], [0.0, 30_000.0, 200_000.0]],
    ids=["wrong-count", "event-before-first-call", "call-without-events"],
)
def test_split_ignores_unusable_annotations(call_starts):
    _, method, _ = split_into_calls(_UNEVEN, 3, call_starts)
    assert method == "trace/gaps"


def test_split_at_gaps_handles_overlapping_streams():
    # Two kernels of one call overlap (two streams): no gap between them may be cut.
    call = [
        KernelEvent(0.0, 10_000.0, "x"),
        KernelEvent(2_000.0, 4_000.0, "y"),
        KernelEvent(8_000.0, 9_000.0, "z"),
    ]
    second = [KernelEvent(ev.start_ns + 50_000.0, ev.end_ns + 50_000.0, ev.name) for ev in call[:2]]
    calls, method, _ = split_into_calls(call + second, 2)
    assert method == "trace/gaps"
    assert [len(c) for c in calls] == [3, 2]


def test_split_needs_an_event_per_call():
    with pytest.raises(ValueError):
        split_into_calls(_calls([[("a", 1.0)]]), 2)


def test_timing_from_events_sums_kernels_per_call():
    events = _calls([[("gemm", 10_000.0), ("bias", 2_000.0)]] * 3)
    timing = timing_from_events(events, 3, device="test", top_k=1)
    assert timing.is_device_time and timing.method == "trace/periodic"
    assert timing.samples_ms == pytest.approx((0.012, 0.012, 0.012))
    assert timing.median_span_ms == pytest.approx(0.0125)  # includes the 0.5 us launch gap
    assert timing.kernels_per_call == 2
    (top,) = timing.kernels
    assert (top.name, top.launches_per_call) == ("gemm", 1.0)
    assert top.us_per_call == pytest.approx(10.0)


_XSPACE = (
    """
planes {
  id: 1 name: "/device:GPU:0"
  lines { id: 1 name: "Stream #7(Compute)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 5000000 }
    events { metadata_id: 2 offset_ps: 6000000 duration_ps: 1000000 } }
  lines { id: 2 name: "XLA Ops" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 5000000 } }
  event_metadata { key: 1 value { id: 1 name: "conv_kernel" } }
  event_metadata { key: 2 value { id: 2 name: "Memset" } }
}
planes {
  id: 2 name: "/host:CPU"
  lines { id: 1 name: "Stream-like host thread" timestamp_ns: 0
    events { metadata_id: 1 offset_ps: 0 duration_ps: 9000000 }
    events { metadata_id: 2 offset_ps: 6500000 duration_ps: 2000000 }
    events { metadata_id: 2 offset_ps: 500000 duration_ps: 6000000 } }
  event_metadata { key: 1 value { id: 1 name: "host_work" } }
  event_metadata { key: 2 value { id: 2 name: "%s" } }
}
"""
    % CALL_ANNOTATION
)


@pytest.mark.parametrize("interleave", [False, True])
def test_device_times_gives_each_case_its_own_calls(monkeypatch, interleave):
    """Case after case or round-robin, each call's events (up to the next call's annotation) go
    to the case that made the call: case "a" launches one 10 us kernel a call, "b" two (20 us
    and 5 us); the calls run in the order asked for."""
    dt = importlib.import_module("jaxcnn.profile.device_time")  # the package exports a function of that name
    ran = []
    cases = [(name, (lambda name: lambda x: ran.append(name) or x)(name), (jnp.ones(2),)) for name in "ab"]
    monkeypatch.setattr(dt, "_jit_and_warm_up", lambda fn, args, iters, warmup: fn)
    monkeypatch.setattr(dt, "_profiler_start_error", lambda directory: None)
    monkeypatch.setattr(jax.profiler, "stop_trace", lambda: None)

    def read_trace(directory):
        starts, events = [], []
        for p, name in enumerate(ran):
            t0 = 1000.0 * p
            starts.append(t0)
            if name == "a":
                events.append(KernelEvent(t0 + 50, t0 + 60, "ka"))
            else:
                events += [KernelEvent(t0 + 50, t0 + 70, "kb1"), KernelEvent(t0 + 80, t0 + 85, "kb2")]
        return events, starts

    monkeypatch.setattr(dt, "_read_trace", read_trace)
    out = dt.device_times(cases, iters=3, warmup=0, interleave=interleave)
    assert ran == (["a", "b"] * 3 if interleave else ["a"] * 3 + ["b"] * 3)
    assert out["a"].median_ms == pytest.approx(10e-6) and out["b"].median_ms == pytest.approx(25e-6)
    assert out["a"].kernels_per_call == 1 and out["b"].kernels_per_call == 2
    assert {k.name for k in out["b"].kernels} == {"kb1", "kb2"} and out["a"].is_device_time


def test_gpu_kernel_events_reads_only_gpu_stream_lines():
    profile = jax.profiler.ProfileData.from_text_proto(_XSPACE)
    events = gpu_kernel_events(profile)
    assert [(ev.name, ev.start_ns, ev.duration_ns) for ev in events] == [
        ("conv_kernel", 1000.0, 5000.0),
        ("Memset", 7000.0, 1000.0),
    ]


def test_call_annotation_starts_reads_host_annotations_in_order():
    profile = jax.profiler.ProfileData.from_text_proto(_XSPACE)
    assert call_annotation_starts(profile) == [500.0, 6500.0]
    timing = timing_from_events(
        gpu_kernel_events(profile), 2, "test", call_starts_ns=call_annotation_starts(profile)
    )
    assert timing.samples_ms == pytest.approx((0.005, 0.001))


# ---------------------------------------------------------------- GPU ceilings and floors


@pytest.mark.parametrize(
    "device_kind, name",
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
    ],
)
def test_lookup_gpu_spec(device_kind, name):
    assert lookup_gpu_spec(device_kind).name == name


@pytest.mark.parametrize("device_kind", ["cpu", "NVIDIA GH200 480GB", "NVIDIA A100-SXM4-80GB"])
def test_lookup_gpu_spec_unknown(device_kind):
    assert lookup_gpu_spec(device_kind) is None


def test_every_ceiling_names_its_source():
    for spec in GPU_SPECS:
        ceilings = [spec.memory, spec.fp32_fma_peak, *spec.compute.values()]
        assert all(c.source in ("measured", "datasheet") and c.per_s > 0 for c in ceilings)
        assert set(spec.compute) == {"bf16", "fp16", "tf32", "fp32"}


def test_h200_ceilings_match_the_baseline_measurements():
    h200 = lookup_gpu_spec("NVIDIA H200")
    assert h200.memory.per_s == 3.97e12 and h200.memory.source == "measured"
    assert h200.compute["bf16"].per_s == 708e12
    assert h200.compute["fp32"].per_s == 51e12
    assert h200.fp32_fma_peak.per_s == pytest.approx(132 * 128 * 2 * 1.98e9)


def test_floor_ms_compute_bound_matches_baseline_roofline():
    # vgg_c1_2 in bf16: the baseline's bf16_roofline_ms is 0.3344.
    h200 = lookup_gpu_spec("NVIDIA H200")
    flops = 2.0 * 64 * 224 * 224 * 64 * 3 * 3 * 64
    bytes_moved = 2 * (2 * 64 * 224 * 224 * 64 + 3 * 3 * 64 * 64)
    floor = floor_ms(flops, bytes_moved, h200, "bf16")
    assert floor["bound"] == "compute"
    assert floor["floor_ms"] == pytest.approx(0.3344, abs=1e-4)
    assert floor["floor_ms"] == max(floor["compute_ms"], floor["memory_ms"])


def test_floor_ms_memory_bound():
    h100 = lookup_gpu_spec("NVIDIA H100 80GB HBM3")
    floor = floor_ms(1e6, 3.35e9, h100, jnp.float32)
    assert floor["bound"] == "memory"
    assert floor["memory_ms"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "dtype, cls",
    [
        ("bf16", "bf16"),
        (jnp.bfloat16, "bf16"),
        ("float16", "fp16"),
        (jnp.float32, "fp32"),
        ("tf32", "tf32"),
    ],
)
def test_precision_class(dtype, cls):
    assert precision_class(dtype) == cls


def test_precision_class_rejects_unknown():
    with pytest.raises(ValueError):
        precision_class("int8")


# ---------------------------------------------------------------- bench_layers.py smoke run


@pytest.mark.slow
def test_bench_layers_quick_smoke(tmp_path):
    jaxcnn = pytest.importorskip("jaxcnn")
    if not hasattr(jaxcnn, "conv2d"):
        pytest.skip("jaxcnn.conv2d does not exist yet")
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    done = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "bench_layers.py"),
            "--quick",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "bench_layers.json").read_text())
    rows = report["rows"]
    assert {(r["layer"], r["dtype"]) for r in rows} >= {("tiny_3x3", "bf16"), ("tiny_dw", "fp32")}
    for row in rows:
        assert row["ok"], row
        assert math.isfinite(row["accuracy"]["jaxcnn_rel_l2"])
        assert row["timings"]["jaxcnn"]["median_ms"] > 0
        assert ("xla_highest" in row["timings"]) == (row["dtype"] == "fp32")
    environment = report["environment"]
    assert environment["jax"] == jax.__version__
    markdown = (tmp_path / "bench_layers.md").read_text()
    assert "| tiny_3x3 |" in markdown
    assert done.stdout.rstrip().endswith(
        markdown.rstrip().splitlines()[-1]
    )  # md table printed last
    if not environment["jaxcnn_cuda_available"]:
        assert "NOT available" in markdown and "NOT available" in done.stderr


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_device_time_on_gpu_reads_kernels():
    x = jnp.ones((1024, 1024), jnp.bfloat16)
    timing = device_time(_matmul, x, iters=10, warmup=2)
    _assert_sane_stats(timing, 10)
    assert timing.is_device_time, timing.note
    assert timing.method.startswith("trace/")
    assert timing.kernels and timing.kernels_per_call >= 1
    assert timing.median_span_ms >= timing.min_ms * 0.999
    # Device time excludes host dispatch, so it stays below the synced wall latency.
    assert timing.median_ms < wall_time(_matmul, x, iters=10, warmup=2).median_ms


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_call_annotations_split_a_real_trace_like_periodic_chunks(tmp_path):
    device_time(_matmul, jnp.ones((512, 512)), iters=6, warmup=2, trace_dir=str(tmp_path))
    (path,) = tmp_path.rglob("*.xplane.pb")
    profile = jax.profiler.ProfileData.from_file(str(path))
    events, starts = gpu_kernel_events(profile), call_annotation_starts(profile)
    assert len(starts) == 6
    assert _split_at_call_starts(events, starts) == _split_periodic(events, 6)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_device_time_on_gpu_scales_with_work():
    small = device_time(_matmul, jnp.ones((2048, 2048), jnp.float32), iters=5).median_ms
    large = device_time(_matmul, jnp.ones((4096, 4096), jnp.float32), iters=5).median_ms
    assert 3 < large / small < 16  # 8x the FLOPs
