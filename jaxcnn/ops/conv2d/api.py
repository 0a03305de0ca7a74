"""`jaxcnn.conv2d`: 2-D convolution of NHWC/NCHW/CHWN activations with HWIO weights and the
general epilogue (+bias, +residual, activation; jaxcnn/ops/epilogue.py).

This module checks the arguments and settles `algorithm="auto"` through the decision owner
(jaxcnn/tuning/conv_choice.py: XLA's own convolution or a jaxcnn kernel family, measured on the
GPU and cached); the primitive itself is jaxcnn/ops/conv2d/primitive.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcnn.ops.conv2d.primitive import bind_conv2d
from jaxcnn.ops.conv2d.config import HANDLER_ALGORITHM, conv2d_output_shape, make_config
from jaxcnn.ops.conv2d.reference import check_residual, xla_conv2d
from jaxcnn.ops.operand_checks import (
    as_array,
    as_optional_array,
    check_int32_args,
    check_int32_shape,
    is_empty_batch,
)


def conv2d(
    x,
    w,
    bias=None,
    *,
    residual=None,
    stride=1,
    padding="SAME",
    dilation=1,
    groups=1,
    activation=None,
    alpha=None,
    layout="NHWC",
    precision=None,
    algorithm="auto",
):
    """2-D convolution of `x` with HWIO `w`, then the epilogue
    `activation(conv + bias + residual)` in fp32 with one rounding.

    Args:
      x: [N, H, W, C] (or the same dims in `layout` order) float32, bfloat16 or float16.
      w: [R, S, C // groups, K], same dtype as x.
      bias: optional [K], same dtype as x.
      residual: optional tensor of the output's shape, layout and dtype, added after the bias
        and before the activation (a ResNet shortcut).
      stride, dilation: int or (h, w) pair, >= 1 (dilation applies to the kernel).
      padding: "SAME", "VALID", an int, an (h, w) pair, or ((top, bottom), (left, right)).
      groups: feature groups (groups == C is depthwise).
      activation: None, "relu", "relu6", "silu", "hard_swish", "gelu_tanh", "gelu_erf",
        "sigmoid" or "leaky_relu" (jax.nn's definitions and gradients; jaxcnn/ops/epilogue.py).
      alpha: leaky_relu's negative slope (default 0.01); only with activation="leaky_relu".
      layout: "NHWC", "NCHW" or "CHWN": memory order of x and of the result.
      precision: float32 math. None/"default" may use TF32 tensor cores (like XLA's DEFAULT on
        GPUs); "highest" (or lax.Precision.HIGHEST) is fp32-accurate (3xTF32 or FMA).
      algorithm: "auto" (the default: XLA's own convolution or the jaxcnn kernel family that
        measures fastest for this conv on this GPU, by at least 3%; measured once per GPU, shape,
        dtype and configuration, and cached, see jaxcnn/tuning/conv_choice.py); "jaxcnn" (the
        CUDA handler's own pick among the families below, never XLA's conv); a family:
        "tensor_core", "direct", "depthwise", "wgmma" (the Hopper TMA + wgmma kernel of
        jaxcnn.conv2d_pool without its pool: bf16/fp16 NHWC 3x3 stride-1 SAME convs, groups 1,
        C a multiple of 32, K of 64; the handler picks it where its tiles cover the image),
        "stem" (jaxcnn.conv2d_pool's small-GEMM-K stem kernel without its pool: NHWC, groups 1,
        R*S*C <= 512, K a multiple of 8 (4 for fp32 at precision "default"); the handler picks
        it where C rules out the tensor-core kernel, e.g. an RGB input); or "xla" (XLA's own
        lax.conv_general_dilated, then the epilogue in x's dtype, on every platform: the
        formulation XLA fuses).

    Returns:
      [N, P, Q, K] (in `layout` order) in x's dtype, accumulated in float32. N = 0 gives the
      empty result.
    """
    x = as_array(x, "x")
    w = as_array(w, "w")
    bias = as_optional_array(bias, "bias")
    residual = as_optional_array(residual, "residual")
    check_int32_args(stride=stride, padding=padding, dilation=dilation)
    decide = algorithm == "auto"
    if algorithm == HANDLER_ALGORITHM:
        algorithm = "auto"
    cfg = make_config(
        x.shape, w.shape, stride=stride, padding=padding, dilation=dilation,
        groups=groups, activation=activation, layout=layout, precision=precision,
        algorithm=algorithm, alpha=alpha,
    )
    # Validate here too so errors point at the caller, not at a custom_vjp trace.
    out_shape = conv2d_output_shape(
        x.shape, x.dtype, w.shape, w.dtype,
        None if bias is None else bias.shape, None if bias is None else bias.dtype, cfg,
    )
    if residual is not None:
        check_residual(residual.shape, residual.dtype, out_shape, x.dtype)
    n_axis = cfg.layout.index("N")
    check_int32_shape("x", x.shape, n_axis)
    check_int32_shape("result", out_shape, n_axis, what=f"padding {cfg.padding} makes the result")
    if is_empty_batch(x.shape, n_axis):
        return jnp.zeros(out_shape, x.dtype)
    if decide:
        cfg = cfg.replace(algorithm=_decided_algorithm(x, w, bias, residual, cfg))
    if cfg.algorithm == "xla":
        return xla_conv2d(x, w, bias, cfg, residual=residual)
    return bind_conv2d(cfg, x, w, bias, residual)


def _decided_algorithm(x, w, bias, residual, cfg) -> str:
    """The algorithm the decision owner picks for this conv ("auto" leaves it to the handler)."""
    # Imported here: the decision owner sits above the ops package (its candidates bind this
    # package's primitives and jaxcnn.ops imports every op module when it loads).
    from jaxcnn.tuning.conv_choice import decide_conv

    def aval(a):
        return None if a is None else jax.ShapeDtypeStruct(a.shape, a.dtype)

    return decide_conv(aval(x), aval(w), aval(bias), aval(residual), cfg).choice
