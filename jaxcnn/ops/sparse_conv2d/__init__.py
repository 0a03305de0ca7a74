"""`jaxcnn.sparse_conv2d` / `jaxcnn.sparse_conv2d_pool`: api (the zero-skipping conv primitive and
its entries), config (argument validation and shape rules), reference (lax)."""

from jaxcnn.ops.sparse_conv2d.api import sparse_conv2d, sparse_conv2d_pool

__all__ = ["sparse_conv2d", "sparse_conv2d_pool"]
