"""What the dashboard shows, as pandas frames read from a jaxcnn.store.Store: one import for the
pages, the charts and the tests, re-exporting the modules that hold each job.

Every reader takes an open Store (or its path) and returns a DataFrame whose column names carry
their unit (``time_ms``, ``size_mib``, ``tflops``...), so pages and charts never guess units.
Nothing here imports Streamlit or jax. ``jaxcnn.dashboard.ui.read(name, ...)`` calls
``data.<name>``, so every reader a page uses is named here.

    sources        -- which store to show (``choose_source``: the user's DB, else the shipped
                      exports in a cached SQLite file; ``shipped_provenance``), the source label of
                      each number (measured / shipped / model / computed: ``column_sources``), and
                      what every reader shares (NoData, read-only SQL, MIB);
    runs_data      -- the runs of a store: the Runs table, run labels, where a run ran, CPU runs
                      on the lax reference path (``reference_path_run``), the run a page starts from;
    speed_data     -- per-layer times and speedups, whole-model times, run vs run comparison,
                      roofline points and the GPU's ceilings;
    memory_data    -- XLA's memory statistics, the planner's arenas and buffers, live bytes,
                      donation savings, peak bytes against batch;
    sparsity_data  -- activation sparsity and the dense/sparse decision per layer.
"""

from __future__ import annotations

from jaxcnn.dashboard.memory_data import (
    MEMORY_ARENA_NOTE,
    MEMORY_QUANTITIES,
    MEMORY_STAT_METRICS,
    PLAN_HINT,
    algorithm_role,
    default_plan_run_id,
    donation_savings,
    live_bytes_curve,
    max_batch_curve,
    memory_stats,
    peak_formula,
    plan_buffers,
    plan_measurements,
    plan_runs,
    plan_summary,
)
from jaxcnn.dashboard.runs_data import (
    REFERENCE_PATH_NOTE,
    RUN_COLUMNS,
    RUN_SUMMARY_COLUMNS,
    SUMMARY_CELL_CHARS,
    default_run_id,
    reference_path_run,
    run_label,
    run_where,
    runs_summary,
    runs_table,
    timed_runs,
)
from jaxcnn.dashboard.sources import (
    CACHE_ENV_VAR,
    COMPUTED,
    COMPUTED_COLUMNS,
    MEASURED,
    MIB,
    MODEL,
    MODEL_COLUMNS,
    MODEL_PREFIX,
    NOT_QUANTITIES,
    SHIPPED,
    SHIPPED_DIR,
    SHORT_COMMIT,
    SOURCE_MEANINGS,
    NoData,
    Source,
    cache_dir,
    choose_source,
    column_sources,
    count_runs,
    default_db_path,
    shipped_files,
    shipped_provenance,
    shipped_store,
    shipped_summary,
    short_commit,
    sources_caption,
)
from jaxcnn.dashboard.sparsity_data import (
    SPARSE_PATTERN,
    crossover_zero_pct,
    dense_sparse_decisions,
    sparsity_table,
)
from jaxcnn.dashboard.speed_data import (
    TIME_METRICS,
    Ceilings,
    ceiling_lines,
    compare_candidates,
    compare_header,
    compare_refusal,
    compare_runs,
    default_compare_id,
    end_to_end,
    layer_table,
    layer_times,
    roofline_points,
    run_ceilings,
    short_kernel_name,
    speedup_table,
    time_metric,
)

__all__ = [
    "CACHE_ENV_VAR", "COMPUTED", "COMPUTED_COLUMNS", "MEASURED", "MEMORY_ARENA_NOTE", "MEMORY_QUANTITIES",
    "MEMORY_STAT_METRICS", "MIB", "MODEL", "MODEL_COLUMNS", "MODEL_PREFIX", "NOT_QUANTITIES", "PLAN_HINT",
    "REFERENCE_PATH_NOTE", "RUN_COLUMNS", "RUN_SUMMARY_COLUMNS", "SHIPPED", "SHIPPED_DIR", "SHORT_COMMIT",
    "SOURCE_MEANINGS", "SPARSE_PATTERN", "SUMMARY_CELL_CHARS", "TIME_METRICS", "Ceilings", "NoData", "Source",
    "algorithm_role", "cache_dir", "ceiling_lines", "choose_source", "column_sources", "compare_candidates",
    "compare_header", "compare_refusal", "compare_runs", "count_runs", "crossover_zero_pct", "default_compare_id",
    "default_db_path", "default_plan_run_id", "default_run_id", "dense_sparse_decisions", "donation_savings",
    "end_to_end", "layer_table", "layer_times", "live_bytes_curve", "max_batch_curve", "memory_stats",
    "peak_formula", "plan_buffers", "plan_measurements", "plan_runs", "plan_summary", "reference_path_run",
    "roofline_points", "run_ceilings", "run_label", "run_where", "runs_summary", "runs_table", "shipped_files",
    "shipped_provenance", "shipped_store", "shipped_summary", "short_commit", "short_kernel_name",
    "sources_caption", "sparsity_table", "speedup_table", "time_metric", "timed_runs",
]
