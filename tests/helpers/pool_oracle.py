"""Independent float64 NumPy oracles for pooling and softmax (no jaxcnn code involved)."""

from __future__ import annotations

import numpy as np

# Transposes from each layout to NHWC and back.
TO_NHWC = {"NHWC": (0, 1, 2, 3), "NCHW": (0, 2, 3, 1), "CHWN": (3, 1, 2, 0)}
FROM_NHWC = {"NHWC": (0, 1, 2, 3), "NCHW": (0, 3, 1, 2), "CHWN": (3, 1, 2, 0)}

# assert_allclose tolerances of one output rounding in each dtype (fp32 sums reorder).
TOL = {
    "float32": dict(rtol=2e-6, atol=2e-6),
    "float16": dict(rtol=1e-3, atol=1e-3),
    "bfloat16": dict(rtol=8e-3, atol=8e-3),
}


def to_layout(x_nhwc, layout):
    return np.transpose(x_nhwc, FROM_NHWC[layout])


def explicit_pads(padding, hw, window, stride):
    """SAME/VALID/int/pair/pairs -> ((t, b), (l, r)), as lax.padtype_to_pads."""
    if isinstance(padding, str):
        if padding.upper() == "VALID":
            return ((0, 0), (0, 0))
        pads = []
        for size, k, s in zip(hw, window, stride):
            out = -(-size // s)
            total = max((out - 1) * s + k - size, 0)
            pads.append((total // 2, total - total // 2))
        return tuple(pads)
    if isinstance(padding, int):
        return ((padding, padding), (padding, padding))
    if isinstance(padding[0], int):
        return ((padding[0], padding[0]), (padding[1], padding[1]))
    return tuple(tuple(p) for p in padding)


def pool_nhwc_f64(x, mode, window, stride, pads, count_include_pad=True):
    """max (-inf padding, NaN propagates) or avg over NHWC x, in float64."""
    x = np.asarray(x, np.float64)
    (pt, pb), (pl, pr) = pads
    r, s = window
    sh, sw = stride
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    inside = np.pad(np.ones(x.shape[1:3]), ((pt, pb), (pl, pr)))
    p = (xp.shape[1] - r) // sh + 1
    q = (xp.shape[2] - s) // sw + 1
    acc = np.full((x.shape[0], p, q, x.shape[3]), fill)
    count = np.zeros((p, q))
    for i in range(r):
        for j in range(s):
            tap = xp[:, i : i + (p - 1) * sh + 1 : sh, j : j + (q - 1) * sw + 1 : sw, :]
            acc = np.maximum(acc, tap) if mode == "max" else acc + tap
            count += inside[i : i + (p - 1) * sh + 1 : sh, j : j + (q - 1) * sw + 1 : sw]
    if mode == "max":
        return acc
    with np.errstate(invalid="ignore", divide="ignore"):
        return acc / (r * s if count_include_pad else count[None, :, :, None])


def pool_f64(x, layout, mode, window, stride, padding, count_include_pad=True):
    """The oracle for x in `layout`; returns float64 in `layout`."""
    x_nhwc = np.transpose(np.asarray(x, np.float64), TO_NHWC[layout])
    window = (window, window) if isinstance(window, int) else tuple(window)
    stride = window if stride is None else stride
    stride = (stride, stride) if isinstance(stride, int) else tuple(stride)
    pads = explicit_pads(padding, x_nhwc.shape[1:3], window, stride)
    return to_layout(pool_nhwc_f64(x_nhwc, mode, window, stride, pads, count_include_pad), layout)


def softmax_f64(x, axis=-1, log=False):
    x = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(x, axis=axis, keepdims=True)
        d = x - m
        s = np.sum(np.exp(d), axis=axis, keepdims=True)
        return d - np.log(s) if log else np.exp(d) / s
