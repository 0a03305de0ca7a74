"""The library's host-side queries through ctypes: workspace sizes and kernel plans.

Each asks the loaded library the same question its handler answers when it plans a launch, so
Python's numbers (scratch operands, plan lines) always match what the handler will do. Plans come
back as the typed records of jaxcnn._native.plans.
"""

from __future__ import annotations

import ctypes

import jax

from jaxcnn._native import library
from jaxcnn._native.codes import (
    ACTIVATION_CODES,
    CONV2D_ALGORITHMS,
    CONV2D_PRECISIONS,
    CONV_POOL_ALGORITHMS,
    FIRE_ALGORITHMS,
    LAYOUTS,
    dtype_code,
)
from jaxcnn._native.plans import (
    ConvPoolPlan,
    DeviceLimits,
    FirePlan,
    SparsePlan,
    parse_conv_pool_plan,
    parse_fire_plan,
    parse_sparse_plan,
)

# The int64 parameters of jaxcnn_conv2d_workspace_bytes (cuda_ops/conv/conv2d_ffi.cu), in the
# C signature's order and spelling (tests/native/test_native_contract.py checks it against the source);
# a `const char** reason` follows them.
CONV2D_QUERY_FIELDS = (
    "n", "h", "w", "c", "r", "s", "k", "p", "q", "stride_h", "stride_w", "pad_h", "pad_w",
    "dil_h", "dil_w", "groups", "activation", "has_residual", "layout", "precision", "algorithm",
    "dtype",
)


def conv2d_workspace_bytes(x_nhwc, w_shape, y_nhwc, dtype, cfg, residual=False) -> int:
    """Device scratch bytes the conv2d handler needs for these shapes and `cfg`
    (the kernel family it will pick, its filter re-layout and fp32 splits), with or without a
    residual operand. Asks the library, so the size always matches the handler's own choice."""
    if not library.handlers_registered():
        return 0
    fn = library.loaded_library().jaxcnn_conv2d_workspace_bytes
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64] * len(CONV2D_QUERY_FIELDS) + [ctypes.POINTER(ctypes.c_char_p)]
    (pt, _), (pl, _) = cfg.padding
    n, h, w, c = x_nhwc
    fields = dict(
        n=n, h=h, w=w, c=c, r=w_shape[0], s=w_shape[1], k=w_shape[3], p=y_nhwc[1], q=y_nhwc[2],
        stride_h=cfg.stride[0], stride_w=cfg.stride[1], pad_h=pt, pad_w=pl,
        dil_h=cfg.dilation[0], dil_w=cfg.dilation[1], groups=cfg.groups,
        activation=ACTIVATION_CODES[cfg.activation], has_residual=int(bool(residual)),
        layout=LAYOUTS.index(cfg.layout), precision=CONV2D_PRECISIONS.index(cfg.precision),
        algorithm=CONV2D_ALGORITHMS.index(cfg.algorithm), dtype=dtype_code(dtype),
    )
    reason = ctypes.c_char_p()
    size = fn(*(fields[name] for name in CONV2D_QUERY_FIELDS), ctypes.byref(reason))
    if size < 0:
        why = reason.value.decode() if reason.value else "unknown reason"
        raise ValueError(
            f"jaxcnn.conv2d: algorithm={cfg.algorithm!r} cannot run x {tuple(x_nhwc)} (NHWC "
            f"order), w {tuple(w_shape)}, {jax.numpy.dtype(dtype).name}, "
            f"activation={cfg.activation!r}{', with a residual' if residual else ''}: {why}"
        )
    return int(size)


_SPARSE_PARAM_FIELDS = ("N", "H", "W", "C", "R", "S", "K", "P", "Q", "stride_h", "stride_w", "pad_h", "pad_w",
                        "dilation_h", "dilation_w", "activation", "pool_h", "pool_w", "pool_stride_h",
                        "pool_stride_w", "pool_pad_h", "pool_pad_w", "PP", "PQ", "elem_bytes")
# Fields a caller may leave out, and their values (elem_bytes: the storage type's size).
_SPARSE_PARAM_DEFAULTS = {"elem_bytes": 4}


def _sparse_params_array(params: dict):
    return (ctypes.c_int64 * len(_SPARSE_PARAM_FIELDS))(
        *(int(params.get(f, _SPARSE_PARAM_DEFAULTS.get(f, 0))) for f in _SPARSE_PARAM_FIELDS))


def _export(name: str, target: str | None = None):
    """The library's function `name`, or None when the library is not loaded (or `target`'s
    handler is not registered) or it predates the function."""
    registered = library.target_registered(target) if target else library.handlers_registered()
    if not registered or not hasattr(library.loaded_library(), name):
        return None
    return getattr(library.loaded_library(), name)


def _plan_line(fn, *args) -> str:
    """Calls a plan query `fn(*args, out, out_len)` and returns the line it wrote into `out`."""
    out = ctypes.create_string_buffer(256)
    fn(*args, out, len(out))
    return out.value.decode()


def _sparse_export(name: str):
    return _export(name, "jaxcnn_sparse_conv2d_fwd")


def sparse_conv_plan(params: dict) -> SparsePlan | None:
    """The zero-skipping conv's plan for these params on the current device, read from the
    library's one line ("kernel=tile tile=2x8 k_per_lane=4 ..." or "kernel=walk ..."), or None when the
    library (or its sparse handler) is not loaded. `params` holds the fields of
    cuda_ops/sparse/sparse_conv.h's SparseConvParams by name."""
    fn = _sparse_export("jaxcnn_sparse_conv_plan")
    if fn is None:
        return None
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]
    return parse_sparse_plan(_plan_line(fn, _sparse_params_array(params), len(_SPARSE_PARAM_FIELDS)))


def sparse_conv_scratch_bytes(params: dict) -> int | None:
    """Device scratch the zero-skipping conv's handler uses for these params (the walk kernel's
    masks or the tile kernel's split partial sums), or None when the library is not loaded.
    Asks the library, so the size matches the handler's own plan."""
    fn = _sparse_export("jaxcnn_sparse_conv_scratch_bytes")
    if fn is None:
        return None
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int64]
    size = fn(_sparse_params_array(params), len(_SPARSE_PARAM_FIELDS))
    return None if size < 0 else int(size)


def fire_plan(x_nhwc, squeeze, expand1, expand3, dtype, algorithm="auto",
              device: DeviceLimits | None = None) -> FirePlan | None:
    """The fire module's kernel configuration for these shapes on the current device (or on the
    described `device`: jaxcnn_fire_plan_for_device, the same decisions), read from the
    library's one line ("kernel=tensor_core tile=8x16 split=1 grid=132 smem=... ...", or
    "kernel=wgmma launches=2 workspace=..."): what the handler will launch. None when the
    library is not loaded (or predates the query)."""
    fn = _export("jaxcnn_fire_plan" if device is None else "jaxcnn_fire_plan_for_device")
    if fn is None:
        return None
    n, h, w, c = x_nhwc
    args = [n, h, w, c, squeeze, expand1, expand3, dtype_code(dtype), FIRE_ALGORITHMS.index(algorithm)]
    if device is not None:
        args += [device.sm_count, device.smem_optin, device.smem_per_sm, device.major,
                 int(device.cooperative)]
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64] * len(args) + [ctypes.c_char_p, ctypes.c_int64]
    return parse_fire_plan(_plan_line(fn, *args))


def fire_workspace_bytes(x_nhwc, squeeze, expand1, expand3, dtype, algorithm) -> int:
    """Device scratch bytes the fire handler needs (the squeeze output when it runs the three
    wgmma convs; 0 for the fused kernels). Asks the library, so the size matches the handler's
    own choice; 0 when the library is not loaded. A kernel that cannot run is the handler's
    error to report, at run time."""
    if not library.handlers_registered():
        return 0
    fn = library.loaded_library().jaxcnn_fire_workspace_bytes
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64] * 9
    n, h, w, c = x_nhwc
    return int(fn(n, h, w, c, squeeze, expand1, expand3,
                  dtype_code(dtype), FIRE_ALGORITHMS.index(algorithm)))


def conv_pool_plan(x_nhwc, w_shape, dtype, cfg) -> ConvPoolPlan | None:
    """The fused conv+pool kernel's configuration for an NHWC x, HWIO w and a ConvPoolConfig on
    the current device, read from the library's one line ("kernel=tensor_core block=8x16 pooled=4x8
    block_k=64 grid=... smem=... recompute=1.00", or "kernel=direct (why) grid=..."): what the
    handler will launch. None when the library is not loaded (or predates the query)."""
    fn = _export("jaxcnn_conv_pool_plan")
    if fn is None:
        return None
    fn.restype = ctypes.c_int64
    i64s = ctypes.POINTER(ctypes.c_int64)
    fn.argtypes = [i64s, i64s, i64s, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_char_p, ctypes.c_int64]
    conv = cfg.conv
    (pt, pb), (pl, pr) = conv.padding
    (qt, qb), (ql, qr) = cfg.pool_padding
    dims = (ctypes.c_int64 * 7)(*x_nhwc, w_shape[0], w_shape[1], w_shape[3])
    conv_attrs = (ctypes.c_int64 * 8)(*conv.stride, pt, pb, pl, pr, *conv.dilation)
    pool_attrs = (ctypes.c_int64 * 8)(*cfg.pool_window, *cfg.pool_stride, qt, qb, ql, qr)
    return parse_conv_pool_plan(_plan_line(fn, dims, conv_attrs, pool_attrs, dtype_code(dtype),
                                           CONV2D_PRECISIONS.index(conv.precision), CONV_POOL_ALGORITHMS.index(cfg.algorithm)))
