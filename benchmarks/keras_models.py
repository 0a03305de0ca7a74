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
leaks into the next. Images are NHWC (Keras's channels_last default). Each BatchNormalization
gets random gamma / beta (like_trained_batchnorm) and moving statistics calibrated on random
images (calibrate_batchnorm), so that BatchNorm is no identity and the output depends on the image.
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
MIN_SIZE = {"InceptionV3": 75, "InceptionResNetV2": 75}
DEFAULT_MIN_SIZE = 32
# Images whose BatchNorm input statistics become the moving ones (calibrate_batchnorm). At the
# tests' tiny images the last stages are 1x1: the statistics of a batch of 2 would give a
# near-zero variance there, and BatchNorm would amplify rounding differences (a folded BatchNorm
# rounds differently) by 1/sqrt(eps).
CALIBRATION_BATCH = 16
# like_trained_batchnorm's role -> the keras.layers.BatchNormalization attribute holding it
# (the moving statistics are calibrated instead: calibrate_batchnorm).
BATCHNORM_AFFINE = {"scale": "gamma", "offset": "beta"}


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


def batchnorm_layers(keras, model) -> list:
    return [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]


def randomize_batchnorm(keras, model, rng: np.random.Generator) -> None:
    """Assigns like_trained_batchnorm values to every BatchNormalization's gamma and beta (Keras
    initialises them to the identity transform, which would hide a wrong BatchNorm fold)."""
    for layer in batchnorm_layers(keras, model):
        for role, attr in BATCHNORM_AFFINE.items():
            v = getattr(layer, attr)
            if v is not None:  # None where scale / center is False (InceptionV3)
                v.assign(like_trained_batchnorm(role, v.shape, v.dtype, rng))


def calibrate_batchnorm(keras, model, x) -> None:
    """Sets every BatchNormalization's moving mean and variance to the statistics of its input on
    the batch x (what training drives them to, for x's distribution). With Keras's initial
    statistics (mean 0, var 1) each glorot-initialised conv shrinks the activations, and a deep
    model (MobileNetV2) ends with outputs that hardly depend on the image: a wrong rewrite of an
    early layer would go unseen."""
    layers = batchnorm_layers(keras, model)
    if not layers:
        return
    momenta = [layer.momentum for layer in layers]
    for layer in layers:
        layer.momentum = 0.0  # moving statistic := this batch's
    try:
        def train_step(trainable, non_trainable, x):
            return model.stateless_call(trainable, non_trainable, x, training=True)[1]

        updated = jax.jit(train_step)([v.value for v in model.trainable_variables],
                                      [v.value for v in model.non_trainable_variables], x)
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
    for v, value in zip(model.non_trainable_variables, updated):
        v.assign(value)


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
    kx, kc = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(kx, (batch, hw, hw, channels), jnp.float32).astype(policy)
    randomize_batchnorm(keras, model, np.random.default_rng(seed))
    calibrate_batchnorm(keras, model, jax.random.normal(kc, (CALIBRATION_BATCH, hw, hw, channels)).astype(policy))
    params = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])

    def apply(params, x):
        trainable, non_trainable = params
        y, _ = model.stateless_call(trainable, non_trainable, x, training=False)
        return y

    return Model(name, apply, params, x, "NHWC", model)
