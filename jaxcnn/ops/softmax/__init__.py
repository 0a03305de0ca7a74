"""`jaxcnn.softmax` / `jaxcnn.log_softmax`: api (the softmax primitive and its entries), config
(argument validation), reference (lax)."""

from jaxcnn.ops.softmax.api import log_softmax, softmax

__all__ = ["log_softmax", "softmax"]
