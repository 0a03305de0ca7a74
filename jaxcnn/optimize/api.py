"""`jaxcnn.optimize(fn)`: the one entry point, over the jaxpr rewriter (rewrite.py) and, with
`fuse`, the fusion of fire / inception / conv->max-pool groups (fused_groups.py) and of
expand -> depthwise chains (chain_groups.py)."""

from __future__ import annotations

from typing import Callable

from jaxcnn.optimize.fused_groups import GROUPS, optimize_fused
from jaxcnn.optimize.rewrite import Optimized


def optimize(fn: Callable, *, example_args=None, policy="auto", fuse="auto", sparse="none") -> Optimized:
    """`fn` with the lax patterns it traces to replaced by jaxcnn kernels.

    Recognised (also inside jit / closed_call / custom_jvp / custom_vjp bodies, e.g. jax.nn.relu):
      * conv_general_dilated with 2 spatial dims, activations NHWC/NCHW/CHWN, any weight order
        (transposed to HWIO), strides, padding, rhs_dilation, feature groups, DEFAULT/HIGH/HIGHEST
        precision, then its epilogue (optimize/epilogue_patterns.py): per-channel affine steps
        (a bias; inference BatchNorm as Keras, Flax and Equinox trace it, folded into the
        weights and bias on every call), a residual add, and an activation recognised by what it
        computes (relu, relu6, silu, hard_swish, gelu, sigmoid, leaky_relu) -> jaxcnn.conv2d;
      * reduce_window_max -> max_pool2d; reduce_window_sum / window size (f32, or between the
        f32 converts of a bf16/f16 model) -> avg_pool2d(count_include_pad=True);
      * an average pool (also Keras's, which counts only the pixels inside the image) read only
        by a 1x1 conv -> the conv first, then the pool on its output (optimize/pool_conv.py):
        the pool then averages the conv's K channels instead of its C (InceptionV3's pool
        branches); the conv's BatchNorm and activation follow the pool as traced;
      * jax.nn.softmax / log_softmax over one axis -> jaxcnn.softmax / log_softmax;
      * with `fuse` (on by default): fire modules (squeeze 1x1 -> [expand 1x1, expand 3x3] ->
        concatenate, as three of the conv matches above) -> one fused jaxcnn.fire; a 1x1 conv
        site read only by a 3x3 depthwise conv site, maybe through a zero pad (inverted
        residual blocks, BatchNorm folded, any activation but leaky_relu) -> one
        jaxcnn.conv1x1_depthwise; and NHWC conv + ReLU read
        only by a max pool -> jaxcnn.conv2d_pool (optimize_fused; also for convs the
        policy leaves to XLA).
    A bias or ReLU is fused only when nothing else reads the value before it. Everything else
    (lhs_dilation, batch groups, a preferred_element_type that changes the dtype, ...) runs as
    traced. The result works under jax.jit, jax.grad and jax.vmap.

    Args:
      fn: the function to optimize (array pytrees in, array pytrees out).
      example_args: optional tuple of arguments: traced now, and the default of explain/rewrites.
      policy: "auto" (each conv site decided by jaxcnn.tuning.decision: where the kernels run,
        XLA's own subgraph, XLA's conv with the epilogue folded and jaxcnn's kernels are measured
        on first use and cached per GPU, and a rewrite is kept only if it is faster (so is each
        pool -> 1x1 conv pair: both orders measured); then the whole
        rewritten program is measured once against fn and runs only if faster; elsewhere
        auto_policy's rules decide; pools and softmax stay XLA's), "all"
        (every recognised pattern, conv2d picking its kernel), "xla" (nothing is rewritten),
        "autotune" (each conv takes jaxcnn.layouts.autotune_conv's winner among its layout's
        kernels and XLA's conv, see autotune_policy), or a
        callable(Site) -> algorithm name ("auto", "tensor_core", "direct", "depthwise"; "xla" or
        None keeps that op as lax). Off CUDA the rewritten ops run their lax reference. Plugging
        in the autotuner (it measures on a GPU, and falls back to a model estimate elsewhere):

            import jaxcnn.layouts as L
            def tuned(site):
                if site.op != "conv2d":
                    return "auto"
                k = site.kwargs
                return L.autotune_conv(site.logical_x_shape(), site.w_shape, site.dtype,
                                       stride=k["stride"], padding=k["padding"],
                                       dilation=k["dilation"], groups=k["groups"],
                                       activation=k["activation"], bias=site.bias).algorithm
            fast = jaxcnn.optimize(model_fn, policy=tuned)

      fuse: "auto" (the default; ignored with policy="xla"), "none" (no cross-layer fusion),
        "all", or a callable(jaxcnn.optimize.JaxprGroup) -> bool. "auto": each expand ->
        depthwise chain fused where jaxcnn.tuning.decision measures the fused kernel faster than
        XLA's subgraph and the two convs as decided alone (the rule where nothing can be
        measured); each fire-shaped group and each NHWC
        conv+ReLU read only by a max pool fused, into jaxcnn.fire / jaxcnn.conv2d_pool, where
        jaxcnn.fusion's decide_groups measures the fused kernel faster on this GPU, or its cost
        model says so off GPU).
      sparse: "none" (dense convs) or "auto": each top-level NHWC conv (groups 1, undilated)
        runs jaxcnn.sparse_conv2d where jaxcnn.tuning.sparse_dispatch's crossover, measured for that
        layer on this GPU (sparse_dispatch.measure_crossover), says so at the fraction of zeros
        its input has on the concrete arguments traced (example_args, or the first call outside
        jit); no crossover measured means dense. explain() lists each pick and why. A conv
        that fusion takes (fuse=) runs fused whatever its pick.

    Returns:
      An `Optimized` callable with `.explain(*args)` (text) and `.rewrites(*args)` (Rewrite list);
      the trace is cached per argument structure, shapes and dtypes.
    """
    if fuse != "none" and policy != "xla":  # policy="xla" rewrites nothing: nothing to fuse
        if not (callable(fuse) or fuse in GROUPS):
            raise ValueError(f"fuse must be one of {GROUPS} or a callable(group) -> bool, got {fuse!r}")
        return optimize_fused(fn, example_args=example_args, policy=policy, groups=fuse, sparse=sparse)
    return Optimized(fn, example_args, policy, sparse)
