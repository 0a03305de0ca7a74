"""CNNs written the way Flax and Equinox users write them, with those libraries' own layers
(not jaxcnn's zoo): the inputs of `jaxcnn.optimize`'s third-party tests and benchmarks.

Flax linen and nnx models take NHWC images (Flax's layout), the Equinox models NCHW images of
one example, applied over a batch with `jax.vmap` as Equinox code does. The zoo-style models end
in a softmax over the classes (an inference head), so each pattern `optimize` knows appears; the
ResNets with BatchNorm end in logits, as the Flax ImageNet example's ResNet does, and run their
BatchNorm in inference mode (running statistics). The "keras_*" models are Keras 3
applications on the JAX backend (benchmarks/keras_models.py), the "equinox_*" ones are in
benchmarks/equinox_models.py.

    from benchmarks import thirdparty_models as tm
    m = tm.build("linen_squeezenet1_1", batch=2, hw=64, dtype=jnp.float32)
    y = m.apply(m.params, m.x)            # a pure function of (params, x) for every model kind

flax, equinox and keras are imported lazily: listing the models needs none of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

# (name, squeeze, expand1x1, expand3x3) of torchvision's SqueezeNet 1.1 after each stage.
SQUEEZENET1_1_FIRES = (
    ("fire2", 16, 64, 64), ("fire3", 16, 64, 64), "pool",
    ("fire4", 32, 128, 128), ("fire5", 32, 128, 128), "pool",
    ("fire6", 48, 192, 192), ("fire7", 48, 192, 192), ("fire8", 64, 256, 256), ("fire9", 64, 256, 256),
)
# VGG-19 (configuration E): channels per conv, "M" = 2x2 max pool.
VGG19_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
             512, 512, 512, 512, "M")
# GoogLeNet's first inception blocks (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj), "M" =
# 3x3/2 max pool: the part of the network GoogLeNetHead runs.
GOOGLENET_HEAD_BLOCKS = ((64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64), "M",
                         (192, 96, 208, 16, 48, 64))
# Blocks per stage of the ResNets (He et al. table 1); stage i has 64 * 2**i channels (x4 out
# of a bottleneck block).
RESNET18_STAGES = (2, 2, 2, 2)
RESNET50_STAGES = (3, 4, 6, 3)


def like_trained_batchnorm(role: str, shape, dtype, rng: np.random.Generator) -> jax.Array:
    """A stand-in for one trained BatchNorm array: role "mean" / "offset" ~ N(0, 0.2^2), "var" /
    "scale" ~ U(0.5, 1.5).

    A freshly initialised BatchNorm is the identity (mean 0, var 1, scale 1, offset 0; the Flax
    example even zero-initialises each block's last scale, which zeroes the residual branch), so
    a wrong fold of the statistics into a conv would go unseen on it. Every builder below puts
    these values into its BatchNorm layers instead.
    """
    if role in ("mean", "offset"):
        value = rng.normal(0.0, 0.2, shape)
    elif role in ("var", "scale"):
        value = rng.uniform(0.5, 1.5, shape)
    else:
        raise ValueError(f"role must be mean, var, scale or offset, got {role!r}")
    return jnp.asarray(value, dtype)  # drawn by numpy: no jax compile per BatchNorm shape


# -- Flax linen ---------------------------------------------------------------------------------

def _linen_models():
    import flax.linen as nn

    class Fire(nn.Module):
        squeeze: int
        expand1: int
        expand3: int
        dtype: Any = jnp.float32

        @nn.compact
        def __call__(self, x):
            s = nn.relu(nn.Conv(self.squeeze, (1, 1), dtype=self.dtype, param_dtype=self.dtype, name="squeeze")(x))
            e1 = nn.relu(nn.Conv(self.expand1, (1, 1), dtype=self.dtype, param_dtype=self.dtype, name="expand1x1")(s))
            e3 = nn.relu(nn.Conv(self.expand3, (3, 3), padding="SAME", dtype=self.dtype, param_dtype=self.dtype,
                                 name="expand3x3")(s))
            return jnp.concatenate([e1, e3], axis=-1)

    class SqueezeNet11(nn.Module):
        num_classes: int = 1000
        dtype: Any = jnp.float32

        @nn.compact
        def __call__(self, x):
            x = nn.Conv(64, (3, 3), strides=(2, 2), padding="VALID", dtype=self.dtype, param_dtype=self.dtype)(x)
            x = nn.relu(x)
            x = nn.max_pool(x, (3, 3), strides=(2, 2))
            for stage in SQUEEZENET1_1_FIRES:
                if stage == "pool":
                    x = nn.max_pool(x, (3, 3), strides=(2, 2))
                else:
                    name, s, e1, e3 = stage
                    x = Fire(s, e1, e3, dtype=self.dtype, name=name)(x)
            x = nn.relu(nn.Conv(self.num_classes, (1, 1), dtype=self.dtype, param_dtype=self.dtype)(x))
            x = nn.avg_pool(x, x.shape[1:3])  # global average pool (torchvision's AdaptiveAvgPool2d(1))
            return nn.softmax(x.reshape(x.shape[0], -1))

    class VGG19(nn.Module):
        num_classes: int = 1000
        hidden: int = 4096
        dtype: Any = jnp.float32

        @nn.compact
        def __call__(self, x):
            for c in VGG19_CFG:
                if c == "M":
                    x = nn.max_pool(x, (2, 2), strides=(2, 2))
                else:
                    x = nn.relu(nn.Conv(c, (3, 3), padding=1, dtype=self.dtype, param_dtype=self.dtype)(x))
            x = x.reshape(x.shape[0], -1)
            x = nn.relu(nn.Dense(self.hidden, dtype=self.dtype, param_dtype=self.dtype)(x))
            x = nn.relu(nn.Dense(self.hidden, dtype=self.dtype, param_dtype=self.dtype)(x))
            return nn.softmax(nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.dtype)(x))

    class LeNet(nn.Module):
        """LeNet-5 style: conv/avg-pool pairs then dense layers (with a log-softmax head)."""

        num_classes: int = 10
        dtype: Any = jnp.float32

        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(6, (5, 5), padding="SAME", dtype=self.dtype, param_dtype=self.dtype)(x))
            x = nn.avg_pool(x, (2, 2), strides=(2, 2))
            x = nn.relu(nn.Conv(16, (5, 5), padding="VALID", dtype=self.dtype, param_dtype=self.dtype)(x))
            x = nn.avg_pool(x, (2, 2), strides=(2, 2))
            x = x.reshape(x.shape[0], -1)
            x = nn.relu(nn.Dense(120, dtype=self.dtype, param_dtype=self.dtype)(x))
            return nn.log_softmax(nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.dtype)(x))

    class Inception(nn.Module):
        filters: tuple
        dtype: Any = jnp.float32

        @nn.compact
        def __call__(self, x):
            n1, r3, n3, r5, n5, proj = self.filters
            conv = lambda k, size, v: nn.relu(nn.Conv(k, (size, size), padding="SAME", dtype=self.dtype,  # noqa: E731
                                                      param_dtype=self.dtype)(v))
            b1 = conv(n1, 1, x)
            b3 = conv(n3, 3, conv(r3, 1, x))
            b5 = conv(n5, 5, conv(r5, 1, x))
            bp = conv(proj, 1, nn.max_pool(x, (3, 3), strides=(1, 1), padding="SAME"))
            return jnp.concatenate([b1, b3, b5, bp], axis=-1)

    class GoogLeNetHead(nn.Module):
        """GoogLeNet (Szegedy et al.) through inception4a, then global pool + classifier."""

        num_classes: int = 1000
        dtype: Any = jnp.float32

        @nn.compact
        def __call__(self, x):
            conv = lambda k, size, stride, v: nn.relu(nn.Conv(k, (size, size), strides=(stride, stride),  # noqa: E731
                                                              padding="SAME", dtype=self.dtype,
                                                              param_dtype=self.dtype)(v))
            x = nn.max_pool(conv(64, 7, 2, x), (3, 3), strides=(2, 2), padding="SAME")
            x = nn.max_pool(conv(192, 3, 1, conv(64, 1, 1, x)), (3, 3), strides=(2, 2), padding="SAME")
            for block in GOOGLENET_HEAD_BLOCKS:
                if block == "M":
                    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
                else:
                    x = Inception(block, dtype=self.dtype)(x)
            x = jnp.mean(x, axis=(1, 2))
            return nn.softmax(nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.dtype)(x))

    class BasicBlock(nn.Module):
        channels: int
        strides: int = 1
        dtype: Any = jnp.float32

        @nn.compact
        def __call__(self, x):
            conv = lambda c, k, s, name: nn.Conv(c, (k, k), strides=(s, s), padding="SAME", use_bias=False,  # noqa: E731
                                                dtype=self.dtype, param_dtype=self.dtype, name=name)
            y = nn.relu(conv(self.channels, 3, self.strides, "conv1")(x))
            y = conv(self.channels, 3, 1, "conv2")(y)
            if x.shape != y.shape:
                x = conv(self.channels, 1, self.strides, "proj")(x)
            return nn.relu(x + y)

    class ResNetSmall(nn.Module):
        """A small ResNet (two basic-block stages, no batch norm), Flax-example style."""

        num_classes: int = 10
        dtype: Any = jnp.float32

        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(16, (3, 3), padding="SAME", dtype=self.dtype, param_dtype=self.dtype)(x))
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            x = BasicBlock(16, dtype=self.dtype)(x)
            x = BasicBlock(32, strides=2, dtype=self.dtype)(x)
            x = jnp.mean(x, axis=(1, 2))
            return nn.softmax(nn.Dense(self.num_classes, dtype=self.dtype, param_dtype=self.dtype)(x))

    # The ResNet of Flax's ImageNet example (examples/imagenet/models.py), as written there:
    # convs without bias, BatchNorm between each conv and its activation, the residual added
    # before the last ReLU. Params float32, compute in `dtype` (the example's mixed precision).
    class ResNetBlock(nn.Module):
        filters: int
        conv: Any
        norm: Any
        act: Callable
        strides: tuple = (1, 1)

        @nn.compact
        def __call__(self, x):
            residual = x
            y = self.conv(self.filters, (3, 3), self.strides)(x)
            y = self.norm()(y)
            y = self.act(y)
            y = self.conv(self.filters, (3, 3))(y)
            y = self.norm(scale_init=nn.initializers.zeros_init())(y)
            if residual.shape != y.shape:
                residual = self.conv(self.filters, (1, 1), self.strides, name="conv_proj")(residual)
                residual = self.norm(name="norm_proj")(residual)
            return self.act(residual + y)

    class BottleneckResNetBlock(nn.Module):
        filters: int
        conv: Any
        norm: Any
        act: Callable
        strides: tuple = (1, 1)

        @nn.compact
        def __call__(self, x):
            residual = x
            y = self.conv(self.filters, (1, 1))(x)
            y = self.norm()(y)
            y = self.act(y)
            y = self.conv(self.filters, (3, 3), self.strides)(y)
            y = self.norm()(y)
            y = self.act(y)
            y = self.conv(self.filters * 4, (1, 1))(y)
            y = self.norm(scale_init=nn.initializers.zeros_init())(y)
            if residual.shape != y.shape:
                residual = self.conv(self.filters * 4, (1, 1), self.strides, name="conv_proj")(residual)
                residual = self.norm(name="norm_proj")(residual)
            return self.act(residual + y)

    class ResNet(nn.Module):
        stage_sizes: tuple
        block_cls: Any
        num_classes: int = 1000
        num_filters: int = 64
        dtype: Any = jnp.float32
        act: Callable = nn.relu

        @nn.compact
        def __call__(self, x, train: bool = True):
            conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype)
            norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5,
                                     dtype=self.dtype)
            x = conv(self.num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], name="conv_init")(x)
            x = norm(name="bn_init")(x)
            x = nn.relu(x)
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            for i, block_size in enumerate(self.stage_sizes):
                for j in range(block_size):
                    strides = (2, 2) if i > 0 and j == 0 else (1, 1)
                    x = self.block_cls(self.num_filters * 2 ** i, strides=strides, conv=conv, norm=norm,
                                       act=self.act)(x)
            x = jnp.mean(x, axis=(1, 2))
            x = nn.Dense(self.num_classes, dtype=self.dtype)(x)
            return jnp.asarray(x, self.dtype)

    return {"squeezenet1_1": SqueezeNet11, "vgg19": VGG19, "lenet": LeNet, "resnet_small": ResNetSmall,
            "googlenet_head": GoogLeNetHead,
            "resnet18": functools.partial(ResNet, stage_sizes=RESNET18_STAGES, block_cls=ResNetBlock),
            "resnet50": functools.partial(ResNet, stage_sizes=RESNET50_STAGES, block_cls=BottleneckResNetBlock)}


def _randomize_linen_batchnorm(variables, rng: np.random.Generator):
    """variables with like_trained_batchnorm values in every BatchNorm's statistics (the
    "batch_stats" collection) and scale / bias (params of modules named *norm* / bn*)."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(variables)
    out = []
    for path, leaf in leaves:
        names = [str(getattr(k, "key", k)) for k in path]
        role = None
        if names[0] == "batch_stats":
            role = names[-1]  # "mean" or "var", the roles' own names
        elif any("norm" in n.lower() or n.startswith("bn") for n in names[1:-1]):
            role = {"scale": "scale", "bias": "offset"}[names[-1]]
        out.append(leaf if role is None else like_trained_batchnorm(role, leaf.shape, leaf.dtype, rng))
    return jax.tree_util.tree_unflatten(treedef, out)


# -- Flax nnx -----------------------------------------------------------------------------------

def _nnx_models():
    from flax import nnx

    def conv(cin, cout, k, rngs, dtype, **kw):
        return nnx.Conv(cin, cout, (k, k), rngs=rngs, dtype=dtype, param_dtype=dtype, **kw)

    class Fire(nnx.Module):
        def __init__(self, cin, s, e1, e3, *, rngs, dtype):
            self.squeeze = conv(cin, s, 1, rngs, dtype)
            self.expand1x1 = conv(s, e1, 1, rngs, dtype)
            self.expand3x3 = conv(s, e3, 3, rngs, dtype, padding="SAME")

        def __call__(self, x):
            s = nnx.relu(self.squeeze(x))
            return jnp.concatenate([nnx.relu(self.expand1x1(s)), nnx.relu(self.expand3x3(s))], axis=-1)

    class SqueezeNet11(nnx.Module):
        def __init__(self, num_classes=1000, *, rngs, dtype=jnp.float32):
            self.stem = conv(3, 64, 3, rngs, dtype, strides=2, padding="VALID")
            fires, cin = [], 64
            for stage in SQUEEZENET1_1_FIRES:
                if stage != "pool":
                    _, s, e1, e3 = stage
                    fires.append(Fire(cin, s, e1, e3, rngs=rngs, dtype=dtype))
                    cin = e1 + e3
            self.fires = nnx.List(fires)
            self.classifier = conv(cin, num_classes, 1, rngs, dtype)

        def __call__(self, x):
            x = nnx.max_pool(nnx.relu(self.stem(x)), (3, 3), strides=(2, 2))
            fires = iter(self.fires)
            for stage in SQUEEZENET1_1_FIRES:
                x = nnx.max_pool(x, (3, 3), strides=(2, 2)) if stage == "pool" else next(fires)(x)
            x = nnx.relu(self.classifier(x))
            x = nnx.avg_pool(x, x.shape[1:3])
            return nnx.softmax(x.reshape(x.shape[0], -1))

    class VGG19(nnx.Module):
        def __init__(self, num_classes=1000, hidden=4096, *, hw=224, rngs, dtype=jnp.float32):
            convs, cin = [], 3
            for c in VGG19_CFG:
                if c == "M":
                    hw //= 2
                else:
                    convs.append(conv(cin, c, 3, rngs, dtype, padding=1))
                    cin = c
            self.convs = nnx.List(convs)
            self.fc1 = nnx.Linear(cin * hw * hw, hidden, rngs=rngs, dtype=dtype, param_dtype=dtype)
            self.fc2 = nnx.Linear(hidden, hidden, rngs=rngs, dtype=dtype, param_dtype=dtype)
            self.fc3 = nnx.Linear(hidden, num_classes, rngs=rngs, dtype=dtype, param_dtype=dtype)

        def __call__(self, x):
            convs = iter(self.convs)
            for c in VGG19_CFG:
                x = nnx.max_pool(x, (2, 2), strides=(2, 2)) if c == "M" else nnx.relu(next(convs)(x))
            x = x.reshape(x.shape[0], -1)
            return nnx.softmax(self.fc3(nnx.relu(self.fc2(nnx.relu(self.fc1(x))))))

    class CNN(nnx.Module):
        """The Flax nnx tutorial's MNIST CNN (conv/relu/avg_pool twice, two linears)."""

        def __init__(self, num_classes=10, *, hw=28, rngs, dtype=jnp.float32):
            self.conv1 = conv(1, 32, 3, rngs, dtype)
            self.conv2 = conv(32, 64, 3, rngs, dtype)
            self.linear1 = nnx.Linear(64 * (hw // 4) ** 2, 256, rngs=rngs, dtype=dtype, param_dtype=dtype)
            self.linear2 = nnx.Linear(256, num_classes, rngs=rngs, dtype=dtype, param_dtype=dtype)

        def __call__(self, x):
            x = nnx.avg_pool(nnx.relu(self.conv1(x)), window_shape=(2, 2), strides=(2, 2))
            x = nnx.avg_pool(nnx.relu(self.conv2(x)), window_shape=(2, 2), strides=(2, 2))
            x = x.reshape(x.shape[0], -1)
            return nnx.log_softmax(self.linear2(nnx.relu(self.linear1(x))))

    # A ResNet-18 in nnx's style (layers made in __init__, params in `dtype` like the models
    # above), BatchNorm in inference mode between each conv and its activation.
    def norm(features, rngs, dtype):
        return nnx.BatchNorm(features, use_running_average=True, momentum=0.9, epsilon=1e-5, dtype=dtype,
                             param_dtype=dtype, rngs=rngs)

    class BasicBlock(nnx.Module):
        def __init__(self, cin, cout, strides, *, rngs, dtype):
            self.conv1 = conv(cin, cout, 3, rngs, dtype, strides=strides, use_bias=False)
            self.bn1 = norm(cout, rngs, dtype)
            self.conv2 = conv(cout, cout, 3, rngs, dtype, use_bias=False)
            self.bn2 = norm(cout, rngs, dtype)
            if strides != 1 or cin != cout:
                self.proj = conv(cin, cout, 1, rngs, dtype, strides=strides, use_bias=False)
                self.proj_bn = norm(cout, rngs, dtype)
            else:
                self.proj = self.proj_bn = None

        def __call__(self, x):
            y = nnx.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            residual = x if self.proj is None else self.proj_bn(self.proj(x))
            return nnx.relu(residual + y)

    class ResNet18(nnx.Module):
        def __init__(self, num_classes=1000, *, rngs, dtype=jnp.float32):
            self.conv_init = conv(3, 64, 7, rngs, dtype, strides=2, padding=[(3, 3), (3, 3)], use_bias=False)
            self.bn_init = norm(64, rngs, dtype)
            blocks, cin = [], 64
            for i, size in enumerate(RESNET18_STAGES):
                for j in range(size):
                    blocks.append(BasicBlock(cin, 64 * 2 ** i, 2 if i > 0 and j == 0 else 1, rngs=rngs, dtype=dtype))
                    cin = 64 * 2 ** i
            self.blocks = nnx.List(blocks)
            self.head = nnx.Linear(cin, num_classes, rngs=rngs, dtype=dtype, param_dtype=dtype)

        def __call__(self, x):
            x = nnx.relu(self.bn_init(self.conv_init(x)))
            x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            for block in self.blocks:
                x = block(x)
            return self.head(jnp.mean(x, axis=(1, 2)))

    return {"squeezenet1_1": SqueezeNet11, "vgg19": VGG19, "cnn": CNN, "resnet18": ResNet18}


def _randomize_nnx_batchnorm(module, rng: np.random.Generator) -> None:
    """Puts like_trained_batchnorm values into every nnx.BatchNorm of module, in place."""
    from flax import nnx

    bns = [node for _, node in nnx.iter_graph(module) if isinstance(node, nnx.BatchNorm)]
    for bn in bns:
        for role, var in (("mean", bn.mean), ("var", bn.var), ("scale", bn.scale), ("offset", bn.bias)):
            var[...] = like_trained_batchnorm(role, var.shape, var.dtype, rng)


# -- one interface over all of them -------------------------------------------------------------

@dataclass
class Model:
    """A built model as a pure function: apply(params, x) -> class scores.

    params: the model's parameters (a linen variables dict, an nnx State, or an Equinox
    module's array leaves); x: a batch of images in the model's layout (`layout`).
    module: the library object (linen Module, nnx Module, Equinox Module).
    """

    name: str
    apply: Callable
    params: Any
    x: jax.Array
    layout: str
    module: Any


MODELS = {
    # name: (library, model key, default image size, channels)
    "linen_squeezenet1_1": ("linen", "squeezenet1_1", 224, 3),
    "linen_vgg19": ("linen", "vgg19", 224, 3),
    "linen_lenet": ("linen", "lenet", 28, 1),
    "linen_resnet_small": ("linen", "resnet_small", 32, 3),
    "linen_googlenet_head": ("linen", "googlenet_head", 224, 3),
    "nnx_squeezenet1_1": ("nnx", "squeezenet1_1", 224, 3),
    "nnx_vgg19": ("nnx", "vgg19", 224, 3),
    "nnx_cnn": ("nnx", "cnn", 28, 1),
    "equinox_squeezenet1_1": ("equinox", "squeezenet1_1", 224, 3),
    "equinox_cnn": ("equinox", "cnn", 28, 1),
    # ResNets with inference BatchNorm (conv -> BN -> ReLU, residual added before the ReLU)
    "linen_resnet18": ("linen", "resnet18", 224, 3),
    "linen_resnet50": ("linen", "resnet50", 224, 3),
    "nnx_resnet18": ("nnx", "resnet18", 224, 3),
    "equinox_resnet18": ("equinox", "resnet18", 224, 3),
    # Keras 3 applications on the JAX backend (benchmarks/keras_models.py; model key = the
    # keras.applications name)
    "keras_resnet50": ("keras", "ResNet50", 224, 3),
    "keras_mobilenetv2": ("keras", "MobileNetV2", 224, 3),
    "keras_vgg16": ("keras", "VGG16", 224, 3),
    "keras_inceptionv3": ("keras", "InceptionV3", 299, 3),
    # Models outside the goal's list, to check that the speedups generalize: SiLU and sigmoid
    # gates (squeeze-excite), hard-swish, pre-activation BatchNorm (BN -> ReLU -> conv),
    # concatenated feature maps, LayerNorm + GELU with 7x7 depthwise convs.
    "keras_efficientnetb0": ("keras", "EfficientNetB0", 224, 3),
    "keras_mobilenetv3small": ("keras", "MobileNetV3Small", 224, 3),
    "keras_resnet50v2": ("keras", "ResNet50V2", 224, 3),
    "keras_densenet121": ("keras", "DenseNet121", 224, 3),
    "keras_convnexttiny": ("keras", "ConvNeXtTiny", 224, 3),
    # scaled residual Inception blocks; its stem block averages 192 channels into a 1x1 conv
    "keras_inceptionresnetv2": ("keras", "InceptionResNetV2", 299, 3),
}



def build(name: str, batch: int = 1, hw: int | None = None, dtype=jnp.float32, seed: int = 0,
          num_classes: int | None = None, hidden: int | None = None) -> Model:
    """Builds model `name` (a key of MODELS) with random weights and a random input batch.

    hw: image height = width (default: the model's usual size; SqueezeNet needs >= 35, VGG-19 a
    multiple of 32, the Keras models >= 32, InceptionV3 >= 75). num_classes / hidden shrink the
    heads for fast CPU tests. The BatchNorm models' BatchNorms get like_trained_batchnorm values.
    """
    if name not in MODELS:
        raise ValueError(f"name must be one of {sorted(MODELS)}, got {name!r}")
    library, key, default_hw, channels = MODELS[name]
    if library == "keras":
        from benchmarks import keras_models  # imports keras: only when a Keras model is built

        return keras_models.build(name, batch=batch, hw=hw, dtype=dtype, seed=seed, num_classes=num_classes)
    hw = default_hw if hw is None else hw
    kp, kx = jax.random.split(jax.random.PRNGKey(seed))
    rng = np.random.default_rng(seed)  # the BatchNorm models' like_trained_batchnorm values
    heads = {}
    if num_classes is not None:
        heads["num_classes"] = num_classes
    if hidden is not None and key == "vgg19":
        heads["hidden"] = hidden

    if library == "linen":
        module = _linen_models()[key](dtype=dtype, **heads)
        x = jax.random.normal(kx, (batch, hw, hw, channels), jnp.float32).astype(dtype)
        if key.startswith("resnet") and key != "resnet_small":  # the Flax example's ResNet(x, train)
            apply = functools.partial(module.apply, train=False)
            params = jax.jit(functools.partial(module.init, train=False))(kp, x)
            return Model(name, apply, _randomize_linen_batchnorm(params, rng), x, "NHWC", module)
        params = jax.jit(module.init)(kp, x)  # one compile instead of one per layer
        return Model(name, module.apply, params, x, "NHWC", module)

    if library == "nnx":
        from flax import nnx
        if key in ("vgg19", "cnn"):
            heads["hw"] = hw
        module = _nnx_models()[key](rngs=nnx.Rngs(int(seed)), dtype=dtype, **heads)
        if key == "resnet18":
            _randomize_nnx_batchnorm(module, rng)
        graphdef, state = nnx.split(module)

        def apply(state, x):
            return nnx.merge(graphdef, state)(x)

        x = jax.random.normal(kx, (batch, hw, hw, channels), jnp.float32).astype(dtype)
        return Model(name, apply, state, x, "NHWC", module)

    from benchmarks import equinox_models  # imports equinox: only when an Equinox model is built

    return equinox_models.build(name, key, batch, hw, channels, dtype, heads, kp, kx, rng)
