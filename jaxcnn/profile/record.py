"""Writes a ModelProfile into the SQLite store: one run, its layers, timings, sparsity,
memory stats, roofline floors and (when the perf model is available) traffic predictions."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any

from jaxcnn.profile.device_time import TimingStats
from jaxcnn.profile.model_profile import ModelProfile
from jaxcnn.store import Store, StoreError


@contextlib.contextmanager
def writable_store(store: Any) -> Iterator[Any]:
    """`store` as an open, writable Store (None stays None): a path is opened here, its schema
    checked and write access required, and closed when the block ends; a Store is used as is."""
    if store is None or isinstance(store, Store):
        if store is not None and store.read_only:
            raise StoreError(f"profile store {store.path} is open read-only: cannot record a profile in it")
        yield store
        return
    if not isinstance(store, (str, os.PathLike)):
        raise TypeError(f"store must be a jaxcnn.store.Store, a path or None, got {type(store).__name__}")
    with Store(store, read_only=False) as opened:
        yield opened


def _layer_row(index: int, info, extra_params: dict[str, Any]) -> dict[str, Any]:
    params = dict(info.op_kwargs(), block=info.block, dtype=info.dtype, **extra_params)
    return dict(
        idx=index, name=info.name, op=info.op,
        input_shapes=[list(s) for s in info.input_shapes],
        weight_shape=None if info.weight_shape is None else list(info.weight_shape),
        output_shape=list(info.output_shape),
        params=json.loads(json.dumps(params, default=list)), flops=int(info.flops), bytes=int(info.bytes),
    )


def _predictions(profile: ModelProfile) -> list[tuple[int, dict[str, Any]]]:
    """(layer index, row) of the roofline floor of every layer, plus the traffic model's for conv
    layers if importable: one per kernel family the model describes, whichever backends ran (a
    jaxcnn layer may run XLA's kernel; readers pick the family of the kernel that ran)."""
    rows = []
    for index, layer in enumerate(profile.layers):
        if layer.floor:
            rows.append((index, dict(model="roofline", time_ms=layer.floor["floor_ms"],
                                     extra=json.loads(json.dumps(layer.floor, default=str)))))
    try:
        from jaxcnn.costmodel.model import model_rows
    except ImportError:
        return rows
    gpu = profile.environment.get("gpu_name")
    for index, layer in enumerate(profile.layers):
        if layer.info.op == "conv2d" and gpu:
            rows += [(index, row) for row in model_rows(layer.info, gpu)]
    return rows


def timing_row(timing: TimingStats, **columns) -> dict[str, Any]:
    """A measurements-table row from a timing (extra: method, kernels)."""
    extra = {k: v for k, v in dataclasses.asdict(timing).items()
             if k in ("method", "note", "is_device_time", "kernels_per_call", "median_span_ms")}
    kernels = getattr(timing, "kernels", ())
    extra["kernels"] = [dataclasses.asdict(k) for k in kernels]
    return dict(median=timing.median_ms, p10=timing.p10_ms, p90=timing.p90_ms, min=timing.min_ms,
                max=timing.max_ms, n=timing.n, unit="ms", extra=json.loads(json.dumps(extra, default=str)),
                **columns)


def _measurements(profile: ModelProfile) -> list[tuple[int | None, dict[str, Any]]]:
    """(layer index or None for the whole model, row) of every timing and memory statistic."""
    metric = "device_time_ms" if profile.is_device_time else "wall_time_ms"
    rows = [(index, timing_row(t, backend=b, metric=metric))
            for index, layer in enumerate(profile.layers) for b, t in layer.times.items()]
    rows += [(None, timing_row(t, backend=b, metric=metric)) for b, t in profile.end_to_end.items()]
    rows += [(None, timing_row(t, backend=b, metric="wall_time_ms")) for b, t in profile.wall.items()]
    rows += [(None, dict(backend=b, metric=name.replace("_size_in_bytes", "_bytes").replace("_in_bytes", "_bytes"),
                         median=value, unit="bytes"))
             for b, stats in profile.memory.items() for name, value in stats.items()]
    return rows


def _sparsity(profile: ModelProfile) -> list[tuple[int, dict[str, Any]]]:
    return [(index, dict(zero_fraction=l.input_zero_fraction, sample_count=profile.batch,
                         extra=dict(output_zero_fraction=l.output_zero_fraction)))
            for index, l in enumerate(profile.layers) if l.input_zero_fraction is not None]


def _with_layer_ids(rows: list[tuple[int | None, dict[str, Any]]], layer_ids: list[int]) -> list[dict[str, Any]]:
    return [dict(row, layer_id=None if index is None else layer_ids[index]) for index, row in rows]


def record_profile(profile: ModelProfile, store: Any, *, predict: bool = True) -> int:
    """Adds the profile as one run in one transaction: a failure or a kill midway leaves no trace
    of it. `store`: a writable Store or a path. Returns the run id (also kept in profile.run_ids)."""
    # Every row is built before the transaction, so the write lock is held only for the inserts.
    git = (profile.environment.get("extra") or {}).get("git") or {}
    layers = [_layer_row(i, l.info, l.params) for i, l in enumerate(profile.layers)]
    measurements, sparsity = _measurements(profile), _sparsity(profile)
    predictions = _predictions(profile) if predict else []
    with writable_store(store) as target, target.transaction():
        run_id = target.add_run(
            "profile", model=profile.model, backend=",".join(profile.backends), batch=profile.batch,
            dtype=profile.dtype, device="gpu" if profile.is_device_time else "cpu", note=profile.note or None,
            git_commit=git.get("commit"), environment=profile.environment, extra=profile.extra or None,
        )
        layer_ids = target.add_layers(run_id, layers)
        target.add_measurements(run_id, _with_layer_ids(measurements, layer_ids))
        target.add_sparsity(run_id, _with_layer_ids(sparsity, layer_ids))
        if predictions:
            target.add_predictions(run_id, _with_layer_ids(predictions, layer_ids))
    profile.run_ids["store"] = run_id
    return run_id
