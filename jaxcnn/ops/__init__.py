"""One module per primitive; each exposes its public function."""

from jaxcnn.ops.conv2d import conv2d

__all__ = ["conv2d"]
