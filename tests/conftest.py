import os
import sys
from pathlib import Path

import pytest

# The shared helper modules (tests/helpers/) are imported by their own names (`from arrays import
# ...`) from the test folders: put their folder on sys.path before any test module is collected.
HELPERS_DIR = Path(__file__).resolve().parent / "helpers"
if str(HELPERS_DIR) not in sys.path:
    sys.path.insert(0, str(HELPERS_DIR))

# pytest-xdist workers (-n N) share one GPU: each takes device memory as it needs it, capped at its
# share, instead of preallocating 75% of the card. Set before jax starts a GPU client; values
# already in the environment win.
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if os.environ.get("PYTEST_XDIST_WORKER") and _XDIST_WORKERS > 1:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / _XDIST_WORKERS:.2f}")

# The suites test results, not choices: automatic decisions (conv2d "auto", optimize's policy)
# use cached measurements and rules instead of timing candidates on every new shape. Measured
# decisions are tested explicitly (measure=True, a temporary cache).
os.environ.setdefault("JAXCNN_MEASURE", "0")

import jaxcnn  # noqa: E402  (after the environment above: jax reads it)


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where the CUDA kernels can run; elsewhere they skip with the reason."""
    reason = jaxcnn.cuda_unavailable_reason()
    if not reason:
        # On a GPU machine a silent fallback to the XLA reference would make GPU tests vacuous.
        os.environ["JAXCNN_STRICT"] = "1"
        return
    skip = pytest.mark.skip(reason=f"CUDA kernels unavailable: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
