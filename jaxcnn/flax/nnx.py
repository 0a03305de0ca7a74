"""Flax nnx layers running jaxcnn kernels: `Conv` (flax.nnx.Conv's arguments for 2-D NHWC
convs; `kernel` and `bias` Params of the same shapes, so nnx states load), `Fire`, and the
pools (nnx uses linen's pooling functions, so these are the same functions)."""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
from flax import nnx  # the flax package (absolute import: this module is jaxcnn.flax.nnx)

from jaxcnn.flax._common import avg_pool, check_unsupported, conv_apply, fire_apply, max_pool, pair

__all__ = ["Conv", "Fire", "avg_pool", "max_pool"]

_default_kernel_init = nnx.initializers.lecun_normal()


class Conv(nnx.Module):
    """flax.nnx.Conv on jaxcnn.conv2d (2-D, NHWC). Extra keywords: `activation` (None or
    "relu", fused after the bias) and `algorithm`. input_dilation != 1, mask,
    preferred_element_type and "CIRCULAR"/"CAUSAL" padding raise ValueError naming the argument."""

    def __init__(self, in_features: int, out_features: int, kernel_size, strides=1, *, padding="SAME",
                 input_dilation=1, kernel_dilation=1, feature_group_count: int = 1, use_bias: bool = True,
                 mask=None, dtype=None, param_dtype=jnp.float32, precision=None,
                 kernel_init: Callable = _default_kernel_init, bias_init: Callable = nnx.initializers.zeros_init(),
                 preferred_element_type=None, activation: str | None = None, algorithm: str = "auto",
                 rngs: nnx.Rngs):
        check_unsupported(input_dilation=input_dilation, mask=mask, preferred_element_type=preferred_element_type)
        kh, kw = pair(kernel_size, "kernel_size", allow_int=False)
        for name, value in (("in_features", in_features), ("out_features", out_features),
                            ("feature_group_count", feature_group_count)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if in_features % feature_group_count or out_features % feature_group_count:
            raise ValueError(f"feature_group_count: {feature_group_count} must divide in_features ({in_features}) "
                             f"and out_features ({out_features})")
        self.kernel_size = (kh, kw)
        self.in_features, self.out_features = in_features, out_features
        self.strides, self.padding, self.kernel_dilation = strides, padding, kernel_dilation
        self.feature_group_count, self.use_bias = feature_group_count, use_bias
        self.dtype, self.param_dtype, self.precision = dtype, param_dtype, precision
        self.activation, self.algorithm = activation, algorithm
        self.kernel = nnx.Param(kernel_init(rngs.params(), (kh, kw, in_features // feature_group_count, out_features),
                                            param_dtype))
        self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype)) if use_bias else None

    def __call__(self, inputs):
        return conv_apply(inputs, self.kernel[...], None if self.bias is None else self.bias[...],
                          strides=self.strides, padding=self.padding, kernel_dilation=self.kernel_dilation,
                          feature_group_count=self.feature_group_count, precision=self.precision,
                          activation=self.activation, algorithm=self.algorithm, dtype=self.dtype)


class Fire(nnx.Module):
    """SqueezeNet's fire module with `squeeze`, `expand1x1`, `expand3x3` nnx-Conv-shaped
    sub-layers (kernel HWIO + bias); fused=True runs jaxcnn.fire, else three jaxcnn.conv2d."""

    def __init__(self, in_features: int, squeeze: int, expand1x1: int, expand3x3: int, *, dtype=None,
                 param_dtype=jnp.float32, fused: bool = False, algorithm: str = "auto", rngs: nnx.Rngs):
        self.squeeze = Conv(in_features, squeeze, (1, 1), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.expand1x1 = Conv(squeeze, expand1x1, (1, 1), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.expand3x3 = Conv(squeeze, expand3x3, (3, 3), dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.dtype, self.fused, self.algorithm = dtype, fused, algorithm

    def __call__(self, inputs):
        params = {name: (layer.kernel[...], layer.bias[...])
                  for name, layer in (("squeeze", self.squeeze), ("expand1x1", self.expand1x1),
                                      ("expand3x3", self.expand3x3))}
        return fire_apply(inputs, params, fused=self.fused, algorithm=self.algorithm, dtype=self.dtype)
