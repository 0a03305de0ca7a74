"""The primitive base of jaxcnn's fused conv blocks (fire, inception, the conv chains).

A block's operands are one NHWC activation (batch leading) followed by its weights and biases
in a fixed order. One output-shape function checks them all together (shapes and dtypes as
lists) and one lax reference computes the block; both serve the primitive's abstract eval, its
non-CUDA lowering, its gradients (unfused: XLA's transposes of the reference) and the public
op's own argument check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from jax.core import ShapedArray

from jaxcnn.ops.operand_checks import is_empty_batch
from jaxcnn.ops.primitive import LeadingBatchPrimitive


class FusedBlockPrimitive(LeadingBatchPrimitive):
    """Subclasses set `name` and `sharding_rules`, implement `output_shape` and
    `block_reference`, and emit their kernel in `cuda_lowering`."""

    @staticmethod
    def output_shape(shapes: Sequence[Sequence[int]], dtypes: Sequence[Any], cfg) -> tuple:
        """The result's shape for operands of these shapes and dtypes (the block's argument
        check: its errors name the operand that is wrong)."""
        raise NotImplementedError

    @staticmethod
    def block_reference(*operands, cfg):
        """Pure-lax implementation of the block."""
        raise NotImplementedError

    @classmethod
    def abstract(cls, *operands, cfg, operand_names):
        shape = cls.output_shape([o.shape for o in operands], [o.dtype for o in operands], cfg)
        return ShapedArray(shape, operands[0].dtype)

    @classmethod
    def reference(cls, *operands, cfg, operand_names):
        return cls.block_reference(*operands, cfg=cfg)

    @classmethod
    def checked_call(cls, cfg, operands, operand_names: tuple[str, ...]):
        """A public op's last step: validates `operands` (so errors point at the caller, not at
        a custom_vjp trace); an empty batch (N = 0) gives the empty result with no kernel
        launch; else the primitive with the reference's gradients."""
        out = cls.abstract(*operands, cfg=cfg, operand_names=operand_names)
        if is_empty_batch(operands[0].shape):
            return jnp.zeros(out.shape, out.dtype)
        return cls.bind_with_reference_vjp(cfg, operands, operand_names)
