"""MobileNetV2 (width 1.0) with torchvision's layer names, batch norm folded into conv biases.

jaxcnn.conv2d fuses ReLU but not ReLU6, so each conv+ReLU6 is the conv with its fused ReLU
followed by a "relu6" layer that clamps at 6 (jnp.minimum); the layer table lists both.
`inverted_residual_block` is the block's fused entry for an op table (see Net.block).
"""

from jaxcnn.models.backends import XLA_OPS
from jaxcnn.models.layers import bind_layer
from jaxcnn.ops.chain.conv1x1_depthwise import conv1x1_depthwise

# Inverted residual stages: expansion ratio, output channels, blocks, stride of the first block.
INVERTED_RESIDUAL_STAGES = (
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
    (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
)
STEM_FEATURES = 32
LAST_FEATURES = 1280
# Scales the init of the projection conv of blocks with a residual add (10 of them), so the
# summed branches keep the activations O(1).
RESIDUAL_INIT_SCALE = 0.5
# The layers of a block (named "<block>.<role>") that one jaxcnn.conv1x1_depthwise runs.
EXPAND_DEPTHWISE_LAYERS = ("expand", "expand.relu6", "depthwise", "depthwise.relu6")


def conv_relu6(net, name, x, features, kernel, **conv_args):
    return net.relu6(f"{name}.relu6", net.conv(name, x, features, kernel, activation="relu", **conv_args))


def inverted_residual(net, name, x, *, expand_ratio, features, stride):
    hidden = x.shape[-1] * expand_ratio
    has_residual = stride == 1 and x.shape[-1] == features
    out = x
    if expand_ratio != 1:
        out = conv_relu6(net, f"{name}.expand", out, hidden, 1)
    out = conv_relu6(net, f"{name}.depthwise", out, hidden, 3, stride=stride, padding=1, groups=hidden)
    out = net.conv(f"{name}.project", out, features, 1, activation=None,
                   init_scale=RESIDUAL_INIT_SCALE if has_residual else 1.0)
    return net.add(f"{name}.add", out, x) if has_residual else out


def mobilenetv2(net, x):
    x = conv_relu6(net, "features.0", x, STEM_FEATURES, 3, stride=2, padding=1)
    index = 1
    for expand_ratio, features, blocks, first_stride in INVERTED_RESIDUAL_STAGES:
        for block in range(blocks):
            x = net.block("inverted_residual", f"features.{index}", inverted_residual, x,
                          expand_ratio=expand_ratio, features=features,
                          stride=first_stride if block == 0 else 1)
            index += 1
    x = conv_relu6(net, f"features.{index}", x, LAST_FEATURES, 1)
    x = net.global_avgpool("avgpool", x)
    return net.dense("classifier", x, 1000, activation=None)


def expand_depthwise(x, expand, depthwise, stride):
    """expand 1x1 + ReLU6 -> depthwise 3x3 (pad 1) + ReLU6 as one jaxcnn.conv1x1_depthwise
    (`expand`, `depthwise`: {"w", "b"}). The layers' ReLU then clamp at 6 is ReLU6, and both
    round to x's dtype once after each conv."""
    return conv1x1_depthwise(x, expand["w"], depthwise["w"], expand["b"], depthwise["b"],
                             stride=stride, activations=("relu6", "relu6"))


def inverted_residual_block(layers, params, x, *, ops=None):
    """The zoo's fused-block entry (`ops["inverted_residual"]` in a models.backends table, see
    Net.block): the expand and depthwise layers as one `expand_depthwise` call, then the
    project conv and the residual add on `ops` (default: XLA's), as the unfused block runs
    them. A block without an expand conv runs layer by layer on `ops`. `params` are the
    block's {layer name: {"w", "b"}}; `layers` its LayerInfos."""
    ops = XLA_OPS if ops is None else ops
    prefix = len(layers[0].block) + 1
    y, rest = x, layers
    if tuple(info.name[prefix:] for info in layers[:4]) == EXPAND_DEPTHWISE_LAYERS:
        ex, _, dw, _ = layers[:4]
        y, rest = expand_depthwise(x, params[ex.name], params[dw.name], dw.stride[0]), layers[4:]
    for info in rest:
        weights = (params[info.name]["w"], params[info.name]["b"]) if info.weight_shape else ()
        y = bind_layer(info, ops)(*((y, x) if info.op == "add" else (y, *weights)))
    return y
