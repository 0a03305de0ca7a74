"""Speed: per-layer time jaxcnn vs XLA, speedups, the kernel/variant each ran, end to end; run vs run."""

import streamlit as st

from jaxcnn.dashboard import charts, data, ui

st.title("Speed")
ui.page_source()

with ui.guard("Speed"):
    runs = ui.runs()
    timed = runs[(runs["layers"] > 0) & (runs["measurements"] > 0)]
    if timed.empty:
        st.info("No data yet: run `jaxcnn profile squeezenet1_1 --db DB` to time a model's layers.")
        st.stop()
    run = ui.pick_run(timed, "Run", key="speed-run", default=data.default_run_id(timed))
    run_id = int(run["id"])

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
                col.metric(f"{backend} ({what})", ui.fmt_ms(ms))
            if {"xla", "jaxcnn"} <= set(main.index):
                cols[-1].metric("speedup of jaxcnn over XLA", f"{main['xla'] / main['jaxcnn']:.3f}×",
                                help="XLA time / jaxcnn time; above 1: jaxcnn is faster")
            if run.get("device") == "cpu":
                st.caption("CPU run: times are host wall times of the reference path, not GPU device times.")
            ui.chart(charts.end_to_end_bars(e2e))
            ui.table(e2e, f"run{run_id}_end_to_end", key="e2e")

    with ui.guard("Per layer"):
        long, metric = ui.read("layer_times", run_id)
        wide = data.speedup_table(long)
        st.subheader("Per layer")
        ui.chart(charts.layer_time_bars(long, metric))
        if wide["speedup"].notna().any():
            ui.chart(charts.speedup_bars(wide))
            faster = int((wide["speedup"] > 1).sum())
            st.caption(f"jaxcnn is faster on {faster} of {int(wide['speedup'].notna().sum())} layers.")
        st.markdown("**Chosen kernel / variant per layer** (the variant recorded by the run, else the "
                    "kernel with the most device time) with times in ms")
        ui.table(wide, f"run{run_id}_layers", key="layers")

    st.subheader("Run vs run")
    other_candidates = timed[timed["id"] != run_id]
    if other_candidates.empty:
        st.info("Only one timed run in this store: record another (`jaxcnn profile ... --db DB`) to compare.")
    else:
        with ui.guard("Run vs run"):
            other = ui.pick_run(other_candidates, "Compare with (run B; run A is the one above)", key="speed-other",
                                position=1, prefer_model=run.get("model"))
            table, metric = ui.read("compare_runs", run_id, int(other["id"]))
            ui.chart(charts.compare_bars(table, run["label"], other["label"]))
            ui.table(table, f"run{run_id}_vs_run{int(other['id'])}", key="compare",
                     caption=f"Metric: {metric}; b_over_a < 1 means run B is faster.")
