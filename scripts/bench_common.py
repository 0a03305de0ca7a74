"""What the benchmark scripts share: the run environment a report records, its JSON and markdown
files, the report cells, the command-line pieces every sweep takes, and the loop that runs the
rows. One place, so every report says the same things the same way.

Importing it makes jaxcnn importable from a checkout that is not pip-installed (the scripts
import it first; scripts/ is on sys.path as the running script's folder)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import re
import sys
import time
import traceback
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable

REPO_ROOT = Path(__file__).resolve().parents[1]

try:
    import jaxcnn  # noqa: F401
except ImportError:  # run from a checkout that is not pip-installed
    sys.path.append(str(REPO_ROOT))
    import jaxcnn  # noqa: F401

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402

from jaxcnn.profile import device_times  # noqa: E402
from jaxcnn.profile.environment import collect_environment, command_output  # noqa: E402
from jaxcnn.profile.gpu_specs import GpuSpec  # noqa: E402

# Command-line dtype names.
DTYPES = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}
# Bytes/s of the memory floors the fused-op benchmarks report: H200 HBM3e, the issues' floor.
FLOOR_BANDWIDTH = 3.97e12
# Timed and untimed calls per measurement: a full run, and --quick (a smoke test).
ITERS, WARMUP = 20, 3
QUICK_ITERS, QUICK_WARMUP = 3, 1


# ---------------------------------------------------------------- environment


def environment(spec: GpuSpec | None) -> dict[str, Any]:
    """What a report records of its run: device, driver, versions, commit, the GPU's ceilings
    (None on a GPU jaxcnn.profile.gpu_specs does not know), the command line."""
    device = jax.devices()[0]
    env = collect_environment()
    extra = env["extra"]
    return dict(
        date_utc=extra["date_utc"],
        device_kind=device.device_kind,
        platform=device.platform,
        device_count=jax.device_count(),
        nvidia_smi=command_output(
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
            "--format=csv,noheader",
        ),
        jax=jax.__version__,
        jaxlib=jaxlib.__version__,
        packages=extra["packages"],
        python=env["python"],
        jaxcnn_version=env["jaxcnn_version"],
        jaxcnn_cuda_available=extra["jaxcnn_cuda_available"],
        jaxcnn_cuda_unavailable_reason=extra["jaxcnn_cuda_unavailable_reason"],
        git=extra["git"],
        gpu_spec=None
        if spec is None
        else dict(
            name=spec.name,
            memory=dataclasses.asdict(spec.memory),
            compute={k: dataclasses.asdict(v) for k, v in spec.compute.items()},
        ),
        argv=sys.argv[1:],
    )


def device_slug() -> str:
    """The first device's kind as a file-name part: "NVIDIA H100 80GB HBM3" -> "h10080gbhbm3"."""
    kind = jax.devices()[0].device_kind.lower().replace("nvidia", "")
    return re.sub("[^a-z0-9]+", "", kind) or "gpu"


def dated_stem(name: str) -> str:
    """<device>-<UTC date>-<name>: the file stem of a report kept per GPU and day."""
    return f"{device_slug()}-{time.strftime('%Y-%m-%d', time.gmtime())}-{name}"


# ---------------------------------------------------------------- measuring


def timed(cases: list[tuple[str, Callable, tuple]], iters: int, warmup: int) -> dict[str, dict]:
    """Device times of each (name, fn, args), measured in one profiler trace (jaxcnn.profile.
    device_times), as dicts with their top kernels. A failure is recorded for every name, not
    raised: one broken config must not stop the suite."""
    try:
        timings = device_times(cases, iters=iters, warmup=warmup)
    except Exception as exc:
        return {name: dict(error=f"{type(exc).__name__}: {exc}") for name, _, _ in cases}
    return {name: t.to_dict() for name, t in timings.items()}


def relative_accuracy(ours, theirs, tolerance: float) -> dict[str, Any]:
    """max |ours - theirs| / max |theirs| against tolerance: ok, max_rel_diff, tolerance and the
    error that failed it (a shape mismatch and non-finite outputs fail too)."""
    a = np.asarray(ours.astype(jnp.float32), np.float64)
    b = np.asarray(theirs.astype(jnp.float32), np.float64)
    if a.shape != b.shape:
        return dict(ok=False, max_rel_diff=None, error=f"shape {a.shape} != {b.shape}")
    if not np.isfinite(a).all():
        return dict(ok=False, max_rel_diff=None, error="non-finite output")
    diff = float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))
    ok = diff <= tolerance
    return dict(ok=ok, max_rel_diff=diff, tolerance=tolerance,
                error=None if ok else f"max rel diff {diff:.2e} > {tolerance:.0e}")


def failed_accuracy(exc: Exception) -> dict[str, Any]:
    """The accuracy of a row whose op raised: recorded, so the suite goes on."""
    return dict(ok=False, max_rel_diff=None, error=f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------- report files


def _json_key(key: Any) -> Any:
    # Keys json.dumps writes itself stay as they are; any other key (a tuple) is written as text.
    return key if key is None or isinstance(key, (str, int, float, bool)) else str(key)


def json_safe(value: Any) -> Any:
    """NaN/inf -> None, so the JSON stays standard."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_json_key(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_report(out_dir: Path, stem: str, report: dict, markdown: str, *, allow_nan=False,
                 default: Callable | None = None) -> str:
    """Writes out_dir/stem.json (the report, NaN-free) and out_dir/stem.md; returns markdown.
    default: json.dumps' converter for values JSON has no type for (None: such a value fails)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(
        json.dumps(json_safe(report), indent=1, allow_nan=allow_nan, default=default) + "\n")
    (out_dir / f"{stem}.md").write_text(markdown)
    return markdown


# ---------------------------------------------------------------- cases and their random inputs


@dataclasses.dataclass(frozen=True)
class SquareCase:
    """A benchmark case on an NHWC input [n, hw, hw, c]; each script's case adds its op's fields."""

    name: str
    hw: int
    c: int

    def x_nhwc(self, n: int) -> tuple[int, int, int, int]:
        return (n, self.hw, self.hw, self.c)


def case_key(seed: int, text: str) -> jax.Array:
    """The key of one row's random inputs: seed folded with a hash of text (the row's name, e.g.
    "case/n/dtype"), so a row's inputs do not depend on which other rows run. "rbg" compiles in a
    fraction of threefry's time for every new shape (seconds on a CPU)."""
    return jax.random.fold_in(jax.random.key(seed, impl="rbg"), zlib.crc32(text.encode()))


def normal_input(key: jax.Array, shape: tuple[int, ...], dtype) -> jax.Array:
    """x ~ N(0, 1), drawn in float32, cast to dtype."""
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def he_weights(key: jax.Array, shape: tuple[int, ...], fan_in: int, dtype) -> jax.Array:
    """He-initialised weights ~ N(0, 2 / fan_in), drawn in float32, cast to dtype."""
    return (jax.random.normal(key, shape, jnp.float32) * math.sqrt(2.0 / fan_in)).astype(dtype)


def small_bias(key: jax.Array, size: int, dtype) -> jax.Array:
    """A bias ~ N(0, 0.01), cast to dtype."""
    return (0.1 * jax.random.normal(key, (size,))).astype(dtype)


# ---------------------------------------------------------------- report cells


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def us(timing: dict) -> str:
    """A timing's median in microseconds, or "error"."""
    return "error" if "median_ms" not in timing else f"{timing['median_ms'] * 1e3:.1f}"


def status(row: dict) -> str:
    """ "ok", or FAIL with the row's accuracy and timing errors."""
    if row["ok"]:
        return "ok"
    errors = [row["accuracy"].get("error")] + [
        f"{k}: {t['error']}" for k, t in row["timings"].items() if "error" in t
    ]
    return "FAIL: " + "; ".join(e for e in errors if e)[:120]


def variant_times(timings: dict, variants: dict[str, str], width: int = 8) -> str:
    """A progress line's times: "label <us> us" for each timing key, by label ({"plain":
    "xla_plain"}), two spaces apart; a missing timing reads "error"."""
    return "  ".join(f"{label} {us(timings.get(key, {})):>{width}} us" for label, key in variants.items())


def table_row(cells: Iterable[str]) -> str:
    """One markdown table row (a | inside a cell escaped)."""
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def table_head(columns: list[str]) -> list[str]:
    """A markdown table's column names and the line under them."""
    return [table_row(columns), "|" + "---|" * len(columns)]


def markdown_table(columns: list[str], rows: Iterable[dict], cells: Callable[[dict], list[str]]) -> list[str]:
    """A markdown table: its head, then a line of cells(row) per row."""
    return [*table_head(columns), *(table_row(cells(r)) for r in rows)]


def top_kernels(timing: dict, top: int, name_chars: int = 70) -> str:
    """The timing's first `top` kernels: `name` us per call; ... ("-" without kernels).
    Backticks keep template brackets (<float>) from being read as HTML."""
    return "; ".join(f"`{k['name'][:name_chars]}` {k['us_per_call']:.1f}"
                     for k in (timing.get("kernels") or [])[:top]) or "-"


def kernel_table(rows: list[dict], key: str, *, launch_config: bool = False, top: int = 4) -> list[str]:
    """Markdown table of each row's variants (rows keyed by row[key], N and dtype): kernels per
    call and the top kernels; with launch_config, the jaxcnn variant's row["config"] too."""
    lines = table_head([key, "N", "dtype", "variant", "kernels per call", "top kernels (us per call)",
                        *(["launch config"] if launch_config else [])])
    for r in rows:
        for variant, t in r["timings"].items():
            cells = [r[key], str(r["n"]), r["dtype"], variant, fmt(t.get("kernels_per_call"), ".1f"),
                     top_kernels(t, top)]
            if launch_config:
                cells.append((r.get("config") or "-") if variant == "jaxcnn" else "-")
            lines.append(table_row(cells))
    return lines


def report_header(title: str, env: dict, rows: list[dict], *, more_warnings: Iterable[str] = (),
                  fallback: str = "the jaxcnn column is its XLA fallback.", jaxlib: bool = True) -> list[str]:
    """A report's first lines: the title, the warnings that make its numbers mean less than they
    seem (no CUDA kernels: `fallback` says what ran instead; host wall time instead of device
    time; then the report's own), the device and the commit."""
    warn = []
    if not env["jaxcnn_cuda_available"]:
        warn.append(f"jaxcnn CUDA kernels are NOT available ({env['jaxcnn_cuda_unavailable_reason']}): {fallback}")
    if any(t.get("is_device_time") is False for r in rows for t in r["timings"].values()):
        warn.append("some times are host wall time (no GPU trace), not device time.")
    warn += more_warnings
    git = env["git"] or {}
    versions = f"jax {env['jax']}, jaxlib {env['jaxlib']}" if jaxlib else f"jax {env['jax']}"
    return [
        title,
        "",
        *[f"> **WARNING: {w}**" for w in warn],
        "",
        f"- device: {env['device_kind']} ({env['nvidia_smi'] or 'no nvidia-smi'}); {versions}",
        f"- commit {git.get('commit', 'unknown')}{' (dirty)' if git.get('dirty') else ''}; {env['date_utc']}",
    ]


def summary_report(header: list[str], summary: list[str], table: list[str], kernels: list[str]) -> str:
    """A sweep report's markdown: its header lines, "## Summary" with the summary lines and the
    summary table, then "## Kernels" with the kernel table."""
    return "\n".join([*header, "", "## Summary", "", *summary, "", *table, "", "## Kernels", "", *kernels]) + "\n"


def has_speedup(row: dict) -> bool:
    """Whether the row timed both jaxcnn and XLA (its XLA/jaxcnn speedup is known)."""
    return row["speedup_vs_xla"] is not None


def timed_rows_summary(is_timed: Callable[[dict], Any] = has_speedup):
    """Decorates a report's summary(rows): it sees only the rows is_timed keeps; with none, the
    summary is one line saying so."""

    def decorate(summarize: Callable[[list[dict]], list[str]]) -> Callable[[list[dict]], list[str]]:
        @functools.wraps(summarize)
        def summary(rows: list[dict]) -> list[str]:
            timed = [r for r in rows if is_timed(r)]
            return summarize(timed) if timed else ["- no timed rows"]

        return summary

    return decorate


def speedup_spread(speedups: Iterable[float]) -> str:
    """ "<count> rows; XLA/jaxcnn median <m> (min <a>, max <b>)" of per-row XLA/jaxcnn speedups."""
    spd = np.array(list(speedups))
    return (f"{len(spd)} rows; XLA/jaxcnn median {np.median(spd):.2f} "
            f"(min {spd.min():.2f}, max {spd.max():.2f})")


def headline_line(label: str, row: dict, goal: float) -> str:
    """The headline row's summary line: jaxcnn and XLA times, XLA/jaxcnn and whether it meets goal."""
    t, s = row["timings"], row["speedup_vs_xla"]
    return (f"- headline ({label}): jaxcnn {t['jaxcnn']['median_ms'] * 1e3:.1f} us, XLA "
            f"{t['xla']['median_ms'] * 1e3:.1f} us, XLA/jaxcnn {s:.2f} "
            f"(goal >= {goal}: {'met' if s >= goal else 'not met'})")


# ---------------------------------------------------------------- command line


def int_list(text: str) -> list[int]:
    """ "1,64" -> [1, 64]."""
    return [int(v) for v in text.split(",")]


def str_list(text: str) -> list[str]:
    return text.split(",")


def csv_of(allowed: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names, each among allowed."""
    allowed = list(allowed)

    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if item not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; known: {', '.join(allowed)}")
        return items

    return parse


def add_timing_options(p: argparse.ArgumentParser, what: str = "variant", *,
                       quick_iters: int = QUICK_ITERS, quick_warmup: int = QUICK_WARMUP) -> None:
    """--iters, --warmup (their defaults set by timing_defaults) and --seed."""
    p.add_argument("--iters", type=int, help=f"timed calls per {what} (default {ITERS}; --quick {quick_iters})")
    p.add_argument("--warmup", type=int, help=f"untimed calls first (default {WARMUP}; --quick {quick_warmup})")
    p.add_argument("--seed", type=int, default=0)


def timing_defaults(args: argparse.Namespace, quick: bool, *, quick_iters: int = QUICK_ITERS,
                    quick_warmup: int = QUICK_WARMUP) -> None:
    """Fills in --iters / --warmup left unset: the full run's counts, or quick's."""
    args.iters = args.iters or (quick_iters if quick else ITERS)
    args.warmup = args.warmup if args.warmup is not None else (quick_warmup if quick else WARMUP)


def check_dtypes(p: argparse.ArgumentParser, dtypes: list[str], known=DTYPES) -> None:
    bad = [d for d in dtypes if d not in known]
    if bad:
        p.error(f"--dtypes must be among {list(known)}, got {bad}")


def case_sweep_parser(description: str, report: str, quick: str) -> argparse.ArgumentParser:
    """The options of a sweep over named cases x batches x dtypes that writes report[_LABEL].*:
    --out, --label, --batches, --dtypes, --cases (name prefixes), the timing options, --quick
    (help: what it runs). case_sweep_args reads them."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="directory for the JSON and markdown")
    p.add_argument("--label", default="", help=f"names the reports ({report}_LABEL.*)")
    p.add_argument("--batches", type=int_list, default=[1, 64])
    p.add_argument("--dtypes", type=str_list, default=["bf16"])
    p.add_argument("--cases", type=str_list, help="case names (prefix match)")
    add_timing_options(p)
    p.add_argument("--quick", action="store_true", help=f"{quick}, few iterations: a smoke test")
    return p


def case_sweep_args(p: argparse.ArgumentParser, argv, cases: tuple, quick_cases: tuple) -> argparse.Namespace:
    """Parses case_sweep_parser's options; args.cases: the cases to run (--cases among every
    case, else quick_cases with --quick, else cases)."""
    args = p.parse_args(argv)
    check_dtypes(p, args.dtypes)
    if args.cases:
        chosen = [c for c in cases + quick_cases if any(c.name.startswith(k) for k in args.cases)]
        if not chosen:
            p.error(f"no case matches {args.cases}")
        args.cases = chosen
    else:
        args.cases = quick_cases if args.quick else cases
    timing_defaults(args, args.quick)
    return args


def case_sweep_jobs(args: argparse.Namespace, row: Callable[..., dict]) -> list[Callable[[], dict]]:
    """One job per case x dtype x batch of case_sweep_args' args (a case with its own batch runs at
    it only): row(case, n, dtype, iters=, warmup=, seed=)."""
    timing = {"iters": args.iters, "warmup": args.warmup, "seed": args.seed}
    return [functools.partial(row, case, n, dtype, **timing)
            for case in args.cases for dtype in args.dtypes
            for n in ([case.batch] if case.batch else args.batches)]


def report_name(report: str, label: str) -> str:
    """report_LABEL, or report without a label."""
    return f"{report}_{label}" if label else report


# ---------------------------------------------------------------- running


def run_rows(jobs: Iterable[Callable[[], dict]], progress_line: Callable[[dict], str],
             write: Callable[[list[dict]], str], *, require_rows: bool = False) -> int:
    """Runs each job (one report row each), printing its progress line and rewriting the reports
    after every row (an interrupted run keeps what it measured); the reports are written once
    before the first row, so a bad --out fails early. Prints the final markdown. Exit status:
    0 when every row is ok (and, with require_rows, there is one), 2 when some row failed."""
    rows: list[dict] = []
    markdown = write(rows)
    for job in jobs:
        row = job()
        rows.append(row)
        print(progress_line(row), flush=True)
        markdown = write(rows)
    return final_status(markdown, rows, require_rows=require_rows)


def final_status(markdown: str, rows: list[dict], *, require_rows: bool = False) -> int:
    """Prints a run's final markdown; its exit status: 0 when every row is ok (and, with
    require_rows, there is one), else 2."""
    print()
    print(markdown)
    return 0 if all(r["ok"] for r in rows) and (rows or not require_rows) else 2


def exit_with(main: Callable[[], int]) -> None:
    """Exits with main()'s status; a crash prints its traceback and exits 1."""
    try:
        raise SystemExit(main())
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        raise SystemExit(1)
