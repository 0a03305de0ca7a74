"""Profile a zoo model: per-layer device time for each backend, end-to-end device time and wall
latency, activation sparsity, FLOPs/bytes and % of floor, XLA memory stats and the environment;
optionally recorded into the SQLite store. (Any other function: jaxcnn.profile.function_profile,
into the same ModelProfile.)

On a machine without a GPU it profiles the reference (lax) path with host wall time and says
so (`is_device_time=False`, run note).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from jaxcnn.models import get_model
from jaxcnn.models.backends import get_ops
from jaxcnn.models.layers import LayerInfo, Net
from jaxcnn.profile.device_time import TimingStats, device_times, wall_time
from jaxcnn.profile.environment import collect_environment
from jaxcnn.profile.gpu_specs import floor_ms, lookup_gpu_spec
from jaxcnn.profile.model_profile import LayerProfile, ModelProfile
from jaxcnn.profile.record import record_profile, writable_store

BACKENDS = ("xla", "jaxcnn")


def _layer_key(info: LayerInfo) -> tuple:
    """Layers that compute the same thing on the same shapes time the same: time them once."""
    return (info.op, info.input_shapes, info.weight_shape, tuple(sorted(info.op_kwargs().items())))


def time_layers(
    spec, params, batch: int, dtype, backends: Sequence[str], *, ops: Sequence[str] | None,
    iters: int, warmup: int, progress: Callable[[str], None] | None = None,
) -> tuple[list[LayerInfo], dict[str, dict[tuple, TimingStats]]]:
    """Each distinct layer alone on each backend, all in one profiler trace per backend."""
    infos = spec.layers(batch, dtype)
    timings: dict[str, dict[tuple, TimingStats]] = {}
    for backend in backends:
        unique = {}
        for layer_fn in spec.layer_fns(params, batch, dtype, backend, ops=tuple(ops) if ops else None):
            unique.setdefault(_layer_key(layer_fn.info), layer_fn)
        cases = [(key, lf.fn, lf.example_args) for key, lf in unique.items()]
        timings[backend] = device_times(
            cases, iters=iters, warmup=warmup,
            progress=None if progress is None else (lambda key, b=backend: progress(f"{b} {key[0]}")),
        )
    return infos, timings


def zero_fraction(x) -> float:
    """Fraction of x's elements that are exactly zero."""
    return float(jnp.mean((jnp.asarray(x) == 0).astype(jnp.float32)))


def activation_sparsity(spec, params, x, backend: str = "xla") -> list[tuple[float, float]]:
    """(input, output) zero fractions of every layer, in the layer table's order, from one
    eager forward pass on `x` whose ops record what they see."""
    record: list[tuple[float, float]] = []

    def recording(fn):
        def run(*args, **kwargs):
            out = fn(*args, **kwargs)
            record.append((zero_fraction(args[0]), zero_fraction(out)))
            return out
        return run

    ops = {name: recording(fn) for name, fn in get_ops(backend).items()}
    spec.body(Net(ops, params), x)
    return record


def memory_stats(fn: Callable, *args) -> dict[str, int]:
    """XLA's compiled memory analysis (bytes) of jit(fn)(*args)."""
    analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
    if analysis is None:
        return {}
    names = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
             "temp_size_in_bytes", "generated_code_size_in_bytes", "peak_memory_in_bytes")
    return {name: int(getattr(analysis, name)) for name in names if hasattr(analysis, name)}


def sample_input(spec, batch: int, dtype, seed: int = 0):
    """A realistic-ish image batch: smooth-ish random values, not zeros."""
    return jax.random.normal(jax.random.PRNGKey(seed + 1), spec.input_shape(batch), jnp.float32).astype(dtype)


def profile_model(
    name: str,
    *,
    batch: int = 1,
    dtype: Any = "bfloat16",
    backends: Sequence[str] = BACKENDS,
    iters: int = 20,
    warmup: int = 3,
    seed: int = 0,
    layer_ops: Sequence[str] | None = None,
    sparsity: bool = True,
    predict: bool = True,
    store: Any = None,
    note: str = "",
    progress: Callable[[str], None] | None = None,
) -> ModelProfile:
    """Profile zoo model `name`. `store`: a jaxcnn.store.Store, a path, or None (not stored).

    The store is opened (schema checked, write access required) before any profiling, so a bad
    store fails at once; the profile is recorded in one transaction at the end.
    layer_ops: which layer ops to time alone (default: all); every backend's end-to-end time
    is always measured.
    """
    check_count("batch", batch, 1)
    check_count("iters", iters, 1)
    check_count("warmup", warmup, 0)
    for backend in backends:
        get_ops(backend)  # unknown backend -> ValueError before any work
    spec = get_model(name)
    with writable_store(store) as target:
        profile = _profile(spec, batch, dtype, backends, iters, warmup, seed, layer_ops, sparsity, note, progress)
        if target is not None:
            (progress or (lambda message: None))("recording")
            record_profile(profile, target, predict=predict)
    return profile


def check_count(name: str, value: Any, least: int) -> None:
    """TypeError unless `value` is an int (not a bool), ValueError unless it is >= least."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")


def _profile(spec, batch, dtype, backends, iters, warmup, seed, layer_ops, sparsity, note, progress) -> ModelProfile:
    dtype = jnp.dtype(dtype)
    params = spec.init(seed, dtype)
    x = sample_input(spec, batch, dtype, seed)
    say = progress or (lambda message: None)

    say("timing layers")
    infos, layer_timings = time_layers(spec, params, batch, dtype, backends, ops=layer_ops,
                                       iters=iters, warmup=warmup, progress=progress)
    gpu = lookup_gpu_spec()
    zero_fractions = activation_sparsity(spec, params, x) if sparsity else []
    layers = []
    for index, info in enumerate(infos):
        key = _layer_key(info)
        times = {b: layer_timings[b][key] for b in backends if key in layer_timings[b]}
        zin, zout = zero_fractions[index] if index < len(zero_fractions) else (None, None)
        floor = floor_ms(info.flops, info.bytes, gpu, dtype.name) if gpu else None
        layers.append(LayerProfile(info, times, zin, zout, floor))

    say("timing end to end")
    forwards = {b: (lambda p, x, b=b: spec.apply(p, x, backend=b)) for b in backends}
    end_to_end, wall, memory = whole_model_timings(forwards, (params, x), iters=iters, warmup=warmup)
    is_device = all(t.is_device_time for t in end_to_end.values())
    return ModelProfile(spec.name, batch, dtype.name, tuple(backends), is_device, layers, end_to_end,
                        wall, memory, collect_environment(), timing_note(note, is_device))


def whole_model_timings(forwards: dict[str, Callable], args: tuple, *, iters: int, warmup: int):
    """(device time, host wall time, XLA memory stats) per backend of forwards[backend](*args)."""
    end_to_end = device_times([(b, f, args) for b, f in forwards.items()], iters=iters, warmup=warmup)
    wall = {b: wall_time(f, *args, iters=iters, warmup=warmup) for b, f in forwards.items()}
    memory = {b: memory_stats(f, *args) for b, f in forwards.items()}
    return end_to_end, wall, memory


def timing_note(note: str, is_device_time: bool) -> str:
    """The run's note, with why it holds no GPU device time where it holds none."""
    if is_device_time:
        return note
    why = ("no GPU device time: CPU reference path, host wall time" if jax.default_backend() == "cpu"
           else "no GPU device time: profiler trace had no kernel events")
    return (note + " " if note else "") + why


def summarize(profile: ModelProfile) -> list[str]:
    """Readable lines: end-to-end per backend and the slowest layers. XLA/jaxcnn ratios only for
    device times: without a GPU both backends ran the lax reference path, and a ratio of those
    times says nothing about jaxcnn's kernels."""
    lines = [f"{profile.model} batch={profile.batch} {profile.dtype} "
             f"({'device time' if profile.is_device_time else 'host wall time: ' + profile.note})"]
    if not profile.is_device_time:
        lines.append("  no XLA/jaxcnn ratio: both backends ran the lax reference path (profile on a GPU for one)")
    base = profile.end_to_end.get("xla") if profile.is_device_time else None
    for backend, timing in profile.end_to_end.items():
        ratio = f"  XLA/{backend} = {base.median_ms / timing.median_ms:.2f}" if base and backend != "xla" else ""
        lines.append(f"  {backend:8s} end-to-end {timing.median_ms:9.4f} ms [{timing.p10_ms:.4f}-{timing.p90_ms:.4f}]"
                     f"  wall {profile.wall[backend].median_ms:9.4f} ms{ratio}")
    # The slowest layers are where the time goes on either backend; whether jaxcnn is the slow
    # one is each layer's own XLA/jaxcnn ratio, never implied by the list.
    slowest = sorted(profile.layers, key=lambda l: -max((t.median_ms for t in l.times.values()), default=0))[:5]
    if slowest:
        lines.append("  slowest layers (median of the slower backend):")
    for layer in slowest:
        cells = "  ".join(f"{b} {t.median_ms:.4f} ms" for b, t in layer.times.items())
        versus = _versus_xla(layer.times) if profile.is_device_time else ""
        lines.append(f"    {layer.info.name:28s} {layer.info.op:8s} {cells}{versus}")
    compared = [l for l in profile.layers if {"xla", "jaxcnn"} <= set(l.times) and profile.is_device_time]
    if compared:
        slower = [l.info.name for l in compared if l.times["jaxcnn"].median_ms > l.times["xla"].median_ms]
        shown = ", ".join(slower[:8]) + (", ..." if len(slower) > 8 else "")
        lines.append(f"  jaxcnn slower than XLA on {len(slower)} of {len(compared)} layers" + (f": {shown}" if slower else ""))
    return lines


def _versus_xla(times: dict[str, TimingStats]) -> str:
    """'  XLA/jaxcnn = r (jaxcnn faster|slower)' where both backends timed the layer."""
    if not {"xla", "jaxcnn"} <= set(times) or not times["jaxcnn"].median_ms:
        return ""
    ratio = times["xla"].median_ms / times["jaxcnn"].median_ms
    verdict = "faster" if ratio > 1 else "slower" if ratio < 1 else "as fast"
    return f"  XLA/jaxcnn = {ratio:.2f} (jaxcnn {verdict})"
