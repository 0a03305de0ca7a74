"""`jaxcnn.inception`: api (the inception primitive and its entry), config (argument validation
and shape rules), reference (lax)."""

from jaxcnn.ops.inception.api import inception

__all__ = ["inception"]
