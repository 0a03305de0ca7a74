"""Combines the outputs of scripts/gpu_check.sh into <gpu>-<date>-check_<label>.{json,md}.

Inputs (all in --out): the step table gpu_check.sh wrote, pytest junit XML files, the log
(compute-sanitizer summaries are read from it) and bench_layers.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

SANITIZER_STEPS = ("memcheck", "racecheck", "synccheck", "initcheck")


def read_steps(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        name, rc, seconds = line.split("\t")
        rows.append(dict(step=name, rc=int(rc), seconds=int(seconds)))
    return rows


def junit_counts(path: Path) -> dict | None:
    if not path.exists():
        return None
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    keys = ("tests", "failures", "errors", "skipped")
    counts = {k: int(suite.get(k, 0)) for k in keys}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["seconds"] = float(suite.get("time", 0.0))
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    counts["failed_tests"] = failed[:50]
    return counts


def _step_block(log: str, step: str) -> str | None:
    block = re.search(rf"=== {re.escape(step)}: .*?(?==== {re.escape(step)}: rc=)", log, re.S)
    return block.group(0) if block else None


def sanitizer_summaries(log: str, steps: list[dict]) -> dict[str, str]:
    """The summary line each compute-sanitizer run printed, by step name (<selftest>-<tool>)."""
    out = {}
    for step in (s["step"] for s in steps):
        if not step.endswith(tuple(f"-{tool}" for tool in SANITIZER_STEPS)):
            continue
        block = _step_block(log, step)
        if block is None:
            continue
        lines = re.findall(r"========= (?:ERROR|RACECHECK|LEAK)? ?SUMMARY: .*", block)
        out[step] = "; ".join(line.replace("========= ", "") for line in lines) or "no summary line"
    return out


def selftest_lines(log: str, steps: list[dict]) -> list[str]:
    """Output of each self-test program (steps named *_selftest)."""
    lines = []
    for step in (s["step"] for s in steps if s["step"].endswith("_selftest")):
        block = _step_block(log, step)
        if block:
            lines += block.splitlines()
    return lines


def gpu_slug(env: dict) -> str:
    name = env.get("gpu_name") or env.get("device_kind") or "unknown-gpu"
    match = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", str(name).upper())
    return (match.group(1) if match else re.sub(r"[^a-z0-9]+", "-", str(name).lower())).lower()


def _environment() -> dict:
    from jaxcnn.profile.environment import collect_environment

    return collect_environment()


def render_md(report: dict, bench_md: str) -> str:
    lines = [f"# jaxcnn GPU check ({report['label']}) — {report['gpu']} — {report['date']}", ""]
    env = report.get("environment", {})
    lines += ["```", json.dumps(env, indent=1)[:3000], "```", "", "## Steps", "",
              "| step | rc | seconds |", "| --- | --- | --- |"]
    lines += [f"| {s['step']} | {s['rc']} | {s['seconds']} |" for s in report["steps"]]
    lines += ["", "## Tests", ""]
    for name, counts in report["pytest"].items():
        if counts:
            lines.append(
                f"- `{name}`: {counts['passed']} passed, {counts['failures'] + counts['errors']} failed, "
                f"{counts['skipped']} skipped ({counts['seconds']:.0f} s)"
            )
            lines += [f"  - FAILED {t}" for t in counts["failed_tests"]]
    lines += ["", "## compute-sanitizer on cuda_ops/selftest", ""]
    lines += [f"- {tool}: {summary}" for tool, summary in report["sanitizer"].items()]
    lines += ["", "Self-test output:", "", "```", *report["selftest"], "```", "", "## Layer benchmark", "", bench_md]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--raw", type=Path, required=True, help="where the sections wrote their files")
    parser.add_argument("--steps", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--label", default="gpu_check", help="report name: <gpu>-<date>-check_<label>")
    parser.add_argument("--extra", type=Path, nargs="*", default=[],
                        help="JSON files of other sections (zoo, perfmodel) to embed by file stem")
    args = parser.parse_args()
    log = args.log.read_text(errors="replace")
    bench_json = args.raw / "bench_layers.json"
    bench = json.loads(bench_json.read_text()) if bench_json.exists() else {}
    env = bench.get("environment") or _environment()
    date = dt.date.today().isoformat()
    steps = read_steps(args.steps)
    report = dict(
        gpu=gpu_slug(env),
        date=date,
        label=args.label,
        environment=env,
        steps=steps,
        pytest={name: junit_counts(args.raw / f"{name}.xml") for name in ("pytest_gpu", "pytest_default")},
        sanitizer=sanitizer_summaries(log, steps),
        selftest=selftest_lines(log, steps),
        bench_rows=bench.get("rows", []),
        sections={path.stem: json.loads(path.read_text()) for path in args.extra if path.exists()},
    )
    # "check_": the benchmarks write their own <gpu>-<date>-<name> reports into the same folder.
    stem = f"{report['gpu']}-{date}-check_{args.label}"
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    bench_md_path = args.raw / "bench_layers.md"
    bench_md = bench_md_path.read_text() if bench_md_path.exists() else "(benchmark did not run)"
    (args.out / f"{stem}.md").write_text(render_md(report, bench_md))
    print(render_md(report, "")[-4000:])
    failed = [s["step"] for s in report["steps"] if s["rc"] != 0]
    print(f"report: {args.out / stem}.{{json,md}}; failed steps: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
