"""SqueezeNet 1.0 and 1.1 with torchvision's layer configurations (ceil-mode max pools)."""

import functools

POOL = "pool"
# After the stem conv: max pools and fire modules (squeeze, expand1x1, expand3x3 filters).
SQUEEZENET1_0_STEM = dict(features=96, kernel=7)
SQUEEZENET1_0_LAYERS = (
    POOL, (16, 64, 64), (16, 64, 64), (32, 128, 128),
    POOL, (32, 128, 128), (48, 192, 192), (48, 192, 192), (64, 256, 256),
    POOL, (64, 256, 256),
)
SQUEEZENET1_1_STEM = dict(features=64, kernel=3)
SQUEEZENET1_1_LAYERS = (
    POOL, (16, 64, 64), (16, 64, 64),
    POOL, (32, 128, 128), (32, 128, 128),
    POOL, (48, 192, 192), (48, 192, 192), (64, 256, 256), (64, 256, 256),
)


def fire(net, name, x, *, squeeze, expand1x1, expand3x3):
    squeezed = net.conv(f"{name}/squeeze1x1", x, squeeze, 1)
    return net.concat(
        f"{name}/concat",
        net.conv(f"{name}/expand1x1", squeezed, expand1x1, 1),
        net.conv(f"{name}/expand3x3", squeezed, expand3x3, 3, padding=1),
    )


def squeezenet(net, x, *, stem, layers):
    x = net.conv("conv1", x, stem["features"], stem["kernel"], stride=2)
    pools, fires = 0, 1  # torchvision numbers fire modules from 2
    for layer in layers:
        if layer == POOL:
            pools += 1
            x = net.maxpool(f"maxpool{pools}", x, 3, stride=2, ceil_mode=True)
        else:
            fires += 1
            squeeze, expand1x1, expand3x3 = layer
            x = net.block("fire", f"fire{fires}", fire, x, squeeze=squeeze,
                          expand1x1=expand1x1, expand3x3=expand3x3)
    x = net.conv("conv10", x, 1000, 1)
    return net.global_avgpool("avgpool", x)


squeezenet1_0 = functools.partial(squeezenet, stem=SQUEEZENET1_0_STEM, layers=SQUEEZENET1_0_LAYERS)
squeezenet1_1 = functools.partial(squeezenet, stem=SQUEEZENET1_1_STEM, layers=SQUEEZENET1_1_LAYERS)
