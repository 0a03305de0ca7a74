"""The report of scripts/bench_conv_sweep.py (issue 33): the ratio (XLA / auto) distributions,
issue 33's goals and whether the rows meet them, and the markdown and JSON files of a sweep
(write_reports: <stem>.json and <stem>.md).

Imported by bench_conv_sweep; bench_common makes jaxcnn importable from a checkout."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from bench_common import fmt as _fmt
from bench_common import json_safe as _json_safe
from conv_sweep_cases import CHUNK_CASES, KINDS, REFERENCE_IMAGES, ZOO_BATCHES, ZOO_KINDS
from conv_sweep_correctness import OUTPUT_ROUNDINGS, TAIL, auto_error

HIGHEST_GOAL_ERROR = 1e-5  # issue 33 item 3: fp32 "highest" vs float64

# Issue 33's goals on the ratio XLA / auto.
SWEEP_GOALS = (("median", 1.05), ("p5", 0.95), ("min", 0.9))
ZOO_EACH_GOAL = 1.0
HIGHEST_ZOO_GEOMEAN_GOAL = 2.5
HIGHEST_ZOO_EACH_GOAL = 2.0  # item 3: every zoo layer with C >= HIGHEST_MIN_CHANNELS
HIGHEST_MIN_CHANNELS = 64
WORST = 10
ZOO_BELOW_LISTED = 40


# ---------------------------------------------------------------- summaries


def distribution(ratios: Sequence[float]) -> dict | None:
    """min, p5, median, p95, max and geometric mean of the ratios (None when there are none)."""
    if not ratios:
        return None
    v = np.asarray(ratios, np.float64)
    p5, median, p95 = np.percentile(v, [5, 50, 95])
    return dict(cases=int(v.size), min=float(v.min()), p5=float(p5), median=float(median), p95=float(p95),
                max=float(v.max()), geomean=float(np.exp(np.mean(np.log(v)))))


def _timed(rows: Sequence[dict], **match) -> list[dict]:
    return [r for r in rows if "ratio" in r and all(r.get(k) == v for k, v in match.items())]


def _choice(row: dict) -> str:
    return (row.get("decision") or {}).get("choice", "undecided")


def distributions(rows: Sequence[dict]) -> list[dict]:
    """The ratio distributions the report shows: each group's label and distribution."""
    groups = [("random sweep", _timed(rows, source="random")), ("random + zoo", _timed(rows))]
    for kind in KINDS:
        groups.append((f"random {kind}", _timed(rows, source="random", kind=kind)))
    random = _timed(rows, source="random")
    for choice in sorted({_choice(r) for r in random}):
        groups.append((f"random, auto chose {choice}", [r for r in random if _choice(r) == choice]))
    groups.append(("zoo", _timed(rows, source="zoo")))
    for kind in ZOO_KINDS:
        for n in ZOO_BATCHES:
            groups.append((f"zoo {kind} N={n}", _timed(rows, source="zoo", kind=kind, n=n)))
    out = []
    for label, group in groups:
        d = distribution([r["ratio"] for r in group])
        if d:
            out.append(dict(group=label, **d))
    return out


def device_timed(rows: Sequence[dict]) -> bool:
    """Every timed row has device time."""
    timed = _timed(rows)
    return bool(timed) and all(r["device_time"] for r in timed)


def times_kernels(rows: Sequence[dict], env: dict) -> bool:
    """The ratios are speedups: device time, and auto could run jaxcnn's kernels (not the lax
    reference a CPU falls back to)."""
    return device_timed(rows) and bool(env.get("jaxcnn_cuda_available"))


def goals(rows: Sequence[dict], env: dict) -> list[dict]:
    """Issue 33's goals: what each measures ("ratio" or "error"), the measured value and met
    (None where the rows say nothing: no such cases, or ratios that are no speedups)."""
    real = times_kernels(rows, env)

    def goal(text, of, value, target, detail="", above=True):
        met = None if value is None or not real else (value >= target if above else value <= target)
        return dict(goal=text, of=of, value=value, target=target, met=met, detail=detail)

    sweep = distribution([r["ratio"] for r in _timed(rows, source="random")]) or {}
    out = [goal(f"random sweep {stat} >= {target}x", "ratio", sweep.get(stat), target) for stat, target in SWEEP_GOALS]
    zoo = _timed(rows, source="zoo")
    worst = min(zoo, key=lambda r: r["ratio"]) if zoo else None
    out.append(goal(f"every zoo layer >= {ZOO_EACH_GOAL}x", "ratio", worst and worst["ratio"], ZOO_EACH_GOAL,
                    f"{sum(r['ratio'] < ZOO_EACH_GOAL for r in zoo)} of {len(zoo)} below"
                    + (f"; worst {worst['name']}" if worst else "")))
    wide = [r for r in _timed(rows, source="zoo", kind="fp32_highest") if r["c"] >= HIGHEST_MIN_CHANNELS]
    geo = distribution([r["ratio"] for r in wide]) or {}
    out.append(goal(f"fp32 highest geomean >= {HIGHEST_ZOO_GEOMEAN_GOAL}x over zoo layers with C >= "
                    f"{HIGHEST_MIN_CHANNELS}", "ratio", geo.get("geomean"), HIGHEST_ZOO_GEOMEAN_GOAL,
                    f"{len(wide)} layers"))
    out.append(goal(f"fp32 highest >= {HIGHEST_ZOO_EACH_GOAL}x on every zoo layer with C >= {HIGHEST_MIN_CHANNELS} "
                    "(item 3)", "ratio", geo.get("min"), HIGHEST_ZOO_EACH_GOAL,
                    f"{sum(r['ratio'] < HIGHEST_ZOO_EACH_GOAL for r in wide)} of {len(wide)} below"))
    highest = [r for r in rows if r.get("correctness") and r["kind"] == "fp32_highest"]
    err = max((auto_error(r) for r in highest), default=None)
    out.append(goal(f"fp32 highest max rel error <= {HIGHEST_GOAL_ERROR:.0e} vs float64 (item 3)", "error", err,
                    HIGHEST_GOAL_ERROR, f"{sum(auto_error(r) > HIGHEST_GOAL_ERROR for r in highest)} of "
                    f"{len(highest)} cases above", above=False))
    return out


# ---------------------------------------------------------------- reports


def _ms(t: dict | None) -> str:
    if not t:
        return "-"
    return f"{t['median_ms']:.4g} [{t['p10_ms']:.4g}-{t['p90_ms']:.4g}]"


def _verdict(met) -> str:
    return "n/a" if met is None else ("met" if met else "MISSED")


def _times_text(decision: dict | None) -> str:
    if not decision or not decision.get("times_ms"):
        return "-"
    return ", ".join(f"{n} {'failed' if t is None else format(t, '.4g')}" for n, t in
                     sorted(decision["times_ms"].items(), key=lambda kv: (kv[1] is None, kv[1] or 0.0)))


def _escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(env: dict, rows: list[dict], meta: dict) -> str:
    real = times_kernels(rows, env)
    git = env.get("git") or {}
    seconds = meta["seconds"]
    sources = {}
    for r in rows:
        d = r.get("decision") or {}
        sources[d.get("source", "none")] = sources.get(d.get("source", "none"), 0) + 1
    lines = ["# conv2d(algorithm=\"auto\") vs XLA: random shape sweep and zoo layers (issue 33)", ""]
    if not env.get("jaxcnn_cuda_available"):
        reason = env.get("jaxcnn_cuda_unavailable_reason")
        lines += [f"> **WARNING: jaxcnn's CUDA kernels are NOT available ({reason}): "
                  "auto runs the lax reference, so the ratios say nothing about jaxcnn's kernels.**", ""]
    if rows and not device_timed(rows):
        lines += ["> **WARNING: no GPU trace: times are host wall time, not device time; no goal verdicts.**", ""]
    lines += [
        "## Setup",
        "",
        f"- device: {env['device_kind']} ({env.get('nvidia_smi') or 'no nvidia-smi'}); jax {env['jax']}, "
        f"jaxlib {env['jaxlib']}; commit {git.get('commit', 'unknown')}{' (dirty)' if git.get('dirty') else ''}; "
        f"{env['date_utc']}",
        f"- cases: {meta['random_cases']} random (seed {meta['seed']}) + {meta['zoo_cases']} zoo "
        f"(batches {meta['zoo_batches']}, kinds {meta['zoo_kinds']}); {len(rows)} ran"
        + (f", {meta['planned'] - len(rows)} not reached (--budget-s {meta['budget_s']:g}; --resume this JSON runs "
           "them)" if meta["planned"] > len(rows) else "")
        + (f"; {meta['resumed']['rows']} of them from {meta['resumed']['path']}" if meta.get("resumed") else ""),
        "- variants: jaxcnn.conv2d(algorithm=\"auto\") vs algorithm=\"xla\" (XLA's conv, then bias, residual and "
        "activation in x's dtype), each jitted; ratio = XLA / auto (> 1: auto faster).",
        f"- times: median [p10-p90] per call over {meta['iters']} synced calls, ms, "
        + ("device time (sum of GPU kernel durations)." if device_timed(rows) else "HOST WALL TIME."),
        "- correctness: images " + f"{REFERENCE_IMAGES} (first, last) of each batch vs a float64 numpy reference; "
        f"tolerance = {OUTPUT_ROUNDINGS} u_out + {TAIL:g} (2 u_mma + 2^-24 sqrt(R*S*C/groups)); any NaN/inf fails.",
        f"- decisions: decide_all per chunk (<= {CHUNK_CASES} cases) into a fresh cache ({meta['cache_dir']}); "
        f"sources {', '.join(f'{k} {v}' for k, v in sorted(sources.items()))}.",
        f"- seconds: decide {seconds['decide']:.1f} ({1e3 * seconds['decide'] / max(meta['ran'], 1):.0f} ms a case), "
        f"compile + first runs {seconds['compile']:.1f}, timing "
        f"{seconds['time']:.1f} (+ float64 references alongside: {seconds['time_and_reference']:.1f}), "
        f"total {seconds['total']:.1f}.",
        "- % floor = roofline floor (FLOPs at the kind's peak, fp32 highest at the CUDA-core fp32 peak; bytes "
        "of x, w, bias, residual and output at the bandwidth) / median.",
        "",
        "## Goals (issue 33)",
        "",
    ]
    for g in goals(rows, env):
        detail = f" ({g['detail']})" if g.get("detail") else ""
        if real:
            lines.append(f"- {g['goal']}: {_fmt(g['value'], '.3g')}{detail}: {_verdict(g['met'])}")
        elif g["of"] == "error":
            lines.append(f"- {g['goal']}: {_fmt(g['value'], '.3g')}{detail} (the lax fallback's): n/a")
        else:
            lines.append(f"- {g['goal']}: n/a (no device time of jaxcnn's kernels)")
    lines += ["", "## Ratio distribution (XLA / auto)", ""]
    if real:
        lines += speedup_tables(rows)
    else:
        lines.append("- not shown: without device time of jaxcnn's kernels the ratios are no speedups "
                     "(each case's times are in the JSON).")
    failed = [r for r in rows if r.get("correctness") and not r["correctness"]["ok"]]
    lines += ["", "## Correctness failures", ""]
    lines += [f"- {r['name']} {r['description']} {r['kind']} (auto chose {_choice(r)}): rel err "
              f"{_fmt(r['correctness']['rel_err_auto'], '.2e')} > {r['correctness']['tolerance']:.2e}"
              f" (XLA {_fmt(r['correctness']['rel_err_xla'], '.2e')}), finite {r['correctness']['finite']}"
              for r in failed] or ["- none"]
    checked = [r for r in rows if r.get("correctness")]
    if checked:
        margin = max(checked, key=lambda r: auto_error(r) / r["correctness"]["tolerance"])
        lines.append(f"- closest to its tolerance: {margin['name']} ({margin['kind']}): "
                     f"{auto_error(margin):.2e} of {margin['correctness']['tolerance']:.2e}")
        lines += ["", "| kind | cases | max rel err auto | max rel err XLA | tolerances | failures |",
                  "|---|---|---|---|---|---|"]
        for kind in KINDS:
            group = [r for r in checked if r["kind"] == kind]
            if group:
                c = [r["correctness"] for r in group]
                xla = [math.inf if e["rel_err_xla"] is None else e["rel_err_xla"] for e in c]
                lines.append(f"| {kind} | {len(group)} | {max(auto_error(r) for r in group):.2e} | {max(xla):.2e} | "
                             f"{min(e['tolerance'] for e in c):.1e}-{max(e['tolerance'] for e in c):.1e} | "
                             f"{sum(not e['ok'] for e in c)} |")
    drift = [r for r in rows if r.get("trace_decision") and r.get("decision")
             and r["trace_decision"]["choice"] != r["decision"]["choice"]]
    lines += ["", "## Decisions", ""]
    counts: dict[tuple, int] = {}
    for r in rows:
        key = (r["kind"], _choice(r))
        counts[key] = counts.get(key, 0) + 1
    lines += [f"- {kind}: " + ", ".join(f"{c} {n}" for (k, c), n in sorted(counts.items()) if k == kind)
              for kind in KINDS if any(k == kind for k, _ in counts)]
    lines.append("- trace-time decision differs from the pre-decided one: "
                 + (", ".join(f"{r['name']} ({r['decision']['choice']} -> {r['trace_decision']['choice']})"
                              for r in drift) or "none"))
    errors = [r for r in rows if "error" in r or "decision_error" in r]
    if errors:
        lines += ["", "## Errors", ""]
        lines += [f"- {r['name']} {r['description']} {r['kind']}: "
                  f"{_escape(r.get('error') or r['decision_error'])[:300]}"
                  for r in errors]
    return "\n".join(lines) + "\n"


def speedup_tables(rows: list[dict]) -> list[str]:
    """The distributions, the worst cases and the zoo layers below ZOO_EACH_GOAL, as markdown."""
    lines = ["| group | cases | min | p5 | median | p95 | max | geomean |", "|---|---|---|---|---|---|---|---|"]
    for d in distributions(rows):
        lines.append(f"| {d['group']} | {d['cases']} | " + " | ".join(
            f"{d[k]:.3f}" for k in ("min", "p5", "median", "p95", "max", "geomean")) + " |")
    lines += ["", f"## The {WORST} worst cases", "",
              "| case | shape | kind | choice (source) | decision times ms | auto ms | XLA ms | ratio "
              "| % floor auto / XLA |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(_timed(rows), key=lambda r: r["ratio"])[:WORST]:
        d = r.get("decision") or {}
        pct = r.get("pct_of_floor") or {}
        lines.append(f"| {r['name']} | {_escape(r['description'])} | {r['kind']} | {d.get('choice', '-')} "
                     f"({d.get('source', '-')}) | {_escape(_times_text(d))} | {_ms(r['timings']['auto'])} | "
                     f"{_ms(r['timings']['xla'])} | {r['ratio']:.3f} | {_fmt(pct.get('auto'), '.0f')} / "
                     f"{_fmt(pct.get('xla'), '.0f')} |")
    below = sorted((r for r in _timed(rows, source="zoo") if r["ratio"] < ZOO_EACH_GOAL), key=lambda r: r["ratio"])
    lines += ["", f"## Zoo layers below {ZOO_EACH_GOAL}x", ""]
    lines += [f"- {r['name']} ({r['description']}): {r['ratio']:.3f}, auto chose {_choice(r)}"
              for r in below[:ZOO_BELOW_LISTED]] or ["- none"]
    if len(below) > ZOO_BELOW_LISTED:
        lines.append(f"- and {len(below) - ZOO_BELOW_LISTED} more (JSON)")
    return lines


def write_reports(out: Path, stem: str, env: dict, rows: list[dict], meta: dict) -> str:
    out.mkdir(parents=True, exist_ok=True)
    report = dict(environment=env, meta=meta, goals=goals(rows, env), distributions=distributions(rows), rows=rows)
    (out / f"{stem}.json").write_text(json.dumps(_json_safe(report), indent=1, allow_nan=False) + "\n")
    markdown = render_markdown(env, rows, meta)
    (out / f"{stem}.md").write_text(markdown)
    return markdown
