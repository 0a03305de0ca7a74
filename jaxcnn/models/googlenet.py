"""GoogLeNet (Inception v1, Szegedy et al. 2014) without the auxiliary heads.

Layout as torchvision: batch norm (folded into the conv biases) instead of LRN, ceil-mode
max pools. Unlike torchvision, whose "5x5" branch is a 3x3 conv (a bug it keeps for its
weights), the 5x5 branch is 5x5 as in the paper.
"""

# Filters: 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection (paper, table 1).
INCEPTION = {
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}
# Max pools (window, stride) between stages, after the named inception module.
POOL_AFTER = {"3b": (3, 2), "4e": (2, 2)}


def inception(net, name, x, *, filters):
    n1x1, n3x3_reduce, n3x3, n5x5_reduce, n5x5, pool_proj = filters
    branch1x1 = net.conv(f"{name}/1x1", x, n1x1, 1)
    branch3x3 = net.conv(f"{name}/3x3_reduce", x, n3x3_reduce, 1)
    branch3x3 = net.conv(f"{name}/3x3", branch3x3, n3x3, 3, padding=1)
    branch5x5 = net.conv(f"{name}/5x5_reduce", x, n5x5_reduce, 1)
    branch5x5 = net.conv(f"{name}/5x5", branch5x5, n5x5, 5, padding=2)
    branch_pool = net.maxpool(f"{name}/pool", x, 3, stride=1, padding=1)
    branch_pool = net.conv(f"{name}/pool_proj", branch_pool, pool_proj, 1)
    return net.concat(f"{name}/concat", branch1x1, branch3x3, branch5x5, branch_pool)


def googlenet(net, x):
    x = net.conv("conv1", x, 64, 7, stride=2, padding=3)
    x = net.maxpool("maxpool1", x, 3, stride=2, ceil_mode=True)
    x = net.conv("conv2", x, 64, 1)
    x = net.conv("conv3", x, 192, 3, padding=1)
    x = net.maxpool("maxpool2", x, 3, stride=2, ceil_mode=True)
    pools = 2
    for stage, filters in INCEPTION.items():
        x = net.block("inception", f"inception{stage}", inception, x, filters=filters)
        if stage in POOL_AFTER:
            pools += 1
            window, stride = POOL_AFTER[stage]
            x = net.maxpool(f"maxpool{pools}", x, window, stride=stride, ceil_mode=True)
    x = net.global_avgpool("avgpool", x)
    return net.dense("fc", x, 1000, activation=None)
