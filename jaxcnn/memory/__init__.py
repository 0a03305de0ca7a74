"""Buffer lifetimes and memory bounds (the packing planner builds on these); donation, batch
planning and rematerialization advice (donation.py, batch.py, remat.py)."""

from jaxcnn.memory.footprint import footprint_bytes, memory_stats
from jaxcnn.memory.hlo import compiled_buffers, hlo_buffer_roles, hlo_buffers
from jaxcnn.memory.lifetimes import Buffer, jaxpr_buffers, live_bytes_lower_bound
from jaxcnn.memory.packing import Plan, pack_2d, plan_all
from jaxcnn.memory.report import plan_model, training_step
from jaxcnn.memory.batch import MaxBatch, max_batch, max_batch_curve, parse_bytes
from jaxcnn.memory.donation import DonationPlan, jit, measure_donation, plan_donation
from jaxcnn.memory.remat import RematAdvice, candidate_policies, remat_advice

__all__ = [
    "DonationPlan", "MaxBatch", "RematAdvice", "candidate_policies", "footprint_bytes", "jit",
    "max_batch", "max_batch_curve", "measure_donation", "parse_bytes", "plan_donation", "remat_advice",
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
