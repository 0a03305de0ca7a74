"""The decision behind `jaxcnn.conv2d(..., algorithm="auto")`: which kernel runs one conv.

Candidates are XLA's own convolution with the epilogue as a JAX user writes it (the baseline,
`algorithm="xla"`) and every jaxcnn kernel family the library accepts for the conv. The decision
owner (jaxcnn.tuning.decision) measures them once per GPU, shapes, dtype and configuration, keeps
XLA unless a family beats it by MIN_GAIN, and caches the record on disk; later traces and
processes read the cache. Where nothing is measured (a CPU, or JAXCNN_MEASURE=0 with no cached
record) the rule below decides: XLA where the only family that takes an ungrouped conv is the
CUDA-core direct kernel (cuDNN's implicit GEMM wins there by a wide margin), else the handler's
own pick.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from jaxcnn._native import library, queries
from jaxcnn.ops.conv2d.primitive import bind_conv2d
from jaxcnn.ops.conv2d.config import Conv2dConfig, conv2d_output_shape
from jaxcnn.ops.conv2d.reference import xla_conv2d
from jaxcnn.ops.layout_axes import convert_shape
from jaxcnn.tuning.decision import BASELINE, Candidate, Decision, Site, decide_all
from jaxcnn.tuning.layout_rules import rule_conv

# The jaxcnn kernel families a conv2d decision weighs, in the handler's own order of preference
# (cuda_ops/conv/conv2d_dispatch.cu plan_conv2d).
FAMILIES = ("depthwise", "wgmma", "tensor_core", "stem", "direct")
# The rule's pick where the handler should choose: "auto" goes to the library unchanged.
HANDLER_PICK = "auto"


def _aval_fields(a: Any) -> list | None:
    return None if a is None else [list(a.shape), jnp.dtype(a.dtype).name]


def site_fields(x, w, bias, residual, cfg: Conv2dConfig) -> dict:
    """The cache key fields of one conv: every input that changes which kernel is fastest."""
    return {
        "kind": "conv2d", "x": _aval_fields(x), "w": _aval_fields(w), "bias": _aval_fields(bias),
        "residual": _aval_fields(residual), "stride": list(cfg.stride), "padding": [list(p) for p in cfg.padding],
        "dilation": list(cfg.dilation), "groups": cfg.groups, "activation": cfg.activation, "alpha": cfg.alpha,
        "layout": cfg.layout, "precision": cfg.precision,
    }


def accepted_families(x, w, residual, cfg: Conv2dConfig) -> tuple[str, ...] | None:
    """The families the loaded library accepts for this conv (it answers the same query its
    handler plans with), or None where no library is loaded to ask."""
    if not library.handlers_registered():
        return None
    x_nhwc = convert_shape(x.shape, cfg.layout, "NHWC")
    out = conv2d_output_shape(x.shape, x.dtype, w.shape, w.dtype, None, None, cfg.replace(algorithm="auto"))
    y_nhwc = convert_shape(out, cfg.layout, "NHWC")
    accepted = []
    for family in FAMILIES:
        try:
            queries.conv2d_workspace_bytes(x_nhwc, w.shape, y_nhwc, x.dtype, cfg.replace(algorithm=family),
                                        residual=residual is not None)
        except ValueError:
            continue
        accepted.append(family)
    return tuple(accepted)


def rule(x, w, residual, cfg: Conv2dConfig) -> tuple[str, str]:
    """(algorithm, why) without a measurement."""
    return _rule_for(accepted_families(x, w, residual, cfg), x, w, cfg)


def _rule_for(families: tuple[str, ...] | None, x, w, cfg: Conv2dConfig) -> tuple[str, str]:
    """rule() given the library's accepted families (None: no library to ask)."""
    if families is None:
        # No library to ask (CPU): the layout rule says which family the handler would take.
        nhwc = convert_shape(x.shape, cfg.layout, "NHWC")
        families = (rule_conv(nhwc, w.shape, jnp.dtype(x.dtype).name, stride=cfg.stride,
                              padding=cfg.padding, dilation=cfg.dilation, groups=cfg.groups).algorithm,)
    if not families:
        return BASELINE, "no jaxcnn kernel family takes this conv"
    if families == ("direct",) and cfg.groups == 1:
        # cuDNN's implicit GEMM beats the CUDA-core kernel on most ungrouped convs; on grouped
        # ones XLA's conv is the slow one more often than not (the conv2d sweep report).
        return BASELINE, ("only the CUDA-core direct kernel takes this ungrouped conv (K off the "
                          "tensor-core multiple, or a non-NHWC layout); cuDNN's convolution is faster")
    return HANDLER_PICK, f"not measured; the handler picks among {', '.join(families)}"


def conv_site(x, w, bias, residual, cfg: Conv2dConfig) -> Site:
    """The Site of one conv for decide_all: XLA's conv + epilogue and each accepted family."""
    names = ["x", "w"] + (["bias"] if bias is not None else []) + (["residual"] if residual is not None else [])
    avals = [a for a in (x, w, bias, residual) if a is not None]

    def run(algorithm):
        def fn(*inputs):
            args = dict(zip(names, inputs))
            b, r = args.get("bias"), args.get("residual")
            if algorithm == BASELINE:
                return xla_conv2d(args["x"], args["w"], b, cfg.replace(algorithm=BASELINE), residual=r)
            return bind_conv2d(cfg.replace(algorithm=algorithm), args["x"], args["w"], b, r)
        return fn

    families = accepted_families(x, w, residual, cfg)
    candidates = [Candidate(BASELINE, run(BASELINE))]
    candidates += [Candidate(f, run(f)) for f in (FAMILIES if families is None else families)]
    return Site(site_fields(x, w, bias, residual, cfg), candidates, avals, lambda: _rule_for(families, x, w, cfg))


def decide_conv(x, w, bias, residual, cfg: Conv2dConfig, *, measure: bool | None = None,
                cache: Any = None) -> Decision:
    """Which algorithm runs this conv (Decision.choice: "xla", a family, or "auto" from the rule)
    and why. x, w, bias, residual: arrays or ShapeDtypeStructs (bias/residual may be None)."""
    (decision,) = decide_all([conv_site(x, w, bias, residual, cfg)], cache=cache, measure=measure)
    return decision
