"""Speed: per-layer time jaxcnn vs XLA, speedups, the kernel/variant each ran, end to end; run vs run
(two GPU runs, e.g. of two commits). A CPU run shows its reference-path times and no ratio."""

import streamlit as st

from jaxcnn.dashboard import charts, data, ui

st.title("Speed")
source = ui.page_source()
measured = source.measured

with ui.guard("Speed"):
    runs = ui.runs()
    run = ui.pick_run_or_stop(data.timed_runs(runs), key="speed-run",
                              empty="No data yet: run `jaxcnn profile squeezenet1_1 --db DB` to time a model's layers.")
    run_id = int(run["id"])
    reference = data.reference_path_run(run)
    if reference:
        st.warning(data.REFERENCE_PATH_NOTE)

    with ui.guard("End to end"):
        e2e = ui.read("end_to_end", run_id)
        st.subheader("End to end")
        if e2e.empty:
            st.info("This run has no whole-model times.")
        else:
            device = bool((e2e["metric"] == "device_time_ms").any())
            what = "device time" if device else "host wall time"
            main = e2e[e2e["metric"] == ("device_time_ms" if device else "wall_time_ms")].set_index("backend")["time_ms"]
            cols = st.columns(len(main) + 1)
            for col, (backend, ms) in zip(cols, main.items()):
                col.metric(f"{backend} {what} ({measured})", ui.fmt_ms(ms),
                           help="median of the timed calls; " + data.SOURCE_MEANINGS[measured])
            if {"xla", "jaxcnn"} <= set(main.index) and not reference:
                cols[-1].metric(f"speedup of jaxcnn over XLA ({measured})", f"{main['xla'] / main['jaxcnn']:.3f}×",
                                help="XLA device time / jaxcnn device time; above 1: jaxcnn is faster")
            ui.chart(charts.end_to_end_bars(e2e, source=measured))
            ui.table(e2e, f"run{run_id}_end_to_end", key="e2e")

    with ui.guard("Per layer"):
        long, metric = ui.read("layer_times", run_id)
        wide = data.speedup_table(long)
        st.subheader("Per layer")
        ui.chart(charts.layer_time_bars(long, metric, source=measured))
        if reference:
            wide = wide.drop(columns=["speedup"])
        elif wide["speedup"].notna().any():
            ui.chart(charts.speedup_bars(wide, source=measured))
            faster = int((wide["speedup"] > 1).sum())
            st.caption(f"jaxcnn is faster on {faster} of {int(wide['speedup'].notna().sum())} layers.")
        st.markdown("**Chosen kernel / variant per layer** (the variant recorded by the run, else the "
                    "kernel with the most device time) with times in ms")
        ui.table(wide, f"run{run_id}_layers", key="layers")

    st.subheader("Run vs run")
    st.caption("Per-layer device time of two GPU runs, e.g. one model at two commits: what a change did.")
    if reference:
        st.info("Run vs run compares GPU device times; this run was timed on a CPU (the lax reference path). "
                "Pick a GPU run above.")
        st.stop()
    other_candidates = data.compare_candidates(runs, run)
    if other_candidates.empty:
        st.info("No other GPU run with per-layer times in this store: profile the model again on a GPU "
                "(`jaxcnn profile MODEL --db DB`), e.g. at another commit, to compare.")
    else:
        with ui.guard("Run vs run"):
            other = ui.pick_run(other_candidates, "Compare with (run B; run A is the one above)", key="speed-other",
                                position=1, default=data.default_compare_id(other_candidates, run))
            header = data.compare_header(run, other)
            st.dataframe(header, hide_index=True, width="stretch")
            if header["commit"].nunique() == 1:
                st.caption(f"Both runs are of commit {header['commit'].iloc[0]}: differences are the runs' own "
                           "(model, batch, GPU, noise), not a code change.")
            table, metric = ui.read("compare_runs", run_id, int(other["id"]))
            ui.chart(charts.compare_bars(table, run["label"], other["label"], source=measured))
            ui.table(table, f"run{run_id}_vs_run{int(other['id'])}", key="compare",
                     caption=f"Metric: {metric}; b_over_a < 1 means run B is faster.")
