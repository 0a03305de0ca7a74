"""`jaxcnn.fire`: SqueezeNet's fire module as one fused primitive.

    fire(x) = concat([relu(conv1x1(s, expand1_w) + expand1_b),
                      relu(conv3x3(s, expand3_w, padding=1) + expand3_b)], axis=-1)
    s       = relu(conv1x1(x, squeeze_w) + squeeze_b)

NHWC activations, HWIO weights, channels in torchvision's order [expand1x1, expand3x3] (the
zoo's `models.squeezenet.fire`). CUDA runs cuda_ops/fusion through XLA FFI, one of:
  - the fused kernel: the squeeze tile stays in shared memory (straight fusion), both expands
    read it there (split) and write straight into their channel slices of the output (merge:
    no concatenate);
  - on Hopper, TMA + wgmma kernels. With 32 squeeze channels the whole module is one launch
    (each tile's squeeze over its halo stays in shared memory; fusion/fire_fused_wgmma.h);
    otherwise the squeeze conv writes s to a workspace and the expands (one merged launch, or
    one conv each) store into their channel slices of the output (merge again). "auto" takes
    it for big problems (many pixels, or S > 32 where the fused kernel recomputes the
    squeeze);
  - for small problems (N = 1), one cooperative launch in two phases: the squeeze spread
    over every SM into the workspace, a grid barrier, then the expands into their slices.
Every other platform runs the lax reference (the unfused composition). Gradients are the
reference's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jaxcnn._native import queries
from jaxcnn.ops.fire.config import (
    ALGORITHMS,
    OPERAND_NAMES,
    FireConfig,
    fire_output_shape,
    make_fire_config,
)
from jaxcnn.ops.fire.reference import fire_reference
from jaxcnn.ops.fused_block import FusedBlockPrimitive
from jaxcnn.ops.operand_checks import as_array, bias_or_zeros

FFI_TARGET = "jaxcnn_fire_fwd"


class FirePrimitive(FusedBlockPrimitive):
    name = "jaxcnn_fire"
    # Only the batch factor n may stay sharded: the 3x3 needs halo rows/columns, the
    # contractions need all channels (every other factor is replicated).
    sharding_rules = {OPERAND_NAMES: "n h w c, a b c s, d e s k, f g s l, s, k, l -> n h w m"}

    @staticmethod
    def output_shape(shapes, dtypes, cfg: FireConfig):
        return fire_output_shape(shapes, dtypes)

    @staticmethod
    def block_reference(*operands, cfg: FireConfig):
        return fire_reference(*operands)  # the module has no configuration but its algorithm

    @classmethod
    def cuda_lowering(cls, ctx, *operands, cfg: FireConfig, operand_names):
        x_aval, sq_aval, e1_aval, e3_aval = ctx.avals_in[:4]
        # The wgmma / two-phase paths' squeeze output is a second result XLA allocates with the program's
        # other temporaries: no allocation inside the handler, CUDA-graph safe.
        scratch = queries.fire_workspace_bytes(
            x_aval.shape, sq_aval.shape[3], e1_aval.shape[3], e3_aval.shape[3], x_aval.dtype,
            cfg.algorithm,
        )
        ctx = ctx.replace(avals_out=[*ctx.avals_out, ShapedArray((scratch,), np.uint8)])
        y, _ = jax.ffi.ffi_lowering(FFI_TARGET)(
            ctx, *operands, algorithm=np.int64(ALGORITHMS.index(cfg.algorithm))
        )
        return [y]



FirePrimitive.register()


def fire(x, squeeze_w, expand1_w, expand3_w, squeeze_b=None, expand1_b=None, expand3_b=None,
         *, algorithm="auto"):
    """SqueezeNet fire module: squeeze 1x1 + ReLU, then [expand 1x1, expand 3x3 pad 1] + ReLU
    concatenated along channels, fused into one kernel on CUDA.

    Args:
      x: [N, H, W, C] float32, bfloat16 or float16 (NHWC).
      squeeze_w: [1, 1, C, S] (HWIO), same dtype as x.
      expand1_w: [1, 1, S, E1]; expand3_w: [3, 3, S, E3].
      squeeze_b, expand1_b, expand3_b: [S], [E1], [E3] biases, or None for zero bias.
      algorithm: "auto" (bf16/fp16 with channel counts multiples of 8: the two-phase
        kernel for at most 1024 output pixels and 8 to 64 squeeze channels; on Hopper the
        wgmma path (one launch for S = 32, C % 32, E1, E3 % 64; else the squeeze conv, then
        both expands in one launch where S % 32 and E1, E3 % 64, else one conv each) for
        >= 8192 output pixels or > 32 squeeze channels,
        unless the squeeze has at most 16 channels and the fused kernel runs two CTAs per SM
        unsplit;
        else the fused tensor-core kernel for at most 64 squeeze channels; else CUDA cores),
        "tensor_core" (the fused mma.sync kernel; error if it cannot run), "wgmma" (that
        path; error if it cannot run), "two_phase" (one cooperative launch: squeeze,
        grid barrier, expands; error if it cannot run) or "fma" (the CUDA-core kernel).
        float32 always runs the CUDA-core kernel (fp32 FMA).

    Returns:
      [N, H, W, E1 + E3] in x's dtype: channels [0, E1) from the 1x1 expand, [E1, E1 + E3)
      from the 3x3. Each conv accumulates in float32 and rounds once to x's dtype (the
      squeeze output too, as the unfused layers would). An empty batch (N = 0) gives the
      empty result.
    """
    cfg = make_fire_config(algorithm)
    x, squeeze_w, expand1_w, expand3_w = (
        as_array(a, name) for a, name in zip((x, squeeze_w, expand1_w, expand3_w), OPERAND_NAMES)
    )
    biases = [bias_or_zeros(b, w, name) for b, w, name in zip(
        (squeeze_b, expand1_b, expand3_b), (squeeze_w, expand1_w, expand3_w), OPERAND_NAMES[4:])]
    operands = (x, squeeze_w, expand1_w, expand3_w, *biases)
    return FirePrimitive.checked_call(cfg, operands, OPERAND_NAMES)


def conv1x1_conv3x3(x, w1, w3, b1=None, b3=None, *, algorithm="auto"):
    """Straight fusion of relu(conv3x3(relu(conv1x1(x, w1) + b1), w3, padding 1) + b3).

    The fire kernel with no 1x1 expand: each tile's 1x1 output (plus its 1-pixel halo,
    recomputed by neighbouring tiles) stays in shared memory and the 3x3 reads it there, so
    the intermediate never reaches DRAM.

    Args:
      x: [N, H, W, C] float32, bfloat16 or float16 (NHWC).
      w1: [1, 1, C, M] (HWIO); w3: [3, 3, M, K]; same dtype as x.
      b1, b3: [M], [K] biases, or None for zero bias.
      algorithm: as for `fire`.

    Returns:
      [N, H, W, K] in x's dtype.
    """
    w1 = as_array(w1, "w1")
    none = jnp.zeros(w1.shape[:2] + w1.shape[3:] + (0,), w1.dtype)  # [1, 1, M, 0]
    return fire(x, w1, none, w3, b1, None, b3, algorithm=algorithm)


def fire_block(layers, params, x, *, algorithm="auto"):
    """The zoo's fused-block entry (`ops["fire"]` in a models.backends table, see Net.block):
    runs `models.squeezenet.fire`'s three convs as one `fire` call. `params` are the block's
    {layer name: {"w", "b"}}; `layers` are its LayerInfos (names end in /squeeze1x1,
    /expand1x1, /expand3x3)."""
    by_role = {}
    for info in layers:
        role = info.name.rsplit("/", 1)[-1]
        if role in ("squeeze1x1", "expand1x1", "expand3x3"):
            by_role[role] = params[info.name]
    missing = {"squeeze1x1", "expand1x1", "expand3x3"} - set(by_role)
    if missing:
        raise ValueError(f"fire_block: layers have no {sorted(missing)} conv (got "
                         f"{[info.name for info in layers]})")
    sq, e1, e3 = by_role["squeeze1x1"], by_role["expand1x1"], by_role["expand3x3"]
    return fire(x, sq["w"], e1["w"], e3["w"], sq["b"], e1["b"], e3["b"], algorithm=algorithm)
