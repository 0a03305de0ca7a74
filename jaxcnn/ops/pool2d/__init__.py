"""`jaxcnn.max_pool2d` / `jaxcnn.avg_pool2d`: api (the pool primitive and its entries), config
(argument normalization, validation and shape rules), reference (lax)."""

from jaxcnn.ops.pool2d.api import avg_pool2d, max_pool2d

__all__ = ["avg_pool2d", "max_pool2d"]
