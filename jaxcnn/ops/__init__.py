"""One module per primitive; each exposes its public function."""

from jaxcnn.ops.conv2d import conv2d
from jaxcnn.ops.fire import fire
from jaxcnn.ops.inception import inception
from jaxcnn.ops.layout_transform import to_layout
from jaxcnn.ops.pool2d import avg_pool2d, max_pool2d
from jaxcnn.ops.softmax import log_softmax, softmax

__all__ = ["avg_pool2d", "conv2d", "fire", "inception", "log_softmax", "max_pool2d", "softmax", "to_layout"]
