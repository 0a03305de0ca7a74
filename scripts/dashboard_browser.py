"""The dashboard in a real browser, as its browser test and its render benchmark drive it: a
`streamlit run dashboard/app.py` server on a free localhost port (started, checked healthy,
stopped), headless Chromium launched through Playwright, and the condition that says a page has
settled (its script has finished and every element, chart and table on it is drawn).

Shared by tests/dashboard/test_dashboard_browser.py and scripts/bench_dashboard.py, so both wait
for the same thing. Only the standard library is needed to import it; Playwright is asked for
where a browser is launched (require_playwright says what to install when it is missing).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # the caller says what is missing (require_playwright) or skips
    sync_playwright = None

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboard" / "app.py"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_ENV_VAR = "JAXCNN_CHROMIUM"  # a Chromium binary to use instead of the ones on PATH
CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage"]  # containers: no user namespaces, small /dev/shm
VIEWPORT = {"width": 1440, "height": 1000}
# The pages of dashboard/app.py: URL path -> title (the page's h1 and its sidebar entry).
PAGES = {"": "Runs", "speed": "Speed", "roofline": "Roofline", "memory": "Memory", "sparsity": "Sparsity"}
SETTLE_TIMEOUT_MS = 60_000

# True (as the ms since navigation start, performance.now()) once the page has settled: the
# script has finished (stApp's script state, what Streamlit's running indicator shows, is
# "notRunning"), no element still waits for its component's code (Streamlit shows an stSkeleton
# in its place: charts, tables, widgets often arrive after the script finished), every
# Vega-Lite chart has drawn its marks (a canvas or svg.marks), at least `least` of them, and
# every table has its grid (.dvn-scroller). Else false.
SETTLED_JS = """least => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
  if (document.querySelector('[data-testid="stSkeleton"]')) return false;
  const charts = [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')];
  const drawn = charts.filter(c => c.querySelector('canvas, svg.marks')).length;
  if (drawn < Math.max(least, charts.length)) return false;
  const tables = [...document.querySelectorAll('[data-testid="stDataFrame"]')];
  if (!tables.every(t => t.querySelector('.dvn-scroller'))) return false;
  return Math.max(performance.now(), 1e-3);
}"""


def require_playwright() -> None:
    """Raises SystemExit with what to install when Playwright is missing."""
    if sync_playwright is None:
        raise SystemExit("Playwright is not installed: pip install playwright (the browser itself: "
                         f"apt-get install -y chromium, or set {CHROMIUM_ENV_VAR})")


def chromium_path() -> str | None:
    """$JAXCNN_CHROMIUM, else the first Chromium or Chrome binary on PATH; None when there is none."""
    candidates = [os.environ.get(CHROMIUM_ENV_VAR)] + [shutil.which(n) for n in CHROMIUM_NAMES]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def launch_chromium(playwright: Any, executable: str) -> Any:
    """Headless Chromium from `executable`, launched by a started sync_playwright()."""
    return playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)


def free_port() -> int:
    """A TCP port nothing listens on now (the OS's pick)."""
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
    """Returns once the Streamlit server on `port` answers its health check; raises when the
    process exits first (with its output) or after `timeout` seconds."""
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
    """The command as a server process, its stderr merged into its stdout (read on failure)."""
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop(process: subprocess.Popen) -> None:
    """Terminates the process, killing it when it has not exited after 15 s."""
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def streamlit_command(port: int) -> list[str]:
    """`streamlit run dashboard/app.py` on `port` with this Python; the bind address comes from
    dashboard/.streamlit/, whatever the working directory."""
    return [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port)]


@contextlib.contextmanager
def dashboard_server(env: dict, cwd: Path) -> Iterator[int]:
    """A healthy `streamlit run dashboard/app.py` server with environment `env` (JAXCNN_DB and
    JAXCNN_DASHBOARD_CACHE choose its data), started from `cwd`; yields its port, stops it on exit."""
    port = free_port()
    server = start(streamlit_command(port), env, cwd)
    try:
        wait_healthy(port, server)
        yield port
    finally:
        stop(server)


def page_url(port: int, path: str) -> str:
    """The URL of the dashboard page at `path` ("" for Runs, "speed", ...)."""
    return f"http://127.0.0.1:{port}/{path}"


def wait_until_settled(page: Any, title: str, least_charts: int = 0, timeout_ms: int = SETTLE_TIMEOUT_MS) -> float:
    """Waits until the page titled `title` (its h1) has settled (SETTLED_JS: script finished, no
    element waiting for its component, every chart and table drawn, at least `least_charts`
    charts); returns the seconds from the page's navigation start to the first check that found
    it settled."""
    page.get_by_role("heading", name=title, level=1).wait_for(timeout=timeout_ms)
    settled = page.wait_for_function(SETTLED_JS, arg=least_charts, polling="raf", timeout=timeout_ms)
    return settled.json_value() / 1000.0
