"""`jaxcnn.conv2d`: api (argument checks, the algorithm decision), primitive (the conv + epilogue
jax primitive and its VJP), config (argument validation and shape rules), reference (lax)."""

from jaxcnn.ops.conv2d.api import conv2d

__all__ = ["conv2d"]
