"""Training and inference programs of zoo models for memory planning: a pure-jax SGD-momentum
and Adam (no optax dependency), a cross-entropy train step, and abstract example arguments.

    opt = adam(1e-3)
    step = train_step(get_model("lenet5"), opt)           # (params, opt_state, images, labels) ->
    args = training_args(get_model("lenet5"), 8, "float32", opt)   # (params, opt_state, loss)
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxcnn.models import ModelSpec, get_model


class Optimizer(NamedTuple):
    """init(params) -> state; update(grads, state, params) -> (new params, new state)."""

    name: str
    init: Callable[[Any], Any]
    update: Callable[[Any, Any, Any], tuple[Any, Any]]


def sgd_momentum(learning_rate: float = 0.01, momentum: float = 0.9) -> Optimizer:
    """Heavy-ball SGD: v <- momentum * v + g; p <- p - lr * v. The velocity has the params' dtype."""
    def init(params):
        return jax.tree.map(jnp.zeros_like, params)

    def update(grads, velocity, params):
        velocity = jax.tree.map(lambda v, g: (momentum * v + g).astype(v.dtype), velocity, grads)
        params = jax.tree.map(lambda p, v: (p - learning_rate * v).astype(p.dtype), params, velocity)
        return params, velocity

    return Optimizer("sgd_momentum", init, update)


def adam(learning_rate: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Optimizer:
    """Adam with bias correction; moments in float32 whatever the params' dtype (bf16 moments
    lose the small updates)."""
    def init(params):
        zeros = lambda p: jnp.zeros(p.shape, jnp.float32)  # noqa: E731
        return {"count": jnp.zeros((), jnp.int32), "mu": jax.tree.map(zeros, params),
                "nu": jax.tree.map(zeros, params)}

    def update(grads, state, params):
        count = state["count"] + 1
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g.astype(jnp.float32), state["mu"], grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g.astype(jnp.float32)), state["nu"], grads)
        t = count.astype(jnp.float32)
        scale = learning_rate * jnp.sqrt(1 - b2**t) / (1 - b1**t)
        params = jax.tree.map(lambda p, m, v: (p - scale * m / (jnp.sqrt(v) + eps)).astype(p.dtype), params, mu, nu)
        return params, {"count": count, "mu": mu, "nu": nu}

    return Optimizer("adam", init, update)


OPTIMIZERS = {"sgd_momentum": sgd_momentum, "adam": adam}


def get_optimizer(optimizer: str | Optimizer) -> Optimizer:
    if isinstance(optimizer, Optimizer):
        return optimizer
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[optimizer]()


def _spec(model: str | ModelSpec) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return get_model(model)
    raise TypeError(f"model must be a zoo model name or a ModelSpec, got {type(model).__name__}")


def cross_entropy(logits, labels):
    """Mean softmax cross-entropy in float32; labels are class indices [N]."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


def train_step(model: str | ModelSpec, optimizer: str | Optimizer = "sgd_momentum", *, backend: str = "xla",
               forward: Callable | None = None) -> Callable:
    """step(params, opt_state, images, labels) -> (params, opt_state, loss).

    forward(params, images) -> logits defaults to the model's apply on `backend`."""
    spec, opt = _spec(model), get_optimizer(optimizer)
    if forward is None:
        forward = lambda params, images: spec.apply(params, images, backend=backend)  # noqa: E731

    def step(params, opt_state, images, labels):
        loss, grads = jax.value_and_grad(lambda p: cross_entropy(forward(p, images), labels))(params)
        params, opt_state = opt.update(grads, opt_state, params)
        return params, opt_state, loss

    return step


def inference_fn(model: str | ModelSpec, *, backend: str = "xla") -> Callable:
    """fn(params, images) -> logits."""
    spec = _spec(model)
    return lambda params, images: spec.apply(params, images, backend=backend)


def inference_args(model: str | ModelSpec, batch: int, dtype="float32") -> tuple:
    """(params, images) as ShapeDtypeStructs."""
    spec = _spec(model)
    return spec.abstract_params(dtype), jax.ShapeDtypeStruct(spec.input_shape(batch), jnp.dtype(dtype))


def training_args(model: str | ModelSpec, batch: int, dtype="float32",
                  optimizer: str | Optimizer = "sgd_momentum") -> tuple:
    """(params, opt_state, images, labels) as ShapeDtypeStructs."""
    params, images = inference_args(model, batch, dtype)
    opt_state = jax.eval_shape(get_optimizer(optimizer).init, params)
    return params, opt_state, images, jax.ShapeDtypeStruct((batch,), jnp.int32)
