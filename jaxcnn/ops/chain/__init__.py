"""Two-conv chains fused into one primitive each: conv1x1_depthwise and conv3x3_conv1x1 (each
module its primitive and entry), on the shared primitive (ChainPrimitive), config (argument
validation, shape rules, when the fused kernel runs) and reference (lax)."""

from jaxcnn.ops.chain.conv1x1_depthwise import conv1x1_depthwise
from jaxcnn.ops.chain.conv3x3_conv1x1 import conv3x3_conv1x1

__all__ = ["conv1x1_depthwise", "conv3x3_conv1x1"]
