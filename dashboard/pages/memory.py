"""Memory: buffer lifetimes × offsets per packing algorithm and XLA, live bytes over program order
with the lower bound and peak, naive / peers / ours / XLA, XLA's compiled memory (each quantity
explained), donation savings, max-batch curve."""

import pandas as pd
import streamlit as st

from jaxcnn.dashboard import charts, data, ui

st.title("Memory")
measured = ui.page_source().measured
computed = data.COMPUTED

with ui.guard("Memory"):
    runs = ui.runs()

    st.subheader("Arena packing")
    planned = runs[runs["plans"] > 0]
    if planned.empty:
        st.info("No data yet: no memory plans in this store. Run `jaxcnn plan MODEL --db DB` "
                "(e.g. `jaxcnn plan squeezenet1_1 --batch 8 --db jaxcnn_profiles.sqlite`) to record the "
                "buffers and every packing algorithm's arena.")
    else:
        with ui.guard("Arena packing"):
            # Start from a pack_2d-vs-XLA plan of the model picked on the Runs page, else of the
            # largest planned program.
            picked = runs[runs["id"].isin(st.session_state.get(ui.PICKED_KEY, [])[:1])]
            model = picked["model"].iloc[0] if len(picked) else None
            run = ui.pick_run(planned, "Planned run", key="memory-run",
                              default=data.default_plan_run_id(planned, ui.read("plan_runs"), model))
            run_id = int(run["id"])
            summary = ui.read("plan_summary", run_id)
            buffers = ui.read("plan_buffers", run_id)
            bound = float(summary["lower_bound_mib"].max())
            by_role = summary.groupby("role")["arena_mib"].min()
            cols = st.columns(5)
            cols[0].metric(f"lower bound ({computed})", ui.fmt_mib(bound),
                           help="peak of live bytes: no plan can use less")
            for col, role in zip(cols[1:], ("naive", "peer", "ours", "XLA")):
                value = by_role.get(role)
                delta = None if value is None or not bound else f"{100 * (value / bound - 1):+.1f} % vs bound"
                # XLA's arena is the temp size of its own compile; the others are our planner's packings.
                where = measured if role == "XLA" else computed
                col.metric(f"{role} (best, {where})" if role == "peer" else f"{role} ({where})", ui.fmt_mib(value),
                           delta=delta, delta_color="inverse")
            ui.chart(charts.arena_bars(summary, source=f"{computed} packings; XLA's: {measured} temp size"))
            ui.table(summary, f"run{run_id}_plans", key="plans",
                     caption="arena: the block each algorithm packs the program's buffers into; lower bound: the "
                             "most bytes live at once; XLA's row is its compiled temp size (its own packing).")

            # Every algorithm packs the same buffers; XLA's own assignment may list different ones.
            algorithms = summary["algorithm"].tolist()
            reference = next((a for a in algorithms if data.algorithm_role(a) != "XLA"), algorithms[0])
            curve = data.live_bytes_curve(buffers[buffers["algorithm"] == reference])
            arenas = {a: float(m) for a, m in zip(summary["algorithm"], summary["arena_mib"]) if a != "naive"}
            ui.chart(charts.live_bytes_chart(curve, float(curve["live_mib"].max()) if len(curve) else bound, arenas,
                                             source=computed))
            st.caption(f"Live bytes of the {reference} plan's buffers (inclusive lifetimes); the red point is the "
                       "peak, which is the lower bound; dashed lines: each plan's arena.")

            # Ours against XLA's own assignment where XLA's plan has offsets, else against the best peer.
            arena_of = dict(zip(summary["algorithm"], summary["arena_mib"]))
            placed_algorithms = set(buffers.loc[buffers["offset_mib"].notna(), "algorithm"])
            default = [a for a in algorithms if data.algorithm_role(a) == "ours"]
            default += [a for a in algorithms if data.algorithm_role(a) == "XLA" and a in placed_algorithms]
            peers = [a for a in algorithms if data.algorithm_role(a) == "peer"]
            if len(default) < 2 and peers:
                default.append(min(peers, key=arena_of.get))
            shown = st.multiselect("Buffer rectangles of", algorithms,
                                   default=default or [a for a in algorithms if a != "naive"][:2] or algorithms[:1],
                                   key=f"memory-algorithms-{run_id}")  # per plan: each starts at its default
            for algorithm in shown:
                placed = buffers[(buffers["algorithm"] == algorithm) & buffers["offset_mib"].notna()]
                if placed.empty:
                    st.info(f"{algorithm}: the plan records no buffer offsets.")
                    continue
                ui.chart(charts.buffer_rectangles(placed, algorithm, float(arena_of[algorithm]), source=computed))
            # The buffer table follows the same pick: every algorithm lists the same buffers again
            # (thousands of rows on a large plan), so it shows the packings being looked at.
            listed = buffers[buffers["algorithm"].isin(shown)] if shown else buffers
            ui.table(listed, f"run{run_id}_buffers", key="buffers",
                     caption="Buffers of the algorithms picked above (pick more to list theirs): lifetime in "
                             "program steps, size, and where each packing puts them.")

    st.subheader("XLA's compiled memory (per backend)")
    stats_runs = runs[(runs["measurements"] > 0) & (runs["kind"] == "profile")]
    if stats_runs.empty:
        st.info("No data yet: run `jaxcnn profile MODEL --db DB` to record XLA's memory_analysis.")
    else:
        with ui.guard("XLA memory"):
            run = ui.pick_run(stats_runs, "Profiled run", key="memory-stats-run", default=data.default_run_id(stats_runs))
            stats = ui.read("memory_stats", int(run["id"]))
            ui.chart(charts.memory_stats_bars(stats, source=f"{measured} (XLA's compile report)"))
            ui.table(stats, f"run{int(run['id'])}_memory_analysis", key="memstats",
                     caption="MiB from compiled.memory_analysis() of the whole model per backend"
                             + (" (XLA's CPU compile: the lax reference path)" if data.reference_path_run(run) else "")
                             + "; peak_is: which sum XLA's peak equals.")
            st.markdown("**What each quantity is**\n\n" + "\n".join(
                f"- `{name}`: {meaning}" for name, meaning in data.MEMORY_QUANTITIES.items()))
            for row in stats.to_dict("records"):
                st.markdown(f"- {row['backend']}: XLA's peak {ui.fmt_mib(row.get('peak_memory_mib'))} = "
                            f"{row['peak_is']}; temp {ui.fmt_mib(row.get('temp_mib'))}.")
            if {"peak_memory_mib", "temp_mib"} <= set(stats.columns):
                below = stats[stats["peak_memory_mib"] < stats["temp_mib"]]
                if not below.empty:
                    st.info(f"XLA's peak is below its temp size for {', '.join(below['backend'])}: that peak is "
                            f"{below['peak_is'].iloc[0]}, which is how XLA's CPU backend reports it. It is not the "
                            "program's footprint there; footprint_mib is.")
            st.caption(data.MEMORY_ARENA_NOTE)

    st.subheader("Donation and max batch")
    with ui.guard("Donation and max batch"):
        rows = ui.read("plan_measurements")
        if rows.empty:
            st.info("No data yet: no max-batch or donation results in this store. Run "
                    "`jaxcnn maxbatch MODEL --budget 8GiB --db DB` (and the planner's donation tuning) to "
                    "record them as kind='plan' runs.")
        else:
            in_bytes = rows["unit"].eq("bytes") | rows["metric"].str.endswith("_bytes")
            rows = rows.assign(value=rows["median"].where(~in_bytes, rows["median"] / data.MIB),
                               metric=rows["metric"].where(~in_bytes, rows["metric"].str.replace("_bytes", "_mib")))
            # saved_bytes is what donation took off the peak (planner/records.py); stores from before
            # it only have the aliased bytes, which are what donation can save at most.
            saved = rows[rows["metric"] == "saved_mib"]
            donation = saved if not saved.empty else rows[rows["metric"] == "alias_mib"]
            if not donation.empty:
                st.metric(f"largest donation saving ({measured})", ui.fmt_mib(float(donation["value"].max())),
                          help="peak MiB without donation minus with it" if not saved.empty else
                               "bytes XLA aliased from donated inputs to outputs")
            with ui.guard("Donation savings"):
                savings = data.donation_savings(ui.read("plan_measurements"))
                ui.chart(charts.donation_bars(savings, source=f"{measured} (XLA's compile report)"))
                ui.table(savings.drop(columns=["label"]), "donation_savings", key="donation",
                         caption="Peak = argument + output - alias + temp bytes of XLA's memory_analysis, "
                                 "without donation (jax.jit) and with the planned donate_argnums.")
            with ui.guard("Max-batch curve"):
                curve = data.max_batch_curve(ui.read("plan_measurements"))
                budgets = rows.loc[rows["metric"].str.contains("budget"), "value"]
                ui.chart(charts.max_batch_chart(curve, float(budgets.max()) if len(budgets) else None,
                                                source=f"{measured} (XLA's compile report)"))
            table = rows.drop(columns=["extra", "median"]).rename(columns={"value": "value (MiB where *_mib)"})
            ui.table(pd.DataFrame(table), "plan_measurements", key="planrows")
