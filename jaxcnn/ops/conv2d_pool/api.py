"""`jaxcnn.conv2d_pool`: conv + bias + ReLU + max-pool as one primitive, so the pre-pool
activation never reaches DRAM.

    y = max_pool(relu(conv(x, w) + bias), pool_window, pool_stride, pool_padding)

The primitive works on NHWC activations and HWIO weights; NCHW/CHWN callers are converted at the
boundary (`to_layout`). CUDA runs cuda_ops/conv_pool through XLA FFI: an implicit-GEMM kernel
(mma.sync tensor cores: bf16/fp16, or TF32 for fp32 at precision "default"; fp32 FMA on CUDA
cores for "highest" and shapes the tensor-core kernel does not take) whose CTA tile is a 2-D
block of conv outputs covering whole pool windows; bias + ReLU are applied in registers, the
windows are reduced through shared memory and only pooled values are stored. Every other
platform runs the lax reference. Gradients are the reference's (unfused: XLA's conv transposes
and select-and-scatter).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxcnn.ops.conv2d.config import PRECISIONS
from jaxcnn.ops.conv_bias_primitive import ConvBiasPrimitive
from jaxcnn.ops.conv2d_pool.config import (
    ALGORITHMS,
    OPERAND_NAMES,
    ConvPoolConfig,
    conv_pool_output_shape,
    make_conv_pool_config,
    nhwc_shape,
)
from jaxcnn.ops.conv2d_pool.reference import conv_pool_reference
from jaxcnn.ops.layout_axes import convert_shape
from jaxcnn.ops.layout_transform.api import to_layout
from jaxcnn.ops.operand_checks import (
    as_array,
    bias_or_zeros,
    check_int32_args,
    is_empty_batch,
    with_batch,
)
from jaxcnn.ops.sparse_conv2d.api import sparse_conv2d_pool

FFI_TARGET = "jaxcnn_conv2d_pool_fwd"


class Conv2dPoolPrimitive(ConvBiasPrimitive):
    name = "jaxcnn_conv2d_pool"
    conv_output_shape = staticmethod(conv_pool_output_shape)
    conv_reference = staticmethod(conv_pool_reference)

    @classmethod
    def cuda_lowering(cls, ctx, x, w, bias, *, cfg: ConvPoolConfig, operand_names):
        conv = cfg.conv
        (pt, pb), (pl, pr) = conv.padding
        (qt, qb), (ql, qr) = cfg.pool_padding
        return jax.ffi.ffi_lowering(FFI_TARGET)(
            ctx, x, w, bias,
            stride_h=np.int64(conv.stride[0]), stride_w=np.int64(conv.stride[1]),
            pad_top=np.int64(pt), pad_bottom=np.int64(pb),
            pad_left=np.int64(pl), pad_right=np.int64(pr),
            dilation_h=np.int64(conv.dilation[0]), dilation_w=np.int64(conv.dilation[1]),
            pool_window_h=np.int64(cfg.pool_window[0]), pool_window_w=np.int64(cfg.pool_window[1]),
            pool_stride_h=np.int64(cfg.pool_stride[0]), pool_stride_w=np.int64(cfg.pool_stride[1]),
            pool_pad_top=np.int64(qt), pool_pad_left=np.int64(ql),
            precision=np.int64(PRECISIONS.index(conv.precision)),
            algorithm=np.int64(ALGORITHMS.index(cfg.algorithm)),
        )



Conv2dPoolPrimitive.register()


def conv2d_pool(
    x,
    w,
    bias=None,
    *,
    stride=1,
    padding="SAME",
    dilation=1,
    pool_window=2,
    pool_stride=None,
    pool_padding="VALID",
    layout="NHWC",
    precision=None,
    sparse=False,
    algorithm="auto",
):
    """max_pool(relu(conv(x, w) + bias)) in one fused kernel on CUDA.

    Args:
      x: [N, H, W, C] (or the same dims in `layout` order) float32, bfloat16 or float16.
      w: [R, S, C, K] (HWIO), same dtype as x.
      bias: optional [K], same dtype as x (None: zero bias).
      stride, padding, dilation: the conv's, with conv2d's forms ("SAME", "VALID", an int, an
        (h, w) pair, or ((top, bottom), (left, right))).
      pool_window: int or (h, w) max-pool window, >= 1.
      pool_stride: int or (h, w); None means pool_window (non-overlapping windows). Overlapping
        windows (e.g. AlexNet's 3x3 / 2) are supported.
      pool_padding: the pool's padding on the conv output, in the same forms (SAME/VALID
        resolved on the conv's output extent); pads count as -inf, and each side must be
        smaller than the window.
      layout: "NHWC", "NCHW" or "CHWN": memory order of x and of the result. The fused kernel
        is NHWC; other layouts are converted with `to_layout` at its boundary.
      precision: float32 math, as conv2d: None/"default" may use TF32 (the CUDA kernel runs
        TF32 tensor cores where K is a multiple of 4, as XLA's DEFAULT does), "highest"
        (or lax.Precision.HIGHEST) is fp32-accurate (fp32 FMA on CUDA cores).
      sparse: True runs the zero-skipping kernel,
        `jaxcnn.ops.sparse_conv2d.sparse_conv2d_pool` (same result up to fp rounding): worth it
        when x has many zeros (e.g. the previous layer's ReLU output). It takes no dilation
        (must be 1) and no `algorithm` (must be "auto"); `precision` is not forwarded.
      algorithm: "auto" (on Hopper, bf16/fp16 3x3 stride-1 SAME convs with a 2x2/2 VALID
        pool, C a multiple of 32 and K of 64 -- VGG's pooled layers -- run the TMA + wgmma
        kernel; otherwise tensor cores for bf16/fp16 with K a multiple of 8 and for fp32 at
        precision "default" with K a multiple of 4, any C: a C below 16 or off that multiple, e.g. an RGB stem's 3, runs the stem kernel where
        R*S*C <= 512 and it fits shared memory, else the tensor-core kernel's flat-K mode;
        else the CUDA-core kernel), "wgmma" (the Hopper kernel; an error where it cannot
        run), "tensor_core" (the implicit-GEMM mma.sync kernel; an error where it cannot run),
        "stem" (the persistent small-GEMM-K tensor-core kernel; an error where it cannot run)
        or "direct" (CUDA cores).

    Returns:
      [N, PH, PW, K] (in `layout` order) in x's dtype: each conv output accumulated in fp32,
      bias and ReLU in fp32, rounded once, then max-pooled (NaN propagates). Equal to
      `max_pool2d(conv2d(x, w, bias, activation="relu"), pool_window, pool_stride, pool_padding)`.
      An empty batch (N = 0) gives the empty result.
    """
    x, w = as_array(x, "x"), as_array(w, "w")
    if not isinstance(layout, str) or layout not in ("NHWC", "NCHW", "CHWN"):
        raise ValueError(f"layout must be one of ('NHWC', 'NCHW', 'CHWN'), got {layout!r}")
    if not isinstance(sparse, (bool, np.bool_)):
        raise TypeError(f"sparse must be a bool, got {sparse!r}")
    if x.ndim != 4:
        raise ValueError(f"x must be rank 4 ({layout}), got shape {tuple(x.shape)}")
    check_int32_args(stride=stride, padding=padding, dilation=dilation)
    x_nhwc_shape = nhwc_shape(x.shape, layout)
    # An empty batch is validated as one image, then gives the empty result (no kernel).
    empty = is_empty_batch(x_nhwc_shape)
    checked_shape = with_batch(x_nhwc_shape, 1) if empty else x_nhwc_shape
    cfg = make_conv_pool_config(
        checked_shape, w.shape, stride=stride, padding=padding, dilation=dilation,
        pool_window=pool_window, pool_stride=pool_stride, pool_padding=pool_padding,
        layout=layout, precision=precision, algorithm=algorithm,
    )
    bias = bias_or_zeros(bias, w, "bias")
    # Validate here too so errors point at the caller, not at a custom_vjp trace.
    out_shape = conv_pool_output_shape(checked_shape, x.dtype, w.shape, w.dtype, bias.shape,
                                       bias.dtype, cfg)
    if sparse and cfg.conv.dilation != (1, 1):
        raise ValueError(f"sparse=True takes no dilation (must be 1), got {dilation!r}")
    if sparse and cfg.algorithm != "auto":
        raise ValueError(f"sparse=True picks its own kernel: algorithm must be 'auto', got {algorithm!r}")
    if empty:
        return jnp.zeros(convert_shape(with_batch(out_shape, 0), "NHWC", layout), x.dtype)

    if layout != "NHWC":
        x = to_layout(x, src=layout, dst="NHWC")
    if sparse:
        y = sparse_conv2d_pool(
            x, w, bias, stride=cfg.conv.stride, padding=cfg.conv.padding,
            pool_window=cfg.pool_window, pool_stride=cfg.pool_stride,
            pool_padding=cfg.pool_padding,
        )
    else:
        y = Conv2dPoolPrimitive.bind_with_reference_vjp(cfg, (x, w, bias), OPERAND_NAMES)
    if layout != "NHWC":
        y = to_layout(y, src="NHWC", dst=layout)
    return y
