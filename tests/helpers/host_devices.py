"""Run a sharding check script in a fresh Python on 8 forced CPU host devices (the device count is
fixed when jax starts, so it cannot change inside the pytest process)."""

import os
import subprocess
import sys
from pathlib import Path

HELPERS_DIR = Path(__file__).resolve().parent
REPO_ROOT = HELPERS_DIR.parents[1]


def run_on_8_host_devices(script: str, timeout: int = 900) -> str:
    """Runs script (python -c) with 8 host devices, the repo root as cwd and tests/helpers/
    importable (fp32_reassociation); fails the test with its output unless it exits 0; returns stdout."""
    pythonpath = os.pathsep.join(filter(None, (str(HELPERS_DIR), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": pythonpath}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout
