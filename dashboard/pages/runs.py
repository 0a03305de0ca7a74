"""Runs: every run in the store (what, where, which commit); pick one or two for the other pages.
On the shipped data: what it was made from (GPU, dates, commits, store schema)."""

import streamlit as st

from jaxcnn.dashboard import data, ui

st.title("Runs")
source = ui.page_source()

with ui.guard("Runs"):
    runs = ui.runs()
    if runs.empty:
        st.info("No runs in this store yet: run `jaxcnn profile squeezenet1_1 --db DB` to record one.")
        st.stop()
    gpus = sorted({g for g in runs["gpu_name"].dropna() if g}) or ["none (CPU)"]
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Runs", len(runs))
    c2.metric("Models", runs["model"].nunique())
    c3.metric("GPUs", ", ".join(gpus))
    c4.metric("Kinds", ", ".join(sorted(runs["kind"].unique())))

    if source.shipped:
        with ui.guard("Shipped data"):
            st.subheader("Shipped data")
            provenance = ui.shipped_provenance()
            st.markdown(f"Made from: **{data.shipped_summary(provenance)}**.")
            ui.table(provenance, "shipped_data", key="shipped",
                     caption="One row per export in dashboard/shipped/: the UTC dates and commits its runs were "
                             "recorded at (-dirty: the tree had uncommitted changes) and the store schema version "
                             "it was written at.")

    ids = runs["id"].astype(int).tolist()
    labels = dict(zip(ids, runs["label"]))
    picked = [i for i in st.session_state.get(ui.PICKED_KEY, []) if i in ids]
    chosen = st.multiselect("Pick one run, or two to compare (Speed, Roofline, Memory and Sparsity start from these)",
                            ids, default=picked or [data.default_run_id(runs)], format_func=lambda i: labels[i], max_selections=2,
                            key="runs-pick")
    st.session_state[ui.PICKED_KEY] = list(chosen)

    st.subheader("All runs")
    ui.table(data.runs_summary(runs), "runs", key="runs",
             caption="recorded: UTC; where: the GPU the run was measured on, or CPU (the lax reference path); "
                     "commit: -dirty where the tree had uncommitted changes; layers / measurements / plans: rows "
                     "recorded under each run. A picked run's whole environment is in its panel below.")

    for run_id in chosen:
        run = runs[runs["id"] == run_id].iloc[0]
        with st.expander(f"Environment of {run['label']}", expanded=len(chosen) == 1):
            env = {k: run[k] for k in ("gpu_name", "gpu_count", "driver", "cuda_version", "jax_version",
                                       "jaxlib_version", "jaxcnn_version", "python", "platform", "hostname",
                                       "git_commit", "commit", "created_at", "backend", "note") if k in run.index}
            recorded = {k: str(v) for k, v in env.items() if v is not None and str(v) not in ("nan", "<NA>", "None", "")}
            st.json(recorded)
