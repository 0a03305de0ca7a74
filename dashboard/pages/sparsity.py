"""Sparsity: per-layer activation sparsity, and the dense/sparse decision with the measured crossover."""

import streamlit as st

from jaxcnn.dashboard import charts, data, ui

st.title("Sparsity")
measured = ui.page_source().measured

with ui.guard("Sparsity"):
    runs = ui.runs()
    run = ui.pick_run_or_stop(runs[runs["sparsity"] > 0], key="sparsity-run",
                              empty="No data yet: run `jaxcnn profile MODEL --db DB` (without --no-sparsity) "
                                    "to measure activation sparsity.")
    run_id = int(run["id"])
    table = ui.read("sparsity_table", run_id)
    c1, c2, c3 = st.columns(3)
    c1.metric(f"mean input zeros ({measured})", f"{table['input_zero_pct'].mean():.1f} %")
    c2.metric(f"layers with ≥ 50 % input zeros ({measured})", int((table["input_zero_pct"] >= 50).sum()))
    c3.metric(f"max input zeros ({measured})", f"{table['input_zero_pct'].max():.1f} %")
    ui.chart(charts.sparsity_bars(table, source=measured))
    ui.table(table, f"run{run_id}_sparsity", key="sparsity",
             caption="Zero fraction of each layer's input and output activation on the profiling input.")

    st.subheader("Dense or sparse kernel")
    if data.reference_path_run(run):
        st.info("This run was timed on a CPU (the lax reference path): dense and sparse times of that path say "
                "nothing about jaxcnn's kernels, so no dense/sparse decision is shown.")
        st.stop()
    with ui.guard("Dense/sparse decision"):
        decisions = ui.read("dense_sparse_decisions", run_id)
        crossover = data.crossover_zero_pct(decisions)
        c1, c2 = st.columns(2)
        c1.metric(f"layers where sparse wins ({measured})",
                  f"{int((decisions['decision'] == 'sparse').sum())} of {len(decisions)}")
        c2.metric(f"crossover (fit of {measured} times)",
                  "none in 0-100 %" if crossover is None else f"{crossover:.1f} % zeros",
                  help="input zero % where sparse/dense time crosses 1× (least-squares line over the layers)")
        ui.chart(charts.crossover_chart(decisions, crossover, source=measured))
        ui.table(decisions, f"run{run_id}_dense_sparse", key="decisions")
