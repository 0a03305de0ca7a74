"""Donation, max-batch and rematerialization results as store runs, for the dashboard.

Every result is one run of kind 'plan' (`runs.note` says which analysis: 'donation',
'max_batch' or 'remat'; `runs.extra` holds its settings) with whole-model measurements
(layer_id NULL, unit 'bytes' unless said otherwise). Metric names:

  peak_bytes              footprint of the compiled program: argument + output - alias + temp
                          bytes of XLA's memory_analysis (planner.footprint.footprint_bytes)
  temp_bytes, argument_bytes, output_bytes, alias_bytes
                          the memory_analysis fields themselves
donation (runs.batch = the batch), variant 'undonated' (jax.jit) or 'donated' (planned):
  peak_bytes, temp_bytes, argument_bytes, output_bytes, alias_bytes per variant;
  donated_bytes           bytes of the donated arguments (variant 'donated');
  saved_bytes             peak_bytes undonated - donated (variant 'donated');
  runs.extra: donate_argnums, donate_argnames, decisions [{label, donated, reason, bytes}].
max_batch (runs.batch NULL), variant 'batch=N' for each compiled batch N (extra {"batch": N}):
  peak_bytes, temp_bytes, argument_bytes, output_bytes, alias_bytes per compiled batch;
  max_batch               unit 'images': variant 'verified' (the answer) and 'predicted' (the
                          affine fit alone);
  budget_bytes;
  runs.extra: budget_bytes, train, optimizer, fit_intercept, fit_slope, fit_max_relative_residual,
  verified, compiles.
remat (runs.batch = the batch), variant = policy name:
  peak_bytes              measured (policies not compiled have none);
  predicted_peak_bytes    program-order prediction; predicted_residual_peak_bytes residual model;
  residual_bytes;
  recompute_flops         unit 'flop';
  runs.extra: budget_bytes, chosen, optimizer, policies [{policy, description}].
"""

from __future__ import annotations

import jax

from jaxcnn.memory.batch import MaxBatch
from jaxcnn.memory.donation import DonationSavings
from jaxcnn.memory.footprint import footprint_bytes
from jaxcnn.memory.remat import RematAdvice
from jaxcnn.profile.environment import collect_environment

_STAT_METRICS = {
    "temp_size_in_bytes": "temp_bytes", "argument_size_in_bytes": "argument_bytes",
    "output_size_in_bytes": "output_bytes", "alias_size_in_bytes": "alias_bytes",
    "footprint_bytes": "peak_bytes",
}


def _device() -> str:
    return "gpu" if jax.default_backend() == "gpu" else "cpu"


def _stat_rows(stats: dict[str, int], backend: str, variant: str, extra: dict | None = None) -> list[dict]:
    rows = []
    for name, metric in _STAT_METRICS.items():
        if name in stats:
            rows.append(dict(backend=backend, metric=metric, median=float(stats[name]), unit="bytes",
                             variant=variant, extra=extra))
    return rows


def _add_run(store, note: str, *, model: str, backend: str, batch: int | None, dtype: str, extra: dict) -> int:
    env = collect_environment()
    git = (env.get("extra") or {}).get("git") or {}
    return store.add_run("plan", model=model, backend=backend, batch=batch, dtype=dtype, device=_device(),
                         note=note, git_commit=git.get("commit"), environment=env, extra=extra)


def record_donation(store, savings: DonationSavings, *, model: str, batch: int, dtype: str,
                    backend: str = "xla", extra: dict | None = None) -> int:
    """One 'donation' run; returns its id."""
    plan = savings.plan
    run_id = _add_run(store, "donation", model=model, backend=backend, batch=batch, dtype=dtype, extra=dict(
        extra or {}, donate_argnums=list(plan.donate_argnums), donate_argnames=list(plan.donate_argnames),
        decisions=[dict(label=d.label, donated=d.donated, reason=d.reason, bytes=d.bytes) for d in plan.decisions]))
    rows = []
    for variant, stats in (("undonated", savings.before), ("donated", savings.after)):
        rows += _stat_rows({**stats, "footprint_bytes": footprint_bytes(stats)}, backend, variant)
    rows.append(dict(backend=backend, metric="donated_bytes", median=float(plan.donated_bytes), unit="bytes",
                     variant="donated"))
    rows.append(dict(backend=backend, metric="saved_bytes", median=float(savings.saved_bytes), unit="bytes",
                     variant="donated"))
    store.add_measurements(run_id, rows)
    return run_id


def record_max_batch(store, result: MaxBatch, *, model: str, dtype: str, train: bool, backend: str = "xla",
                     optimizer: str | None = None, extra: dict | None = None) -> int:
    """One 'max_batch' run with the compiled curve; returns its id."""
    run_id = _add_run(store, "max_batch", model=model, backend=backend, batch=None, dtype=dtype, extra=dict(
        extra or {}, budget_bytes=result.budget_bytes, train=train, optimizer=optimizer if train else None,
        fit_intercept=result.fit.intercept, fit_slope=result.fit.slope,
        fit_max_relative_residual=result.fit.max_relative_residual, verified=result.verified,
        compiles=result.compiles))
    rows = []
    for batch, stats in result.stats.items():
        rows += _stat_rows(stats, backend, f"batch={batch}", {"batch": batch})
    rows.append(dict(backend=backend, metric="max_batch", median=float(result.batch), unit="images",
                     variant="verified"))
    rows.append(dict(backend=backend, metric="max_batch", median=float(result.predicted_batch), unit="images",
                     variant="predicted"))
    rows.append(dict(backend=backend, metric="budget_bytes", median=float(result.budget_bytes), unit="bytes"))
    store.add_measurements(run_id, rows)
    return run_id


def record_remat(store, advice: RematAdvice, *, dtype: str, backend: str = "xla", optimizer: str | None = None,
                 extra: dict | None = None) -> int:
    """One 'remat' run, a row set per policy; returns its id."""
    run_id = _add_run(store, "remat", model=advice.model, backend=backend, batch=advice.batch, dtype=dtype, extra=dict(
        extra or {}, budget_bytes=advice.budget_bytes, chosen=advice.chosen, optimizer=optimizer,
        policies=[dict(policy=r.policy, description=r.description) for r in advice.rows]))
    rows = []
    for r in advice.rows:
        values = dict(peak_bytes=r.measured, predicted_peak_bytes=r.predicted,
                      predicted_residual_peak_bytes=r.predicted_residuals, residual_bytes=r.residual_bytes,
                      recompute_flops=r.recompute_flops)
        for metric, value in values.items():
            if value is not None:
                rows.append(dict(backend=backend, metric=metric, median=float(value), variant=r.policy,
                                 unit="flop" if metric == "recompute_flops" else "bytes"))
    store.add_measurements(run_id, rows)
    return run_id
