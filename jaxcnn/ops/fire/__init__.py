"""`jaxcnn.fire` / `jaxcnn.conv1x1_conv3x3`: api (the fused fire primitive and its entries), config
(argument validation and shape rules), reference (lax)."""

from jaxcnn.ops.fire.api import conv1x1_conv3x3, fire

__all__ = ["conv1x1_conv3x3", "fire"]
