"""Writes a ModelProfile into the SQLite store: one run, its layers, timings, sparsity,
memory stats, roofline floors and (when the perf model is available) traffic predictions."""

from __future__ import annotations

import json
from typing import Any

from jaxcnn.profile.profiler import ModelProfile, timing_row


def _open(store: Any):
    from jaxcnn.store import Store

    return (store, False) if isinstance(store, Store) else (Store(store), True)


def _layer_row(index: int, info) -> dict[str, Any]:
    params = dict(info.op_kwargs(), block=info.block, dtype=info.dtype)
    return dict(
        idx=index, name=info.name, op=info.op,
        input_shapes=[list(s) for s in info.input_shapes],
        weight_shape=None if info.weight_shape is None else list(info.weight_shape),
        output_shape=list(info.output_shape),
        params=json.loads(json.dumps(params, default=list)), flops=int(info.flops), bytes=int(info.bytes),
    )


def _predictions(profile: ModelProfile, layer_ids: list[int]) -> list[dict[str, Any]]:
    """Roofline floors for every layer, plus the traffic model for conv layers if importable."""
    rows = []
    for layer, layer_id in zip(profile.layers, layer_ids):
        if layer.floor:
            rows.append(dict(layer_id=layer_id, model="roofline", time_ms=layer.floor["floor_ms"],
                             extra=json.loads(json.dumps(layer.floor, default=str))))
    try:
        from jaxcnn.perfmodel import predict_layer_info
    except ImportError:
        return rows
    gpu = profile.environment.get("gpu_name")
    for layer, layer_id in zip(profile.layers, layer_ids):
        if layer.info.op != "conv2d" or not gpu:
            continue
        for impl in profile.backends:
            row = predict_layer_info(layer.info, gpu=gpu, impl=impl)
            if row is not None:
                rows.append(dict(row, layer_id=layer_id))
    return rows


def record_profile(profile: ModelProfile, store: Any, *, predict: bool = True) -> int:
    """Adds the profile as one run; returns the run id (also kept in profile.run_ids)."""
    store, owned = _open(store)
    try:
        git = (profile.environment.get("extra") or {}).get("git") or {}
        run_id = store.add_run(
            "profile", model=profile.model, backend=",".join(profile.backends), batch=profile.batch,
            dtype=profile.dtype, device="gpu" if profile.is_device_time else "cpu", note=profile.note or None,
            git_commit=git.get("commit"), environment=profile.environment,
        )
        layer_ids = store.add_layers(run_id, [_layer_row(i, l.info) for i, l in enumerate(profile.layers)])
        metric = "device_time_ms" if profile.is_device_time else "wall_time_ms"
        rows = [timing_row(t, layer_id=lid, backend=b, metric=metric)
                for layer, lid in zip(profile.layers, layer_ids) for b, t in layer.times.items()]
        rows += [timing_row(t, layer_id=None, backend=b, metric=metric) for b, t in profile.end_to_end.items()]
        rows += [timing_row(t, layer_id=None, backend=b, metric="wall_time_ms") for b, t in profile.wall.items()]
        rows += [dict(layer_id=None, backend=b, metric=name.replace("_size_in_bytes", "_bytes").replace("_in_bytes", "_bytes"),
                      median=value, unit="bytes")
                 for b, stats in profile.memory.items() for name, value in stats.items()]
        store.add_measurements(run_id, rows)
        store.add_sparsity(run_id, [
            dict(layer_id=lid, zero_fraction=l.input_zero_fraction, sample_count=profile.batch,
                 extra=dict(output_zero_fraction=l.output_zero_fraction))
            for l, lid in zip(profile.layers, layer_ids) if l.input_zero_fraction is not None])
        if predict:
            store.add_predictions(run_id, _predictions(profile, layer_ids))
        profile.run_ids["store"] = run_id
        return run_id
    finally:
        if owned:
            store.close()
