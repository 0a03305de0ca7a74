"""LeNet-5 (LeCun et al. 1998) on 32x32x1 images, with ReLU for tanh, plain average pooling for
the trainable subsampling, and C5 as a dense layer (it sees a 5x5 map, so they are the same)."""

from jaxcnn.models.layers import mlp_head


def lenet5(net, x):
    x = net.conv("conv1", x, 6, 5)
    x = net.avgpool("pool1", x, 2, stride=2)
    x = net.conv("conv2", x, 16, 5)
    x = net.avgpool("pool2", x, 2, stride=2)
    return mlp_head(net, net.flatten(x), (("fc1", 120), ("fc2", 84), ("fc3", 10)))
