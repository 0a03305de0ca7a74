"""The primitive base of the straight two-conv chains (`jaxcnn.conv3x3_conv1x1`,
`jaxcnn.conv1x1_depthwise`): operands (x, first weight, first bias, second weight, second
bias), one cuda_ops/chain custom call taking both stages' activation codes, and the public
ops' shared last steps (arrays, zero biases, the check, the call)."""

from __future__ import annotations

from typing import Any, ClassVar

from jaxcnn.ops.chain.config import ChainConfig, activation_code
from jaxcnn.ops.fused_block import FusedBlockPrimitive
from jaxcnn.ops.operand_checks import as_array, bias_or_zeros


class ChainPrimitive(FusedBlockPrimitive):
    """Subclasses set `name`, `operand_names`, `sharding_rules` and `ffi_target`, and
    implement `output_shape`, `block_reference` and `fused_kernel`."""

    operand_names: ClassVar[tuple[str, ...]]
    ffi_target: ClassVar[str]

    @staticmethod
    def fused_kernel(avals_in, cfg: ChainConfig) -> tuple[bool, dict[str, Any]]:
        """Whether the fused kernel runs these operands, and its custom call's attributes
        besides act1/act2."""
        raise NotImplementedError

    @classmethod
    def cuda_lowering(cls, ctx, *operands, cfg: ChainConfig, operand_names):
        fused, attributes = cls.fused_kernel(ctx.avals_in, cfg)
        return cls.kernel_or_reference(
            ctx, operands, {"cfg": cfg, "operand_names": operand_names}, cls.ffi_target, fused,
            act1=activation_code(cfg.act1), act2=activation_code(cfg.act2), **attributes)

    @classmethod
    def chain_call(cls, cfg: ChainConfig, x, first_w, second_w, first_b, second_b):
        """The public op on its raw arguments: arrays (a None bias is zeros), checked at the
        caller, then the primitive (an empty batch gives the empty result)."""
        x_name, first_w_name, first_b_name, second_w_name, second_b_name = cls.operand_names
        x, first_w = as_array(x, x_name), as_array(first_w, first_w_name)
        second_w = as_array(second_w, second_w_name)
        first_b = bias_or_zeros(first_b, first_w, first_b_name)
        second_b = bias_or_zeros(second_b, second_w, second_b_name)
        return cls.checked_call(cfg, (x, first_w, first_b, second_w, second_b), cls.operand_names)
