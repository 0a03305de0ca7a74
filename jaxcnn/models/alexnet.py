"""AlexNet as torchvision builds it (one tower, 64/192/384/256/256 filters, no LRN).

torchvision's AdaptiveAvgPool2d((6, 6)) is left out: at 224 (and 227) the features are 6x6 already.
"""

from jaxcnn.models.layers import mlp_head


def alexnet(net, x):
    x = net.conv("conv1", x, 64, 11, stride=4, padding=2)
    x = net.maxpool("pool1", x, 3, stride=2)
    x = net.conv("conv2", x, 192, 5, padding=2)
    x = net.maxpool("pool2", x, 3, stride=2)
    x = net.conv("conv3", x, 384, 3, padding=1)
    x = net.conv("conv4", x, 256, 3, padding=1)
    x = net.conv("conv5", x, 256, 3, padding=1)
    x = net.maxpool("pool5", x, 3, stride=2)
    return mlp_head(net, net.flatten(x), (("fc6", 4096), ("fc7", 4096), ("fc8", 1000)))
