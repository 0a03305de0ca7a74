"""The model zoo: pure-JAX NHWC CNNs for inference, each one definition (a body function over
`Net` layer calls) that gives the params, the forward pass on either backend and the layer table.

    model = get_model("resnet50")
    params = model.init(0, jnp.bfloat16)
    logits = jax.jit(functools.partial(model.apply, backend="jaxcnn"))(params, x)
    rows = layer_rows(layer_table("resnet50", batch=8, dtype="bfloat16"), model="resnet50")
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxcnn.models.alexnet import alexnet
from jaxcnn.models.backends import BACKENDS, JAXCNN_OPS, XLA_OPS
from jaxcnn.models.googlenet import googlenet
from jaxcnn.models.layers import LayerInfo, Net, layer_rows
from jaxcnn.models.lenet import lenet5
from jaxcnn.models.mobilenet import mobilenetv2
from jaxcnn.models.resnet import resnet50
from jaxcnn.models.spec import LayerFn, ModelSpec
from jaxcnn.models.squeezenet import squeezenet1_0, squeezenet1_1
from jaxcnn.models.vgg import vgg16, vgg19

_IMAGENET = dict(image_size=224, channels=3, num_classes=1000)

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("lenet5", image_size=32, channels=1, num_classes=10, body=lenet5),
        ModelSpec("alexnet", body=alexnet, **_IMAGENET),
        ModelSpec("vgg16", body=vgg16, **_IMAGENET),
        ModelSpec("vgg19", body=vgg19, **_IMAGENET),
        ModelSpec("googlenet", body=googlenet, **_IMAGENET),
        ModelSpec("squeezenet1_0", body=squeezenet1_0, **_IMAGENET),
        ModelSpec("squeezenet1_1", body=squeezenet1_1, **_IMAGENET),
        ModelSpec("resnet50", body=resnet50, **_IMAGENET),
        ModelSpec("mobilenetv2", body=mobilenetv2, **_IMAGENET),
    )
}


def list_models() -> list[str]:
    """The zoo's model names, in the order MODELS holds them."""
    return list(MODELS)


def get_model(name: str) -> ModelSpec:
    """The zoo model `name` (one of list_models()); ValueError naming the known ones."""
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None


def layer_table(name: str, batch: int = 1, dtype=jnp.float32) -> list[LayerInfo]:
    """The layers `get_model(name).apply` runs on a batch of `batch` images in `dtype`."""
    return get_model(name).layers(batch, dtype)


__all__ = [
    "BACKENDS", "JAXCNN_OPS", "MODELS", "XLA_OPS", "LayerFn", "LayerInfo", "ModelSpec", "Net",
    "get_model", "layer_rows", "layer_table", "list_models",
]
