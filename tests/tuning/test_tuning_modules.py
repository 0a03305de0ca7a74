"""The layout choice split into jaxcnn.tuning (one job per module) and the cost model pieces in
jaxcnn.costmodel: each module imports on its own in a fresh interpreter (an import cycle among
them fails whichever module starts it), and jaxcnn.layouts re-exports exactly its public API."""

from __future__ import annotations

import subprocess
import sys

import pytest

import jaxcnn.layouts as L
from jaxcnn.costmodel import roofline
from jaxcnn.tuning import autotune_cache, layer_autotune, layout_plan

MODULES = (
    "jaxcnn.layouts",
    "jaxcnn.costmodel.roofline",
    "jaxcnn.costmodel.layout_cost",
    "jaxcnn.tuning.autotune_cache",
    "jaxcnn.tuning.case_timing",
    "jaxcnn.tuning.layer",
    "jaxcnn.tuning.layer_autotune",
    "jaxcnn.tuning.layer_choice",
    "jaxcnn.tuning.layout_apply",
    "jaxcnn.tuning.layout_plan",
    "jaxcnn.tuning.layout_rules",
    "jaxcnn.tuning.text_table",
    "jaxcnn.tuning.tuner_args",
    "jaxcnn.tuning.fusion_plan",
    "jaxcnn.tuning.sparse_dispatch",
    "jaxcnn.optimize.policy",
)


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_alone(module):
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def test_layouts_facade_reexports_its_public_names():
    assert sorted(L.__all__) == sorted(set(L.__all__))
    for name in L.__all__:
        assert getattr(L, name) is not None, name
    # The facade holds no code of its own: every public function and class is defined in a home
    # module of jaxcnn.tuning.
    homes = {getattr(L, n).__module__ for n in L.__all__ if hasattr(getattr(L, n), "__module__")
             and callable(getattr(L, n))}
    assert all(h.startswith("jaxcnn.tuning.") for h in homes), homes
    assert L.autotune_conv is layer_autotune.autotune_conv and L.ChainPlan is layout_plan.ChainPlan
    assert L.AutotuneCache is autotune_cache.AutotuneCache


def test_one_kernel_floor():
    """Layout transforms and fusion kernels share costmodel.roofline's floor: the smallest
    transform costs exactly the floor, and so does the fusion model's smallest kernel."""
    from jaxcnn.costmodel import fusion_cost as cost
    from jaxcnn.profile.gpu_specs import spec_by_name

    assert not hasattr(cost, "KERNEL_FLOOR_MS")
    assert L.transform_ms((1, 1, 1, 1), "float32", "NHWC", "NCHW") == roofline.KERNEL_FLOOR_MS
    tiny = cost.Kernel("tiny", flops=0.0, bytes=4.0, math="memory")
    assert tiny.ms(spec_by_name("H200"), "float32") == roofline.KERNEL_FLOOR_MS
