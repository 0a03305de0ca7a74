"""Buffer lifetimes and memory bounds (the packing planner builds on these)."""

from jaxcnn.planner.hlo import compiled_buffers, hlo_buffer_roles, hlo_buffers, memory_stats
from jaxcnn.planner.lifetimes import Buffer, jaxpr_buffers, live_bytes_lower_bound
from jaxcnn.planner.packing import Plan, pack_2d, plan_all
from jaxcnn.planner.report import plan_model, training_step

__all__ = [
    "Buffer",
    "compiled_buffers",
    "hlo_buffer_roles",
    "hlo_buffers",
    "jaxpr_buffers",
    "live_bytes_lower_bound",
    "memory_stats",
    "pack_2d",
    "Plan",
    "plan_all",
    "plan_model",
    "training_step",
]
