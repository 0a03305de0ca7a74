"""`jaxcnn.inception`: GoogLeNet's inception block as one primitive, with split fusion.

    inception(x) = concat([relu(conv1x1(x)),
                           relu(convKxK(relu(conv1x1(x, w_3x3_reduce)), w_3x3)),
                           relu(convKxK(relu(conv1x1(x, w_5x5_reduce)), w_5x5)),
                           relu(conv1x1(maxpool3x3/1(x), w_pool_proj))], axis=-1)

NHWC activations, HWIO weights, branches in the zoo's order (`models.googlenet.inception`:
1x1, 3x3, 5x5, pool projection). The two branch convs may have any odd square kernel with
"same" padding: the zoo's third branch is a true 5x5 (the paper), torchvision's is a 3x3.

CUDA lowering = a composition of jaxcnn's own FFI kernels, not one new kernel:
  split: the three 1x1 convs that read x (1x1, 3x3_reduce, 5x5_reduce) run as ONE conv2d over
         their weights concatenated along K, so x is read once instead of three times and two
         launches are saved;
  then the 3x3 and 5x5 branch convs (jaxcnn.conv2d on channel slices of the split output), the
  3x3/1 max pool (jaxcnn's pool kernel) -> pool projection (jaxcnn.conv2d), and
  merge: XLA's concatenate of the four branch outputs into their channel slices.
What still goes through DRAM (honestly): the split output (K1 + R3 + R5 channels; XLA copies
the two reduce slices out of it for the branch convs), the reduce->branch intermediates, the
pooled x and every branch output, which the concatenate reads again and writes once more. Only
the two extra reads of x and two launches are saved; no intermediate stays on chip. Every
other platform runs the lax reference (the unfused composition). Gradients are the
reference's (unfused).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax.interpreters import mlir

from jaxcnn.ops.conv2d.primitive import Conv2dPrimitive
from jaxcnn.ops.fused_block import FusedBlockPrimitive
from jaxcnn.ops.inception.config import (
    BIAS_NAMES,
    BRANCH_LAYERS,
    OPERAND_NAMES,
    InceptionConfig,
    inception_output_shape,
    make_inception_config,
)
from jaxcnn.ops.inception.reference import conv_config, inception_reference, pool_config
from jaxcnn.ops.operand_checks import as_array
from jaxcnn.ops.pool2d.api import Pool2dPrimitive

_CONV_NAMES = ("x", "w", "bias")


class InceptionPrimitive(FusedBlockPrimitive):
    name = "jaxcnn_inception"
    # Only the batch factor n may stay sharded: the branch convs and the pool need halos,
    # the contractions need every channel.
    sharding_rules = {OPERAND_NAMES: (
        "n h w c, a b c k, d e c r, f g r l, i j c s, o p s m, q t c u, k, r, l, s, m, u "
        "-> n h w y")}

    block_reference = staticmethod(inception_reference)

    @staticmethod
    def output_shape(shapes, dtypes, cfg: InceptionConfig):
        return inception_output_shape(shapes, dtypes)

    @classmethod
    def cuda_lowering(cls, ctx, *operands, cfg: InceptionConfig, operand_names):
        return mlir.lower_fun(functools.partial(_cuda_composition, cfg=cfg),
                              multiple_results=False)(ctx, *operands)



def _conv(x, w, b, cfg: InceptionConfig):
    """One jaxcnn conv2d kernel (the shard-level primitive: its CUDA lowering is the FFI call)."""
    conv_cfg = conv_config(x.shape, w.shape, cfg, cfg.algorithm)
    return Conv2dPrimitive.inner.bind(x, w, b, cfg=conv_cfg, operand_names=_CONV_NAMES)


def _cuda_composition(x, w_1x1, w_3x3_reduce, w_3x3, w_5x5_reduce, w_5x5, w_pool_proj,
                      b_1x1, b_3x3_reduce, b_3x3, b_5x5_reduce, b_5x5, b_pool_proj, *, cfg):
    k1, r3, r5 = w_1x1.shape[3], w_3x3_reduce.shape[3], w_5x5_reduce.shape[3]
    # Split fusion: the three 1x1 convs reading x as one GEMM over concatenated weights.
    split = _conv(x, jnp.concatenate([w_1x1, w_3x3_reduce, w_5x5_reduce], axis=3),
                  jnp.concatenate([b_1x1, b_3x3_reduce, b_5x5_reduce]), cfg)
    branch3 = _conv(split[..., k1:k1 + r3], w_3x3, b_3x3, cfg)
    branch5 = _conv(split[..., k1 + r3:k1 + r3 + r5], w_5x5, b_5x5, cfg)
    pooled = Pool2dPrimitive.inner.bind(x, cfg=pool_config(x.shape, x.dtype), operand_names=("x",))
    branch_pool = _conv(pooled, w_pool_proj, b_pool_proj, cfg)
    # Merge: the branches into their channel slices (an XLA concatenate; its slice of the
    # split output is read straight from there).
    return jnp.concatenate([split[..., :k1], branch3, branch5, branch_pool], axis=-1)


InceptionPrimitive.register()


def inception(x, w_1x1, w_3x3_reduce, w_3x3, w_5x5_reduce, w_5x5, w_pool_proj,
              b_1x1=None, b_3x3_reduce=None, b_3x3=None, b_5x5_reduce=None, b_5x5=None,
              b_pool_proj=None, *, algorithm="auto", precision=None):
    """GoogLeNet inception block (conv + bias + ReLU everywhere), split-fused on CUDA.

    Args:
      x: [N, H, W, C] float32, bfloat16 or float16 (NHWC).
      w_1x1, w_3x3_reduce, w_5x5_reduce, w_pool_proj: [1, 1, C, K] (HWIO), same dtype as x.
      w_3x3: [k, k, R3, K3] reading w_3x3_reduce's R3 outputs; w_5x5: [k, k, R5, K5] reading
        w_5x5_reduce's R5 outputs; k odd ("same" padding k // 2; the zoo uses 3 and 5).
      b_*: [K] bias of each conv, or None for zero bias.
      algorithm: conv2d kernel family of every conv: "auto", "tensor_core" or "direct".
      precision: float32 math, as conv2d's (None/"default" may use TF32; "highest").

    Returns:
      [N, H, W, K1 + K3 + K5 + Kpool] in x's dtype, channels in that branch order. The pool
      branch is a 3x3 max pool with stride 1 and -inf padding 1, then the 1x1 projection.
      An empty batch (N = 0) gives the empty result.
    """
    cfg = make_inception_config(algorithm, precision)
    weights = [as_array(a, name) for a, name in zip(
        (x, w_1x1, w_3x3_reduce, w_3x3, w_5x5_reduce, w_5x5, w_pool_proj), OPERAND_NAMES)]
    biases = []
    for b, w, name in zip((b_1x1, b_3x3_reduce, b_3x3, b_5x5_reduce, b_5x5, b_pool_proj),
                          weights[1:], BIAS_NAMES):
        if b is None:
            shape = w.shape[-1:] if w.ndim == 4 else (0,)
            biases.append(jnp.zeros(shape, w.dtype))
        else:
            biases.append(as_array(b, name))
    return InceptionPrimitive.checked_call(cfg, (*weights, *biases), OPERAND_NAMES)


def inception_block(layers, params, x, *, algorithm="auto"):
    """The zoo's fused-block entry (`ops["inception"]` in a models.backends table, see
    Net.block): runs `models.googlenet.inception`'s six convs, pool and concat as one
    `inception` call. `params` are the block's {layer name: {"w", "b"}}; `layers` its
    LayerInfos (names end in /1x1, /3x3_reduce, /3x3, /5x5_reduce, /5x5, /pool_proj)."""
    by_role = {}
    for info in layers:
        role = info.name.rsplit("/", 1)[-1]
        if role in BRANCH_LAYERS and info.op == "conv2d":
            by_role[role] = params[info.name]
    missing = [r for r in BRANCH_LAYERS if r not in by_role]
    if missing:
        raise ValueError(f"inception_block: layers have no {missing} conv (got "
                         f"{[info.name for info in layers]})")
    ws = [by_role[r]["w"] for r in BRANCH_LAYERS]
    bs = [by_role[r]["b"] for r in BRANCH_LAYERS]
    return inception(x, *ws, *bs, algorithm=algorithm)
