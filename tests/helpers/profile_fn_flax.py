"""A small Flax CNN built the way `jaxcnn profile --fn MODULE:CALLABLE` wants it: a callable
returning (fn, example_args), taking batch= and dtype= keywords (tests/profile/test_profiler_cli.py)."""

from __future__ import annotations

import flax.linen as nn
import jax


class SmallCNN(nn.Module):
    """conv+bias+ReLU, max pool, strided conv+BatchNorm+ReLU, conv with a residual add, a head."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.max_pool(x, (2, 2), (2, 2))
        x = nn.Conv(16, (3, 3), strides=2, use_bias=False)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=True)(x))
        x = nn.relu(nn.Conv(16, (3, 3))(x) + x)
        return nn.Dense(10)(x.mean(axis=(1, 2)))


def flax_cnn(batch: int = 2, dtype: str = "float32"):
    """SmallCNN's apply and (variables, a batch of 16x16 RGB images)."""
    model = SmallCNN()
    x = jax.random.normal(jax.random.key(1), (batch, 16, 16, 3)).astype(dtype)
    variables = model.init(jax.random.key(0), x)
    return model.apply, (variables, x)
