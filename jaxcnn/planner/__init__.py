"""Buffer lifetimes and memory bounds (the packing planner builds on these)."""

from jaxcnn.planner.lifetimes import Buffer, jaxpr_buffers, live_bytes_lower_bound

__all__ = ["Buffer", "jaxpr_buffers", "live_bytes_lower_bound"]
