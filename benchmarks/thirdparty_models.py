"""CNNs written the way Flax and Equinox users write them, with those libraries' own layers
(not jaxcnn's zoo): the inputs of `jaxcnn.optimize`'s third-party tests and benchmarks.

Flax linen and nnx models take NHWC images (Flax's layout), the Equinox model NCHW images of
one example, applied over a batch with `jax.vmap` as Equinox code does. Every model ends in a
softmax over the classes (an inference head), so each pattern `optimize` knows appears.

    from benchmarks import thirdparty_models as tm
    m = tm.build("linen_squeezenet1_1", batch=2, hw=64, dtype=jnp.float32)
    y = m.apply(m.params, m.x)            # a pure function of (params, x) for every model kind

flax and equinox are imported lazily: listing the models needs neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp

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

    return {"squeezenet1_1": SqueezeNet11, "vgg19": VGG19, "lenet": LeNet, "resnet_small": ResNetSmall,
            "googlenet_head": GoogLeNetHead}


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

    return {"squeezenet1_1": SqueezeNet11, "vgg19": VGG19, "cnn": CNN}


# -- Equinox ------------------------------------------------------------------------------------

def _equinox_models():
    import equinox as eqx

    class Fire(eqx.Module):
        squeeze: eqx.nn.Conv2d
        expand1x1: eqx.nn.Conv2d
        expand3x3: eqx.nn.Conv2d

        def __init__(self, cin, s, e1, e3, key, dtype):
            k1, k2, k3 = jax.random.split(key, 3)
            self.squeeze = eqx.nn.Conv2d(cin, s, 1, key=k1, dtype=dtype)
            self.expand1x1 = eqx.nn.Conv2d(s, e1, 1, key=k2, dtype=dtype)
            self.expand3x3 = eqx.nn.Conv2d(s, e3, 3, padding=1, key=k3, dtype=dtype)

        def __call__(self, x):  # x: [C, H, W], one example
            s = jax.nn.relu(self.squeeze(x))
            return jnp.concatenate([jax.nn.relu(self.expand1x1(s)), jax.nn.relu(self.expand3x3(s))], axis=0)

    class SqueezeNet11(eqx.Module):
        stem: eqx.nn.Conv2d
        pool: eqx.nn.MaxPool2d
        stages: list
        classifier: eqx.nn.Conv2d

        def __init__(self, key, num_classes=1000, dtype=jnp.float32):
            keys = iter(jax.random.split(key, 16))
            self.stem = eqx.nn.Conv2d(3, 64, 3, stride=2, key=next(keys), dtype=dtype)
            self.pool = eqx.nn.MaxPool2d(3, stride=2)
            stages, cin = [], 64
            for stage in SQUEEZENET1_1_FIRES:
                if stage == "pool":
                    stages.append(None)
                else:
                    _, s, e1, e3 = stage
                    stages.append(Fire(cin, s, e1, e3, next(keys), dtype))
                    cin = e1 + e3
            self.stages = stages
            self.classifier = eqx.nn.Conv2d(cin, num_classes, 1, key=next(keys), dtype=dtype)

        def __call__(self, x):
            x = self.pool(jax.nn.relu(self.stem(x)))
            for stage in self.stages:
                x = self.pool(x) if stage is None else stage(x)
            x = jax.nn.relu(self.classifier(x))
            x = eqx.nn.AvgPool2d(x.shape[1:])(x)
            return jax.nn.softmax(x.reshape(-1))

    class CNN(eqx.Module):
        """The Equinox MNIST-tutorial CNN, widened: conv/pool/relu stacks and linears."""

        layers: list

        def __init__(self, key, num_classes=10, hw=28, dtype=jnp.float32):
            k1, k2, k3, k4 = jax.random.split(key, 4)
            flat = 32 * ((hw - 2) // 2 - 2) ** 2
            self.layers = [
                eqx.nn.Conv2d(1, 16, kernel_size=3, key=k1, dtype=dtype),
                eqx.nn.MaxPool2d(kernel_size=2, stride=2),
                jax.nn.relu,
                eqx.nn.Conv2d(16, 32, kernel_size=3, key=k2, dtype=dtype),
                jax.nn.relu,
                jnp.ravel,
                eqx.nn.Linear(flat, 64, key=k3, dtype=dtype),
                jax.nn.relu,
                eqx.nn.Linear(64, num_classes, key=k4, dtype=dtype),
                jax.nn.log_softmax,
            ]

        def __call__(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    return {"squeezenet1_1": SqueezeNet11, "cnn": CNN}


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
}


def build(name: str, batch: int = 1, hw: int | None = None, dtype=jnp.float32, seed: int = 0,
          num_classes: int | None = None, hidden: int | None = None) -> Model:
    """Builds model `name` (a key of MODELS) with random weights and a random input batch.

    hw: image height = width (default: the model's usual size; SqueezeNet needs >= 35, VGG-19 a
    multiple of 32). num_classes / hidden shrink the heads for fast CPU tests.
    """
    if name not in MODELS:
        raise ValueError(f"name must be one of {sorted(MODELS)}, got {name!r}")
    library, key, default_hw, channels = MODELS[name]
    hw = default_hw if hw is None else hw
    kp, kx = jax.random.split(jax.random.PRNGKey(seed))
    heads = {}
    if num_classes is not None:
        heads["num_classes"] = num_classes
    if hidden is not None and key == "vgg19":
        heads["hidden"] = hidden

    if library == "linen":
        module = _linen_models()[key](dtype=dtype, **heads)
        x = jax.random.normal(kx, (batch, hw, hw, channels), jnp.float32).astype(dtype)
        params = jax.jit(module.init)(kp, x)  # one compile instead of one per layer
        return Model(name, module.apply, params, x, "NHWC", module)

    if library == "nnx":
        from flax import nnx
        if key in ("vgg19", "cnn"):
            heads["hw"] = hw
        module = _nnx_models()[key](rngs=nnx.Rngs(int(seed)), dtype=dtype, **heads)
        graphdef, state = nnx.split(module)

        def apply(state, x):
            return nnx.merge(graphdef, state)(x)

        x = jax.random.normal(kx, (batch, hw, hw, channels), jnp.float32).astype(dtype)
        return Model(name, apply, state, x, "NHWC", module)

    import equinox as eqx
    if key == "cnn":
        heads["hw"] = hw
    module = _equinox_models()[key](kp, dtype=dtype, **heads)
    params, static = eqx.partition(module, eqx.is_array)

    def apply(params, x):
        return jax.vmap(eqx.combine(params, static))(x)  # Equinox layers take one example

    x = jax.random.normal(kx, (batch, channels, hw, hw), jnp.float32).astype(dtype)
    return Model(name, apply, params, x, "NCHW", module)
