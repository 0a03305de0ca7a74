"""One module per primitive; each exposes its public function."""

from jaxcnn.ops.conv2d import conv2d
from jaxcnn.ops.layout_transform import to_layout

__all__ = ["conv2d", "to_layout"]
