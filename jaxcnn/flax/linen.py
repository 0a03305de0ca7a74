"""Flax linen layers running jaxcnn kernels: `Conv` (flax.linen.Conv's arguments for 2-D NHWC
convs, same parameter names and shapes, so linen checkpoints load), `Fire`, and the pools."""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn  # the flax package (absolute import: this module is jaxcnn.flax.linen)
import jax.numpy as jnp

from jaxcnn.flax._common import avg_pool, check_unsupported, conv_apply, fire_apply, max_pool, pair

__all__ = ["Conv", "Fire", "avg_pool", "max_pool"]

_default_kernel_init = nn.initializers.lecun_normal()


class Conv(nn.Module):
    """flax.linen.Conv on jaxcnn.conv2d: 2-D, NHWC inputs ([H, W, C], [N, H, W, C] or more
    leading batch dims), params "kernel" [kh, kw, C // groups, features] and "bias" [features].

    Beyond Flax's arguments: `activation` (None or "relu", fused after the bias) and
    `algorithm` (jaxcnn.conv2d's kernel choice). input_dilation != 1, mask, padding "CIRCULAR"
    / "CAUSAL" and custom conv_general_dilated functions raise ValueError naming the argument.
    """

    features: int
    kernel_size: tuple[int, int]
    strides: None | int | tuple[int, int] = 1
    padding: Any = "SAME"
    input_dilation: None | int | tuple[int, int] = 1
    kernel_dilation: None | int | tuple[int, int] = 1
    feature_group_count: int = 1
    use_bias: bool = True
    mask: Any = None
    dtype: Any = None
    param_dtype: Any = jnp.float32
    precision: Any = None
    kernel_init: Callable = _default_kernel_init
    bias_init: Callable = nn.initializers.zeros_init()
    conv_general_dilated: Any = None
    conv_general_dilated_cls: Any = None
    activation: str | None = None
    algorithm: str = "auto"

    @nn.compact
    def __call__(self, inputs):
        check_unsupported(input_dilation=self.input_dilation, mask=self.mask,
                          conv_general_dilated=self.conv_general_dilated,
                          conv_general_dilated_cls=self.conv_general_dilated_cls)
        kh, kw = pair(self.kernel_size, "kernel_size", allow_int=False)
        if not isinstance(self.feature_group_count, int) or self.feature_group_count < 1:
            raise ValueError(f"feature_group_count: expected an int >= 1, got {self.feature_group_count!r}")
        in_features = jnp.shape(inputs)[-1]
        if in_features % self.feature_group_count:
            raise ValueError(f"feature_group_count: {self.feature_group_count} does not divide the input's "
                             f"{in_features} channels")
        kernel = self.param("kernel", self.kernel_init, (kh, kw, in_features // self.feature_group_count, self.features),
                            self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
        return conv_apply(inputs, kernel, bias, strides=self.strides, padding=self.padding,
                          kernel_dilation=self.kernel_dilation, feature_group_count=self.feature_group_count,
                          precision=self.precision, activation=self.activation, algorithm=self.algorithm,
                          dtype=self.dtype)


class Fire(nn.Module):
    """SqueezeNet's fire module: squeeze 1x1 + ReLU, [expand 1x1, expand 3x3 (SAME)] + ReLU,
    concatenated on channels. Params: {"squeeze", "expand1x1", "expand3x3"} each with "kernel"
    (HWIO) and "bias", as three linen Convs of those names would have.

    fused=True runs jaxcnn.fire (one kernel for the block); the default runs three
    jaxcnn.conv2d, which measured faster on H200 so far (benchmarks/results/*fire_fusion*).
    """

    squeeze: int
    expand1x1: int
    expand3x3: int
    dtype: Any = None
    param_dtype: Any = jnp.float32
    kernel_init: Callable = _default_kernel_init
    bias_init: Callable = nn.initializers.zeros_init()
    fused: bool = False
    algorithm: str = "auto"

    @nn.compact
    def __call__(self, inputs):
        for name in ("squeeze", "expand1x1", "expand3x3"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a channel count >= 1, got {value!r}")
        c = jnp.shape(inputs)[-1]
        params = {}
        for name, k, cin, cout in (("squeeze", 1, c, self.squeeze), ("expand1x1", 1, self.squeeze, self.expand1x1),
                                   ("expand3x3", 3, self.squeeze, self.expand3x3)):
            # nested like nn.Conv submodules named `name`, so linen Fire checkpoints load
            kernel = self._sub_param(name, "kernel", self.kernel_init, (k, k, cin, cout))
            bias = self._sub_param(name, "bias", self.bias_init, (cout,))
            params[name] = (kernel, bias)
        return fire_apply(inputs, params, fused=self.fused, algorithm=self.algorithm, dtype=self.dtype)

    def _sub_param(self, scope_name, name, init, shape):
        scope = self.scope.push(scope_name, reuse=True)
        return scope.param(name, init, shape, self.param_dtype)
