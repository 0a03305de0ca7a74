"""The primitive base of the NHWC conv + bias kernels with a pooled or sparse twist
(`jaxcnn.conv2d_pool`, `jaxcnn.sparse_conv2d`): operands (x, w, bias), bias always present,
one shape check and one lax reference taking them with the op's configuration."""

from __future__ import annotations

from typing import ClassVar

from jax.core import ShapedArray

from jaxcnn.ops.primitive import LeadingBatchPrimitive

OPERAND_NAMES = ("x", "w", "bias")


class ConvBiasPrimitive(LeadingBatchPrimitive):
    """Subclasses set `name`, `conv_output_shape(x_shape, x_dtype, w_shape, w_dtype,
    bias_shape, bias_dtype, cfg)` and `conv_reference(x, w, bias, cfg)`, and emit their
    kernel in `cuda_lowering`."""

    # Only the batch factor n may stay sharded: the conv window needs halo rows and columns
    # (and a pool's windows cross spatial tiles), the contraction needs every input channel.
    sharding_rules: ClassVar[dict[tuple[str, ...], str]] = {
        OPERAND_NAMES: "n h w c, r s i k, k -> n p q k"}

    @classmethod
    def abstract(cls, x, w, bias, *, cfg, operand_names):
        shape = cls.conv_output_shape(x.shape, x.dtype, w.shape, w.dtype, bias.shape,
                                      bias.dtype, cfg)
        return ShapedArray(shape, x.dtype)

    @classmethod
    def reference(cls, x, w, bias, *, cfg, operand_names):
        return cls.conv_reference(x, w, bias, cfg)
