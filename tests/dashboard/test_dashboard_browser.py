"""The dashboard in a real browser: `streamlit run dashboard/app.py` (and `jaxcnn dashboard`) on a
free localhost port, every page opened in headless Chromium (Debian's `chromium` driven by
Playwright), key elements asserted, screenshots saved under tests/_output/screenshots/. Three
stores: a store made from the shipped H200 data plus real memory plans ("planned"), no store at
all so the shipped data itself is shown with what it was made from ("shipped"), and a fresh CPU
profile, whose pages must show no speedup ("cpu"). On every page: no exception or error, chart
titles inside their chart, tables of the Runs page no wider than the page.

Server start and stop, the browser launch and the wait until a page has settled come from
scripts/dashboard_browser.py, shared with the render benchmark (scripts/bench_dashboard.py).

Skips only when Playwright or a Chromium binary is missing (CI installs both: see .ci/run).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")

import dashboard_stores as stores  # noqa: E402
from jaxcnn.dashboard import data  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import dashboard_browser  # noqa: E402

SCREENSHOTS = Path(os.environ.get("JAXCNN_TEST_OUTPUT", ROOT / "tests" / "_output")) / "screenshots"
NAV = list(dashboard_browser.PAGES.values())
SHIPPED_MADE = "made 2026-11-21 to 2026-11-29, commits 1041c42, 37d5348-dirty, cc1624b-dirty"

# store -> page url -> (title, texts that must be on it, texts that must not be, least charts drawn)
PAGES = {
    "planned": {
        "": ("Runs", ["All runs", "NVIDIA H200", "Download runs.csv"], [], 0),
        "speed": ("Speed", ["End to end", "Per layer", "speedup of jaxcnn over XLA (measured)", "Run vs run"], [], 4),
        "roofline": ("Roofline", ["DRAM bandwidth (measured)", "708 TFLOP/s", "Model vs measurement"], [], 3),
        "memory": ("Memory", ["Arena packing", "lower bound (computed)", "XLA's compiled memory",
                              "What each quantity is", "Donation and max batch", "largest donation saving (measured)",
                              "Download donation_savings.csv"], [], 7),
        "sparsity": ("Sparsity", ["mean input zeros (measured)", "Dense or sparse kernel"], [], 1),
    },
    "shipped": {
        "": ("Runs", ["Shipped data", f"Made from: NVIDIA H200, {SHIPPED_MADE}", "Download shipped_data.csv",
                      "All runs"], [], 0),
        "speed": ("Speed", [SHIPPED_MADE, "speedup of jaxcnn over XLA (shipped)", "source: shipped"], [], 4),
        "roofline": ("Roofline", [SHIPPED_MADE, "median |error| of the traffic model (model vs shipped)"], [], 3),
        "memory": ("Memory", [SHIPPED_MADE, "largest donation saving (shipped)", "= argument + output - alias + temp"],
                   [], 7),
        "sparsity": ("Sparsity", [SHIPPED_MADE, "mean input zeros (shipped)"], [], 1),
    },
    "cpu": {
        "": ("Runs", ["All runs", "none (CPU)"], ["shipped"], 0),
        "speed": ("Speed", ["xla host wall time (measured)", data.REFERENCE_PATH_NOTE.split(",")[0],
                            "Run vs run compares GPU device times"],
                  ["speedup of jaxcnn over XLA", "Speedup of jaxcnn over xla per layer"], 2),
        "roofline": ("Roofline", ["No roofline for this run: a CPU run"], [], 0),
        "memory": ("Memory", ["= argument + output - alias (temp not counted)", "What each quantity is"], [], 1),
        "sparsity": ("Sparsity", ["mean input zeros (measured)", "timed on a CPU (the lax reference path)"], [], 1),
    },
}

# Title, subtitle and axis-title texts of every chart that stick out of their chart (clipped).
CLIPPED_TITLES_JS = """() => {
  const out = {texts: 0, clipped: []};
  for (const svg of document.querySelectorAll('[data-testid="stVegaLiteChart"] svg.marks')) {
    const box = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll('.role-title-text text, .role-title-subtitle text, .role-axis-title text')) {
      out.texts += 1;
      const r = t.getBoundingClientRect();
      if (r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5 || r.left < box.left - 0.5 || r.right > box.right + 0.5)
        out.clipped.push(t.textContent);
    }
  }
  return out;
}"""
# How far each table's grid is wider than its frame (px; > 0: it scrolls sideways).
TABLE_OVERFLOW_JS = """() => [...document.querySelectorAll('[data-testid="stDataFrame"] .dvn-scroller')].map(
  s => s.scrollWidth - s.clientWidth)"""


@pytest.fixture(scope="module")
def chromium():
    path = dashboard_browser.chromium_path()
    if path is None:
        pytest.skip("no Chromium binary found (apt-get install -y chromium, or set JAXCNN_CHROMIUM)")
    return path


@pytest.fixture(scope="module")
def store_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("dashboard_browser")
    cache = root / "cache"
    db = stores.shipped_with_plans(cache)
    env = dict(os.environ, JAXCNN_DB=str(db), JAXCNN_DASHBOARD_CACHE=str(cache), PYTHONUNBUFFERED="1")
    return env, root


@pytest.fixture(scope="module")
def store_paths(store_env):
    env, root = store_env
    return {"planned": Path(env["JAXCNN_DB"]), "shipped": root / "no_store_here.sqlite",
            "cpu": stores.cpu_profile(root / "cpu.sqlite")}


# The CPU profile's pages in make test; the other stores' pages in CI (slow).
@pytest.mark.parametrize("store", [s if s == "cpu" else pytest.param(s, marks=pytest.mark.slow) for s in PAGES])
def test_every_page_in_chromium(chromium, store_env, store_paths, store):
    env, root = store_env
    env = dict(env, JAXCNN_DB=str(store_paths[store]))
    prefix = "" if store == "planned" else f"{store}-"
    seconds = {}
    # Started from another directory: the bind address must come from dashboard/.streamlit/.
    with dashboard_browser.dashboard_server(env, cwd=root) as port:
        assert dashboard_browser.listening_addresses(port) == {"0100007F"}, \
            "the dashboard must listen on 127.0.0.1 only"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        with sync_api.sync_playwright() as pw:
            browser = dashboard_browser.launch_chromium(pw, chromium)
            page = browser.new_page(viewport=dashboard_browser.VIEWPORT)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            for url, (title, expected, absent, least_charts) in PAGES[store].items():
                started = time.monotonic()
                page.goto(dashboard_browser.page_url(port, url))
                dashboard_browser.wait_until_settled(page, title, least_charts)
                for text in expected:
                    page.get_by_text(text, exact=False).first.wait_for(timeout=60_000)
                charts = page.locator('[data-testid="stVegaLiteChart"]')
                seconds[title] = round(time.monotonic() - started, 2)
                assert charts.count() >= least_charts
                assert page.locator('[data-testid="stException"]').count() == 0
                assert page.locator('[data-testid="stAlertContentError"]').count() == 0
                body = page.locator('[data-testid="stMain"]').inner_text()
                for text in absent:
                    assert text.lower() not in body.lower(), f"{store} {title}: {text!r} is shown"
                nav = page.locator('[data-testid="stSidebarNav"]')
                assert [t.strip() for t in nav.locator("span").all_inner_texts() if t.strip() in set(NAV)] == NAV
                titles = page.evaluate(CLIPPED_TITLES_JS)
                assert titles["clipped"] == [], f"{store} {title}: clipped chart titles {titles['clipped']}"
                assert titles["texts"] >= charts.count()  # the check saw the charts' titles
                if title == "Runs":
                    page.wait_for_function("n => document.querySelectorAll('[data-testid=\"stDataFrame\"] "
                                           ".dvn-scroller').length >= n", arg=2 if store == "shipped" else 1,
                                           timeout=60_000)
                    assert max(page.evaluate(TABLE_OVERFLOW_JS)) <= 2, f"{store}: a Runs table is wider than the page"
                # Streamlit scrolls inside its main block, so grow the window to the page's height
                # for a screenshot of the whole page.
                height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
                page.set_viewport_size({**dashboard_browser.VIEWPORT, "height": min(int(height) + 40, 9000)})
                page.wait_for_timeout(1200)
                page.screenshot(path=str(SCREENSHOTS / f"{prefix}{title.lower()}.png"), full_page=True)
                page.set_viewport_size(dashboard_browser.VIEWPORT)
            browser.close()
            assert not errors, errors
    # Seconds from opening each page to its expected texts and charts on screen (first visit).
    (SCREENSHOTS / f"{prefix}page_seconds.json").write_text(json.dumps(seconds, indent=1) + "\n")
    # Every page's screenshot exists (the folder also holds other stores' prefixed ones).
    taken = {p.name for p in SCREENSHOTS.glob(f"{prefix}*.png")}
    assert {f"{prefix}{t.lower()}.png" for t, *_ in PAGES[store].values()} <= taken


def test_jaxcnn_dashboard_binds_to_localhost(store_env):
    env, root = store_env
    port = dashboard_browser.free_port()
    server = dashboard_browser.start([sys.executable, "-m", "jaxcnn.cli", "dashboard", "--db", env["JAXCNN_DB"],
                                      "--port", str(port)], {**env, "STREAMLIT_SERVER_HEADLESS": "true"}, cwd=root)
    try:
        dashboard_browser.wait_healthy(port, server)
        assert dashboard_browser.listening_addresses(port) == {"0100007F"}
    finally:
        dashboard_browser.stop(server)
    # The CLI is the server (no orphaned child keeps the port once it is stopped).
    deadline = time.monotonic() + 10
    while dashboard_browser.listening_addresses(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not dashboard_browser.listening_addresses(port)
