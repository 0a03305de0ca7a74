"""Roofline: layers on the roofline of the run's GPU, the traffic model's predictions beside the
measurements, and the model's error per layer."""

import pandas as pd
import streamlit as st

from jaxcnn.dashboard import charts, data, ui

st.title("Roofline")
measured = ui.page_source().measured

with ui.guard("Roofline"):
    run = ui.pick_run_or_stop(data.timed_runs(ui.runs()), key="roofline-run",
                              empty="No data yet: run `jaxcnn profile squeezenet1_1 --db DB` on a GPU machine.")
    run_id = int(run["id"])
    ceilings = data.run_ceilings(run)
    if ceilings is None:
        where = "a CPU run (host wall times)" if run.get("device") == "cpu" else f"GPU {run.get('gpu_name')!r}"
        st.warning(f"No roofline for this run: {where} has no entry in jaxcnn.profile.gpu_specs. "
                   "Pick a GPU run, or profile on a GPU: `jaxcnn profile MODEL --db DB`.")
        st.stop()

    points = ui.read("roofline_points", run_id)
    c1, c2, c3 = st.columns(3)
    c1.metric(f"DRAM bandwidth ({ceilings.memory_source})", f"{ceilings.memory_bytes_per_s / 1e12:.2f} TB/s")
    c2.metric(f"{ceilings.precision} compute ({ceilings.compute_source})",
              f"{ceilings.compute_flops_per_s / 1e12:.0f} TFLOP/s")
    c3.metric("ridge point (compute ceiling / DRAM bandwidth)", f"{ceilings.ridge_flop_per_byte:.0f} FLOP/byte")
    # From below the lowest layer to past the ridge, so both the slope and the flat top show.
    roof = data.ceiling_lines(ceilings, float(points["flop_per_byte"].min()) / 2,
                              max(float(points["flop_per_byte"].max()) * 2, ceilings.ridge_flop_per_byte * 4))
    ui.chart(charts.roofline_chart(points, roof, ceilings, source=f"{measured} times; {data.COMPUTED} FLOPs and "
                                                                    f"bytes; ceilings as labelled"))
    st.caption("Traffic per layer is the layer's compulsory bytes (inputs, weights, outputs), counted from its "
               "shapes; the roof is min(compute ceiling, intensity × DRAM bandwidth). Hover a point for layer, "
               "shapes and bytes.")

    st.subheader("Model vs measurement")
    modelled = points["prediction"].eq("traffic model")
    st.metric(f"median |error| of the traffic model ({data.MODEL} vs {measured})",
              f"{points.loc[modelled, 'error_pct'].abs().median():.1f} %" if modelled.any() else "n/a",
              help="over the layers the traffic/time model predicts (conv layers); others use the roofline floor")
    # The roofline floor is a bound, not a prediction: its "error" is how far the layer is from it
    # (pct_of_floor in the table). The error chart shows the traffic model where it predicts.
    versus = f"{data.MODEL} vs {measured}"
    ui.chart(charts.model_error_bars(points[modelled] if modelled.any() else points, source=versus))
    if modelled.any():
        st.caption(f"The traffic model predicts {int(modelled.sum())} of {len(points)} layer timings (conv layers); "
                   "the others appear with their roofline floor in the chart below and the table.")
    ui.chart(charts.predicted_vs_measured(points, source=versus))
    columns = ["idx", "layer", "op", "backend", "variant", "input_shapes", "output_shape", "gflop", "mib",
               "flop_per_byte", "time_ms", "tflops", "gb_per_s", "pred_floor_ms", "pct_of_floor",
               "pred_model_ms", "pred_dram_bytes", "prediction", "error_pct"]
    ui.table(points[[c for c in columns if c in points.columns]], f"run{run_id}_roofline", key="roofline")
    ceiling_rows = pd.DataFrame([
        {"ceiling": "DRAM", "value": ceilings.memory_bytes_per_s / 1e12, "unit": "TB/s", "source": ceilings.memory_source},
        {"ceiling": f"compute {ceilings.precision}", "value": ceilings.compute_flops_per_s / 1e12, "unit": "TFLOP/s",
         "source": ceilings.compute_source},
    ])
    ui.table(ceiling_rows, f"{ceilings.gpu}_ceilings", key="ceilings",
             caption="measured: on our H200 (copy / GEMM benchmarks); datasheet: NVIDIA's dense numbers.")
