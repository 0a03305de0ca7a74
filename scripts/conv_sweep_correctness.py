"""Correctness in scripts/bench_conv_sweep.py (issue 33): the float64 numpy reference a case's
sampled images are judged against (independent of jax's and jaxcnn's convolutions), the tolerance
a correct conv2d meets (from the dtype, the precision and the reduction length), the relative
error, and each case's verdict.

Imported by bench_conv_sweep after bench_common, which makes jaxcnn importable from a checkout."""

from __future__ import annotations

import math

import numpy as np
from jax import lax

from conv_sweep_cases import REFERENCE_IMAGES, Case

# Tolerance (see tolerance()): the output roundings of the XLA formulation auto may lower to
# (conv, +bias, +residual, and silu's sigmoid and product, each rounded to x's dtype), the
# rounding of the multiplicands inside the MMA, and the fp32 accumulator.
UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 2.0**-24}
OUTPUT_ROUNDINGS = 5
# TF32 keeps 10 of fp32's 23 mantissa bits; 3xTF32 splits each operand into two TF32 parts and
# drops the small x small product, both of order 2**-21; bf16/fp16 products are exact in fp32.
MMA_ROUNDOFF = {"bf16": 0.0, "fp16": 0.0, "fp32": 2.0**-11, "fp32_highest": 2.0**-21}
ACCUMULATOR_ROUNDOFF = 2.0**-24
# Rounding errors of random sign grow like sqrt(terms) times the result's scale; an output
# tensor's largest one sits within a few standard deviations of them.
TAIL = 4.0


def sample_images(case: Case) -> list[int]:
    """The images of the batch the float64 reference checks."""
    return sorted({0, case.n - 1})[:REFERENCE_IMAGES]


ACTIVATIONS_F64 = {
    None: lambda y: y,
    "relu": lambda y: np.maximum(y, 0.0),
    "relu6": lambda y: np.clip(y, 0.0, 6.0),
    "silu": lambda y: y / (1.0 + np.exp(-y)),
}


def explicit_padding(case: Case) -> tuple[tuple[int, int], tuple[int, int]]:
    """The case's padding as ((top, bottom), (left, right)); SAME/VALID as lax defines them."""
    p = case.padding
    if isinstance(p, str):
        window = [d * (f - 1) + 1 for d, f in zip(case.dilation, (case.r, case.s))]
        return tuple(tuple(v) for v in lax.padtype_to_pads((case.h, case.w), window, case.stride, p))
    if isinstance(p, int):
        return ((p, p), (p, p))
    if isinstance(p[0], int):
        return ((p[0], p[0]), (p[1], p[1]))
    return tuple(tuple(v) for v in p)


def reference_f64(case: Case, x, w, b, residual=None) -> np.ndarray:
    """activation(conv(x, w) + b + residual) in float64 with numpy, one batched matmul per filter
    tap (x, residual: NHWC images; w: HWIO): independent of jax's and jaxcnn's convolutions."""
    x = np.asarray(x, np.float64)
    (pt, pb), (pl, pr) = explicit_padding(case)
    (sh, sw), (dh, dw), g = case.stride, case.dilation, case.groups
    n, h, wd, c = x.shape
    r, s, cg, k = case.w_shape
    # taps [r, s, groups, C/groups, K/groups]: group j maps its input channels to its K/groups outputs
    taps = np.asarray(w, np.float64).reshape(r, s, cg, g, k // g).transpose(0, 1, 3, 2, 4)
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    p = (h + pt + pb - dh * (r - 1) - 1) // sh + 1
    q = (wd + pl + pr - dw * (s - 1) - 1) // sw + 1
    y = np.zeros((g, n * p * q, k // g))
    for i in range(r):
        for j in range(s):
            window = xp[:, i * dh: i * dh + (p - 1) * sh + 1: sh, j * dw: j * dw + (q - 1) * sw + 1: sw, :]
            y += np.matmul(window.reshape(n * p * q, g, cg).transpose(1, 0, 2), taps[i, j])
    y = y.transpose(1, 0, 2).reshape(n, p, q, k) + np.asarray(b, np.float64)
    if residual is not None:
        y = y + np.asarray(residual, np.float64)
    return ACTIVATIONS_F64[case.activation](y)


def tolerance(case: Case) -> float:
    """Largest max |error| / max |reference| a correct conv2d has for the case: OUTPUT_ROUNDINGS
    roundings of the output's dtype, plus TAIL times the random-sign errors of the two rounded
    multiplicands and of an fp32 sum of `terms` terms."""
    u_out = UNIT_ROUNDOFF[case.dtype]
    return OUTPUT_ROUNDINGS * u_out + TAIL * (2 * MMA_ROUNDOFF[case.kind]
                                              + ACCUMULATOR_ROUNDOFF * math.sqrt(case.terms))


def auto_error(row: dict) -> float:
    """A checked row's auto error; inf where it was not finite (the JSON keeps that as null)."""
    err = row["correctness"]["rel_err_auto"]
    return math.inf if err is None else err


def rel_error(out, ref) -> float:
    """max |out - ref| / max |ref|; anything non-finite in out gives inf, so it never passes."""
    out = np.asarray(out, np.float64)
    if not np.all(np.isfinite(out)):
        return math.inf
    return float(np.max(np.abs(out - ref))) / max(float(np.max(np.abs(ref))), 1e-30)


def check(case: Case, sampled: dict, reference: np.ndarray) -> dict:
    """auto's (and XLA's) error against the float64 reference; finite over the whole output."""
    tol = tolerance(case)
    auto_err = rel_error(sampled["y_auto"], reference)
    finite = bool(sampled["finite"])
    scale = float(sampled["scale"])
    ok = finite and auto_err <= tol
    return dict(rel_err_auto=auto_err, rel_err_xla=rel_error(sampled["y_xla"], reference), tolerance=tol,
                finite=finite, images=sample_images(case), ok=ok,
                auto_vs_xla=float(sampled["diff"]) / scale if scale > 0 else None)


def reference_for(case: Case, sampled: dict, memo: dict) -> np.ndarray | str:
    """The float64 reference of the sampled images (or why it failed), shared through `memo` by
    cases with the same inputs."""
    if case.input_key not in memo:
        try:
            memo[case.input_key] = reference_f64(case, sampled["x"], sampled["w"], sampled["b"], sampled["residual"])
        except Exception as e:  # recorded on the case; the others go on
            return f"{type(e).__name__}: {e}"[:1000]
    return memo[case.input_key]
