"""Automatic activation-layout (and conv kernel) choice: a rule, on-device autotuning with a
disk cache, and an exact dynamic program over chains of layers.

    import jaxcnn.layouts as L
    L.rule_conv((64, 56, 56, 64), (3, 3, 64, 128), "bfloat16")        # prior, with a reason
    choice = L.autotune_conv((64, 56, 56, 64), (3, 3, 64, 128), "bfloat16", padding="SAME")
    print(choice.explain())                                            # every candidate vs XLA
    plan = L.plan_model_layouts("squeezenet1_1", batch=64, dtype="bfloat16")
    print(plan.explain())
    y = jax.jit(lambda p, x: L.apply_plan(plan, p, x))(params, x)      # run the plan

Layouts are "NHWC", "NCHW" and "CHWN" (jaxcnn.ops.layout_axes); shapes given to this module are
always *logical* NHWC activations and HWIO weights, whatever layout a candidate runs in.

Costs come from one of three sources, always labelled:
  "measured": device time of the kernel (jaxcnn.profile.device_times, profiler kernel events)
      on the GPU this process sees, cached on disk per GPU kind;
  "model":    estimates on a machine without the CUDA kernels: jaxcnn.costmodel predictions for
      the implicit-GEMM families, else bytes (at 32-byte sector granularity) / DRAM bandwidth of
      the GPU spec, plus a per-kernel floor;
  "given":    costs handed to choose_chain by the caller.

Cache: JSON at $JAXCNN_AUTOTUNE_CACHE, else ~/.cache/jaxcnn/autotune.json; entries keyed by GPU
device_kind, op, shapes, dtype and parameters. Writes merge under a file lock and replace the
file atomically; an unreadable file is ignored with a warning.

This module is the public face of the layout choice; the code lives in jaxcnn.tuning (layer,
layout_rules, layer_autotune, layer_choice, layout_plan, layout_apply, autotune_cache) and
jaxcnn.costmodel.layout_cost (the model estimates).
"""

from jaxcnn.ops.layout_axes import LAYOUTS
from jaxcnn.tuning.autotune_cache import AutotuneCache, default_cache_path
from jaxcnn.tuning.layer import Block, Layer, conv_layer, pool_layer
from jaxcnn.tuning.layer_autotune import autotune_conv, autotune_pool, autotune_transforms, transform_ms
from jaxcnn.tuning.layer_choice import CandidateResult, ConvChoice, PoolChoice
from jaxcnn.tuning.layout_apply import apply_plan
from jaxcnn.tuning.layout_plan import (
    ChainPlan,
    ChainStep,
    LayerCost,
    Transform,
    choose_chain,
    explain,
    layer_cost,
    model_chain,
    plan_model_layouts,
)
from jaxcnn.tuning.layout_rules import RuleChoice, rule_conv, rule_for, rule_pool

__all__ = [
    "LAYOUTS", "AutotuneCache", "Block", "CandidateResult", "ChainPlan", "ChainStep",
    "ConvChoice", "Layer", "LayerCost", "PoolChoice", "RuleChoice", "Transform",
    "apply_plan", "autotune_conv", "autotune_pool", "autotune_transforms", "choose_chain",
    "conv_layer", "default_cache_path", "explain", "layer_cost", "model_chain",
    "plan_model_layouts", "pool_layer", "rule_conv", "rule_for", "rule_pool", "transform_ms",
]
