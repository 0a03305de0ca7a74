"""Keras 3 `keras.applications` CNNs on the JAX backend, as a Keras user runs them in JAX: built
with `weights=None` (random weights), then run as the pure function
`model.stateless_call(trainable, non_trainable, x, training=False)`, which jits like any JAX
function. The models behind benchmarks/thirdparty_models.py's "keras_*" entries: reach them
through `tm.build`, which imports this module (and keras) only when a Keras model is built.

    from benchmarks import thirdparty_models as tm
    m = tm.build("keras_resnet50", batch=1, hw=64, dtype=jnp.bfloat16)
    y = jax.jit(m.apply)(m.params, m.x)   # params = (trainable values, non-trainable values)

The dtype is Keras's global dtype policy while the model is built ("bfloat16": weights and
compute in bf16; "float32", Keras's default), restored right after, so one build's policy never
leaks into the next. Images are NHWC (Keras's channels_last default).
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.thirdparty_models import MODELS, Model, like_trained_batchnorm

# Keras's smallest input side per application with weights=None (keras.applications'
# obtain_input_shape): a smaller image raises there.
MIN_SIZE = {"InceptionV3": 75}
DEFAULT_MIN_SIZE = 32
# like_trained_batchnorm's role -> the keras.layers.BatchNormalization attribute holding it.
BATCHNORM_ROLES = {"mean": "moving_mean", "var": "moving_variance", "scale": "gamma", "offset": "beta"}


def import_keras():
    """keras, on the JAX backend: KERAS_BACKEND is read once, at keras's first import."""
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = "jax"
    import keras

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"keras was imported with the {keras.backend.backend()!r} backend before "
                           "benchmarks.keras_models: set KERAS_BACKEND=jax before importing keras")
    return keras


def dtype_policy_name(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype must be bfloat16, float16 or float32 for a Keras model, got {name}")
    return name


def randomize_batchnorm(keras, model, rng: np.random.Generator) -> None:
    """Assigns trained-like values to the variables of every BatchNormalization layer of `model`
    (Keras initialises them to the identity transform, which would hide a wrong BatchNorm fold)."""
    layers = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    for layer in layers:
        for role, attr in BATCHNORM_ROLES.items():
            v = getattr(layer, attr)
            if v is not None:  # gamma / beta are None where scale / center is False (InceptionV3)
                v.assign(like_trained_batchnorm(role, v.shape, v.dtype, rng))


def build(name: str, batch: int = 1, hw: int | None = None, dtype=jnp.float32, seed: int = 0,
          num_classes: int | None = None) -> Model:
    """Builds keras.applications model `name` (a "keras_*" key of thirdparty_models.MODELS).

    hw: image side (default the application's own: 224, InceptionV3 299; at least 32, 75 for
    InceptionV3). num_classes: the classifier's width (default 1000).
    """
    if name not in MODELS or MODELS[name][0] != "keras":
        raise ValueError(f"name must be a Keras model of {sorted(n for n, e in MODELS.items() if e[0] == 'keras')}, "
                         f"got {name!r}")
    _, application, default_hw, channels = MODELS[name]
    hw = default_hw if hw is None else hw
    min_size = MIN_SIZE.get(application, DEFAULT_MIN_SIZE)
    if hw < min_size:
        raise ValueError(f"hw must be >= {min_size} for {application}, got {hw}")
    keras = import_keras()
    policy = dtype_policy_name(dtype)
    keras.utils.set_random_seed(seed)  # Keras's own initialisers draw from its global seed
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = getattr(keras.applications, application)(
            weights=None, input_shape=(hw, hw, channels), classes=1000 if num_classes is None else num_classes)
    finally:
        keras.config.set_dtype_policy(previous)
    randomize_batchnorm(keras, model, np.random.default_rng(seed))
    params = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])

    def apply(params, x):
        trainable, non_trainable = params
        y, _ = model.stateless_call(trainable, non_trainable, x, training=False)
        return y

    x = jax.random.normal(jax.random.PRNGKey(seed), (batch, hw, hw, channels), jnp.float32).astype(policy)
    return Model(name, apply, params, x, "NHWC", model)
