"""Cross-layer fusion for the model zoo: find fusable groups (fire modules, inception blocks,
straight conv->ReLU->max pool, MobileNetV2's expand->depthwise), decide each from a cost model
checked by on-device autotuning, explain the decision and run the model with the chosen fused
kernels. (Groups in a plain JAX function: jaxcnn.optimize(fn, fuse=...), which decides them
with decide_groups here.)

    from jaxcnn import fusion
    plan = fusion.plan_fusion("squeezenet1_1", batch=64, dtype="bfloat16")
    print(plan.explain())
    logits = jax.jit(plan.apply)(params, x)

This module is the public face of the zoo fusion plan; the code lives in jaxcnn.tuning
(fusion_groups: finding the groups; fusion_plan: deciding and applying them) and
jaxcnn.costmodel.fusion_cost (the fused / unfused cost off GPU).
"""

from jaxcnn.costmodel.fusion_cost import fused_cost, unfused_cost
from jaxcnn.tuning.fusion_groups import KINDS, FusionGroup, conv_pool_available, find_groups
from jaxcnn.tuning.fusion_plan import (
    CANDIDATES,
    Candidate,
    FusionPlan,
    decide_groups,
    GroupDecision,
    group_fn,
    group_params,
    plan_fusion,
)

__all__ = [
    "CANDIDATES", "KINDS", "Candidate", "FusionGroup", "FusionPlan", "GroupDecision",
    "conv_pool_available", "decide_groups", "find_groups", "fused_cost", "group_fn", "group_params",
    "plan_fusion", "unfused_cost",
]
