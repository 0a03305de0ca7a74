"""ResNet-50 (torchvision v1.5: the stride sits on the 3x3 conv) for inference, with every batch
norm folded into its conv's bias: conv+bias(+ReLU), residual add, then ReLU."""

# Bottleneck width (the block outputs 4x), number of blocks, stride of the first block.
RESNET50_STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))
EXPANSION = 4
# Scales the init of each residual branch's last conv so that the sum of 16 residual
# branches keeps the activations O(1) (the role zero-init of the last BN plays in training).
RESIDUAL_INIT_SCALE = 0.25


def bottleneck(net, name, x, *, width, stride):
    out = net.conv(f"{name}.conv1", x, width, 1)
    out = net.conv(f"{name}.conv2", out, width, 3, stride=stride, padding=1)
    out = net.conv(f"{name}.conv3", out, EXPANSION * width, 1, activation=None,
                   init_scale=RESIDUAL_INIT_SCALE)
    shortcut = x
    if stride != 1 or x.shape[-1] != EXPANSION * width:
        shortcut = net.conv(f"{name}.downsample", x, EXPANSION * width, 1, stride=stride, activation=None)
    return net.add(f"{name}.add", out, shortcut, activation="relu")


def resnet50(net, x):
    x = net.conv("conv1", x, 64, 7, stride=2, padding=3)
    x = net.maxpool("maxpool", x, 3, stride=2, padding=1)
    for stage, (width, blocks, first_stride) in enumerate(RESNET50_STAGES, start=1):
        for index in range(blocks):
            x = net.block("bottleneck", f"layer{stage}.{index}", bottleneck, x, width=width,
                          stride=first_stride if index == 0 else 1)
    x = net.global_avgpool("avgpool", x)
    return net.dense("fc", x, 1000, activation=None)
