"""Sparsity frames of a run: per-layer activation zero fractions, the dense/sparse kernel
decision per layer and the zero fraction where sparse starts to win.
"""

from __future__ import annotations

import re

import pandas as pd

from jaxcnn.dashboard.sources import NoData
from jaxcnn.dashboard.speed_data import layer_table, layer_times
from jaxcnn.store import Store

SPARSE_PATTERN = re.compile(r"sparse", re.IGNORECASE)


def sparsity_table(store: Store, run_id: int) -> pd.DataFrame:
    """Per-layer activation sparsity (zero fraction of the layer's input and output)."""
    rows = store.sparsity(int(run_id))
    if rows.empty:
        raise NoData(f"run {run_id} has no sparsity measurements: run `jaxcnn profile MODEL --db DB` "
                     "(without --no-sparsity)")
    layers = layer_table(store, run_id)[["idx", "layer", "op", "input_shapes", "output_shape"]]
    out_zero = [(e or {}).get("output_zero_fraction") if isinstance(e, dict) else None for e in rows["extra"]]
    table = pd.DataFrame({"layer": rows["layer"], "input_zero_pct": 100 * rows["zero_fraction"].astype("float64"),
                          "output_zero_pct": 100 * pd.Series(out_zero, dtype="float64").to_numpy()})
    return layers.merge(table, on="layer", how="inner").sort_values("idx", ignore_index=True)


def dense_sparse_decisions(store: Store, run_id: int) -> pd.DataFrame:
    """Per layer: the best dense and best sparse time (backends or variants named *sparse*), the
    faster one as the decision, and the input zero fraction it was measured at."""
    long, _metric = layer_times(store, run_id)
    kind = [("sparse" if SPARSE_PATTERN.search(f"{b} {v}") else "dense") for b, v in zip(long["backend"], long["variant"])]
    long = long.assign(kind=kind)
    if not (long["kind"] == "sparse").any():
        raise NoData(f"run {run_id} has no sparse-kernel measurements yet: the dense/sparse decision appears "
                     "once a run times sparse variants (a backend or variant whose name contains `sparse`)")
    best = long.groupby(["idx", "layer", "kind"], as_index=False)["time_ms"].min()
    wide = best.pivot_table(index=["idx", "layer"], columns="kind", values="time_ms").reset_index()
    wide = wide.rename(columns={"dense": "dense_ms", "sparse": "sparse_ms"}).dropna(subset=["dense_ms", "sparse_ms"])
    wide["sparse_over_dense"] = wide["sparse_ms"] / wide["dense_ms"]
    wide["decision"] = (wide["sparse_ms"] < wide["dense_ms"]).map({True: "sparse", False: "dense"})
    sparsity = sparsity_table(store, run_id)[["layer", "input_zero_pct"]]
    return wide.merge(sparsity, on="layer", how="left").sort_values("idx", ignore_index=True)


def crossover_zero_pct(decisions: pd.DataFrame) -> float | None:
    """The input zero % where sparse starts to win: the ratio sparse/dense fitted linearly in the
    zero % (least squares over the measured layers) and solved for 1. None if it never crosses
    inside [0, 100] or there are fewer than two distinct zero fractions."""
    points = decisions.dropna(subset=["input_zero_pct", "sparse_over_dense"])
    if points["input_zero_pct"].nunique() < 2:
        return None
    x, y = points["input_zero_pct"].to_numpy(float), points["sparse_over_dense"].to_numpy(float)
    xm, ym = x.mean(), y.mean()
    slope = ((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum()
    if slope == 0:
        return None
    crossing = xm + (1.0 - ym) / slope
    return float(crossing) if 0.0 <= crossing <= 100.0 else None
