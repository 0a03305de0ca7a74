"""The repository's own shape: the results folder holds one report per benchmark named by GPU,
date and benchmark (no run-diary tags), within its size limits, every link into it from the
README and docs resolves, and no Python file is longer than one job needs."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
# <gpu>-<YYYY-MM-DD>-<benchmark>.<ext>; the gpu part names a kind (h100, h200, h200x2, cpu).
REPORT_NAME = re.compile(r"^(cpu|[a-z]\d{3}(x\d)?)-\d{4}-\d{2}-\d{2}-[a-z0-9][a-z0-9_]*\.(md|json)$")
# Session or issue tags and "final" versions belong to git history, not to a report's name.
DIARY_TAG = re.compile(r"(^|[_-])(s\d+|session\d*|issue\d+|final)([_.-]|$)")
MAX_FILES, MAX_BYTES = 60, 5 * 1024 * 1024
MAX_PYTHON_LINES = 700
PYTHON_TREES = ("jaxcnn", "scripts", "benchmarks", "dashboard", "tests")
LINK = re.compile(r"\]\(([^)#\s]+)\)")
DOCUMENTS = [ROOT / "README.md", RESULTS / "INDEX.md", *sorted((ROOT / "docs").glob("*.md"))]


def _reports():
    return [p for p in RESULTS.iterdir() if p.is_file() and p.name != "INDEX.md"]


def test_report_names_say_gpu_date_benchmark():
    bad = [p.name for p in _reports() if not REPORT_NAME.match(p.name) or DIARY_TAG.search(p.stem.split("-", 4)[-1])]
    assert not bad, f"report names outside <gpu>-<date>-<benchmark>.(md|json) or with a run-diary tag: {bad}"


def test_results_within_limits():
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    assert len(files) <= MAX_FILES, f"{len(files)} files in benchmarks/results (limit {MAX_FILES})"
    size = sum(p.stat().st_size for p in files)
    assert size <= MAX_BYTES, f"benchmarks/results holds {size} bytes (limit {MAX_BYTES})"


def test_no_python_file_over_the_line_limit():
    long = {str(p.relative_to(ROOT)): n for tree in PYTHON_TREES for p in (ROOT / tree).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_PYTHON_LINES}
    assert not long, f"Python files over {MAX_PYTHON_LINES} lines (split them by job): {long}"


def test_links_to_reports_and_docs_resolve():
    broken = []
    for doc in DOCUMENTS:
        for target in LINK.findall(doc.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)
