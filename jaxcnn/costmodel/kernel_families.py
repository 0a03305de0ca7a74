"""Which kernel family of the traffic/time model a measured GPU kernel belongs to.

The model describes two implicit-GEMM families (costmodel.model.IMPLS): XLA's convolutions, run
by cuDNN's implicit-GEMM kernels or by cuBLAS GEMMs (1x1 convs), and jaxcnn's CUDA-core direct
kernel; and two stream families (costmodel.streaming): cuDNN's depthwise kernels and jaxcnn's.
A per-layer measurement names the kernels that ran, and a jaxcnn layer may run XLA's kernel (the
decision owner keeps XLA where it measured faster): its prediction is that family's, whichever
backend ran it. Other kernels (jaxcnn's stem, tensor-core, wgmma, fused fire and chain kernels,
cuDNN's direct engine) are families the model does not cover: None.

Jax-free: the dashboard reads it.
"""

from __future__ import annotations

import re

# (pattern on the kernel's full name, the model's family), first match wins.
KERNEL_FAMILIES = (
    (re.compile(r"\bjaxcnn::conv2d_direct\b|\bconv2d_direct_kernel\b"), "jaxcnn_direct"),
    (re.compile(r"\bconv2d_c1_k1"), "depthwise"),  # cuDNN's depthwise engines
    (re.compile(r"\bjaxcnn::conv2d_depthwise::"), "jaxcnn_depthwise"),
    (re.compile(r"\bjaxcnn::"), None),  # our other kernels: no model yet
    # cuDNN implicit GEMM (sm80_xmma_fprop_implicit_gemm_*, implicit_convolve_sgemm), cuBLAS
    # (nvjet_*, xmma_gemm_*, and its CUTLASS-built cutlass_80_*gemm kernels)
    (re.compile(r"implicit_gemm|implicit_convolve_sgemm|xmma_gemm|\bnvjet|cutlass_\d+_\w*gemm"), "xla"),
)


def impl_of_kernel(name: str) -> str | None:
    """The model's family ("xla", "jaxcnn_direct", "depthwise", "jaxcnn_depthwise") of the GPU kernel
    `name` (its full name as the profiler records it), None where the model does not describe
    that kernel."""
    for pattern, family in KERNEL_FAMILIES:
        if pattern.search(name or ""):
            return family
    return None
