"""An InceptionV3 pool branch as the frameworks trace it: an average pool (Keras's, which counts
only the pixels inside the image, or Flax's sum / window size), then a 1x1 conv, inference
BatchNorm and ReLU. Shared by the pool_conv tests (optimize/pool_conv.py) and the profiler's."""

import jax
from jax import lax
import jax.numpy as jnp


def window(layout, size=3):
    return (1, size, size, 1) if layout == "NHWC" else (1, 1, size, size)


def keras_avg(x, layout="NHWC", stride=1):
    """keras.layers.AveragePooling2D(3, stride, padding="same") on the JAX backend."""
    strides = window(layout, stride)
    total = lax.reduce_window(x, 0.0, lax.add, window(layout), strides, "SAME")
    spatial = x.shape[1:3] if layout == "NHWC" else x.shape[2:]
    ones = jnp.ones((1, *spatial, 1) if layout == "NHWC" else (1, 1, *spatial), x.dtype)
    return total / lax.reduce_window(ones, 0.0, lax.add, window(layout), strides, "SAME")


def flax_avg(x, layout="NHWC", stride=1):
    """flax.linen.avg_pool(x, (3, 3), padding="SAME") (count_include_pad=True): sum / size."""
    return lax.reduce_window(x, 0.0, lax.add, window(layout), window(layout, stride), "SAME") / 9.0


def conv(x, w, layout="NHWC", stride=1):
    return lax.conv_general_dilated(x, w, (stride, stride), "VALID", dimension_numbers=(layout, "HWIO", layout))


def block(pool, layout="NHWC"):
    """fn(x, w, mean, var, gamma, beta): pool -> 1x1 conv -> inference BatchNorm -> ReLU."""
    def fn(x, w, m, v, g, b):
        y = conv(pool(x, layout), w, layout)
        shape = (1, 1, 1, -1) if layout == "NHWC" else (1, -1, 1, 1)
        m, v, g, b = (a.reshape(shape) for a in (m, v, g, b))
        return jax.nn.relu((y - m) * lax.rsqrt(v + 1e-3) * g + b)
    return fn
