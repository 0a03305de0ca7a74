import os

import pytest

import jaxcnn


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
