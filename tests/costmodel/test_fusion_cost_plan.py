"""The cost model's fused fire version reads the library's plan for the GPU it is asked about
(jaxcnn_fire_plan_for_device through jaxcnn._native.queries.fire_plan(..., device=)), on the
CPU: the export plans SqueezeNet's fires as the cost model's former Python mirror of fire.cu
did, the cost model's kernel is the plan's, and without the library one labelled fallback
estimate stands in."""

import pytest

from jaxcnn import fusion
from jaxcnn._native import queries
from jaxcnn._native.plans import DeviceLimits
from jaxcnn.costmodel import fusion_cost as cost
from jaxcnn.profile.gpu_specs import spec_by_name

SPECS = ("H100 SXM", "H200")
DTYPES = ("bfloat16", "float16", "float32")
# The kernel jaxcnn.fire's "auto" runs for SqueezeNet's fires 2-9 in bf16/fp16 on H100 SXM and
# H200 (132 SMs each), wgmma with its launches: the answers of the cost model's Python mirror
# of fire.cu, recorded before it was replaced by the plan query (float32: the CUDA-core kernel
# everywhere). N=1: the fused kernel on the 54/55-pixel fires, the two-phase kernel from 1024
# output pixels down; N=64: the fused kernel two CTAs per SM unsplit for the 16-channel
# squeezes, else the wgmma path (one launch at S=32, merged expands at S=64, one conv each at
# S=48).
AT_SCALE = ("tensor_core", "tensor_core", "wgmma/1", "wgmma/1", "wgmma/3", "wgmma/3", "wgmma/2",
            "wgmma/2")
MIRROR_KERNELS = {
    ("squeezenet1_0", 1): ("tensor_core",) * 3 + ("two_phase",) * 5,
    ("squeezenet1_0", 64): AT_SCALE,
    ("squeezenet1_1", 1): ("tensor_core",) * 2 + ("two_phase",) * 6,
    ("squeezenet1_1", 64): AT_SCALE,
}


@pytest.fixture(scope="module")
def plans_available():
    limits = DeviceLimits.from_spec(spec_by_name("H200"))
    if queries.fire_plan((1, 8, 8, 16), 16, 16, 16, "bfloat16", device=limits) is None:
        pytest.skip("the library's jaxcnn_fire_plan_for_device is not loaded")


def fire_groups(model, n, dtype):
    groups, _ = fusion.find_groups(model, batch=n, dtype=dtype, kinds=("fire",))
    return groups


def kernel_name(plan) -> str:
    return f"wgmma/{plan.launches}" if plan.kernel == "wgmma" else plan.kernel


def test_device_limits_from_the_spec_table():
    """The attributes the plan reads, from jaxcnn.profile.gpu_specs (what
    cudaDeviceGetAttribute reports on those parts)."""
    assert DeviceLimits.from_spec(spec_by_name("H200")) == DeviceLimits(132, 232448, 233472, 9, True)
    assert DeviceLimits.from_spec(spec_by_name("H100 PCIe")) == DeviceLimits(114, 232448, 233472, 9, True)
    assert DeviceLimits.from_spec(spec_by_name("A100 SXM 80GB")) == DeviceLimits(108, 166912, 167936, 8, True)


@pytest.mark.parametrize("spec_name", SPECS)
@pytest.mark.parametrize("model,n", sorted(MIRROR_KERNELS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_plan_for_device_chooses_as_the_former_mirror(plans_available, spec_name, model, n, dtype):
    spec = spec_by_name(spec_name)
    want = MIRROR_KERNELS[(model, n)] if dtype != "float32" else ("fma",) * 8
    got = tuple(kernel_name(cost.fire_plan(g, spec)) for g in fire_groups(model, n, dtype))
    assert got == want


# Tile, expand-channel split, CTAs per SM and shared memory of the fused tensor-core kernel:
# the planner's answers on H200 (jaxcnn_fire_plan_for_device; the same on H100 SXM: 132 SMs,
# 227 KiB). N=1 leaves SMs idle with 8-row tiles: 4x16 tiles, and the expand channels split so
# that every SM has a (tile, slice).
TENSOR_CORE_PLANS = [
    # (model, N, fire index, tile, split, ctas_per_sm, smem)
    ("squeezenet1_1", 64, 0, (8, 16), 1, 2, 109632),
    ("squeezenet1_1", 64, 1, (8, 16), 1, 2, 112704),
    ("squeezenet1_0", 64, 0, (8, 16), 1, 2, 112704),
    ("squeezenet1_1", 1, 0, (4, 16), 2, 2, 72512),
    ("squeezenet1_0", 1, 2, (4, 16), 4, 2, 96640),
]


@pytest.mark.parametrize("spec_name", SPECS)
@pytest.mark.parametrize("model,n,index,tile,split,ctas,smem", TENSOR_CORE_PLANS)
def test_tensor_core_plan_tile_and_split(plans_available, spec_name, model, n, index, tile, split,
                                         ctas, smem):
    plan = cost.fire_plan(fire_groups(model, n, "bfloat16")[index], spec_by_name(spec_name))
    assert (plan.kernel, plan.tile, plan.split, plan.ctas_per_sm, plan.smem) == \
        ("tensor_core", tile, split, ctas, smem), plan.text


@pytest.mark.parametrize("spec_name", SPECS)
@pytest.mark.parametrize("model,n", sorted(MIRROR_KERNELS))
def test_cost_model_runs_the_plans_kernel(plans_available, spec_name, model, n):
    spec = spec_by_name(spec_name)
    for g in fire_groups(model, n, "bfloat16"):
        plan = cost.fire_plan(g, spec)
        fused = cost.fused_cost(g, spec)
        assert fused.config == f"library plan: {plan.text}"
        names = [k.what for k in fused.kernels]
        if plan.kernel == "wgmma":
            assert fused.launches == plan.launches and all(n.startswith("jaxcnn_fire/") for n in names)
        elif plan.kernel == "two_phase":
            assert names == ["jaxcnn_fire/two_phase"]
        else:
            assert names == ["jaxcnn_fire"] and fused.kernels[0].math == "tensor"
        assert cost.fire_uses_tensor_cores(g, spec)


def test_fused_cost_without_the_library_uses_the_labelled_fallback(monkeypatch):
    monkeypatch.setattr(queries, "fire_plan", lambda *args, **kwargs: None)
    spec = spec_by_name("H200")
    for dtype, math_kind in (("bfloat16", "tensor"), ("float32", "fma")):
        g = fire_groups("squeezenet1_1", 64, dtype)[3]
        fused = cost.fused_cost(g, spec)
        assert fused.config == cost.FALLBACK_FIRE_NOTE and "fallback" in fused.to_dict()["config"]
        (kernel,) = fused.kernels
        assert "fallback estimate" in kernel.what and kernel.math == math_kind
        assert fused.time_ms > 0 and fused.dram_bytes < cost.unfused_cost(g, spec).dram_bytes
        assert cost.fire_uses_tensor_cores(g, spec) == (dtype == "bfloat16")
