"""The rules and policies that say which algorithm runs an op `optimize` found (a Site): the
built-in policies ("auto"'s rules, "autotune") and the checks of a user's policy callable.
Measured decisions for conv sites go through the decision owner (jaxcnn.tuning.decision);
these rules decide where nothing can be measured."""

from __future__ import annotations

import jax

from jaxcnn._native import ConvPoolPlan, library, queries
from jaxcnn.ops.conv2d.config import ALGORITHMS
from jaxcnn.ops.conv2d_pool.config import make_conv_pool_config
from jaxcnn.optimize.patterns import Site
from jaxcnn.tuning.layer_autotune import autotune_conv, cached_conv_choice

# Pools and softmax stay XLA's under policy="auto": on the H200 (pool_softmax bench) XLA's
# reduce_window / softmax ran at 0.43-1.01x of jaxcnn's time on CNN shapes, and XLA fuses them
# into their neighbours, which a custom call prevents.
AUTO_KEEPS_XLA = ("max_pool2d", "avg_pool2d", "softmax", "log_softmax")


def auto_policy(site: Site) -> str | None:
    """policy="auto": the rewrites that pay. A conv the autotuner has measured on this GPU (its
    cache holds the layer) takes that measured winner, XLA's conv included. Otherwise:
      * depthwise convs (groups == C > 1) run jaxcnn's depthwise kernel;
      * fp32 convs at precision "highest" (HIGH/HIGHEST) run the tensor-core kernel (NHWC,
        groups 1, C >= 8, K a multiple of 4): its 3xTF32 path ran 1.4-3.2x faster than XLA's
        HIGHEST on the H200;
      * on Hopper, bf16/fp16 3x3/1 SAME convs the wgmma kernel takes run it where its tiles
        cover the image exactly, else the tensor-core kernel from 256 input channels on
        (hopper_3x3_choice: VGG-19 1.15-1.21x the original with it, 1.13-1.17x with XLA's);
      * ReLU convs of an image (C < 8) into >= 64 channels run the stem kernel (stem_pays:
        VGG-19's c1_1 2.0-2.5x XLA);
      * every other dense conv (bf16/fp16, fp32 at default/TF32 precision) stays XLA's: on the
        H200 our tensor-core conv ran at 0.84-0.91x of cuDNN on VGG layers and whole models
        with it at 0.98-1.04x of the original, so only a measured win (the cache) rewrites it.
    Convs that would fall back to the CUDA-core direct kernel (NCHW/CHWN, grouped, odd K) stay
    XLA's, as do pools and softmax (AUTO_KEEPS_XLA). fuse= still offers the convs left here
    to XLA to its groups (fire, conv -> max pool), where the fusion planner decides.
    policy="all" rewrites every recognised pattern instead."""
    if site.op == "pool_conv":
        return "auto" if commute_pays(site) else None
    if site.op != "conv2d":
        return None if site.op in AUTO_KEEPS_XLA else "auto"
    # The autotuner measures convs with at most a bias and ReLU.
    plain = site.kwargs["activation"] in (None, "relu") and not site.residual
    measured = _cached_choice(site) if plain else None
    if measured is not None:
        return measured
    n, h, w, c = site.logical_x_shape()
    k, groups = site.w_shape[3], site.kwargs["groups"]
    if groups == c > 1 and k % c == 0:
        return "auto"  # the depthwise kernel
    hopper = hopper_3x3_choice(site)
    if hopper is not None:
        return hopper
    if stem_pays(site):
        return "stem"
    if not (jax.numpy.dtype(site.dtype) == jax.numpy.float32 and site.kwargs["precision"] == "highest"):
        return None  # a dense conv at cuDNN's own speed: XLA's unless measured (above)
    # C < 8 (an image's 1-3 channels) pads GEMM-K with zeros: cuDNN's own first-layer kernels
    # won there (H200: a C=1 MNIST conv ran at 0.92x of XLA). fp32 rows: 16 bytes = 4 channels.
    if (site.layout == "NHWC" and groups == 1 and c >= 8 and k % 4 == 0
            and max(site.kwargs["stride"]) <= 8):
        return "auto"  # the tensor-core kernel (3xTF32)
    return None


def unpooled_plan(site: Site, algorithm: str) -> ConvPoolPlan | None:
    """The library's plan for running NHWC groups-1 conv `site` as a conv_pool kernel with
    a 1x1/1 pool (what conv2d's "wgmma" and "stem" algorithms launch), e.g. "kernel=wgmma
    block=28x8 ... recompute=1.00"; None where the kernel does not take it or no GPU library is
    loaded."""
    if (site.op != "conv2d" or site.layout != "NHWC" or site.kwargs["groups"] != 1
            or jax.default_backend() != "gpu" or not library.handlers_registered()):
        return None
    k = site.kwargs
    try:
        cfg = make_conv_pool_config(site.x_shape, site.w_shape, stride=k["stride"], padding=k["padding"],
                                    dilation=k["dilation"], pool_window=1, pool_stride=1,
                                    precision=k["precision"], algorithm=algorithm)
    except ValueError:
        return None
    plan = queries.conv_pool_plan(site.x_shape, site.w_shape, site.dtype, cfg)
    return plan if plan is not None and plan.kernel == algorithm else None


def hopper_3x3_choice(site: Site) -> str | None:
    """auto_policy's kernel for a conv jaxcnn.conv2d's Hopper wgmma kernel takes on this
    process's GPU (the library's own plan: bf16/fp16 NHWC 3x3/1 SAME, groups 1, C % 32, K % 64,
    sm_90), else None: "wgmma" where its tiles cover the image exactly (the plan's recompute
    1.00); else "tensor_core" for C >= 256 and XLA's conv (None) below. Measured on an H100
    (benchmarks/results/h100-2026-11-26-optimize_conv_policy.md), VGG-19 bf16 under
    optimize(fuse="auto") in one process: XLA's convs 1.13-1.17x the original, wgmma
    everywhere 1.12-1.23x, this rule 1.15-1.21x. Alone (XLA's time / the kernel's), the wgmma
    kernel ran 0.97-1.59x on the 224-, 112- and 56-pixel layers and 0.76-0.91x at 28 and 14
    pixels, where its 28x8 and 16x16 tiles pad the image by 14% and 31%. Inside VGG the
    tensor-core kernel on those 256-512-channel convs beat XLA's (alone: 0.79-1.01x), but on
    nnx_cnn's 32-channel 14x14 conv it ran 0.97x."""
    plan = unpooled_plan(site, "wgmma")
    if plan is None or plan.recompute is None:
        return None
    if plan.recompute <= 1.0:
        return "wgmma"
    return "tensor_core" if site.logical_x_shape()[3] >= 256 else None


def stem_pays(site: Site) -> bool:
    """Whether auto_policy runs this conv on jaxcnn.conv2d's stem kernel: an NHWC ReLU conv of
    fewer than 8 input channels (an image) and at least 64 output channels that the kernel takes
    on this process's GPU (the library's own plan). Measured on an H100 (VGG-19's c1_1, 224x224
    RGB -> 64, bf16): 285 us vs XLA's 579 us at N=64, 8.0 vs 20.1 us at N=1; the small CNNs'
    1-channel, 6-32-filter convs stay XLA's (not measured)."""
    if site.op != "conv2d" or site.layout != "NHWC" or site.kwargs["activation"] != "relu":
        return False
    if site.logical_x_shape()[3] >= 8 or site.w_shape[3] < 64:
        return False
    return unpooled_plan(site, "stem") is not None


def _conv_candidates(site: Site) -> list[tuple[str, str]]:
    """The kernels a conv site can run in its own layout, and XLA's conv."""
    channels = site.logical_x_shape()[3]
    candidates = [(site.layout, "direct"), (site.layout, "xla")]
    if site.layout == "NHWC":
        candidates.append(("NHWC", "tensor_core"))
    if site.kwargs["groups"] == channels and channels > 1:
        candidates.append((site.layout, "depthwise"))
    return candidates


def _conv_layer_kwargs(site: Site) -> dict:
    k = site.kwargs
    return dict(stride=k["stride"], padding=k["padding"], dilation=k["dilation"], groups=k["groups"],
                activation=k["activation"], precision=k["precision"], bias=site.bias,
                candidates=_conv_candidates(site))


def _cached_choice(site: Site):
    """The autotuner's measured choice for this conv when its cache already holds one for
    this GPU (e.g. from `jaxcnn layouts --autotune` or policy="autotune"), else None."""
    return cached_conv_choice(site.logical_x_shape(), site.w_shape, site.dtype, **_conv_layer_kwargs(site))


def commute_pays(site: Site) -> bool:
    """An average pool read by a 1x1 conv (optimize/pool_conv.py) runs after the conv where that
    moves fewer bytes: the pool keeps the image size (stride 1), so the conv's reads and writes
    stay as they are, and it then pools K channels instead of C (K < C)."""
    _, _, c, k = site.w_shape
    return all(s == 1 for s in site.kwargs["stride"]) and k < c


def autotune_policy(site: Site):
    """policy="autotune": jaxcnn.layouts.autotune_conv's choice among the kernels that run in
    the site's own layout and XLA's conv (measured device times on a GPU, cached per GPU kind;
    model estimates elsewhere). XLA winning keeps the conv as lax: never slower than XLA on a
    layer the autotuner measured. Pools and softmax follow auto_policy (XLA's)."""
    if site.op != "conv2d":
        return auto_policy(site)
    return autotune_conv(site.logical_x_shape(), site.w_shape, site.dtype, **_conv_layer_kwargs(site))


def choose_algorithm(policy, site: Site) -> str | None:
    """The conv algorithm for `site` (None: leave the pattern as lax)."""
    if policy == "all":
        return "auto"
    if policy == "auto":
        policy = auto_policy
    if policy == "autotune":
        policy = autotune_policy
    choice = policy(site)
    if choice is None or choice == "xla":
        return None
    if site.op != "conv2d":
        return "auto"
    algorithm = getattr(choice, "algorithm", choice)  # a layouts.ConvChoice works too
    if algorithm == "xla":
        return None
    if algorithm not in ALGORITHMS:
        raise ValueError(f"policy returned algorithm {algorithm!r} for {site}; expected one of {ALGORITHMS} or None")
    return algorithm
