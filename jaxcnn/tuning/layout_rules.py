"""The layout rule: the preferred (layout, algorithm) of a layer on Hopper before any
measurement, with the reason. Autotuning (tuning.layer_autotune) is what settles each layer;
the rule is its prior and what explain() compares the winner against."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from jaxcnn.ops.layout_axes import check_layout
from jaxcnn.costmodel.layout_cost import TENSOR_CORE_CHANNEL_MULTIPLE
from jaxcnn.tuning.layer import Layer, conv_layer
from jaxcnn.tuning.tuner_args import dtype_name, shape4

# Depthwise NHWC loads 4 channels per vector; CHWN vectorizes over the batch when a warp's worth
# of images is there.
DEPTHWISE_VECTOR_CHANNELS = 4
DEPTHWISE_CHWN_MIN_N = 32
# Li et al. (SC'16) layout thresholds for CUDA-core convolutions: CHWN when N >= Nt and C < Ct,
# else NCHW (measured there on Kepler/Maxwell; they apply to our CUDA-core direct kernel, and
# autotuning is what settles each layer on Hopper).
SEED_CHWN_MIN_N = 128
SEED_CHWN_MAX_C = 32


@dataclass(frozen=True)
class RuleChoice:
    """The rule's preferred (layout, algorithm) for one layer, and why."""

    layout: str
    algorithm: str
    reason: str
    layer: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def explain(self) -> str:
        head = f"{self.layer}: " if self.layer else ""
        return f"{head}rule -> {self.layout}/{self.algorithm}: {self.reason}"


def rule_conv(x_shape, w_shape, dtype="bfloat16", *, stride=1, padding="SAME", dilation=1,
              groups=1, activation=None, precision=None, name="") -> RuleChoice:
    """The preferred (layout, algorithm) of a conv on Hopper, before any measurement.

    * depthwise (groups == C, K = C * multiplier): memory-bound. NHWC when C % 4 == 0 (4-channel
      vectors); else CHWN when N >= 32 (vectors over the batch); else NHWC (no layout vectorizes,
      and NHWC is what the neighbours use).
    * dense with C/groups and K/groups multiples of 8: NHWC tensor cores (channels contiguous =
      GEMM K contiguous, what TMA/ldmatrix tiles want).
    * otherwise the CUDA-core direct kernel with the seed's thresholds (Li et al.): CHWN when
      N >= 128 and C < 32 (coalesced over the batch), else NCHW.
    """
    layer = conv_layer(x_shape, w_shape, dtype, stride=stride, padding=padding, dilation=dilation,
                       groups=groups, activation=activation, precision=precision, name=name)
    return rule_conv_layer(layer)


def rule_conv_layer(layer: Layer) -> RuleChoice:
    """rule_conv of a conv2d Layer."""
    n, _, _, c = layer.x_shape
    k, g = layer.w_shape[3], layer.groups
    if layer.is_depthwise:
        if c % DEPTHWISE_VECTOR_CHANNELS == 0:
            return RuleChoice("NHWC", "depthwise", f"depthwise, memory-bound: C={c} is a multiple of "
                              f"{DEPTHWISE_VECTOR_CHANNELS}, so NHWC loads channel vectors", layer.name)
        if n >= DEPTHWISE_CHWN_MIN_N:
            return RuleChoice("CHWN", "depthwise", f"depthwise, memory-bound: C={c} does not vectorize "
                              f"but N={n} >= {DEPTHWISE_CHWN_MIN_N}, so CHWN loads batch vectors", layer.name)
        return RuleChoice("NHWC", "depthwise", f"depthwise, memory-bound: neither C={c} nor N={n} "
                          "vectorizes; NHWC avoids transforms", layer.name)
    m = TENSOR_CORE_CHANNEL_MULTIPLE
    if g == 1 and k % m == 0:
        return RuleChoice("NHWC", "tensor_core", f"groups=1 and K={k} a multiple of {m}: "
                          "tensor-core implicit GEMM with GEMM-K (channels) contiguous in NHWC",
                          layer.name)
    if n >= SEED_CHWN_MIN_N and c < SEED_CHWN_MAX_C:
        return RuleChoice("CHWN", "direct", f"grouped or K not a multiple of {m}: CUDA-core direct; seed "
                          f"rule N={n} >= {SEED_CHWN_MIN_N} and C={c} < {SEED_CHWN_MAX_C}: CHWN "
                          "coalesces over the batch", layer.name)
    return RuleChoice("NCHW", "direct", f"grouped or K not a multiple of {m}: CUDA-core direct; seed rule "
                      f"(N={n} < {SEED_CHWN_MIN_N} or C={c} >= {SEED_CHWN_MAX_C}): NCHW", layer.name)


def rule_pool(x_shape, dtype="bfloat16", *, neighbour_layout: str | None = None, name="") -> RuleChoice:
    """Pools are memory-bound in every layout (same bytes, all coalesced): keep the
    neighbours' layout, since a transform alone moves as many bytes as the pool."""
    shape4(x_shape, "x_shape")
    dtype_name(dtype)
    layout = check_layout(neighbour_layout, "neighbour_layout") if neighbour_layout else "NHWC"
    why = "the neighbours' layout" if neighbour_layout else "NHWC (no neighbour given)"
    return RuleChoice(layout, "xla", f"pooling is memory-bound in every layout: {why}", name)


def rule_for(layer: Layer, neighbour_layout: str | None = None) -> RuleChoice:
    """The rule's choice for any Layer (elementwise ops behave like pools)."""
    if not isinstance(layer, Layer):
        raise TypeError(f"layer must be a Layer, got {type(layer).__name__}")
    if layer.op == "conv2d":
        return rule_conv_layer(layer)
    return rule_pool(layer.x_shape, layer.dtype, neighbour_layout=neighbour_layout, name=layer.name)
