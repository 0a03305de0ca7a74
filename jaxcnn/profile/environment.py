"""Where a measurement was taken: GPU, driver, CUDA, jax/jaxlib versions, git commit."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

import jax
import jaxlib

import jaxcnn

REPO_ROOT = Path(__file__).resolve().parents[2]


def command_output(*cmd: str) -> str | None:
    """stdout of a command run in the repository, or None when it is missing or fails."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=REPO_ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state() -> dict[str, Any] | None:
    """Commit and dirtiness. JAXCNN_GIT_COMMIT, where set, names the commit instead (a copy of
    a commit's tree, e.g. a `git archive` sent to a GPU machine, has no .git of its own, and
    git would report whatever repository encloses it); its dirtiness is then unknown."""
    given = os.environ.get("JAXCNN_GIT_COMMIT")
    if given:
        return dict(commit=given, dirty=None)
    commit = command_output("git", "rev-parse", "HEAD")
    if commit is None:
        return None
    changes = command_output("git", "status", "--porcelain")  # untracked files count too
    return dict(commit=commit, dirty=bool(changes))


def jax_package_versions() -> dict[str, str]:
    """Versions of jax, jaxlib and the jax CUDA plugins that are installed."""
    versions = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in ("jax", "jaxlib") or name.startswith("jax-cuda"):
            versions[name] = dist.version
    return versions


def _nvidia_smi() -> dict[str, str] | None:
    line = command_output(
        "nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"
    )
    if not line:
        return None
    name, driver, memory, clock = (part.strip() for part in line.splitlines()[0].split(","))
    return dict(name=name, driver=driver, memory=memory, max_sm_clock=clock)


def _cuda_version() -> str | None:
    smi = command_output("nvidia-smi")
    if smi and "CUDA Version:" in smi:
        return smi.split("CUDA Version:")[1].split()[0]
    return None


def collect_environment() -> dict[str, Any]:
    """The environment of this process, keyed like the store's `environments` table."""
    device = jax.devices()[0]
    smi = _nvidia_smi()
    return dict(
        gpu_name=device.device_kind if device.platform == "gpu" else None,
        gpu_count=jax.device_count() if device.platform == "gpu" else 0,
        driver=smi["driver"] if smi else None,
        cuda_version=_cuda_version(),
        jax_version=jax.__version__,
        jaxlib_version=jaxlib.__version__,
        jaxcnn_version=jaxcnn.__version__,
        python=platform.python_version(),
        platform=device.platform,
        hostname=socket.gethostname(),
        extra=dict(
            date_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            device_kind=device.device_kind,
            nvidia_smi=smi,
            packages=jax_package_versions(),
            git=git_state(),
            jaxcnn_cuda_available=jaxcnn.cuda_available(),
            jaxcnn_cuda_unavailable_reason=jaxcnn.cuda_unavailable_reason() or None,
        ),
    )
