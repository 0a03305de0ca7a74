"""`jaxcnn.conv2d_pool`: api (the fused conv + bias + ReLU + max-pool primitive and its entry),
config (argument validation and shape rules), reference (lax)."""

from jaxcnn.ops.conv2d_pool.api import conv2d_pool

__all__ = ["conv2d_pool"]
