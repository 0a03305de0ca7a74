"""The Equinox CNNs behind benchmarks/thirdparty_models.py's "equinox_*" entries, written as
Equinox users write them: NCHW images of one example, applied over a batch with `jax.vmap`;
the ResNet's eqx.nn.BatchNorm in inference mode with its state threaded through. Reach them
through `tm.build`, which imports this module (and equinox) only when an Equinox model is built.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.thirdparty_models import RESNET18_STAGES, SQUEEZENET1_1_FIRES, Model, like_trained_batchnorm


def build(name: str, key: str, batch: int, hw: int, channels: int, dtype, heads: dict, kp, kx,
          rng: np.random.Generator) -> Model:
    """Equinox model `key` as tm.build's Model `name`: random weights from kp, a random batch
    from kx, like_trained_batchnorm values from rng; heads: the classifier's sizes."""
    if key == "cnn":
        heads["hw"] = hw
    if key == "resnet18":
        module, state = eqx.nn.make_with_state(_equinox_models()[key])(kp, dtype=dtype, **heads)
        module, state = _randomize_equinox_batchnorm(eqx.nn.inference_mode(module), state, rng)
        arrays, static = eqx.partition(module, eqx.is_array)

        def apply(params, x):
            arrays, state = params
            batched = jax.vmap(eqx.combine(arrays, static), axis_name="batch", in_axes=(0, None), out_axes=(0, None))
            return batched(x, state)[0]

        x = jax.random.normal(kx, (batch, channels, hw, hw), jnp.float32).astype(dtype)
        return Model(name, apply, (arrays, state), x, "NCHW", module)
    module = _equinox_models()[key](kp, dtype=dtype, **heads)
    params, static = eqx.partition(module, eqx.is_array)

    def apply(params, x):
        return jax.vmap(eqx.combine(params, static))(x)  # Equinox layers take one example

    x = jax.random.normal(kx, (batch, channels, hw, hw), jnp.float32).astype(dtype)
    return Model(name, apply, params, x, "NCHW", module)


def _equinox_models():

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

    # A ResNet-18 written as Equinox code writes stateful layers: eqx.nn.BatchNorm threads an
    # eqx.nn.State through __call__(x, state), the model is made with eqx.nn.make_with_state,
    # switched to running statistics with eqx.nn.inference_mode, and vmapped over the batch
    # with the BatchNorm's axis_name.
    class BasicBlock(eqx.Module):
        conv1: eqx.nn.Conv2d
        bn1: eqx.nn.BatchNorm
        conv2: eqx.nn.Conv2d
        bn2: eqx.nn.BatchNorm
        proj: eqx.nn.Conv2d | None
        proj_bn: eqx.nn.BatchNorm | None

        def __init__(self, cin, cout, stride, key, dtype):
            k1, k2, k3 = jax.random.split(key, 3)
            bn = functools.partial(eqx.nn.BatchNorm, axis_name="batch", mode="ema", dtype=dtype)
            self.conv1 = eqx.nn.Conv2d(cin, cout, 3, stride=stride, padding=1, use_bias=False, key=k1, dtype=dtype)
            self.bn1 = bn(cout)
            self.conv2 = eqx.nn.Conv2d(cout, cout, 3, padding=1, use_bias=False, key=k2, dtype=dtype)
            self.bn2 = bn(cout)
            if stride != 1 or cin != cout:
                self.proj = eqx.nn.Conv2d(cin, cout, 1, stride=stride, use_bias=False, key=k3, dtype=dtype)
                self.proj_bn = bn(cout)
            else:
                self.proj = self.proj_bn = None

        def __call__(self, x, state):  # x: [C, H, W], one example
            y, state = self.bn1(self.conv1(x), state)
            y, state = self.bn2(self.conv2(jax.nn.relu(y)), state)
            if self.proj is not None:
                x, state = self.proj_bn(self.proj(x), state)
            return jax.nn.relu(x + y), state

    class ResNet18(eqx.Module):
        stem: eqx.nn.Conv2d
        bn: eqx.nn.BatchNorm
        pool: eqx.nn.MaxPool2d
        blocks: list
        fc: eqx.nn.Linear

        def __init__(self, key, num_classes=1000, dtype=jnp.float32):
            keys = iter(jax.random.split(key, 2 + sum(RESNET18_STAGES)))
            self.stem = eqx.nn.Conv2d(3, 64, 7, stride=2, padding=3, use_bias=False, key=next(keys), dtype=dtype)
            self.bn = eqx.nn.BatchNorm(64, axis_name="batch", mode="ema", dtype=dtype)
            self.pool = eqx.nn.MaxPool2d(3, stride=2, padding=1)
            self.blocks, cin = [], 64
            for i, size in enumerate(RESNET18_STAGES):
                for j in range(size):
                    self.blocks.append(BasicBlock(cin, 64 * 2 ** i, 2 if i > 0 and j == 0 else 1, next(keys), dtype))
                    cin = 64 * 2 ** i
            self.fc = eqx.nn.Linear(cin, num_classes, key=next(keys), dtype=dtype)

        def __call__(self, x, state):
            x, state = self.bn(self.stem(x), state)
            x = self.pool(jax.nn.relu(x))
            for block in self.blocks:
                x, state = block(x, state)
            return self.fc(jnp.mean(x, axis=(1, 2))), state

    return {"squeezenet1_1": SqueezeNet11, "cnn": CNN, "resnet18": ResNet18}


def _randomize_equinox_batchnorm(module, state, rng: np.random.Generator):
    """(module, state) with like_trained_batchnorm values in every eqx.nn.BatchNorm's weight and
    bias (the module) and running statistics (the state)."""

    def batchnorms(m):
        is_bn = lambda node: isinstance(node, eqx.nn.BatchNorm)  # noqa: E731
        return [node for node in jax.tree.leaves(m, is_leaf=is_bn) if is_bn(node)]

    fresh = lambda role, a: like_trained_batchnorm(role, a.shape, a.dtype, rng)  # noqa: E731
    for bn in batchnorms(module):
        mean, var = state.get(bn.ema_state_index)
        state = state.set(bn.ema_state_index, (fresh("mean", mean), fresh("var", var)))
    module = eqx.tree_at(lambda m: [a for bn in batchnorms(m) for a in (bn.weight, bn.bias)], module,
                         replace=[fresh(role, a) for bn in batchnorms(module)
                                  for role, a in (("scale", bn.weight), ("offset", bn.bias))])
    return module, state
