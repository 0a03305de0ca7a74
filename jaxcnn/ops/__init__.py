"""One package per primitive (api, primitive, config, reference), on the shared base at this
level; each package re-exports its public functions."""

from jaxcnn.ops.chain import conv1x1_depthwise, conv3x3_conv1x1
from jaxcnn.ops.conv2d import conv2d
from jaxcnn.ops.conv2d_pool import conv2d_pool
from jaxcnn.ops.fire import conv1x1_conv3x3, fire
from jaxcnn.ops.inception import inception
from jaxcnn.ops.layout_transform import to_layout
from jaxcnn.ops.pool2d import avg_pool2d, max_pool2d
from jaxcnn.ops.softmax import log_softmax, softmax
from jaxcnn.ops.sparse_conv2d import sparse_conv2d, sparse_conv2d_pool
from jaxcnn.ops.weights import fold_weights, relayout_weights

__all__ = ["avg_pool2d", "conv1x1_conv3x3", "conv1x1_depthwise", "conv2d", "conv2d_pool",
           "conv3x3_conv1x1", "fire", "fold_weights", "inception", "log_softmax", "max_pool2d",
           "relayout_weights", "softmax", "sparse_conv2d", "sparse_conv2d_pool", "to_layout"]
