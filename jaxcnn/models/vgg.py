"""VGG-16 and VGG-19 (configurations D and E), without batch norm.

torchvision's AdaptiveAvgPool2d((7, 7)) is left out: at 224 the features are 7x7 already.
"""

import functools

from jaxcnn.models.layers import mlp_head

# Filters of the 3x3 convs of each stage; a 2x2 max pool ends every stage.
VGG16_STAGES = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))
VGG19_STAGES = ((64, 64), (128, 128), (256,) * 4, (512,) * 4, (512,) * 4)


def vgg(net, x, *, stages):
    for stage, widths in enumerate(stages, start=1):
        for index, width in enumerate(widths, start=1):
            x = net.conv(f"conv{stage}_{index}", x, width, 3, padding=1)
        x = net.maxpool(f"pool{stage}", x, 2, stride=2)
    return mlp_head(net, net.flatten(x), (("fc6", 4096), ("fc7", 4096), ("fc8", 1000)))


vgg16 = functools.partial(vgg, stages=VGG16_STAGES)
vgg19 = functools.partial(vgg, stages=VGG19_STAGES)
