"""The dashboard in a real browser: `streamlit run dashboard/app.py` (and `jaxcnn dashboard`) on a
free localhost port over a store made from the shipped H200 data plus real memory plans, every
page opened in headless Chromium (Debian's `chromium` driven by Playwright), key elements
asserted, screenshots saved under tests/_output/screenshots/.

Skips only when Playwright or a Chromium binary is missing (CI installs both: see .ci/run).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")

import dashboard_stores as stores  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = Path(os.environ.get("JAXCNN_TEST_OUTPUT", ROOT / "tests" / "_output")) / "screenshots"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# page url -> (title, texts that must be on it)
PAGES = {
    "": ("Runs", ["All runs", "NVIDIA H200", "Download runs.csv"]),
    "speed": ("Speed", ["End to end", "Per layer", "speedup of jaxcnn over XLA", "Run vs run"]),
    "roofline": ("Roofline", ["DRAM bandwidth (measured)", "708 TFLOP/s", "Model vs measurement"]),
    "memory": ("Memory", ["Arena packing", "lower bound", "XLA's compiled memory", "Donation and max batch",
                         "largest donation saving", "Download donation_savings.csv"]),
    "sparsity": ("Sparsity", ["mean input zeros", "Dense or sparse kernel"]),
}
MIN_CHARTS = {"": 0, "speed": 4, "roofline": 3, "memory": 7, "sparsity": 1}


def chromium_path() -> str | None:
    candidates = [os.environ.get("JAXCNN_CHROMIUM")] + [shutil.which(n) for n in CHROMIUM_NAMES]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_addresses(port: int) -> set[str]:
    """Local IPv4/IPv6 addresses with a socket listening on `port` (from /proc/net/tcp*)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if int(hex_port, 16) == port and state == "0A":  # 0A: LISTEN
                found.add(address)
    return found


def wait_healthy(port: int, process: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}: {process.stdout.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as reply:
                if reply.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"no healthy Streamlit server on port {port} after {timeout} s")


def start(command: list[str], env: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def chromium():
    path = chromium_path()
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


def test_every_page_in_chromium(chromium, store_env):
    env, root = store_env
    port = free_port()
    # Started from another directory: the bind address must come from dashboard/.streamlit/.
    server = start([sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "app.py"),
                    "--server.port", str(port)], env, cwd=root)
    try:
        wait_healthy(port, server)
        assert listening_addresses(port) == {"0100007F"}, "the dashboard must listen on 127.0.0.1 only"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                         args=["--no-sandbox", "--disable-dev-shm-usage"])
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            for url, (title, expected) in PAGES.items():
                page.goto(f"http://127.0.0.1:{port}/{url}")
                page.get_by_role("heading", name=title, level=1).wait_for(timeout=60_000)
                for text in expected:
                    page.get_by_text(text, exact=False).first.wait_for(timeout=60_000)
                charts = page.locator('[data-testid="stVegaLiteChart"]')
                page.wait_for_function(
                    "n => document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] canvas, "
                    "[data-testid=\"stVegaLiteChart\"] svg.marks').length >= n", arg=MIN_CHARTS[url], timeout=60_000)
                assert charts.count() >= MIN_CHARTS[url]
                assert page.locator('[data-testid="stException"]').count() == 0
                assert page.locator('[data-testid="stAlertContentError"]').count() == 0
                nav = page.locator('[data-testid="stSidebarNav"]')
                assert [t.strip() for t in nav.locator("span").all_inner_texts() if t.strip() in
                        {"Runs", "Speed", "Roofline", "Memory", "Sparsity"}] == [
                    "Runs", "Speed", "Roofline", "Memory", "Sparsity"]
                # Streamlit scrolls inside its main block, so grow the window to the page's height
                # for a screenshot of the whole page.
                height = page.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
                page.set_viewport_size({"width": 1440, "height": min(int(height) + 40, 9000)})
                page.wait_for_timeout(1200)
                page.screenshot(path=str(SCREENSHOTS / f"{title.lower()}.png"), full_page=True)
                page.set_viewport_size({"width": 1440, "height": 1000})
            browser.close()
            assert not errors, errors
    finally:
        stop(server)
    assert sorted(p.name for p in SCREENSHOTS.glob("*.png")) >= sorted(
        f"{t.lower()}.png" for t, _ in PAGES.values())


def test_jaxcnn_dashboard_binds_to_localhost(store_env):
    env, root = store_env
    port = free_port()
    server = start([sys.executable, "-m", "jaxcnn.cli", "dashboard", "--db", env["JAXCNN_DB"], "--port", str(port)],
                   {**env, "STREAMLIT_SERVER_HEADLESS": "true"}, cwd=root)
    try:
        wait_healthy(port, server)
        assert listening_addresses(port) == {"0100007F"}
    finally:
        stop(server)
    # The CLI is the server (no orphaned child keeps the port once it is stopped).
    deadline = time.monotonic() + 10
    while listening_addresses(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not listening_addresses(port)
